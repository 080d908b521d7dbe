//! The desired vrouter state and the requests that express endpoint changes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use brindle_api::endpoint::Endpoint;
use brindle_api::vrouter::{
    DesiredState, Mac, Neighbor, NodeConfig, PolicyUpdate, PortKind, PortSpec, Route, RouteTarget,
    VrouterRequest,
};
use brindle_policy::ipset::SetContent;
use brindle_policy::program::{EndpointKey, Program, ProgramUpdate, SetId, SetUpdate};
use ipnet::IpNet;

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

/// The requests that attach `ep`: a pod port on its host veth that accepts
/// only the pod's addresses, then a Local host route per address. Ports
/// before routes, so a route never names a missing port.
pub fn endpoint_added(ep: &Endpoint) -> Result<Vec<VrouterRequest>, String> {
    if ep.host_ifname.is_empty() || ep.host_ifname.len() > 15 {
        return Err(format!(
            "host_ifname {:?}: must be an interface name of 1-15 bytes",
            ep.host_ifname
        ));
    }
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
                name: ep.host_ifname.clone(),
                kind: PortKind::Pod,
                addresses: ep.ips.iter().map(|n| n.addr()).collect(),
                peer_mac,
                endpoint: Some(ep.key.handle()),
                device: Default::default(),
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
                    target: RouteTarget::Local {
                        port: ep.host_ifname.clone(),
                    },
                })
                .collect(),
        },
    ])
}

/// The requests that detach `ep`: routes first, then the port.
pub fn endpoint_removed(ep: &Endpoint) -> Vec<VrouterRequest> {
    vec![
        VrouterRequest::RemoveRoutes {
            prefixes: ep.ips.iter().map(host_prefix).collect(),
        },
        VrouterRequest::RemovePorts {
            names: vec![ep.host_ifname.clone()],
        },
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
