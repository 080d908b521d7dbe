//! The pipeline's behaviour cases with exact bytes, as one table driven
//! through two kinds of ports:
//!
//! - in-memory ports (`MemoryPort`), on every `cargo test`;
//! - AF_XDP sockets (`port::xdp::XdpPort`, the daemon's port, appliance
//!   steering) on veths in a network namespace made by the test, frames
//!   injected with an AF_PACKET socket on the peer end of each veth and what
//!   the vrouter transmits read back there (root, ignored by default).
//!
//! Each case is a fresh demo node (`brindle_vrouter::demo::Node`, the same
//! routes, neighbours and ports either way) and a list of steps: a frame in
//! on one port, and exactly the frames expected out, with their ports.
//! Expected frames are built with etherparse (`demo::frames`) or written
//! out, as in `tests/pipeline.rs`.

use std::net::{Ipv4Addr, Ipv6Addr};

use brindle_vrouter::demo::frames::{self, ethernet, ipv4_header, udp_frame, udp_packet};
use brindle_vrouter::demo::{Node, addr::*, frames_diff, ports};
use brindle_vrouter::endpoint::{GATEWAY_MAC, GATEWAY_V4};
use brindle_vrouter::fib::NextHop;
use brindle_vrouter::frame::PortId;
use brindle_vrouter::pipeline::{PipelineConfig, vtep_mac};
use etherparse::{Icmpv4Header, Icmpv4Type, icmpv4};

const PAYLOAD: [u8; 18] = [0x42; 18];

/// One frame in, and every frame expected out (in port order).
struct Step {
    ingress: PortId,
    frame: Vec<u8>,
    want: Vec<(PortId, Vec<u8>)>,
}

/// A behaviour: a node configuration, changes to the demo node, steps.
struct Case {
    name: &'static str,
    cfg: PipelineConfig,
    setup: fn(&mut Node),
    steps: Vec<Step>,
}

fn step(ingress: PortId, frame: Vec<u8>, want: Vec<(PortId, Vec<u8>)>) -> Step {
    Step {
        ingress,
        frame,
        want,
    }
}

fn case(name: &'static str, steps: Vec<Step>) -> Case {
    Case {
        name,
        cfg: PipelineConfig::new(NODE, 24),
        setup: |_| {},
        steps,
    }
}

fn pod_a_udp(dst: Ipv4Addr, ttl: u8) -> Vec<u8> {
    udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, ttl, &PAYLOAD)
}

/// The pseudo-header sum a pod leaves in the UDP checksum field with TX
/// checksum offload on, computed here independently of the wire crate.
fn partial_udp_checksum(frame: &[u8]) -> u16 {
    let ip = &frame[14..34];
    let udp_len = u16::from_be_bytes([frame[38], frame[39]]);
    let mut sum: u32 = (12..20)
        .step_by(2)
        .map(|i| u32::from(u16::from_be_bytes([ip[i], ip[i + 1]])))
        .sum();
    sum += 17 + u32::from(udp_len);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn icmp_error_frame(error: Icmpv4Type, quoted: &[u8], ident: u16) -> Vec<u8> {
    let icmp = Icmpv4Header::with_checksum(error, quoted);
    let len = icmp.header_len() + quoted.len();
    let mut ip = ipv4_header(NODE, POD_A, 1, len, 64, ident, false, 0xc0);
    ip.extend_from_slice(&icmp.to_bytes());
    ip.extend_from_slice(quoted);
    ethernet(GATEWAY_MAC, POD_A_MAC, 0x0800, &ip)
}

fn v6_frame(src_mac: [u8; 6], dst_mac: [u8; 6], src: &str, dst: &str, hop_limit: u8) -> Vec<u8> {
    let src: Ipv6Addr = src.parse().unwrap();
    let dst: Ipv6Addr = dst.parse().unwrap();
    let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac)
        .ipv6(src.octets(), dst.octets(), hop_limit)
        .udp(40000, 5000);
    let mut v = Vec::new();
    b.write(&mut v, &PAYLOAD).unwrap();
    v
}

fn dual_stack(node: &mut Node) {
    for (port, addr) in [(ports::POD_A, "fd00::2"), (ports::POD_B, "fd00::3")] {
        let ep = node
            .worker
            .pipeline_mut()
            .ports_mut()
            .get_mut(port)
            .unwrap();
        ep.addrs.push(addr.parse().unwrap());
        node.fib.insert(
            format!("{addr}/128").parse().unwrap(),
            NextHop::Local { port },
        );
    }
}

