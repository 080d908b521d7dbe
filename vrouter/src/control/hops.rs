//! The underlay next hops the routes need, counted per route as routes
//! come and go, so the question "which next hops lack a MAC" costs the
//! number of distinct next hops (a few per node), never a walk of the
//! routes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use brindle_api::vrouter as api;

use crate::pipeline::PipelineConfig;

/// Routes per next hop.
#[derive(Debug, Default)]
pub(super) struct NextHops {
    /// Tunnel remotes (IPIP/VXLAN outer destinations).
    remotes: BTreeMap<Ipv4Addr, u32>,
    /// IPv4 gateways, by port.
    gateways: BTreeMap<(String, Ipv4Addr), u32>,
}

fn bump<K: Ord>(map: &mut BTreeMap<K, u32>, key: K, up: bool) {
    if up {
        *map.entry(key).or_default() += 1;
    } else if let Some(n) = map.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            map.remove(&key);
        }
    }
}

impl NextHops {
    /// A route with this target was added.
    pub(super) fn add(&mut self, t: &api::RouteTarget) {
        self.count(t, true);
    }

    /// A route with this target was removed (or replaced).
    pub(super) fn remove(&mut self, t: &api::RouteTarget) {
        self.count(t, false);
    }

    fn count(&mut self, t: &api::RouteTarget, up: bool) {
        match t {
            api::RouteTarget::Encap { remote, .. } => bump(&mut self.remotes, *remote, up),
            api::RouteTarget::Gateway {
                via: IpAddr::V4(via),
                port,
            } => bump(&mut self.gateways, (port.clone(), *via), up),
            _ => {}
        }
    }

    /// The (port, address) pairs whose MAC the workers need: each tunnel
    /// remote on the node's subnet, or the underlay gateway for those
    /// beyond it, on `uplink`; each gateway on an uplink port.
    pub(super) fn needed(
        &self,
        uplink: Option<&str>,
        is_uplink: impl Fn(&str) -> bool,
        cfg: &PipelineConfig,
    ) -> BTreeSet<(String, Ipv4Addr)> {
        let mut out = BTreeSet::new();
        if let Some(uplink) = uplink {
            for &remote in self.remotes.keys() {
                let hop = if cfg.on_link(remote) {
                    Some(remote)
                } else {
                    cfg.underlay_gateway
                };
                if let Some(hop) = hop {
                    out.insert((uplink.to_owned(), hop));
                }
            }
        }
        for (port, via) in self.gateways.keys() {
            if is_uplink(port) {
                out.insert((port.clone(), *via));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encap(remote: &str) -> api::RouteTarget {
        api::RouteTarget::Encap {
            encap: api::Encap::Ipip,
            remote: remote.parse().unwrap(),
        }
    }

    #[test]
    fn a_next_hop_is_needed_while_one_route_uses_it() {
        let mut cfg = PipelineConfig::new("192.168.0.1".parse().unwrap(), 24);
        cfg.underlay_gateway = Some("192.168.0.254".parse().unwrap());
        let mut hops = NextHops::default();
        hops.add(&encap("192.168.0.2"));
        hops.add(&encap("192.168.0.2"));
        hops.add(&encap("10.9.0.2"));
        hops.add(&api::RouteTarget::Gateway {
            via: "192.168.0.9".parse().unwrap(),
            port: "eth0".into(),
        });
        hops.add(&api::RouteTarget::Gateway {
            via: "10.1.1.1".parse().unwrap(),
            port: "pod1".into(),
        });
        let needed = hops.needed(Some("eth0"), |p| p == "eth0", &cfg);
        let want: BTreeSet<(String, Ipv4Addr)> = [
            ("eth0".to_owned(), "192.168.0.2".parse().unwrap()),
            ("eth0".to_owned(), "192.168.0.254".parse().unwrap()),
            ("eth0".to_owned(), "192.168.0.9".parse().unwrap()),
        ]
        .into();
        assert_eq!(needed, want);
        hops.remove(&encap("192.168.0.2"));
        assert!(
            hops.needed(Some("eth0"), |p| p == "eth0", &cfg)
                .contains(&("eth0".to_owned(), "192.168.0.2".parse().unwrap())),
            "one route left"
        );
        hops.remove(&encap("192.168.0.2"));
        hops.remove(&encap("10.9.0.2"));
        assert_eq!(hops.needed(Some("eth0"), |p| p == "eth0", &cfg).len(), 1);
        assert!(hops.needed(None, |_| false, &cfg).is_empty());
    }
}
