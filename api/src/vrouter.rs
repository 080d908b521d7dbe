//! How the node daemon programs the vrouter, over `/run/brindle/vrouter.sock`
//! ([`crate::VROUTER_SOCKET`], mode 0600).
//!
//! Framing is [`crate::framing`]: one [`VrouterRequest`] per line, answered by
//! one [`crate::framing::Reply`] line whose `result` is the type named on each
//! request. Requests are tagged by `op`:
//!
//! ```json
//! {"op":"add_routes","routes":[{"prefix":"10.244.1.0/26","target":{"kind":"encap","encap":"ipip","remote":"192.168.0.12"}}]}
//! {"status":"ok","result":{"changed":1}}
//! ```
//!
//! Every operation is idempotent: adding what exists (with the same value)
//! or removing what does not is success. A controller that restarts, or that
//! sees a new [`Hello::boot_id`] (the vrouter restarted), resyncs by sending
//! [`VrouterRequest::Sync`] with its whole desired state; the vrouter then
//! converges to exactly that state (removing what is not in it) without
//! stopping its workers.
//!
//! Ports and routes name ports by interface name, never by the vrouter's
//! internal indices, so the controller needs no knowledge of them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::POD_GATEWAY_MAC;
/// A pod's identity in network policy (namespace and name).
pub use brindle_policy::program::EndpointKey as PolicyEndpoint;
/// The network policy wire format carried by [`VrouterRequest::ApplyPolicy`]
/// and [`DesiredState::policy`].
pub use brindle_policy::program::Update as PolicyUpdate;

/// A MAC address, written `aa:bb:cc:dd:ee:ff` in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or_else(|| format!("bad MAC {s:?}"))?;
            if p.len() != 2 {
                return Err(format!("bad MAC {s:?}"));
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC {s:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("bad MAC {s:?}"));
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which encapsulation reaches a remote node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encap {
    /// IPv4 in IPv4 (IP protocol 4).
    Ipip,
    /// VXLAN with the node's VNI and UDP port ([`VxlanConfig`]).
    Vxlan,
}

/// Where packets for a prefix go.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RouteTarget {
    /// A pod on this node, behind the named port.
    Local {
        /// The port's interface name (the pod veth's host end).
        port: String,
    },
    /// A remote node's block: encapsulate to the node's underlay address.
    Encap {
        /// The encapsulation.
        encap: Encap,
        /// The remote node's underlay address (outer destination).
        remote: Ipv4Addr,
    },
    /// Route natively via a gateway on the named port (usually the uplink):
    /// encapsulation mode `none`, or cross-subnet with the peer on our subnet.
    Gateway {
        /// The next hop's address.
        via: IpAddr,
        /// The port the next hop is reached on.
        port: String,
    },
    /// Drop.
    Blackhole,
    /// Hand to the node's kernel.
    Host,
}

/// One route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    /// The destination prefix.
    pub prefix: IpNet,
    /// Where it goes.
    pub target: RouteTarget,
}

/// What a port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortKind {
    /// The host end of a pod's veth: proxy ARP/NDP, anti-spoofing.
    Pod,
    /// The node's underlay interface: encapsulated and native traffic.
    Uplink,
    /// A port to the node's kernel: the next hop of `host` routes.
    Host,
    /// A port of the plain appliance mode (`brindle-vrouter run --port IF`):
    /// the uplink's forwarding, but every frame it receives goes to the
    /// vrouter (ARP replies too, so it resolves its neighbours itself).
    Appliance,
}

/// The device behind a port, and how the vrouter moves its frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PortDevice {
    /// An interface in the vrouter's network namespace named like the port,
    /// taken with AF_XDP (AF_PACKET as the fallback): the uplink, veth pods.
    #[default]
    Xdp,
    /// A persistent multi-queue TAP with a virtio-net header
    /// (`IFF_TAP|IFF_NO_PI|IFF_VNET_HDR|IFF_MULTI_QUEUE`), attached by name in
    /// a network namespace, one queue per worker: frames move as
    /// super-packets by read/write. A TAP pod's `eth0`, or the host port.
    Tap {
        /// The network namespace it lives in (a path such as the pod's
        /// `CNI_NETNS`); `None`: the vrouter's own (the host port).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<String>,
        /// Its name in that namespace (a pod's `CNI_IFNAME`).
        ifname: String,
        /// How many queues it was made with (at least the vrouter's workers).
        queues: u16,
    },
}

impl PortDevice {
    /// Whether this is the default, an AF_XDP interface.
    pub fn is_xdp(&self) -> bool {
        matches!(self, PortDevice::Xdp)
    }
}

