//! The forwarding demo (`brindle-vrouter demo`, run by `cargo xtask lab`
//! until the real lab lands), and the node fixture tests and benchmarks share.
//!
//! [`Node`] is one Brindle node on in-memory ports: two pods, an uplink to
//! an underlay with two remote nodes (one reached by IPIP, one by VXLAN), and
//! a FIB as the daemon would program it. [`run`] sends the frames of each
//! behaviour through it, prints decoded summaries of what came out, checks
//! each result, and ends with the counters.
//!
//! The frame builders here use etherparse, an implementation independent of
//! `brindle-wire`, so tests that compare the pipeline's output with frames
//! built here do not check the wire views against themselves.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use etherparse::{Ethernet2Header, IpNumber, Ipv4Header, PacketBuilder, UdpHeader};

use crate::endpoint::{Endpoint, GATEWAY_MAC, GATEWAY_V4};
use crate::fib::{Encap, Fib, NextHop};
use crate::frame::{FrameArena, Port, PortId};
use crate::pipeline::PipelineConfig;
use crate::port::{MemoryPort, MemoryPortHandle, PcapPort};
use crate::wire::{self, EtherType, ethernet, ipv4};
use crate::worker::Worker;

/// Addresses of the demo node and its neighbours.
pub mod addr {
    use std::net::Ipv4Addr;

    /// This node's underlay address (a /24 underlay).
    pub const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 1);
    /// The uplink NIC's MAC.
    pub const UPLINK_MAC: [u8; 6] = [0x02, 0x00, 0xc0, 0xa8, 0x00, 0x01];
    /// A remote node reached by IPIP.
    pub const REMOTE_IPIP: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);
    /// Its MAC.
    pub const REMOTE_IPIP_MAC: [u8; 6] = [0x02, 0x00, 0xc0, 0xa8, 0x00, 0x02];
    /// A remote node reached by VXLAN.
    pub const REMOTE_VXLAN: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 3);
    /// Its MAC.
    pub const REMOTE_VXLAN_MAC: [u8; 6] = [0x02, 0x00, 0xc0, 0xa8, 0x00, 0x03];
    /// A remote node whose MAC nobody knows yet (the miss path).
    pub const REMOTE_UNRESOLVED: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 4);
    /// Pod A, on port 0.
    pub const POD_A: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 2);
    /// Pod A's MAC.
    pub const POD_A_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x41, 0x00, 0x02];
    /// Pod B, on port 1.
    pub const POD_B: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 3);
    /// Pod B's MAC.
    pub const POD_B_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x41, 0x00, 0x03];
    /// A pod on the IPIP node (block 10.65.1.0/26).
    pub const REMOTE_POD_IPIP: Ipv4Addr = Ipv4Addr::new(10, 65, 1, 5);
    /// A pod on the VXLAN node (block 10.65.2.0/26).
    pub const REMOTE_POD_VXLAN: Ipv4Addr = Ipv4Addr::new(10, 65, 2, 5);
    /// A pod on the unresolved node (block 10.65.3.0/26).
    pub const REMOTE_POD_UNRESOLVED: Ipv4Addr = Ipv4Addr::new(10, 65, 3, 5);
    /// Inside a blackholed range (10.66.0.0/16).
    pub const BLACKHOLED: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);
}

/// Port ids of the demo node.
pub mod ports {
    use crate::frame::PortId;
    /// Pod A's port.
    pub const POD_A: PortId = 0;
    /// Pod B's port.
    pub const POD_B: PortId = 1;
    /// The uplink.
    pub const UPLINK: PortId = 2;
}

/// MTU of every port of the demo node.
pub const MTU: u32 = 1500;

/// The VXLAN VNI (Calico's default).
pub const VNI: u32 = 4096;

/// One node on in-memory ports, programmed as described in the module docs.
pub struct Node {
    /// The worker.
    pub worker: Worker,
    /// The FIB (keep it: dropping the writer is fine, but tests add routes).
    pub fib: Fib,
    /// The handles of ports 0 (pod A), 1 (pod B), 2 (uplink).
    pub handles: Vec<MemoryPortHandle>,
    /// The time passed to the worker; each [`Node::send`] advances it 1 ms.
    pub now: Instant,
}

impl Node {
    /// The node with the default configuration.
    pub fn new() -> Self {
        Self::with_config(PipelineConfig::new(addr::NODE, 24))
    }

