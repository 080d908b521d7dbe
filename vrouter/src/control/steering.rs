//! Which routes the steering programs send to the vrouter, and what
//! changes in that set when routes change (pure: the map writes are
//! [`super::Effects`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use brindle_api::vrouter as api;
use ipnet::IpNet;

/// The steering map key of a route, when the route is steered. The steering
/// programs send to the vrouter what is routed to pods, tunnels and natively
/// routed remote blocks (gateway routes). Without the gateway routes a pod's
/// frame to a remote block would go to the node's kernel, which has no pod
/// routes and sends it to its default route. A default route stays out: it
/// would pull every frame of every pod in. IPv6 is not steered.
pub(super) fn steering_key(prefix: &IpNet, target: &api::RouteTarget) -> Option<(Ipv4Addr, u8)> {
    let steered = match target {
        api::RouteTarget::Local { .. } | api::RouteTarget::Encap { .. } => true,
        api::RouteTarget::Gateway { .. } => prefix.prefix_len() > 0,
        api::RouteTarget::Blackhole | api::RouteTarget::Host => false,
    };
    match prefix.trunc() {
        IpNet::V4(n) if steered => Some((n.network(), n.prefix_len())),
        _ => None,
    }
}

/// Steering keys to take out of and put into the map.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SteeringDelta {
    pub(super) remove: Vec<(Ipv4Addr, u8)>,
    pub(super) add: Vec<(Ipv4Addr, u8)>,
}

/// What changes in the steered set when the routes of `touched` (already
/// updated in `routes`) changed: a prefix whose route is gone or no longer
/// of a steered kind leaves, one newly of a steered kind enters.
pub(super) fn steering_delta(
    steered: &BTreeSet<(Ipv4Addr, u8)>,
    routes: &BTreeMap<IpNet, api::RouteTarget>,
    touched: &[IpNet],
) -> SteeringDelta {
    let mut delta = SteeringDelta::default();
    let mut seen = BTreeSet::new();
    for p in touched {
        let p = p.trunc();
        let IpNet::V4(n) = p else {
            continue;
        };
        let key = (n.network(), n.prefix_len());
        if !seen.insert(key) {
            continue;
        }
        let want = routes.get(&p).and_then(|t| steering_key(&p, t)).is_some();
        let have = steered.contains(&key);
        if want && !have {
            delta.add.push(key);
        } else if !want && have {
            delta.remove.push(key);
        }
    }
    delta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn key(s: &str) -> (Ipv4Addr, u8) {
        match net(s) {
            IpNet::V4(n) => (n.network(), n.prefix_len()),
            IpNet::V6(_) => unreachable!("test keys are IPv4"),
        }
    }

    fn local() -> api::RouteTarget {
        api::RouteTarget::Local {
            port: "bri1".into(),
        }
    }

    fn gateway() -> api::RouteTarget {
        api::RouteTarget::Gateway {
            via: "192.168.0.1".parse().unwrap(),
            port: "eth0".into(),
        }
    }

    /// Applies a route change the way `add_routes`/`remove_routes` do and
    /// folds the delta into `steered` as `update_steering` does.
    fn change(
        steered: &mut BTreeSet<(Ipv4Addr, u8)>,
        routes: &mut BTreeMap<IpNet, api::RouteTarget>,
        adds: &[(&str, api::RouteTarget)],
        removes: &[&str],
    ) -> SteeringDelta {
        let mut touched = Vec::new();
        for (p, t) in adds {
            routes.insert(net(p).trunc(), t.clone());
            touched.push(net(p));
        }
        for p in removes {
            routes.remove(&net(p).trunc());
            touched.push(net(p));
        }
        let delta = steering_delta(steered, routes, &touched);
        for k in &delta.remove {
            steered.remove(k);
        }
        for k in &delta.add {
            steered.insert(*k);
        }
        delta
    }

    /// The set a full rebuild over the route map gives: the incremental
    /// updates must always equal it.
    fn rebuilt(routes: &BTreeMap<IpNet, api::RouteTarget>) -> BTreeSet<(Ipv4Addr, u8)> {
        routes
            .iter()
            .filter_map(|(p, t)| steering_key(p, t))
            .collect()
    }

    #[test]
    fn steered_kinds_enter_and_the_others_stay_out() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        let delta = change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", local()),
                (
                    "10.244.1.0/26",
                    api::RouteTarget::Encap {
                        encap: api::Encap::Vxlan,
                        remote: "192.168.0.12".parse().unwrap(),
                    },
                ),
                ("10.245.0.0/24", gateway()),
                ("0.0.0.0/0", gateway()),
                ("10.9.0.0/16", api::RouteTarget::Blackhole),
                ("10.8.0.0/16", api::RouteTarget::Host),
                ("fd00::5/128", local()),
            ],
            &[],
        );
        assert_eq!(
            delta,
            SteeringDelta {
                remove: vec![],
                add: vec![
                    key("10.244.0.5/32"),
                    key("10.244.1.0/26"),
                    key("10.245.0.0/24")
                ],
            }
        );
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn a_replaced_route_moves_in_and_out_of_the_steered_set() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", local())],
            &[],
        );
        // Steered → not steered.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", api::RouteTarget::Blackhole)],
            &[],
        );
        assert_eq!(delta.remove, vec![key("10.244.0.0/24")]);
        assert!(delta.add.is_empty());
        assert!(steered.is_empty());
        // Not steered → steered, written with host bits.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.9/24", gateway())],
            &[],
        );
        assert_eq!(delta.add, vec![key("10.244.0.0/24")]);
        // Steered → steered of another kind: the map is not touched.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", local())],
            &[],
        );
        assert_eq!(delta, SteeringDelta::default());
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn removal_takes_out_only_what_was_steered_and_repeats_change_nothing() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", local()),
                ("10.244.0.6/32", local()),
                ("10.9.0.0/16", api::RouteTarget::Blackhole),
            ],
            &[],
        );
        let delta = change(
            &mut steered,
            &mut routes,
            &[],
            &["10.244.0.5/32", "10.9.0.0/16", "10.1.0.0/16"],
        );
        assert_eq!(delta.remove, vec![key("10.244.0.5/32")]);
        assert_eq!(steered, BTreeSet::from([key("10.244.0.6/32")]));
        // The same request again and an unchanged add: nothing to do.
        let again = change(&mut steered, &mut routes, &[], &["10.244.0.5/32"]);
        assert_eq!(again, SteeringDelta::default());
        let again = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.6/32", local())],
            &[],
        );
        assert_eq!(again, SteeringDelta::default());
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn a_prefix_twice_in_one_request_is_one_map_change() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        let delta = change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", api::RouteTarget::Blackhole),
                ("10.244.0.5/32", local()),
            ],
            &[],
        );
        assert_eq!(delta.add, vec![key("10.244.0.5/32")]);
        assert_eq!(steered, rebuilt(&routes));
    }
}