/// A port to attach (or that is attached).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    /// The port's name, unique in the vrouter: for AF_XDP ports the
    /// interface's name in the vrouter's network namespace; for TAP pods a
    /// name ctrl gives (the interface itself is in `device`).
    pub name: String,
    /// Pod or uplink.
    pub kind: PortKind,
    /// For pod ports: the only source addresses accepted from the pod
    /// (anti-spoofing). Ignored for the uplink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
    /// The peer's MAC, when known: for pod ports the pod interface's (saves
    /// an ARP); for other kinds the MAC of the host behind the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_mac: Option<Mac>,
    /// Which endpoint this port belongs to (the CNI handle), for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The device and how frames move (default: AF_XDP on the interface
    /// named `name`).
    #[serde(default, skip_serializing_if = "PortDevice::is_xdp")]
    pub device: PortDevice,
    /// For pod ports: the pod's policy identity (K8S_POD_NAMESPACE and
    /// K8S_POD_NAME), the key of its program in [`VrouterRequest::ApplyPolicy`]
    /// updates. `None`: the port is never policed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<PolicyEndpoint>,
}

/// VXLAN settings (Calico's defaults: VNI 4096, UDP 4789).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanConfig {
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The UDP destination port.
    pub port: u16,
    /// Compute the outer UDP checksum (false: zero, as RFC 7348 allows).
    #[serde(default)]
    pub udp_checksum: bool,
}

impl Default for VxlanConfig {
    fn default() -> Self {
        VxlanConfig {
            vni: 4096,
            port: 4789,
            udp_checksum: false,
        }
    }
}

/// The node's own identity on the underlay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeConfig {
    /// The node's underlay IPv4 address (outer source of encapsulated
    /// packets, source of ICMP errors).
    pub address_v4: Option<Ipv4Addr>,
    /// The node's IPv6 address, if any.
    #[serde(default)]
    pub address_v6: Option<Ipv6Addr>,
    /// The underlay subnet, for cross-subnet decisions.
    #[serde(default)]
    pub underlay_subnet: Option<IpNet>,
    /// The underlay router that reaches node addresses outside
    /// `underlay_subnet` (the uplink's default gateway): the next hop of
    /// tunnels to such nodes. `None`: every node is taken as on-link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_gateway: Option<Ipv4Addr>,
    /// VXLAN settings.
    #[serde(default)]
    pub vxlan: VxlanConfig,
    /// Accept IPIP/VXLAN only from these node addresses (the other live
    /// nodes, sent in every encapsulation mode). Empty: from nobody.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tunnel_peers: Vec<Ipv4Addr>,
}

/// An underlay neighbour (IP → MAC on a port).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Neighbor {
    /// The port it is on.
    pub port: String,
    /// Its address.
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: Mac,
}

/// The whole desired state, for [`VrouterRequest::Sync`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Node identity; `None` leaves it as it is.
    #[serde(default)]
    pub node: Option<NodeConfig>,
    /// Every port.
    #[serde(default)]
    pub ports: Vec<PortSpec>,
    /// Every route.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Every static neighbour.
    #[serde(default)]
    pub neighbors: Vec<Neighbor>,
    /// The whole network policy state
    /// (`brindle_policy::compile::Compiler::snapshot()`); `None` leaves the
    /// policy as it is (a controller without policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyUpdate>,
}

/// A request to the vrouter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum VrouterRequest {
    /// First message of a connection. Result: [`Hello`].
    Hello {
        /// The client's [`crate::framing::PROTOCOL_VERSION`].
        version: u32,
    },
    /// Set the node's identity and encapsulation. Result: [`Changed`].
    SetNode {
        /// The settings.
        node: NodeConfig,
    },
    /// Attach ports (idempotent by name). Result: [`Changed`].
    AddPorts {
        /// The ports.
        ports: Vec<PortSpec>,
    },
    /// Detach ports by name (missing is fine). Result: [`Changed`].
    RemovePorts {
        /// Interface names.
        names: Vec<String>,
    },
    /// Add or replace routes, as one batch. Result: [`Changed`].
    AddRoutes {
        /// The routes.
        routes: Vec<Route>,
    },
    /// Remove routes by exact prefix (missing is fine). Result: [`Changed`].
    RemoveRoutes {
        /// The prefixes.
        prefixes: Vec<IpNet>,
    },
    /// Add or replace static neighbours. Result: [`Changed`].
    SetNeighbors {
        /// The neighbours.
        neighbors: Vec<Neighbor>,
    },
    /// Converge to exactly this state. Result: [`Changed`].
    Sync {
        /// The whole desired state.
        state: DesiredState,
    },
    /// Apply one network policy step (sets, per-endpoint programs, touched
    /// endpoints), all or nothing: a generation not newer than the
    /// vrouter's, a program reading a missing set or a removal of a set
    /// still read is refused (the controller then resyncs with `Sync`, whose
    /// `policy` is the compiler's snapshot). Result: [`Changed`] (1 when
    /// applied, 0 when empty).
    ApplyPolicy {
        /// The compiler's output (`brindle_policy::compile::Compiler::apply`).
        update: PolicyUpdate,
    },
    /// Counters. Result: [`Stats`].
    GetStats,
    /// Network policy counters per policy and rule, summed over the
    /// workers. Result: `Vec<PolicyRuleStats>`.
    PolicyStats,
    /// Every route. Result: `Vec<Route>`.
    DumpRoutes,
    /// Every port with its counters. Result: `Vec<PortStatus>`.
    DumpPorts,
    /// Liveness and readiness. Result: [`Health`].
    Health,
}