    /// The node with `cfg` (whose node address should stay
    /// [`addr::NODE`]).
    pub fn with_config(cfg: PipelineConfig) -> Self {
        Self::build(cfg, |port| Box::new(port))
    }

    /// The node with every port recorded to `<dir>/<port name>.pcap`.
    pub fn with_pcap(cfg: PipelineConfig, dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut error = None;
        let node = Self::build(cfg, |port| {
            let path = dir.join(format!("{}.pcap", port.name()));
            match File::create(&path) {
                Ok(f) => Box::new(PcapPort::new(port, BufWriter::new(f))),
                Err(e) => {
                    error.get_or_insert(e);
                    Box::new(port)
                }
            }
        });
        match error {
            Some(e) => Err(e),
            None => Ok(node),
        }
    }

    /// The node, with each in-memory port wrapped by `wrap` (middleware).
    pub fn build(cfg: PipelineConfig, wrap: impl FnMut(MemoryPort) -> Box<dyn Port>) -> Self {
        Self::build_on(cfg, FrameArena::new_heap(256, 2048), wrap)
    }

    /// The node on `arena` (e.g. a UMEM), with each in-memory port
    /// ("pod-a", "pod-b", "uplink", in port order) replaced or wrapped by
    /// `wrap`: the same node over other ports, such as AF_XDP sockets on
    /// veths. When `wrap` drops the in-memory port, its handle in
    /// [`Node::handles`] reaches nothing.
    pub fn build_on(
        cfg: PipelineConfig,
        arena: FrameArena,
        mut wrap: impl FnMut(MemoryPort) -> Box<dyn Port>,
    ) -> Self {
        let (mut fib, reader) = Fib::new();
        let routes: [(&str, NextHop); 6] = [
            ("10.65.0.2/32", NextHop::Local { port: ports::POD_A }),
            ("10.65.0.3/32", NextHop::Local { port: ports::POD_B }),
            (
                "10.65.1.0/26",
                NextHop::Encap {
                    encap: Encap::Ipip,
                    remote: addr::REMOTE_IPIP,
                },
            ),
            (
                "10.65.2.0/26",
                NextHop::Encap {
                    encap: Encap::Vxlan { vni: VNI },
                    remote: addr::REMOTE_VXLAN,
                },
            ),
            (
                "10.65.3.0/26",
                NextHop::Encap {
                    encap: Encap::Ipip,
                    remote: addr::REMOTE_UNRESOLVED,
                },
            ),
            ("10.66.0.0/16", NextHop::Blackhole),
        ];
        for (prefix, nh) in routes {
            // The literals above are valid prefixes.
            if let Ok(p) = prefix.parse() {
                fib.insert(p, nh);
            }
        }
        let mut worker = Worker::new(arena, cfg, reader);
        let mut handles = Vec::new();
        for (name, ip, mac) in [
            ("pod-a", addr::POD_A, addr::POD_A_MAC),
            ("pod-b", addr::POD_B, addr::POD_B_MAC),
        ] {
            let (port, h) = MemoryPort::new(name, GATEWAY_MAC, MTU);
            worker.add_port(wrap(port), Endpoint::pod(vec![ip.into()], Some(mac), MTU));
            handles.push(h);
        }
        let (port, h) = MemoryPort::new("uplink", addr::UPLINK_MAC, MTU);
        worker.add_port(wrap(port), Endpoint::uplink(addr::UPLINK_MAC, MTU));
        handles.push(h);
        let neigh = worker.pipeline_mut().neigh_mut();
        neigh.insert(
            ports::UPLINK,
            addr::REMOTE_IPIP.into(),
            addr::REMOTE_IPIP_MAC,
        );
        neigh.insert(
            ports::UPLINK,
            addr::REMOTE_VXLAN.into(),
            addr::REMOTE_VXLAN_MAC,
        );
        Node {
            worker,
            fib,
            handles,
            now: Instant::now(),
        }
    }

    /// Receives `frame` on `port`, runs one worker iteration, and returns
    /// every frame transmitted, with its port, in port order.
    pub fn send(&mut self, port: PortId, frame: &[u8]) -> Vec<(PortId, Vec<u8>)> {
        if let Some(h) = self.handles.get(port as usize) {
            h.inject(frame);
        }
        self.now += Duration::from_millis(1);
        self.worker.poll_once(self.now);
        self.transmitted()
    }

