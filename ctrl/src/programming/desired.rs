//! The desired vrouter state and the requests that express endpoint changes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use brindle_api::endpoint::{Endpoint, PodInterface};
use brindle_api::vrouter::{
    DesiredState, Mac, Neighbor, NodeConfig, PolicyUpdate, PortDevice, PortKind, PortSpec, Route,
    RouteTarget, VrouterRequest,
};
use brindle_policy::ipset::SetContent;
use brindle_policy::program::{EndpointKey, Program, ProgramUpdate, SetId, SetUpdate};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// What the vrouter should hold, kept by the executor whatever the vrouter's
/// reachability, so a resync can replay it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Node identity and encapsulation.
    pub node: Option<NodeConfig>,
    /// Ports by interface name.
    pub ports: BTreeMap<String, PortSpec>,
    /// Routes by prefix.
    pub routes: BTreeMap<IpNet, RouteTarget>,
    /// Static neighbours by (port, ip).
    pub neighbors: BTreeMap<(String, IpAddr), Neighbor>,
    /// The network policy the vrouter holds: every `ApplyPolicy` merged.
    pub policy: PolicyState,
}

/// The merge of every policy update sent: what a resync sends as
/// `DesiredState::policy` (the compiler's snapshot, rebuilt from the
/// updates so the executor needs no access to the compiler).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyState {
    /// The last update's generation (0: no policy ever sent).
    pub generation: u64,
    /// Live sets by id.
    pub sets: BTreeMap<SetId, SetContent>,
    /// Local endpoints' programs.
    pub programs: BTreeMap<EndpointKey, Program>,
}

impl PolicyState {
    fn merge(&mut self, update: &PolicyUpdate) {
        if update.is_empty() {
            return;
        }
        self.generation = update.generation;
        for s in &update.sets {
            match &s.content {
                Some(c) => self.sets.insert(s.id, c.clone()),
                None => self.sets.remove(&s.id),
            };
        }
        for p in &update.programs {
            match &p.program {
                Some(prog) => self.programs.insert(p.endpoint.clone(), prog.clone()),
                None => self.programs.remove(&p.endpoint),
            };
        }
    }

    /// The whole state as one update (`None` before any policy).
    pub fn to_update(&self) -> Option<PolicyUpdate> {
        (self.generation > 0).then(|| PolicyUpdate {
            generation: self.generation,
            sets: self
                .sets
                .iter()
                .map(|(id, c)| SetUpdate {
                    id: *id,
                    content: Some(c.clone()),
                })
                .collect(),
            programs: self
                .programs
                .iter()
                .map(|(k, p)| ProgramUpdate {
                    endpoint: k.clone(),
                    program: Some(p.clone()),
                })
                .collect(),
            touched: Vec::new(),
        })
    }
}

impl Desired {
    /// Records the effect of `req` (queries change nothing).
    pub fn apply(&mut self, req: &VrouterRequest) {
        match req {
            VrouterRequest::SetNode { node } => self.node = Some(node.clone()),
            VrouterRequest::AddPorts { ports } => {
                for p in ports {
                    self.ports.insert(p.name.clone(), p.clone());
                }
            }
            VrouterRequest::RemovePorts { names } => {
                for n in names {
                    self.ports.remove(n);
                }
            }
            VrouterRequest::AddRoutes { routes } => {
                for r in routes {
                    self.routes.insert(r.prefix, r.target.clone());
                }
            }
            VrouterRequest::RemoveRoutes { prefixes } => {
                for p in prefixes {
                    self.routes.remove(p);
                }
            }
            VrouterRequest::SetNeighbors { neighbors } => {
                for n in neighbors {
                    self.neighbors.insert((n.port.clone(), n.ip), n.clone());
                }
            }
            VrouterRequest::ApplyPolicy { update } => self.policy.merge(update),
            VrouterRequest::Sync { state } => {
                let policy = std::mem::take(&mut self.policy);
                *self = Desired::default();
                self.policy = match &state.policy {
                    Some(p) => {
                        let mut fresh = PolicyState::default();
                        fresh.merge(p);
                        fresh
                    }
                    None => policy,
                };
                self.node = state.node.clone();
                self.apply(&VrouterRequest::AddPorts {
                    ports: state.ports.clone(),
                });
                self.apply(&VrouterRequest::AddRoutes {
                    routes: state.routes.clone(),
                });
                self.apply(&VrouterRequest::SetNeighbors {
                    neighbors: state.neighbors.clone(),
                });
            }
            VrouterRequest::Hello { .. }
            | VrouterRequest::GetStats
            | VrouterRequest::PolicyStats
            | VrouterRequest::DumpRoutes
            | VrouterRequest::DumpPorts
            | VrouterRequest::Health => {}
        }
    }