/// Answer to [`VrouterRequest::Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The vrouter's protocol version.
    pub version: u32,
    /// Changes every time the vrouter starts: a controller that sees a new
    /// one resyncs.
    pub boot_id: String,
}

/// Answer to a change: how many items actually changed (0 when the request
/// was already in effect).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    /// Items added, replaced or removed.
    pub changed: u64,
}

/// Packet and byte counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames transmitted.
    pub tx_packets: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
}

/// A port and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStatus {
    /// What was asked for.
    pub spec: PortSpec,
    /// `af_xdp`, `af_packet` or `memory`.
    pub backend: String,
    /// The worker that owns it.
    pub worker: u32,
    /// Its counters.
    pub counters: PortCounters,
}

/// Counters of one worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// The worker's index.
    pub worker: u32,
    /// The core it is pinned to, if any.
    pub core: Option<u32>,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames transmitted.
    pub tx_packets: u64,
    /// Drops by reason (`parse_error`, `spoofed`, `no_route`, `ttl`,
    /// `no_neighbor`, `mtu`, ...).
    pub drops: BTreeMap<String, u64>,
    /// Poll loops that found work.
    pub busy_polls: u64,
    /// Poll loops that found none.
    pub idle_polls: u64,
}

/// Answer to [`VrouterRequest::GetStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Per worker.
    pub workers: Vec<WorkerStats>,
    /// Routes in the FIB.
    pub routes: u64,
    /// Ports attached.
    pub ports: u64,
    /// Network policy snapshots (a `Sync`'s `policy`) refused since start:
    /// the Sync went on, the policy in force stayed.
    #[serde(default)]
    pub policy_snapshots_refused: u64,
}

/// One rule's counters (answer to [`VrouterRequest::PolicyStats`]):
/// packets it denied, and allowed flows it classified (their first packet;
/// a flow revalidated under a newer policy counts again).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRuleStats {
    /// The tier (empty for `no-policy` and `profile`).
    pub tier: String,
    /// The policy (`ns/knp.default.name` for a Kubernetes policy); empty
    /// when no policy's rule decided.
    pub policy: String,
    /// The rule's index in the policy's ingress or egress rules, or
    /// `end-of-tier` (the tier's default deny), `no-policy` (no policy
    /// selects the pod in that direction: allowed), `profile` (every tier
    /// passed: allowed).
    pub rule: String,
    /// `ingress` or `egress` (of the pod whose program decided).
    pub direction: String,
    /// `allow` or `deny`.
    pub action: String,
    /// Packets.
    pub packets: u64,
    /// Bytes (IP header to the end).
    pub bytes: u64,
}