    /// Every frame transmitted since the last call, with its port.
    pub fn transmitted(&mut self) -> Vec<(PortId, Vec<u8>)> {
        let mut out = Vec::new();
        for (i, h) in self.handles.iter().enumerate() {
            out.extend(h.take_transmitted().into_iter().map(|f| (i as PortId, f)));
        }
        out
    }

    /// Whether every arena chunk is back in the free list, or held (and
    /// counted) for a next hop being resolved.
    pub fn no_frame_leaked(&self) -> bool {
        let held = self.worker.pipeline().held_frames();
        self.worker.arena().free_count() + held == self.worker.arena().frames() as usize
            && self.worker.counters().neighbor_held == held as u64
    }

    /// Whether every arena chunk is back in the free list (nothing held).
    pub fn all_frames_free(&self) -> bool {
        self.worker.arena().free_count() == self.worker.arena().frames() as usize
    }
}

impl Default for Node {
    fn default() -> Self {
        Self::new()
    }
}

/// Frame builders (etherparse), for the demo, tests, benchmarks and fuzz
/// seeds.
pub mod frames {
    use super::*;

    /// UDP source and destination ports of built packets.
    pub const UDP_PORTS: (u16, u16) = (40000, 5000);

    /// An IPv4/UDP packet (no Ethernet) with DF set and IP ID 0, as Linux
    /// sends them with path MTU discovery on.
    pub fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, ttl: u8, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ipv4(src.octets(), dst.octets(), ttl).udp(UDP_PORTS.0, UDP_PORTS.1);
        let mut v = Vec::with_capacity(b.size(payload.len()));
        // Writing into a Vec cannot fail, and the sizes are in range.
        let _ = b.write(&mut v, payload);
        v
    }

    /// `packet` behind an Ethernet header with `ethertype`.
    pub fn ethernet(src: [u8; 6], dst: [u8; 6], ethertype: u16, packet: &[u8]) -> Vec<u8> {
        let mut v = Ethernet2Header {
            source: src,
            destination: dst,
            ether_type: ethertype.into(),
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(packet);
        v
    }

    /// An Ethernet/IPv4/UDP frame.
    pub fn udp_frame(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ttl: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        ethernet(
            src_mac,
            dst_mac,
            0x0800,
            &udp_packet(src, dst, ttl, payload),
        )
    }

    /// A 20-byte IPv4 header with a correct checksum.
    #[allow(clippy::too_many_arguments)]
    pub fn ipv4_header(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        protocol: u8,
        payload_len: usize,
        ttl: u8,
        ident: u16,
        dont_frag: bool,
        tos: u8,
    ) -> Vec<u8> {
        let Ok(mut h) = Ipv4Header::new(
            payload_len as u16,
            ttl,
            IpNumber(protocol),
            src.octets(),
            dst.octets(),
        ) else {
            return Vec::new();
        };
        h.identification = ident;
        h.dont_fragment = dont_frag;
        h.dscp = etherparse::IpDscp::try_new(tos >> 2).unwrap_or_default();
        h.ecn = etherparse::IpEcn::try_new(tos & 3).unwrap_or_default();
        h.header_checksum = h.calc_header_checksum();
        h.to_bytes().to_vec()
    }

    /// An IPIP frame from `outer_src` to `outer_dst` carrying `inner` (an
    /// IPv4 packet), outer TTL 64, DF set.
    pub fn ipip_frame(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        outer_src: Ipv4Addr,
        outer_dst: Ipv4Addr,
        inner: &[u8],
    ) -> Vec<u8> {
        let mut p = ipv4_header(outer_src, outer_dst, 4, inner.len(), 64, 0, true, 0);
        p.extend_from_slice(inner);
        ethernet(src_mac, dst_mac, 0x0800, &p)
    }

    /// A VXLAN frame (UDP checksum 0, source port `src_port`) carrying the
    /// Ethernet frame `inner`.
    #[allow(clippy::too_many_arguments)]
    pub fn vxlan_frame(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        outer_src: Ipv4Addr,
        outer_dst: Ipv4Addr,
        src_port: u16,
        vni: u32,
        inner: &[u8],
        ident: u16,
    ) -> Vec<u8> {
        let udp_payload = 8 + inner.len();
        let mut p = ipv4_header(
            outer_src,
            outer_dst,
            17,
            8 + udp_payload,
            64,
            ident,
            false,
            0,
        );
        if let Ok(u) = UdpHeader::without_ipv4_checksum(src_port, wire::VXLAN_PORT, udp_payload) {
            p.extend_from_slice(&u.to_bytes());
        }
        p.extend_from_slice(&[0x08, 0, 0, 0]);
        p.extend_from_slice(&(vni << 8).to_be_bytes());
        p.extend_from_slice(inner);
        ethernet(src_mac, dst_mac, 0x0800, &p)
    }

    /// "Who has `target`? Tell `sender`" from `mac`, broadcast.
    pub fn arp_request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        let mut p = vec![0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01];
        p.extend_from_slice(&mac);
        p.extend_from_slice(&sender.octets());
        p.extend_from_slice(&[0; 6]);
        p.extend_from_slice(&target.octets());
        ethernet(mac, [0xff; 6], 0x0806, &p)
    }
}