/// The MAC the unresolved remote node answers with.
const UNRESOLVED_MAC: [u8; 6] = [0x02, 0, 0xc0, 0xa8, 0, 0x04];

fn cases() -> Vec<Case> {
    let mut v = Vec::new();

    v.push(case(
        "pod to pod on the same node: MACs rewritten, TTL decremented",
        vec![step(
            ports::POD_A,
            pod_a_udp(POD_B, 64),
            vec![(
                ports::POD_B,
                udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD),
            )],
        )],
    ));

    let mut partial = pod_a_udp(POD_B, 64);
    let sum = partial_udp_checksum(&partial);
    partial[40..42].copy_from_slice(&sum.to_be_bytes());
    v.push(case(
        "a UDP checksum left to offload by the pod is completed",
        vec![step(
            ports::POD_A,
            partial,
            vec![(
                ports::POD_B,
                udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD),
            )],
        )],
    ));

    let inner = udp_packet(POD_A, REMOTE_POD_IPIP, 63, &PAYLOAD);
    let mut outer = ipv4_header(NODE, REMOTE_IPIP, 4, inner.len(), 63, 1, true, 0);
    outer.extend_from_slice(&inner);
    v.push(case(
        "pod to remote pod over IPIP: outer TTL inherited, DF, IP ID 1",
        vec![step(
            ports::POD_A,
            pod_a_udp(REMOTE_POD_IPIP, 64),
            vec![(
                ports::UPLINK,
                ethernet(UPLINK_MAC, REMOTE_IPIP_MAC, 0x0800, &outer),
            )],
        )],
    ));

    let inner = udp_frame(
        vtep_mac(NODE),
        vtep_mac(REMOTE_VXLAN),
        POD_A,
        REMOTE_POD_VXLAN,
        63,
        &PAYLOAD,
    );
    v.push(case(
        "pod to remote pod over VXLAN: VNI 4096, UDP checksum 0, flow-hash source port",
        vec![step(
            ports::POD_A,
            pod_a_udp(REMOTE_POD_VXLAN, 64),
            vec![(
                ports::UPLINK,
                frames::vxlan_frame(
                    UPLINK_MAC,
                    REMOTE_VXLAN_MAC,
                    NODE,
                    REMOTE_VXLAN,
                    // This flow's hash (tests/pipeline.rs checks the range
                    // and that it is stable per flow).
                    VXLAN_SRC_PORT,
                    4096,
                    &inner,
                    1,
                ),
            )],
        )],
    ));

    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 63, &PAYLOAD);
    v.push(case(
        "remote pod to pod: IPIP decapsulated",
        vec![step(
            ports::UPLINK,
            frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, &inner),
            vec![(
                ports::POD_A,
                udp_frame(GATEWAY_MAC, POD_A_MAC, REMOTE_POD_IPIP, POD_A, 62, &PAYLOAD),
            )],
        )],
    ));

    let inner = udp_frame(
        vtep_mac(REMOTE_VXLAN),
        vtep_mac(NODE),
        REMOTE_POD_VXLAN,
        POD_A,
        63,
        &PAYLOAD,
    );
    let mut vx = frames::vxlan_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        REMOTE_VXLAN,
        NODE,
        50000,
        4096,
        &inner,
        9,
    );
    vx.extend_from_slice(&[0; 6]);
    v.push(case(
        "remote pod to pod: VXLAN decapsulated, Ethernet padding dropped",
        vec![step(
            ports::UPLINK,
            vx,
            vec![(
                ports::POD_A,
                udp_frame(
                    GATEWAY_MAC,
                    POD_A_MAC,
                    REMOTE_POD_VXLAN,
                    POD_A,
                    62,
                    &PAYLOAD,
                ),
            )],
        )],
    ));

    #[rustfmt::skip]
    let arp_reply = vec![
        0x0a, 0x58, 0x0a, 0x41, 0x00, 0x03, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x08, 0x06,
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02,
        0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 169, 254, 1, 1,
        0x0a, 0x58, 0x0a, 0x41, 0x00, 0x03, 10, 65, 0, 3,
    ];
    v.push(case(
        "proxy ARP answers the pod's gateway, not the pod's own address",
        vec![
            step(
                ports::POD_B,
                frames::arp_request(POD_B_MAC, POD_B, GATEWAY_V4),
                vec![(ports::POD_B, arp_reply)],
            ),
            step(
                ports::POD_B,
                frames::arp_request(POD_B_MAC, POD_B, POD_B),
                vec![],
            ),
        ],
    ));

    v.push(case(
        "the uplink never answers ARP",
        [NODE, POD_A, GATEWAY_V4]
            .into_iter()
            .map(|target| {
                step(
                    ports::UPLINK,
                    frames::arp_request(REMOTE_IPIP_MAC, REMOTE_IPIP, target),
                    vec![],
                )
            })
            .collect(),
    ));

    v.push(case(
        "spoofed sources are dropped",
        vec![
            step(
                ports::POD_A,
                udp_frame(POD_A_MAC, GATEWAY_MAC, POD_B, REMOTE_POD_IPIP, 64, &PAYLOAD),
                vec![],
            ),
            step(
                ports::POD_A,
                udp_frame(
                    POD_A_MAC,
                    GATEWAY_MAC,
                    Ipv4Addr::new(8, 8, 8, 8),
                    POD_B,
                    64,
                    &PAYLOAD,
                ),
                vec![],
            ),
        ],
    ));

    let sent = pod_a_udp(POD_B, 1);
    let time_exceeded = icmp_error_frame(
        Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit),
        &sent[14..14 + 28],
        1,
    );
    v.push(case(
        "TTL 1 is answered with ICMP time exceeded from the node address",
        vec![step(
            ports::POD_A,
            sent,
            vec![(ports::POD_A, time_exceeded)],
        )],
    ));

    for (name, dst, mtu) in [
        (
            "too big with DF to a pod: fragmentation needed, MTU 1500",
            POD_B,
            1500u16,
        ),
        (
            "too big with DF over IPIP: fragmentation needed, MTU 1480",
            REMOTE_POD_IPIP,
            1480,
        ),
        (
            "too big with DF over VXLAN: fragmentation needed, MTU 1450",
            REMOTE_POD_VXLAN,
            1450,
        ),
    ] {
        let too_big = usize::from(mtu) + 1 - 28;
        let sent = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, 64, &vec![0; too_big]);
        let want = icmp_error_frame(
            Icmpv4Type::DestinationUnreachable(
                icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: mtu },
            ),
            &sent[14..14 + 28],
            1,
        );
        v.push(case(
            name,
            vec![step(ports::POD_A, sent, vec![(ports::POD_A, want)])],
        ));
    }

    let plain = pod_a_udp(POD_B, 64);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
    tagged.extend_from_slice(&plain[12..]);
    v.push(case(
        "an 802.1Q-tagged frame is forwarded untagged",
        vec![step(
            ports::POD_A,
            tagged,
            vec![(
                ports::POD_B,
                udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD),
            )],
        )],
    ));

    v.push(case(
        "unknown ethertypes are dropped",
        [0x88cc_u16, 0x8847, 0x9000]
            .into_iter()
            .map(|t| {
                step(
                    ports::POD_A,
                    ethernet(POD_A_MAC, GATEWAY_MAC, t, &[0u8; 46]),
                    vec![],
                )
            })
            .collect(),
    ));

    v.push(case(
        "the uplink carries no transit traffic but delivers native frames to local pods",
        vec![
            step(
                ports::UPLINK,
                udp_frame(
                    REMOTE_IPIP_MAC,
                    UPLINK_MAC,
                    REMOTE_POD_IPIP,
                    REMOTE_POD_VXLAN,
                    64,
                    &PAYLOAD,
                ),
                vec![],
            ),
            step(
                ports::UPLINK,
                udp_frame(
                    REMOTE_IPIP_MAC,
                    UPLINK_MAC,
                    REMOTE_POD_IPIP,
                    POD_B,
                    64,
                    &PAYLOAD,
                ),
                vec![(
                    ports::POD_B,
                    udp_frame(GATEWAY_MAC, POD_B_MAC, REMOTE_POD_IPIP, POD_B, 63, &PAYLOAD),
                )],
            ),
        ],
    ));

    // Cross-subnet as the node daemon programs it: a remote block on our
    // subnet is a native route via the remote node's underlay address.
    let mut cross = case(
        "cross-subnet native routing: pod to a remote block via its node, and back",
        vec![
            step(
                ports::POD_A,
                pod_a_udp(REMOTE_POD_IPIP, 64),
                vec![(
                    ports::UPLINK,
                    udp_frame(
                        UPLINK_MAC,
                        REMOTE_IPIP_MAC,
                        POD_A,
                        REMOTE_POD_IPIP,
                        63,
                        &PAYLOAD,
                    ),
                )],
            ),
            step(
                ports::UPLINK,
                udp_frame(
                    REMOTE_IPIP_MAC,
                    UPLINK_MAC,
                    REMOTE_POD_IPIP,
                    POD_A,
                    63,
                    &PAYLOAD,
                ),
                vec![(
                    ports::POD_A,
                    udp_frame(GATEWAY_MAC, POD_A_MAC, REMOTE_POD_IPIP, POD_A, 62, &PAYLOAD),
                )],
            ),
        ],
    );
    cross.cfg.cross_subnet = true;
    cross.setup = |node| {
        node.fib.insert(
            "10.65.1.0/26".parse().unwrap(),
            NextHop::Gateway {
                via: REMOTE_IPIP.into(),
                port: ports::UPLINK,
            },
        );
    };
    v.push(cross);

    let mut reply = vec![0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02];
    reply.extend_from_slice(&UNRESOLVED_MAC);
    reply.extend_from_slice(&REMOTE_UNRESOLVED.octets());
    reply.extend_from_slice(&UPLINK_MAC);
    reply.extend_from_slice(&NODE.octets());
    let inner = udp_packet(POD_A, REMOTE_POD_UNRESOLVED, 63, &PAYLOAD);
    let mut outer = ipv4_header(NODE, REMOTE_UNRESOLVED, 4, inner.len(), 63, 1, true, 0);
    outer.extend_from_slice(&inner);
    v.push(case(
        "a frame to an unresolved node waits for the ARP reply, then leaves",
        vec![
            step(
                ports::POD_A,
                pod_a_udp(REMOTE_POD_UNRESOLVED, 64),
                vec![(
                    ports::UPLINK,
                    frames::arp_request(UPLINK_MAC, NODE, REMOTE_UNRESOLVED),
                )],
            ),
            step(
                ports::UPLINK,
                ethernet(UNRESOLVED_MAC, UPLINK_MAC, 0x0806, &reply),
                vec![(
                    ports::UPLINK,
                    ethernet(UPLINK_MAC, UNRESOLVED_MAC, 0x0800, &outer),
                )],
            ),
        ],
    ));

    let mut v6 = case(
        "IPv6 pod to pod: routed natively, hop limit decremented",
        vec![step(
            ports::POD_A,
            v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd00::3", 64),
            vec![(
                ports::POD_B,
                v6_frame(GATEWAY_MAC, POD_B_MAC, "fd00::2", "fd00::3", 63),
            )],
        )],
    );
    v6.setup = dual_stack;
    v.push(v6);

    v
}