/// Answer to [`VrouterRequest::Health`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Every worker is polling.
    pub live: bool,
    /// The uplink is attached and the node is configured.
    pub ready: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_device_is_omitted_when_xdp_and_tagged_when_tap() {
        let mut port = PortSpec {
            name: "brt1a2b3c".into(),
            kind: PortKind::Pod,
            addresses: vec!["10.65.0.7".parse().unwrap()],
            peer_mac: None,
            endpoint: None,
            device: PortDevice::Xdp,
            workload: None,
        };
        let json = serde_json::to_value(&port).unwrap();
        assert!(json.get("device").is_none(), "{json}");
        port.device = PortDevice::Tap {
            netns: Some("/var/run/netns/pod1".into()),
            ifname: "eth0".into(),
            queues: 2,
        };
        let json = serde_json::to_value(&port).unwrap();
        assert_eq!(
            json["device"],
            serde_json::json!({"type": "tap", "netns": "/var/run/netns/pod1", "ifname": "eth0", "queues": 2})
        );
        assert_eq!(serde_json::from_value::<PortSpec>(json).unwrap(), port);
        let host: PortDevice =
            serde_json::from_str(r#"{"type":"tap","ifname":"brindle0","queues":1}"#).unwrap();
        assert_eq!(
            host,
            PortDevice::Tap {
                netns: None,
                ifname: "brindle0".into(),
                queues: 1
            }
        );
    }

    #[test]
    fn requests_are_tagged_by_op_and_name_ports_by_interface() {
        let r = VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: "10.244.1.0/26".parse().unwrap(),
                target: RouteTarget::Encap {
                    encap: Encap::Ipip,
                    remote: Ipv4Addr::new(192, 168, 0, 12),
                },
            }],
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"op":"add_routes","routes":[{"prefix":"10.244.1.0/26","target":{"kind":"encap","encap":"ipip","remote":"192.168.0.12"}}]}"#
        );
        let back: VrouterRequest = serde_json::from_str(
            r#"{"op":"add_ports","ports":[{"name":"bri0123456789a","kind":"pod","addresses":["10.244.0.5"],"peer_mac":"0a:58:0a:f4:00:05"}]}"#,
        )
        .unwrap();
        let VrouterRequest::AddPorts { ports } = back else {
            panic!("wrong op")
        };
        assert_eq!(ports[0].peer_mac, Some(Mac([0x0a, 0x58, 0x0a, 0xf4, 0, 5])));
        assert_eq!(ports[0].kind, PortKind::Pod);
    }

    #[test]
    fn policy_travels_as_apply_policy_and_in_sync_only_when_set() {
        let json = serde_json::to_value(DesiredState::default()).unwrap();
        assert!(json.get("policy").is_none(), "{json}");
        let update = PolicyUpdate {
            generation: 3,
            ..PolicyUpdate::default()
        };
        let req = VrouterRequest::ApplyPolicy {
            update: update.clone(),
        };
        let json = serde_json::to_string(&req).unwrap();
        assert!(
            json.starts_with(r#"{"op":"apply_policy","update":{"generation":3"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<VrouterRequest>(&json).unwrap(), req);
        let state = DesiredState {
            policy: Some(update),
            ..DesiredState::default()
        };
        let json = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<DesiredState>(&json).unwrap(), state);
    }

    #[test]
    fn policy_sets_with_ipv6_ranges_and_named_ports_survive_the_tagged_request() {
        // The request is an internally tagged enum: serde buffers it and has
        // no 128-bit integers, so the sets' u128 addresses travel as strings.
        use brindle_policy::ipset::{IpSet, PortSet, SetContent};
        use brindle_policy::program::{SetId, SetUpdate};
        let update = PolicyUpdate {
            generation: 2,
            sets: vec![
                SetUpdate {
                    id: SetId(1),
                    content: Some(SetContent::Ports(PortSet::new([(
                        "10.65.0.7".parse().unwrap(),
                        6,
                        81,
                    )]))),
                },
                SetUpdate {
                    id: SetId(2),
                    content: Some(SetContent::Ips(IpSet::from_nets(&[
                        "fd00::/64".parse().unwrap(),
                        "10.0.0.0/8".parse().unwrap(),
                    ]))),
                },
            ],
            ..PolicyUpdate::default()
        };
        let req = VrouterRequest::ApplyPolicy { update };
        let json = serde_json::to_string(&req).unwrap();
        assert!(json.contains(r#"["::ffff:10.65.0.7",6,81]"#), "{json}");
        assert_eq!(serde_json::from_str::<VrouterRequest>(&json).unwrap(), req);
        let state = DesiredState {
            policy: Some(match req {
                VrouterRequest::ApplyPolicy { update } => update,
                _ => unreachable!(),
            }),
            ..DesiredState::default()
        };
        let sync = VrouterRequest::Sync { state };
        let json = serde_json::to_string(&sync).unwrap();
        assert_eq!(serde_json::from_str::<VrouterRequest>(&json).unwrap(), sync);
    }

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(
            "ee:ee:ee:ee:ee:ee".parse::<Mac>().unwrap(),
            Mac(POD_GATEWAY_MAC)
        );
        for bad in [
            "",
            "ee:ee",
            "ee:ee:ee:ee:ee:ee:ee",
            "eee:e:ee:ee:ee:ee",
            "zz:ee:ee:ee:ee:ee",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad:?} accepted");
        }
    }
}