fn mac(m: &[u8]) -> String {
    ethernet::MacAddr::from_bytes(m).to_string()
}

/// `None` when the transmitted frames `got` equal `want` (port and bytes,
/// in order); else both lists, each frame decoded by [`describe`] and
/// dumped, for a test's failure message.
pub fn frames_diff(got: &[(PortId, Vec<u8>)], want: &[(PortId, Vec<u8>)]) -> Option<String> {
    if got == want {
        return None;
    }
    let show = |v: &[(PortId, Vec<u8>)]| {
        v.iter()
            .map(|(p, f)| format!("  port {p}: {}\n    {:02x?}", describe(f), f))
            .collect::<String>()
    };
    Some(format!(" got:\n{}\n want:\n{}", show(got), show(want)))
}

/// A one-line decoded summary of an Ethernet frame (slow path: the demo
/// and test failure messages). Tunnels are decoded to the inner packet.
pub fn describe(frame: &[u8]) -> String {
    let mut s = String::new();
    describe_into(&mut s, frame, 0);
    s
}

fn describe_into(s: &mut String, frame: &[u8], depth: u8) {
    let Ok(eth) = wire::EthernetFrame::new_checked(frame) else {
        let _ = write!(s, "truncated Ethernet ({} bytes)", frame.len());
        return;
    };
    let _ = write!(s, "{} > {} ", eth.src_addr(), eth.dst_addr());
    let l3 = &frame[eth.header_len()..];
    match eth.ethertype() {
        EtherType::Arp => match wire::ArpPacket::new_checked(l3) {
            Ok(a) if a.operation() == wire::ArpOperation::Request => {
                let _ = write!(
                    s,
                    "ARP who-has {} tell {}",
                    a.target_protocol_addr(),
                    a.source_protocol_addr()
                );
            }
            Ok(a) => {
                let _ = write!(
                    s,
                    "ARP reply {} is-at {}",
                    a.source_protocol_addr(),
                    a.source_hardware_addr()
                );
            }
            Err(_) => s.push_str("ARP (truncated)"),
        },
        EtherType::Ipv4 => describe_ipv4(s, l3, depth),
        other => {
            let _ = write!(s, "ethertype {:#06x}", u16::from(other));
        }
    }
}

fn describe_ipv4(s: &mut String, packet: &[u8], depth: u8) {
    let Ok(ip) = ipv4::Packet::new_checked(packet) else {
        s.push_str("IPv4 (truncated)");
        return;
    };
    let _ = write!(
        s,
        "IPv4 {} > {} ttl {} len {}{} ",
        ip.src_addr(),
        ip.dst_addr(),
        ip.ttl(),
        ip.total_len(),
        if ip.dont_frag() { " DF" } else { "" }
    );
    let payload = &packet[ip.header_len()..usize::from(ip.total_len())];
    match ip.protocol() {
        wire::IpProtocol::IpIp if depth < 2 => {
            s.push_str("IPIP [ ");
            describe_ipv4(s, payload, depth + 1);
            s.push_str(" ]");
        }
        wire::IpProtocol::Udp => match wire::UdpPacket::new_checked(payload) {
            Ok(u) if u.dst_port() == wire::VXLAN_PORT && depth < 2 && payload.len() >= 16 => {
                let vni = u32::from_be_bytes([0, payload[12], payload[13], payload[14]]);
                let _ = write!(
                    s,
                    "UDP {} > {} VXLAN vni {vni} [ ",
                    u.src_port(),
                    u.dst_port()
                );
                describe_into(s, &payload[16..], depth + 1);
                s.push_str(" ]");
            }
            Ok(u) => {
                let _ = write!(s, "UDP {} > {}", u.src_port(), u.dst_port());
            }
            Err(_) => s.push_str("UDP (truncated)"),
        },
        wire::IpProtocol::Icmp if payload.len() >= 8 => {
            let (t, c) = (payload[0], payload[1]);
            let what = match (t, c) {
                (11, 0) => "time exceeded in transit".to_owned(),
                (3, 4) => format!(
                    "fragmentation needed, next-hop MTU {}",
                    u16::from_be_bytes([payload[6], payload[7]])
                ),
                _ => format!("type {t} code {c}"),
            };
            let _ = write!(s, "ICMP {what}");
        }
        p => {
            let _ = write!(s, "protocol {}", u8::from(p));
        }
    }
}