/// The VXLAN source port of the flow in the VXLAN case.
const VXLAN_SRC_PORT: u16 = 40776;

/// Fails with decoded frames rather than byte dumps.
fn compare(case: &str, n: usize, got: &[(PortId, Vec<u8>)], want: &[(PortId, Vec<u8>)]) {
    if let Some(diff) = frames_diff(got, want) {
        panic!("{case}, step {n}: frames differ\n{diff}");
    }
}

#[test]
fn every_case_through_in_memory_ports() {
    for case in cases() {
        let mut node = Node::with_config(case.cfg.clone());
        (case.setup)(&mut node);
        for (n, s) in case.steps.iter().enumerate() {
            let got = node.send(s.ingress, &s.frame);
            compare(case.name, n, &got, &s.want);
        }
        let c = node.worker.counters();
        assert!(c.balanced(), "{}: {c:?}", case.name);
        assert!(node.all_frames_free(), "{}: a frame leaked", case.name);
    }
}

#[test]
fn the_table_covers_every_kind_of_port_and_outcome() {
    let cases = cases();
    let steps = || cases.iter().flat_map(|c| c.steps.iter());
    for port in [ports::POD_A, ports::POD_B, ports::UPLINK] {
        assert!(steps().any(|s| s.ingress == port), "nothing in on {port}");
        assert!(
            steps().any(|s| s.want.iter().any(|(p, _)| *p == port)),
            "nothing out on {port}"
        );
    }
    assert!(steps().any(|s| s.want.is_empty()), "no drop case");
}