    /// The whole state for `Sync`, in a stable order.
    pub fn to_sync(&self) -> DesiredState {
        DesiredState {
            node: self.node.clone(),
            ports: self.ports.values().cloned().collect(),
            routes: self
                .routes
                .iter()
                .map(|(prefix, target)| Route {
                    prefix: *prefix,
                    target: target.clone(),
                })
                .collect(),
            neighbors: self.neighbors.values().cloned().collect(),
            policy: self.policy.to_update(),
        }
    }
}

/// A pod address as the host prefix the vrouter routes (/32 or /128).
fn host_prefix(net: &IpNet) -> IpNet {
    IpNet::from(net.addr())
}

/// Prefix of the vrouter port names ctrl gives TAP pods.
pub const TAP_PORT_PREFIX: &str = "tap";

/// The vrouter port name of a TAP pod: `tap` + 11 hex digits of SHA-256 of
/// the attachment handle (the CNI plugin's host veth names have the same
/// shape with `bri`). Not a kernel interface (the TAP is in the pod's netns
/// as `CNI_IFNAME`): a name unique among the vrouter's ports that ctrl
/// derives again after a restart, so a resync names the same port.
pub fn tap_port_name(handle: &str) -> String {
    let digest = Sha256::digest(handle.as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{TAP_PORT_PREFIX}{}", &hex[..11])
}

/// The vrouter port of `ep` and its device: the host veth (AF_XDP) for a
/// veth pod, [`tap_port_name`] and the pod's TAP by netns and name for a
/// TAP pod. Errors name the field that cannot be programmed.
pub fn pod_port(ep: &Endpoint) -> Result<(String, PortDevice), String> {
    let ifname_ok = |n: &str| !n.is_empty() && n.len() <= 15 && !n.contains('/');
    match &ep.interface {
        PodInterface::Veth => {
            if !ifname_ok(&ep.host_ifname) {
                return Err(format!(
                    "host_ifname {:?}: must be an interface name of 1-15 bytes",
                    ep.host_ifname
                ));
            }
            Ok((ep.host_ifname.clone(), PortDevice::Xdp))
        }
        PodInterface::Tap {
            netns,
            ifname,
            queues,
        } => {
            if netns.is_empty() {
                return Err("interface tap: netns is empty".into());
            }
            if !ifname_ok(ifname) {
                return Err(format!(
                    "interface tap: ifname {ifname:?} must be an interface name of 1-15 bytes"
                ));
            }
            if *queues == 0 {
                return Err("interface tap: queues must be at least 1".into());
            }
            Ok((
                tap_port_name(&ep.key.handle()),
                PortDevice::Tap {
                    netns: Some(netns.clone()),
                    ifname: ifname.clone(),
                    queues: *queues,
                },
            ))
        }
    }
}

/// The requests that attach `ep`: a pod port (its host veth, or its TAP)
/// that accepts only the pod's addresses, then a Local host route per
/// address. Ports before routes, so a route never names a missing port.
pub fn endpoint_added(ep: &Endpoint) -> Result<Vec<VrouterRequest>, String> {
    let (name, device) = pod_port(ep)?;
    if ep.ips.is_empty() {
        return Err("endpoint has no addresses".into());
    }
    let peer_mac = if ep.pod_mac.is_empty() {
        None
    } else {
        Some(ep.pod_mac.parse::<Mac>()?)
    };
    Ok(vec![
        VrouterRequest::AddPorts {
            ports: vec![PortSpec {
                name: name.clone(),
                kind: PortKind::Pod,
                addresses: ep.ips.iter().map(|n| n.addr()).collect(),
                peer_mac,
                endpoint: Some(ep.key.handle()),
                device,
                // Network policy's key of the pod (K8S_POD_NAMESPACE/NAME).
                workload: (!ep.pod.name.is_empty())
                    .then(|| EndpointKey::new(ep.pod.namespace.clone(), ep.pod.name.clone())),
            }],
        },
        VrouterRequest::AddRoutes {
            routes: ep
                .ips
                .iter()
                .map(|n| Route {
                    prefix: host_prefix(n),
                    target: RouteTarget::Local { port: name.clone() },
                })
                .collect(),
        },
    ])
}

/// The requests that detach `ep`: routes first, then the port.
pub fn endpoint_removed(ep: &Endpoint) -> Vec<VrouterRequest> {
    let name = match &ep.interface {
        PodInterface::Veth => ep.host_ifname.clone(),
        PodInterface::Tap { .. } => tap_port_name(&ep.key.handle()),
    };
    vec![
        VrouterRequest::RemoveRoutes {
            prefixes: ep.ips.iter().map(host_prefix).collect(),
        },
        VrouterRequest::RemovePorts { names: vec![name] },
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use brindle_api::endpoint::{EndpointKey, PodRef};

    use super::*;

    pub(crate) fn endpoint(container: &str, ifname: &str, ip: &str) -> Endpoint {
        Endpoint {
            key: EndpointKey {
                network: "k8s-pod-network".into(),
                container_id: container.into(),
                ifname: "eth0".into(),
            },
            pod: PodRef::default(),
            netns: "/var/run/netns/x".into(),
            host_ifname: ifname.into(),
            host_ifindex: 7,
            host_mac: "ee:ee:ee:ee:ee:ee".into(),
            pod_mac: "02:00:00:00:00:01".into(),
            ips: vec![ip.parse().unwrap()],
            gateways: vec!["169.254.1.1".parse().unwrap()],
            mtu: 1480,
            interface: Default::default(),
        }
    }

    /// A TAP pod: no host veth, the TAP `eth0` in the pod's netns.
    pub(crate) fn tap_endpoint(container: &str, ip: &str) -> Endpoint {
        let mut ep = endpoint(container, "", ip);
        ep.interface = PodInterface::Tap {
            netns: format!("/var/run/netns/{container}"),
            ifname: "eth0".into(),
            queues: 2,
        };
        ep
    }

    #[test]
    fn a_tap_port_name_is_tap_and_eleven_hex_digits_of_the_handle() {
        // The same value from another SHA-256: `printf %s k8s-pod-network/c1/eth0 | sha256sum`.
        assert_eq!(tap_port_name("k8s-pod-network/c1/eth0"), "tap966edce24ef");
        let name = tap_port_name("k8s-pod-network/c2/eth0");
        assert_eq!(name.len(), 14);
        assert_ne!(name, tap_port_name("k8s-pod-network/c1/eth0"));
    }

    #[test]
    fn a_tap_endpoint_gets_a_tap_port_in_its_netns_and_local_routes_on_it() {
        let ep = tap_endpoint("c1", "10.244.0.5/32");
        let name = tap_port_name("k8s-pod-network/c1/eth0");
        assert_eq!(
            endpoint_added(&ep).unwrap(),
            vec![
                VrouterRequest::AddPorts {
                    ports: vec![PortSpec {
                        name: name.clone(),
                        kind: PortKind::Pod,
                        addresses: vec!["10.244.0.5".parse().unwrap()],
                        peer_mac: Some(Mac([2, 0, 0, 0, 0, 1])),
                        endpoint: Some("k8s-pod-network/c1/eth0".into()),
                        device: PortDevice::Tap {
                            netns: Some("/var/run/netns/c1".into()),
                            ifname: "eth0".into(),
                            queues: 2,
                        },
                        workload: None,
                    }],
                },
                VrouterRequest::AddRoutes {
                    routes: vec![Route {
                        prefix: "10.244.0.5/32".parse().unwrap(),
                        target: RouteTarget::Local { port: name.clone() },
                    }],
                },
            ]
        );
        assert_eq!(
            endpoint_removed(&ep),
            vec![
                VrouterRequest::RemoveRoutes {
                    prefixes: vec!["10.244.0.5/32".parse().unwrap()]
                },
                VrouterRequest::RemovePorts { names: vec![name] },
            ]
        );
    }

    #[test]
    fn a_tap_endpoint_without_netns_name_or_queues_is_refused() {
        let good = tap_endpoint("c1", "10.244.0.5/32");
        let with = |f: &dyn Fn(&mut String, &mut String, &mut u16)| {
            let mut ep = good.clone();
            if let PodInterface::Tap {
                netns,
                ifname,
                queues,
            } = &mut ep.interface
            {
                f(netns, ifname, queues);
            }
            endpoint_added(&ep).unwrap_err()
        };
        assert!(with(&|n, _, _| n.clear()).contains("netns"));
        assert!(with(&|_, i, _| *i = "eth0123456789abc".into()).contains("ifname"));
        assert!(with(&|_, i, _| i.clear()).contains("ifname"));
        assert!(with(&|_, _, q| *q = 0).contains("queues"));
    }

    #[test]
    fn a_bad_endpoint_is_refused_before_anything_is_programmed() {
        let mut ep = endpoint("c1", "bri0123456789abcdef", "10.244.0.5/32");
        assert!(endpoint_added(&ep).unwrap_err().contains("host_ifname"));
        ep.host_ifname = "bri1".into();
        ep.pod_mac = "nope".into();
        assert!(endpoint_added(&ep).is_err());
        ep.pod_mac = String::new();
        ep.ips.clear();
        assert_eq!(
            endpoint_added(&ep).unwrap_err(),
            "endpoint has no addresses"
        );
    }

    #[test]
    fn sync_replaces_everything_and_round_trips() {
        let mut d = Desired::default();
        for r in endpoint_added(&endpoint("c1", "bri1", "10.244.0.5/32")).unwrap() {
            d.apply(&r);
        }
        let mut other = Desired::default();
        other.apply(&VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: "10.9.0.0/24".parse().unwrap(),
                target: RouteTarget::Blackhole,
            }],
        });
        other.apply(&VrouterRequest::Sync { state: d.to_sync() });
        assert_eq!(other, d);
    }
}

