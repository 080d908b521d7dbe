//! The static configuration: ports, routes and neighbours as written on the
//! command line (`--port`, `--route`, `--neighbor`) or in a TOML file.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;
use brindle_api::vrouter as api;
use ipnet::{IpNet, Ipv4Net};
use serde::Deserialize;

use brindle_api::vrouter::Mac;

use crate::endpoint::PortKind;
use crate::engine::{EngineConfig, IoMode, Polling};
use crate::pipeline::PipelineConfig;
use crate::port::xdp::XdpPortConfig;

/// Why a spec did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} {text:?}: {why}")]
pub struct SpecError {
    what: &'static str,
    text: String,
    why: &'static str,
}

fn err(what: &'static str, text: &str, why: &'static str) -> SpecError {
    SpecError {
        what,
        text: text.to_owned(),
        why,
    }
}

/// `IF`, `IF=uplink`, `IF=host` or `IF=pod:ADDR[,ADDR...]`.
///
/// A bare `IF` is an appliance port: the uplink kind (no proxy ARP, no
/// anti-spoofing) with a steering program that sends every frame to the
/// vrouter. A pod port's addresses are its anti-spoofing allow-list and
/// each gets a /32 (or /128) route to the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// Interface name.
    pub name: String,
    /// What it connects to.
    pub kind: PortKind,
    /// Whether it was given without a kind (appliance mode: steer all).
    pub appliance: bool,
    /// The pod's addresses.
    pub addrs: Vec<IpAddr>,
}

impl FromStr for PortSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (name, rest) = match s.split_once('=') {
            Some((n, r)) => (n, Some(r)),
            None => (s, None),
        };
        if name.is_empty() || name.len() > 15 || name.contains('/') {
            return Err(err("port", s, "interface names are 1 to 15 bytes"));
        }
        let mut spec = PortSpec {
            name: name.to_owned(),
            kind: PortKind::Uplink,
            appliance: rest.is_none(),
            addrs: Vec::new(),
        };
        match rest {
            None | Some("uplink") => {}
            Some("host") => spec.kind = PortKind::Host,
            Some(r) if r == "pod" || r.starts_with("pod:") => {
                spec.kind = PortKind::Pod;
                if let Some(list) = r.strip_prefix("pod:") {
                    for a in list.split(',') {
                        spec.addrs.push(
                            a.parse()
                                .map_err(|_| err("port", s, "pod addresses are IPs"))?,
                        );
                    }
                }
            }
            Some(_) => return Err(err("port", s, "kind is uplink, host or pod:ADDR,...")),
        }
        Ok(spec)
    }
}

/// Where a route goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteTarget {
    /// Out of a port, to its peer (a pod, or the neighbour given for an
    /// address of the prefix).
    Port(String),
    /// IPIP to a remote node.
    Ipip(Ipv4Addr),
    /// VXLAN to a remote node.
    Vxlan(Ipv4Addr),
    /// Via a gateway on a port.
    Via(IpAddr, String),
    /// Drop.
    Blackhole,
    /// To the node's kernel (through the host port).
    Host,
}

/// `CIDR=port|ipip:REMOTE|vxlan:REMOTE|via:GW@port|blackhole|host`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Destination prefix.
    pub prefix: IpNet,
    /// Next hop.
    pub target: RouteTarget,
}

impl FromStr for RouteSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (cidr, target) = s
            .split_once('=')
            .ok_or_else(|| err("route", s, "expected CIDR=TARGET"))?;
        let prefix: IpNet = cidr
            .parse()
            .map_err(|_| err("route", s, "the prefix is not a CIDR"))?;
        let v4 = |t: &str| -> Result<Ipv4Addr, SpecError> {
            t.parse()
                .map_err(|_| err("route", s, "the remote is not an IPv4 address"))
        };
        let target = if let Some(r) = target.strip_prefix("ipip:") {
            RouteTarget::Ipip(v4(r)?)
        } else if let Some(r) = target.strip_prefix("vxlan:") {
            RouteTarget::Vxlan(v4(r)?)
        } else if let Some(r) = target.strip_prefix("via:") {
            let (gw, port) = r
                .split_once('@')
                .ok_or_else(|| err("route", s, "expected via:GW@PORT"))?;
            RouteTarget::Via(
                gw.parse()
                    .map_err(|_| err("route", s, "the gateway is not an IP"))?,
                port.to_owned(),
            )
        } else if target == "blackhole" {
            RouteTarget::Blackhole
        } else if target == "host" {
            RouteTarget::Host
        } else if target.is_empty() || target.contains(':') {
            return Err(err("route", s, "unknown target"));
        } else {
            RouteTarget::Port(target.to_owned())
        };
        Ok(RouteSpec {
            prefix: prefix.trunc(),
            target,
        })
    }
}