mod xdp {
    //! The same table through AF_XDP ports on veths.

    use std::time::{Duration, Instant};

    use anyhow::{Context, Result, bail};
    use brindle_testkit::netns::Netns;
    use brindle_vrouter::demo::Node;
    use brindle_vrouter::frame::{Port, PortId};
    use brindle_vrouter::port::xdp::{FillSizing, LinkInfo, XdpPort, XdpPortConfig, umem_arena};
    use brindle_xsk::{
        Desc, PacketConfig, PacketSocket, Role, Steering, SteeringConfig, Umem, UmemConfig,
    };

    use super::{Case, cases, compare};

    /// The vrouter's end and the peer end of each port's veth, in port
    /// order (pod A, pod B, uplink).
    const VETHS: [(&str, &str); 3] = [("pa", "pa-peer"), ("pb", "pb-peer"), ("up", "up-peer")];

    /// UMEM chunks (512 KiB, well inside the 8 MiB memlock limit).
    const UMEM_FRAMES: u32 = 256;

    /// Longest wait for the frames a step expects.
    const DEADLINE: Duration = Duration::from_secs(2);

    /// How long the vrouter is polled after the last expected frame, to
    /// catch a frame too many (and for steps that expect none).
    const QUIET: Duration = Duration::from_millis(50);

