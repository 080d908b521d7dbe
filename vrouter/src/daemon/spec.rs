//! The static configuration: ports, routes and neighbours as written on the
//! command line (`--port`, `--route`, `--neighbor`) or in a TOML file.

use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::endpoint::PortKind;
use brindle_api::vrouter::Mac;

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

/// How a worker waits when there is no traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// Spin on the rings without ever sleeping: lowest latency, one core at
    /// 100 % even when idle.
    Busy,
    /// Spin while frames arrive; after a run of empty polls, sleep between
    /// polls, growing to 1 ms, with need_wakeup so the kernel is woken only
    /// when it asks. An idle vrouter costs near-zero CPU.
    #[default]
    Adaptive,
    /// After a run of empty polls, block in poll(2) on the ports' sockets
    /// (up to 100 ms at a time) until frames arrive: the least CPU when
    /// idle, a wake-up's latency on the first frame of a burst.
    Interrupt,
    /// Preferred busy polling: the AF_XDP sockets get SO_PREFER_BUSY_POLL,
    /// SO_BUSY_POLL (20 µs) and SO_BUSY_POLL_BUDGET (64), every receive
    /// starts with a recvfrom that runs the queue's NAPI in the worker's
    /// context, and the interface gets napi_defer_hard_irqs=2 and
    /// gro_flush_timeout=200000 if it had neither (restored on close), so
    /// the kernel's softirq leaves the queue to the worker. Idle, the worker
    /// blocks in poll(2), which busy-polls too.
    #[serde(rename = "busy-poll", alias = "busy_poll")]
    #[value(name = "busy-poll")]
    BusyPoll,
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
            CpuSpec::List(s) => crate::daemon::serve::parse_cores(s),
        }
    }
}

/// Which socket kind ports use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// AF_XDP, falling back to AF_PACKET per port with a log line saying why.
    #[default]
    Auto,
    /// AF_XDP only; fail if a port cannot be opened.
    Xdp,
    /// AF_PACKET only.
    Packet,
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
}