/// `IP=MAC` or `IP=MAC@PORT`: a static neighbour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighSpec {
    /// The neighbour's address.
    pub addr: IpAddr,
    /// Its MAC.
    pub mac: [u8; 6],
    /// The port it is on; `None`: the port a route to the address uses.
    pub port: Option<String>,
}

impl FromStr for NeighSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (ip, rest) = s
            .split_once('=')
            .ok_or_else(|| err("neighbor", s, "expected IP=MAC[@PORT]"))?;
        let (mac, port) = match rest.split_once('@') {
            Some((m, p)) => (m, Some(p.to_owned())),
            None => (rest, None),
        };
        Ok(NeighSpec {
            addr: ip
                .parse()
                .map_err(|_| err("neighbor", s, "not an IP address"))?,
            mac: mac
                .parse::<Mac>()
                .map_err(|_| {
                    err(
                        "neighbor MAC",
                        mac,
                        "not a MAC address (six bytes of exactly two hex digits, as `ip link` prints)",
                    )
                })?
                .0,
            port,
        })
    }
}

/// The worker cores of `run`: one core (`cpu = 1`) or a CPU list
/// (`cpu = "0,1"`, `"0-1"`, `"auto"`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CpuSpec {
    /// One core.
    One(usize),
    /// A CPU list or "auto".
    List(String),
}

impl CpuSpec {
    /// The cores it names.
    pub fn cores(&self) -> anyhow::Result<Vec<usize>> {
        match self {
            CpuSpec::One(c) => Ok(vec![*c]),
            CpuSpec::List(s) => super::config::parse_cores(s),
        }
    }
}

/// The `[vrouter]` section of a TOML config file; the command line adds to
/// (lists) or overrides (scalars) it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Ports, in `--port` syntax.
    #[serde(default)]
    pub ports: Vec<String>,
    /// Routes, in `--route` syntax.
    #[serde(default)]
    pub routes: Vec<String>,
    /// Neighbours, in `--neighbor` syntax.
    #[serde(default)]
    pub neighbors: Vec<String>,
    /// The node's underlay address.
    pub node: Option<Ipv4Addr>,
    /// Prefix length of the underlay subnet.
    pub underlay_prefix_len: Option<u8>,
    /// VXLAN VNI.
    pub vxlan_vni: Option<u32>,
    /// VXLAN UDP port.
    pub vxlan_port: Option<u16>,
    /// Cores of the workers (one worker per core).
    pub cpu: Option<CpuSpec>,
    /// Polling policy.
    pub polling: Option<Polling>,
    /// Socket kind.
    pub io: Option<IoMode>,
    /// UMEM frames.
    pub umem_frames: Option<u32>,
}