    /// The namespace with the three veth pairs, one queue each (the port
    /// binds the queues sysfs lists, and sysfs shows the test's namespace,
    /// not this one: one socket on queue 0 must see every frame). IPv6 is
    /// off so the kernel
    /// sends nothing of its own (router solicitations, MLD) into them; the
    /// links' MTU leaves room for the cases' too-big frames (the pipeline
    /// uses the port table's 1500).
    fn topology() -> Result<Netns> {
        let ns = Netns::new("brvc")?;
        for key in ["all", "default"] {
            ns.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{key}.disable_ipv6=1"),
            ])?;
        }
        for (ours, peer) in VETHS {
            ns.ip(&[
                "link",
                "add",
                "dev",
                ours,
                "mtu",
                "1700",
                "numtxqueues",
                "1",
                "numrxqueues",
                "1",
                "type",
                "veth",
                "peer",
                "name",
                peer,
                "mtu",
                "1700",
                "numtxqueues",
                "1",
                "numrxqueues",
                "1",
            ])?;
            ns.ip(&["link", "set", "dev", ours, "up"])?;
            ns.ip(&["link", "set", "dev", peer, "up"])?;
        }
        Ok(ns)
    }

    /// The peer end of one veth: inject with AF_PACKET, read back what the
    /// vrouter sent (our own transmissions are ignored by the socket).
    struct Peer {
        socket: PacketSocket,
        mem: Vec<u8>,
        chunks: Vec<u64>,
        descs: Vec<Desc>,
    }

    impl Peer {
        fn open(ifname: &str) -> Result<Peer> {
            let config = PacketConfig {
                rx_frames: 64,
                tx_frames: 64,
                ..PacketConfig::default()
            };
            let socket = PacketSocket::bind(brindle_xsk::ifindex(ifname)?, &config)
                .with_context(|| format!("AF_PACKET on {ifname}"))?;
            let chunks: Vec<u64> = (1..33).map(|i| i * 2048).collect();
            Ok(Peer {
                socket,
                mem: vec![0; 34 * 2048],
                chunks,
                descs: vec![Desc::default(); 32],
            })
        }

        fn inject(&mut self, frame: &[u8]) -> Result<()> {
            self.mem[..frame.len()].copy_from_slice(frame);
            let desc = Desc {
                addr: 0,
                len: frame.len() as u32,
            };
            if self.socket.tx_burst(&self.mem, &[desc]) != 1 {
                bail!("AF_PACKET TX ring full");
            }
            self.socket.kick_tx()?;
            Ok(())
        }

        fn receive(&mut self, into: &mut Vec<Vec<u8>>) {
            let n = self
                .socket
                .rx_burst(&mut self.mem, &self.chunks, &mut self.descs);
            for d in &self.descs[..n] {
                let at = d.addr as usize;
                into.push(self.mem[at..at + d.len as usize].to_vec());
            }
        }
    }

    /// A fresh demo node whose three ports are AF_XDP sockets on the
    /// vrouter's ends of the veths, with the appliance program (every frame
    /// to the socket, as an in-memory port receives every frame).
    fn xdp_node(case: &Case) -> Result<(Node, Steering)> {
        let umem = Umem::new(UmemConfig {
            frame_count: UMEM_FRAMES,
            ..UmemConfig::default()
        })?;
        let (arena, handle) = umem_arena(umem);
        let steering = Steering::new(SteeringConfig {
            max_pod_prefixes: 64,
            max_queues: 4,
        })?;
        let config = XdpPortConfig {
            fill_budget: 32,
            pod_fill_budget: 32,
            max_queues: 1,
            umem_frames: UMEM_FRAMES,
            ..XdpPortConfig::default()
        };
        let mut error = None;
        let mut next = 0;
        let node = Node::build_on(case.cfg.clone(), arena, |memory| {
            let (ifname, _) = VETHS[next];
            next += 1;
            // sysfs shows the test's own namespace, not this thread's: the
            // link facts are given, not read.
            let link = LinkInfo {
                mac: [0x02, 0, 0, 0, 0, next as u8],
                mtu: 1700,
            };
            // The previous case's sockets on this queue are closed, but the
            // kernel clears the queue's pool in deferred work: a bind can
            // meet it still there (EBUSY) for a moment.
            let open = || {
                XdpPort::open(
                    &handle,
                    &steering,
                    ifname,
                    Role::All,
                    FillSizing::Uplink,
                    link,
                    &config,
                )
            };
            let mut opened = open();
            for _ in 0..100 {
                match &opened {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(10));
                        opened = open();
                    }
                    _ => break,
                }
            }
            match opened {
                Ok(p) => Box::new(p) as Box<dyn Port>,
                Err(e) => {
                    error.get_or_insert(anyhow::anyhow!("AF_XDP port on {ifname}: {e}"));
                    Box::new(memory)
                }
            }
        });
        match error {
            Some(e) => Err(e),
            None => Ok((node, steering)),
        }
    }

    /// Injects `frame` on the peer of `ingress` and polls the worker until
    /// `expected` frames came back (then `QUIET` more) or `DEADLINE`.
    fn send(
        node: &mut Node,
        peers: &mut [Peer],
        ingress: PortId,
        frame: &[u8],
        expected: usize,
    ) -> Result<Vec<(PortId, Vec<u8>)>> {
        peers[usize::from(ingress)].inject(frame)?;
        // The pipeline's clock moves as with in-memory ports: 1 ms a step.
        node.now += Duration::from_millis(1);
        let start = Instant::now();
        let mut enough_at = None;
        let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); peers.len()];
        loop {
            node.worker.poll_once(node.now);
            for (i, p) in peers.iter_mut().enumerate() {
                p.receive(&mut got[i]);
            }
            let n: usize = got.iter().map(Vec::len).sum();
            if n >= expected && enough_at.is_none() {
                enough_at = Some(Instant::now());
            }
            if enough_at.is_some_and(|t| t.elapsed() >= QUIET) || start.elapsed() >= DEADLINE {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(got
            .into_iter()
            .enumerate()
            .flat_map(|(i, frames)| frames.into_iter().map(move |f| (i as PortId, f)))
            .collect())
    }

    pub(super) fn run_every_case() -> Result<()> {
        let ns = topology()?;
        let result = brindle_testkit::netns::in_netns(&ns, move || {
            let mut peers = VETHS
                .iter()
                .map(|(_, peer)| Peer::open(peer))
                .collect::<Result<Vec<_>>>()?;
            let mut ran = 0;
            for case in cases() {
                let (mut node, _steering) = xdp_node(&case)?;
                (case.setup)(&mut node);
                // The first poll puts frames on the fill rings: until then
                // the kernel has nowhere to put a received frame.
                node.worker.poll_once(node.now);
                for (n, s) in case.steps.iter().enumerate() {
                    let got = send(&mut node, &mut peers, s.ingress, &s.frame, s.want.len())?;
                    if got != s.want {
                        eprintln!(
                            "{}: counters after step {n}:\n{}",
                            case.name,
                            node.worker.counters()
                        );
                    }
                    compare(case.name, n, &got, &s.want);
                }
                let c = node.worker.counters();
                assert!(c.balanced(), "{}: {c:?}", case.name);
                assert_eq!(
                    c.rx_packets,
                    case.steps.len() as u64,
                    "{}: the vrouter received exactly the injected frames",
                    case.name
                );
                ran += 1;
                // Dropping the node closes the sockets and detaches the
                // programs before the next case attaches its own.
            }
            Ok(ran)
        })
        .join();
        let ran = match result {
            Ok(r) => r?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        assert_eq!(ran, cases().len());
        drop(ns);
        Ok(())
    }
}

#[test]
#[ignore = "requires root and network namespaces"]
fn every_case_through_af_xdp_ports_on_veths() -> anyhow::Result<()> {
    xdp::run_every_case()
}