#[cfg(test)]
mod policy_tests {
    use brindle_policy::compile::{Change, Compiler, EndpointInfo};
    use brindle_policy::resource::{Kind, ResourceKey, parse_documents};

    use super::*;

    fn ep(name: &str, addr: &str) -> Change {
        Change::Endpoint(
            EndpointKey {
                namespace: "default".into(),
                name: name.into(),
            },
            Some(EndpointInfo {
                addrs: vec![addr.parse().unwrap()],
                local: true,
            }),
        )
    }

    #[test]
    fn the_merged_updates_resync_as_the_compilers_snapshot() {
        let mut compiler = Compiler::new();
        let mut desired = Desired::default();
        assert_eq!(desired.to_sync().policy, None, "no policy: Sync omits it");
        let docs = parse_documents(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web}\n\
             spec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {app: client}}\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {app: web}}\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata: {name: b, labels: {app: client}}\n",
        )
        .unwrap();
        let mut changes: Vec<Change> = docs.into_iter().map(Change::Apply).collect();
        changes.extend([ep("a", "10.65.0.2"), ep("b", "10.65.0.3")]);
        let mut send = |changes: Vec<Change>, desired: &mut Desired| {
            let update = compiler.apply(changes);
            desired.apply(&VrouterRequest::ApplyPolicy { update });
            compiler.snapshot()
        };
        let snap = send(changes, &mut desired);
        assert_eq!(desired.to_sync().policy, Some(snap));
        // The client relabelled away: its set shrinks; then the policy goes.
        let relabel = parse_documents("apiVersion: v1\nkind: Pod\nmetadata: {name: b}\n").unwrap();
        let snap = send(
            relabel.into_iter().map(Change::Apply).collect(),
            &mut desired,
        );
        assert_eq!(desired.to_sync().policy, Some(snap));
        let gone = Change::Delete(ResourceKey {
            kind: Kind::KubernetesNetworkPolicy,
            namespace: Some("default".into()),
            name: "web".into(),
        });
        let snap = send(vec![gone], &mut desired);
        let synced = desired.to_sync().policy.unwrap();
        assert_eq!(synced, snap);
        assert!(synced.sets.is_empty(), "no set outlives its last reader");
        // A Sync carrying a policy replaces the merge; one without keeps it.
        let mut other = Desired::default();
        other.apply(&VrouterRequest::Sync {
            state: desired.to_sync(),
        });
        assert_eq!(other.policy, desired.policy);
        other.apply(&VrouterRequest::Sync {
            state: DesiredState::default(),
        });
        assert_eq!(other.policy, desired.policy);
    }
}