/// Flags of `brindle-vrouter run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// A TOML file with the same settings (`ports`, `routes`, `neighbors`,
    /// `node`, `underlay_prefix_len`, `vxlan_vni`, `vxlan_port`, `cpu`,
    /// `polling`, `io`, `umem_frames`); flags add to its lists and override
    /// its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A port: `IF` (appliance: every frame to the vrouter), `IF=uplink`,
    /// `IF=host` or `IF=pod:ADDR[,ADDR]` (proxy ARP, anti-spoofing, a /32
    /// route per address). Repeat for each port.
    #[arg(long = "port", value_name = "IF[=KIND]")]
    pub ports: Vec<PortSpec>,
    /// A route: `CIDR=PORT`, `CIDR=ipip:REMOTE`, `CIDR=vxlan:REMOTE`,
    /// `CIDR=via:GW@PORT`, `CIDR=blackhole` or `CIDR=host`.
    #[arg(long = "route", value_name = "CIDR=TARGET")]
    pub routes: Vec<RouteSpec>,
    /// A static neighbour `IP=MAC[@PORT]`. Inside a prefix routed to a
    /// port, it is that port's peer.
    #[arg(long = "neighbor", value_name = "IP=MAC")]
    pub neighbors: Vec<NeighSpec>,
    /// The node's underlay address (tunnel endpoint).
    #[arg(long)]
    pub node: Option<Ipv4Addr>,
    /// Prefix length of the underlay subnet [default: 24].
    #[arg(long)]
    pub underlay_prefix_len: Option<u8>,
    /// VXLAN VNI [default: 4096].
    #[arg(long)]
    pub vxlan_vni: Option<u32>,
    /// VXLAN UDP port [default: 4789].
    #[arg(long)]
    pub vxlan_port: Option<u16>,
    /// Worker cores: one worker per core, each pinned: `1`, `0,1`, `0-1`
    /// or `auto` (every core this process may use). Without it, one
    /// unpinned worker.
    #[arg(long, value_name = "CPUS")]
    pub cpu: Option<String>,
    /// Polling policy [default: adaptive].
    #[arg(long, value_enum)]
    pub polling: Option<Polling>,
    /// Socket kind [default: auto].
    #[arg(long, value_enum)]
    pub io: Option<IoMode>,
    /// UMEM frames of 2048 B; registering the UMEM counts against
    /// RLIMIT_MEMLOCK [default: 4096 = 8 MiB].
    #[arg(long)]
    pub umem_frames: Option<u32>,
    /// Log format: text (ANSI colours only on a terminal) or json (one
    /// object per line) [default: text].
    #[arg(long, value_enum)]
    pub log_format: Option<super::config::LogFormat>,
}

impl RunArgs {
    /// Merges the file (if any) and the flags.
    pub fn resolve(self) -> anyhow::Result<RunConfig> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read {}", path.display()))?;
                match toml::from_str::<FileConfig>(&text) {
                    Ok(c) => c,
                    Err(e) => {
                        // The node daemon's file (deploy/systemd/vrouter.toml)
                        // belongs to `serve`; say so rather than list keys.
                        let daemon_keys = ["cores", "api", "metrics", "xdp", "uplink"];
                        let looks_like_daemon = toml::from_str::<toml::Table>(&text)
                            .is_ok_and(|t| daemon_keys.iter().any(|k| t.contains_key(*k)));
                        if looks_like_daemon {
                            anyhow::bail!(
                                "{} is a daemon config (cores, [api], [metrics], [xdp]): run `brindle-vrouter serve --config {}`",
                                path.display(),
                                path.display()
                            );
                        }
                        return Err(e).with_context(|| format!("parse {}", path.display()));
                    }
                }
            }
            None => FileConfig::default(),
        };
        let mut ports: Vec<PortSpec> = file
            .ports
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        ports.extend(self.ports);
        let mut routes: Vec<RouteSpec> = file
            .routes
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        routes.extend(self.routes);
        let mut neighbors: Vec<NeighSpec> = file
            .neighbors
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        neighbors.extend(self.neighbors);
        Ok(RunConfig {
            ports,
            routes,
            neighbors,
            node: self.node.or(file.node),
            underlay_prefix_len: self
                .underlay_prefix_len
                .or(file.underlay_prefix_len)
                .unwrap_or(24),
            vxlan_vni: self.vxlan_vni.or(file.vxlan_vni).unwrap_or(4096),
            vxlan_port: self
                .vxlan_port
                .or(file.vxlan_port)
                .unwrap_or(crate::wire::VXLAN_PORT),
            cores: match self.cpu.map(CpuSpec::List).or(file.cpu) {
                Some(spec) => spec.cores()?,
                None => Vec::new(),
            },
            polling: self.polling.or(file.polling).unwrap_or_default(),
            io: self.io.or(file.io).unwrap_or_default(),
            umem_frames: self.umem_frames.or(file.umem_frames).unwrap_or(4096),
        })
    }
}

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Ports, in the order given.
    pub ports: Vec<PortSpec>,
    /// Static routes.
    pub routes: Vec<RouteSpec>,
    /// Static neighbours.
    pub neighbors: Vec<NeighSpec>,
    /// The node's underlay address (tunnel endpoint, ICMP source); without
    /// one, IPIP/VXLAN are not steered to the vrouter.
    pub node: Option<Ipv4Addr>,
    /// Prefix length of the underlay subnet.
    pub underlay_prefix_len: u8,
    /// VXLAN VNI.
    pub vxlan_vni: u32,
    /// VXLAN UDP port.
    pub vxlan_port: u16,
    /// Cores of the workers, one worker each; empty: one unpinned worker.
    pub cores: Vec<usize>,
    /// Polling policy.
    pub polling: Polling,
    /// Socket kind.
    pub io: IoMode,
    /// UMEM frames (2048 B each).
    pub umem_frames: u32,
}