fn port_name(p: PortId) -> &'static str {
    match p {
        ports::POD_A => "pod-a",
        ports::POD_B => "pod-b",
        ports::UPLINK => "uplink",
        _ => "?",
    }
}

/// Checks what a step transmitted and the counters after it.
type Check = fn(&[(PortId, Vec<u8>)], &crate::counters::Counters) -> Result<(), String>;

/// One demo step: a frame in, what must come out.
struct Step {
    title: &'static str,
    port: PortId,
    frame: Vec<u8>,
    check: Check,
}

fn only_on(out: &[(PortId, Vec<u8>)], port: PortId) -> Result<&[u8], String> {
    match out {
        [(p, f)] if *p == port => Ok(f),
        [] => Err("nothing was transmitted".into()),
        _ => Err(format!(
            "expected one frame on {}, got {}",
            port_name(port),
            out.len()
        )),
    }
}

fn expect(cond: bool, what: &str) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what.to_owned()) }
}

fn ip_at(f: &[u8], off: usize) -> Option<ipv4::Packet<&[u8]>> {
    ipv4::Packet::new_checked(f.get(off..)?).ok()
}

fn steps() -> Vec<Step> {
    use addr::*;
    let payload = [0x42u8; 18];
    vec![
        Step {
            title: "proxy ARP: pod A asks for its gateway 169.254.1.1",
            port: ports::POD_A,
            frame: frames::arp_request(POD_A_MAC, POD_A, GATEWAY_V4),
            check: |out, _| {
                let f = only_on(out, ports::POD_A)?;
                let a = wire::ArpPacket::new_checked(f.get(14..).unwrap_or_default())
                    .map_err(|e| e.to_string())?;
                expect(
                    a.operation() == wire::ArpOperation::Reply
                        && a.source_hardware_addr().0 == GATEWAY_MAC
                        && a.source_protocol_addr() == GATEWAY_V4
                        && a.target_hardware_addr().0 == POD_A_MAC,
                    "not a reply 169.254.1.1 is-at ee:ee:ee:ee:ee:ee to pod A",
                )
            },
        },
        Step {
            title: "pod A -> pod B on the same node",
            port: ports::POD_A,
            frame: frames::udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &payload),
            check: |out, _| {
                let f = only_on(out, ports::POD_B)?;
                let ip = ip_at(f, 14).ok_or("no IPv4 header")?;
                expect(
                    f[..6] == POD_B_MAC && f[6..12] == GATEWAY_MAC,
                    "MACs not rewritten",
                )?;
                expect(ip.ttl() == 63 && ip.verify_checksum(), "TTL/checksum wrong")
            },
        },
        Step {
            title: "pod A -> remote pod over IPIP",
            port: ports::POD_A,
            frame: frames::udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_IPIP, 64, &payload),
            check: |out, _| {
                let f = only_on(out, ports::UPLINK)?;
                let outer = ip_at(f, 14).ok_or("no outer IPv4")?;
                expect(
                    f[..6] == REMOTE_IPIP_MAC,
                    "outer MAC is not the remote node's",
                )?;
                expect(
                    outer.protocol() == wire::IpProtocol::IpIp
                        && outer.src_addr() == NODE
                        && outer.dst_addr() == REMOTE_IPIP
                        && outer.verify_checksum(),
                    "outer header wrong",
                )?;
                let inner = ip_at(f, 34).ok_or("no inner IPv4")?;
                expect(
                    inner.dst_addr() == REMOTE_POD_IPIP && inner.ttl() == 63,
                    "inner wrong",
                )
            },
        },
        Step {
            title: "pod A -> remote pod over VXLAN",
            port: ports::POD_A,
            frame: frames::udp_frame(
                POD_A_MAC,
                GATEWAY_MAC,
                POD_A,
                REMOTE_POD_VXLAN,
                64,
                &payload,
            ),
            check: |out, _| {
                let f = only_on(out, ports::UPLINK)?;
                let outer = ip_at(f, 14).ok_or("no outer IPv4")?;
                expect(
                    f[..6] == REMOTE_VXLAN_MAC,
                    "outer MAC is not the remote node's",
                )?;
                expect(
                    outer.protocol() == wire::IpProtocol::Udp
                        && outer.dst_addr() == REMOTE_VXLAN
                        && f[36..38] == wire::VXLAN_PORT.to_be_bytes()
                        && f[46..49] == [0x00, 0x10, 0x00],
                    "not VXLAN to 192.168.0.3:4789 with VNI 4096",
                )?;
                let inner = ip_at(f, 64).ok_or("no inner IPv4")?;
                expect(
                    inner.dst_addr() == REMOTE_POD_VXLAN && inner.ttl() == 63,
                    "inner wrong",
                )
            },
        },
        Step {
            title: "remote pod -> pod A: IPIP decapsulated",
            port: ports::UPLINK,
            frame: frames::ipip_frame(
                REMOTE_IPIP_MAC,
                UPLINK_MAC,
                REMOTE_IPIP,
                NODE,
                &frames::udp_packet(REMOTE_POD_IPIP, POD_A, 63, &payload),
            ),
            check: |out, _| {
                let f = only_on(out, ports::POD_A)?;
                let ip = ip_at(f, 14).ok_or("no IPv4")?;
                expect(
                    f[..6] == POD_A_MAC
                        && ip.src_addr() == REMOTE_POD_IPIP
                        && ip.ttl() == 62
                        && ip.verify_checksum(),
                    "not the inner packet, TTL 62, to pod A",
                )
            },
        },
        Step {
            title: "remote pod -> pod A: VXLAN decapsulated",
            port: ports::UPLINK,
            frame: frames::vxlan_frame(
                REMOTE_VXLAN_MAC,
                UPLINK_MAC,
                REMOTE_VXLAN,
                NODE,
                50000,
                VNI,
                &frames::udp_frame(
                    crate::pipeline::vtep_mac(REMOTE_VXLAN),
                    crate::pipeline::vtep_mac(NODE),
                    REMOTE_POD_VXLAN,
                    POD_A,
                    63,
                    &payload,
                ),
                7,
            ),
            check: |out, _| {
                let f = only_on(out, ports::POD_A)?;
                let ip = ip_at(f, 14).ok_or("no IPv4")?;
                expect(
                    ip.src_addr() == REMOTE_POD_VXLAN && ip.ttl() == 62 && f.len() == 14 + 46,
                    "not the inner packet, TTL 62, to pod A",
                )
            },
        },
        Step {
            title: "pod A spoofs pod B's address: dropped and counted",
            port: ports::POD_A,
            frame: frames::udp_frame(POD_A_MAC, GATEWAY_MAC, POD_B, REMOTE_POD_IPIP, 64, &payload),
            check: |out, c| {
                expect(out.is_empty(), "a spoofed frame was forwarded")?;
                expect(
                    c.drops_for(crate::counters::DropReason::Spoofed) == 1,
                    "spoofed drop not counted",
                )
            },
        },
        Step {
            title: "TTL 1 from pod A: ICMP time exceeded from the node address",
            port: ports::POD_A,
            frame: frames::udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 1, &payload),
            check: |out, _| {
                let f = only_on(out, ports::POD_A)?;
                let ip = ip_at(f, 14).ok_or("no IPv4")?;
                expect(
                    ip.src_addr() == NODE
                        && ip.dst_addr() == POD_A
                        && ip.protocol() == wire::IpProtocol::Icmp
                        && f.get(34..36) == Some(&[11, 0][..]),
                    "not ICMP time exceeded from 192.168.0.1 to pod A",
                )
            },
        },
        Step {
            title: "1500-byte DF packet to an IPIP pod: ICMP fragmentation needed, MTU 1480",
            port: ports::POD_A,
            frame: frames::udp_frame(
                POD_A_MAC,
                GATEWAY_MAC,
                POD_A,
                REMOTE_POD_IPIP,
                64,
                &[0u8; 1500 - 28],
            ),
            check: |out, _| {
                let f = only_on(out, ports::POD_A)?;
                expect(
                    f.get(34..36) == Some(&[3, 4][..])
                        && f.get(40..42) == Some(&1480u16.to_be_bytes()[..]),
                    "not ICMP fragmentation needed with next-hop MTU 1480",
                )
            },
        },
    ]
}