impl RunConfig {
    /// The engine's settings (AF_XDP rings and modes: the port defaults).
    pub fn engine(&self) -> EngineConfig {
        let d = XdpPortConfig::default();
        EngineConfig {
            cores: self.cores.clone(),
            polling: self.polling,
            io: self.io,
            umem_frames: self.umem_frames,
            ring_size: None,
            bind: d.socket.mode,
            xdp_mode: d.xdp_mode,
            flows_per_worker: crate::policy::DEFAULT_FLOWS_PER_WORKER,
        }
    }

    /// The settings the workers start with.
    pub fn pipeline(&self) -> PipelineConfig {
        let mut p = PipelineConfig::new(
            self.node.unwrap_or(Ipv4Addr::UNSPECIFIED),
            self.underlay_prefix_len,
        );
        p.vxlan_vni = self.vxlan_vni;
        p.vxlan_port = self.vxlan_port;
        p
    }

    /// The requests that program this configuration, as `serve` gets them
    /// from the controller: the node, the ports (a pod's addresses become
    /// /32 or /128 routes to its port), the routes, the neighbours. A
    /// neighbour inside a prefix routed to a port is that port's peer (the
    /// sink of the appliance mode, a pod whose MAC is known); one with
    /// neither a port nor such a prefix is set on every port.
    pub fn requests(&self) -> Result<Vec<api::VrouterRequest>, SpecError> {
        let mut names = BTreeSet::new();
        for p in &self.ports {
            if !names.insert(p.name.as_str()) {
                return Err(err("port", &p.name, "given twice"));
            }
        }
        let mut routes = Vec::new();
        let mut port_routes: Vec<(IpNet, &str)> = Vec::new();
        for p in &self.ports {
            for a in &p.addrs {
                let prefix = IpNet::from(*a);
                port_routes.push((prefix, &p.name));
                routes.push(api::Route {
                    prefix,
                    target: api::RouteTarget::Local {
                        port: p.name.clone(),
                    },
                });
            }
        }
        for r in &self.routes {
            let target = match &r.target {
                RouteTarget::Port(p) => {
                    port_routes.push((r.prefix, p));
                    api::RouteTarget::Local { port: p.clone() }
                }
                RouteTarget::Ipip(remote) => api::RouteTarget::Encap {
                    encap: api::Encap::Ipip,
                    remote: *remote,
                },
                RouteTarget::Vxlan(remote) => api::RouteTarget::Encap {
                    encap: api::Encap::Vxlan,
                    remote: *remote,
                },
                RouteTarget::Via(via, port) => api::RouteTarget::Gateway {
                    via: *via,
                    port: port.clone(),
                },
                RouteTarget::Blackhole => api::RouteTarget::Blackhole,
                RouteTarget::Host => api::RouteTarget::Host,
            };
            routes.push(api::Route {
                prefix: r.prefix,
                target,
            });
        }
        let mut peer_macs: BTreeMap<&str, Mac> = BTreeMap::new();
        let mut neighbors = Vec::new();
        for n in &self.neighbors {
            let covering = port_routes
                .iter()
                .filter(|(p, _)| p.contains(&n.addr))
                .max_by_key(|(p, _)| p.prefix_len())
                .map(|&(_, port)| port);
            let ports: Vec<&str> = match (n.port.as_deref(), covering) {
                (Some(p), _) => vec![p],
                (None, Some(p)) => vec![p],
                (None, None) => self.ports.iter().map(|p| p.name.as_str()).collect(),
            };
            for port in ports {
                if covering == Some(port) {
                    peer_macs.insert(port, Mac(n.mac));
                }
                neighbors.push(api::Neighbor {
                    port: port.to_owned(),
                    ip: n.addr,
                    mac: Mac(n.mac),
                });
            }
        }
        let ports = self
            .ports
            .iter()
            .map(|p| api::PortSpec {
                name: p.name.clone(),
                kind: match (p.appliance, p.kind) {
                    (true, _) => api::PortKind::Appliance,
                    (false, PortKind::Pod) => api::PortKind::Pod,
                    (false, PortKind::Uplink) => api::PortKind::Uplink,
                    (false, PortKind::Host) => api::PortKind::Host,
                },
                addresses: p.addrs.clone(),
                peer_mac: peer_macs.get(p.name.as_str()).copied(),
                endpoint: None,
                device: Default::default(),
                workload: None,
            })
            .collect();
        let node = api::NodeConfig {
            address_v4: self.node,
            address_v6: None,
            underlay_subnet: self.node.and_then(|n| {
                Ipv4Net::new(n, self.underlay_prefix_len)
                    .ok()
                    .map(|s| IpNet::V4(s.trunc()))
            }),
            underlay_gateway: None,
            vxlan: api::VxlanConfig {
                vni: self.vxlan_vni,
                port: self.vxlan_port,
                udp_checksum: false,
            },
            // The static routes' tunnel ends are the only nodes whose
            // IPIP/VXLAN is accepted (none: no tunnel from anyone).
            tunnel_peers: self
                .routes
                .iter()
                .filter_map(|r| match r.target {
                    RouteTarget::Ipip(remote) | RouteTarget::Vxlan(remote) => Some(remote),
                    _ => None,
                })
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        Ok(vec![
            api::VrouterRequest::SetNode { node },
            api::VrouterRequest::AddPorts { ports },
            api::VrouterRequest::AddRoutes { routes },
            api::VrouterRequest::SetNeighbors { neighbors },
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs() {
        let p: PortSpec = "eth0".parse().unwrap();
        assert_eq!((p.kind, p.appliance), (PortKind::Uplink, true));
        let p: PortSpec = "eth0=uplink".parse().unwrap();
        assert_eq!((p.kind, p.appliance), (PortKind::Uplink, false));
        let p: PortSpec = "cali1=pod:10.65.0.2,fd00::2".parse().unwrap();
        assert_eq!(p.kind, PortKind::Pod);
        assert_eq!(
            p.addrs,
            vec![
                "10.65.0.2".parse::<IpAddr>().unwrap(),
                "fd00::2".parse().unwrap()
            ]
        );
        assert!("a=pod:10.65.0".parse::<PortSpec>().is_err());
        assert!("a=router".parse::<PortSpec>().is_err());
        assert!("averyveryverylongname".parse::<PortSpec>().is_err());
    }

    #[test]
    fn route_specs() {
        let r: RouteSpec = "10.201.2.7/24=out0".parse().unwrap();
        assert_eq!(r.prefix, "10.201.2.0/24".parse::<IpNet>().unwrap());
        assert_eq!(r.target, RouteTarget::Port("out0".into()));
        assert_eq!(
            "10.66.0.0/26=ipip:192.168.0.2"
                .parse::<RouteSpec>()
                .unwrap()
                .target,
            RouteTarget::Ipip("192.168.0.2".parse().unwrap())
        );
        assert_eq!(
            "10.66.0.0/26=vxlan:192.168.0.2"
                .parse::<RouteSpec>()
                .unwrap()
                .target,
            RouteTarget::Vxlan("192.168.0.2".parse().unwrap())
        );
        assert_eq!(
            "0.0.0.0/0=via:192.168.0.254@eth0"
                .parse::<RouteSpec>()
                .unwrap()
                .target,
            RouteTarget::Via("192.168.0.254".parse().unwrap(), "eth0".into())
        );
        assert_eq!(
            "10.0.0.0/8=blackhole".parse::<RouteSpec>().unwrap().target,
            RouteTarget::Blackhole
        );
        assert!("10.0.0.0/8".parse::<RouteSpec>().is_err());
        assert!("10.0.0.0/33=x".parse::<RouteSpec>().is_err());
        assert!("10.0.0.0/8=ipip:nowhere".parse::<RouteSpec>().is_err());
        assert!("10.0.0.0/8=via:1.2.3.4".parse::<RouteSpec>().is_err());
    }

    #[test]
    fn neighbor_specs() {
        let n: NeighSpec = "10.201.2.2=02:00:00:00:00:02".parse().unwrap();
        assert_eq!(n.mac, [2, 0, 0, 0, 0, 2]);
        assert_eq!(n.port, None);
        let n: NeighSpec = "192.168.0.1=02:00:00:00:00:01@eth0".parse().unwrap();
        assert_eq!(n.port.as_deref(), Some("eth0"));
        assert!("10.0.0.1=02:00".parse::<NeighSpec>().is_err());
        // Exactly two digits per byte, as `ip link` prints; the error names
        // the bad value.
        let e = "10.0.0.1=2:0:0:0:0:2".parse::<NeighSpec>().unwrap_err();
        assert!(e.to_string().contains("\"2:0:0:0:0:2\""), "{e}");
        assert!(e.to_string().contains("two hex digits"), "{e}");
    }

    #[test]
    fn file_config_parses_and_refuses_unknown_keys() {
        let c: FileConfig = toml::from_str(
            "ports = [\"eth0\"]\nroutes = [\"10.0.0.0/8=eth0\"]\npolling = \"busy\"\nio = \"packet\"\n",
        )
        .unwrap();
        assert_eq!(c.polling, Some(Polling::Busy));
        assert_eq!(c.io, Some(IoMode::Packet));
        let c: FileConfig = toml::from_str("polling = \"busy-poll\"\ncpu = \"0,1\"").unwrap();
        assert_eq!(c.polling, Some(Polling::BusyPoll));
        assert_eq!(c.cpu.unwrap().cores().unwrap(), vec![0, 1]);
        let c: FileConfig = toml::from_str("cpu = 1").unwrap();
        assert_eq!(c.cpu.unwrap().cores().unwrap(), vec![1]);
        assert!(toml::from_str::<FileConfig>("portz = []").is_err());
    }

    #[test]
    fn run_flags_become_the_requests_serve_gets() {
        let cfg = RunConfig {
            ports: vec![
                "eth0=uplink".parse().unwrap(),
                "pod1=pod:10.65.0.2".parse().unwrap(),
                "out".parse().unwrap(),
            ],
            routes: vec![
                "10.201.2.0/24=out".parse().unwrap(),
                "10.66.0.0/26=vxlan:192.168.0.2".parse().unwrap(),
            ],
            neighbors: vec![
                "10.201.2.2=02:00:00:00:00:02".parse().unwrap(),
                "192.168.0.2=02:00:00:00:00:09@eth0".parse().unwrap(),
            ],
            node: Some("192.168.0.1".parse().unwrap()),
            underlay_prefix_len: 24,
            vxlan_vni: 7,
            vxlan_port: 4789,
            cores: vec![],
            polling: Polling::Adaptive,
            io: IoMode::Auto,
            umem_frames: 4096,
        };
        let reqs = cfg.requests().unwrap();
        let api::VrouterRequest::SetNode { node } = &reqs[0] else {
            panic!("{reqs:?}")
        };
        assert_eq!(node.vxlan.vni, 7);
        assert_eq!(
            node.tunnel_peers,
            vec!["192.168.0.2".parse::<Ipv4Addr>().unwrap()],
            "tunnels accepted from the routes' far ends only"
        );
        assert_eq!(
            node.underlay_subnet,
            Some("192.168.0.0/24".parse().unwrap())
        );
        let api::VrouterRequest::AddPorts { ports } = &reqs[1] else {
            panic!("{reqs:?}")
        };
        let kinds: Vec<api::PortKind> = ports.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            vec![
                api::PortKind::Uplink,
                api::PortKind::Pod,
                api::PortKind::Appliance
            ]
        );
        // The sink behind the appliance port is its peer.
        assert_eq!(ports[2].peer_mac, Some(Mac([2, 0, 0, 0, 0, 2])));
        assert_eq!(ports[0].peer_mac, None, "an explicit @port is not a peer");
        let api::VrouterRequest::AddRoutes { routes } = &reqs[2] else {
            panic!("{reqs:?}")
        };
        assert_eq!(routes.len(), 3, "the pod's /32, then the two routes");
        assert_eq!(routes[0].prefix, "10.65.0.2/32".parse::<IpNet>().unwrap());
        let api::VrouterRequest::SetNeighbors { neighbors } = &reqs[3] else {
            panic!("{reqs:?}")
        };
        let on: Vec<&str> = neighbors.iter().map(|n| n.port.as_str()).collect();
        assert_eq!(on, vec!["out", "eth0"]);
        let twice = RunConfig {
            ports: vec!["a".parse().unwrap(), "a=uplink".parse().unwrap()],
            ..cfg
        };
        assert!(
            twice
                .requests()
                .unwrap_err()
                .to_string()
                .contains("given twice")
        );
    }
}