/// Runs the demo, writing to `w` (and, with `pcap_dir`, every port's
/// traffic to `<pcap_dir>/<port>.pcap`); returns whether every step
/// behaved.
pub fn run(w: &mut dyn Write, pcap_dir: Option<&Path>) -> io::Result<bool> {
    let cfg = PipelineConfig::new(addr::NODE, 24);
    let mut node = match pcap_dir {
        Some(dir) => Node::with_pcap(cfg, dir)?,
        None => Node::with_config(cfg),
    };
    let mut ok = true;
    writeln!(
        w,
        "Brindle vrouter forwarding demo: node {} (uplink {}), pods {} and {} on in-memory ports\n",
        addr::NODE,
        mac(&addr::UPLINK_MAC),
        addr::POD_A,
        addr::POD_B
    )?;
    for (i, step) in steps().into_iter().enumerate() {
        writeln!(w, "{}. {}", i + 1, step.title)?;
        writeln!(
            w,
            "   in  {:<7} {}",
            port_name(step.port),
            describe(&step.frame)
        )?;
        let out = node.send(step.port, &step.frame);
        for (p, f) in &out {
            writeln!(w, "   out {:<7} {}", port_name(*p), describe(f))?;
        }
        match (step.check)(&out, &node.worker.counters()) {
            Ok(()) => writeln!(w, "   ok")?,
            Err(e) => {
                ok = false;
                writeln!(w, "   FAILED: {e}")?;
            }
        }
    }
    let c = node.worker.counters();
    writeln!(w, "\ncounters:\n{c}")?;
    if !c.balanced() {
        ok = false;
        writeln!(
            w,
            "FAILED: counters do not balance (rx + generated != tx + consumed + dropped)"
        )?;
    }
    if !node.no_frame_leaked() {
        ok = false;
        writeln!(w, "FAILED: frames leaked from the arena")?;
    }
    writeln!(
        w,
        "{}",
        if ok {
            "demo: all checks passed"
        } else {
            "demo: FAILED"
        }
    )?;
    if let Some(dir) = pcap_dir {
        // Dropping the worker flushes and closes the captures.
        drop(node);
        writeln!(
            w,
            "captures (tcpdump -r): {}/{{pod-a,pod-b,uplink}}.pcap",
            dir.display()
        )?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    #[test]
    fn frames_diff_is_none_for_equal_lists_and_names_ports_and_bytes_otherwise() {
        let frame = vec![0xaa; 14];
        let same = [(1, frame.clone())];
        assert_eq!(super::frames_diff(&same, &same), None);
        let diff = super::frames_diff(&same, &[(2, frame)]).expect("ports differ");
        assert!(
            diff.contains("port 1:") && diff.contains("port 2:"),
            "{diff}"
        );
        assert!(diff.contains("aa, aa"), "{diff}");
        assert!(super::frames_diff(&same, &[]).is_some());
    }

    #[test]
    fn the_demo_writes_readable_captures() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        assert!(super::run(&mut out, Some(dir.path())).unwrap());
        let uplink = std::fs::read(dir.path().join("uplink.pcap")).unwrap();
        assert_eq!(&uplink[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        // Two frames in (IPIP, VXLAN) and two out (IPIP, VXLAN) at least.
        assert!(
            uplink.len() > 24 + 4 * 16 + 4 * 60,
            "{} bytes",
            uplink.len()
        );
    }

    #[test]
    fn the_demo_passes_its_own_checks() {
        let mut out = Vec::new();
        let ok = super::run(&mut out, None).unwrap();
        assert!(ok, "{}", String::from_utf8_lossy(&out));
    }
}
