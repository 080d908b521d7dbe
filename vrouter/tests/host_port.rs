//! The host port (`brindle0`, the node's kernel behind a TAP) on the demo
//! node, through in-memory ports: proxy ARP for what the vrouter routes,
//! frames to the kernel's MAC, host → pods (local and remote) with no
//! source check, pods → the host for everything outside the pools, no
//! hairpin back to the host, never a decapsulation, and ICMP errors back
//! through the host port. Exact bytes out (etherparse builds the expected
//! frames), counters balanced, no frame leaked.

use std::net::Ipv4Addr;

use brindle_vrouter::counters::{Counters, DropReason};
use brindle_vrouter::demo::frames::{self, ipv4_header, udp_frame, udp_packet};
use brindle_vrouter::demo::{MTU, Node, addr::*, frames_diff, ports};
use brindle_vrouter::endpoint::{Endpoint, GATEWAY_MAC, GATEWAY_V4};
use brindle_vrouter::fib::NextHop;
use brindle_vrouter::frame::PortId;
use brindle_vrouter::port::memory::MemoryPort;
use etherparse::{Icmpv4Header, Icmpv4Type, icmpv4};

const PAYLOAD: [u8; 18] = [0x42; 18];
/// The kernel's end of `brindle0`.
const HOST_MAC: [u8; 6] = [0x02, 0xb0, 0x00, 0x00, 0x00, 0x01];
/// Slot of the host port, after pod A, pod B and the uplink.
const HOST: PortId = 3;
/// Outside every pool and every node: the internet, a Service's ClusterIP.
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);

/// The demo node with a host port and the default route to it, as ctrl
/// programs a node with `brindle0`.
fn node() -> Node {
    node_with_mtu(MTU)
}

fn node_with_mtu(mtu: u32) -> Node {
    let mut node = Node::new();
    let (port, handle) = MemoryPort::new("brindle0", GATEWAY_MAC, mtu);
    let id = node
        .worker
        .add_port(Box::new(port), Endpoint::host(GATEWAY_MAC, HOST_MAC, mtu));
    assert_eq!(id, HOST);
    node.handles.push(handle);
    node.fib.insert("0.0.0.0/0".parse().unwrap(), NextHop::Host);
    node
}

fn assert_frames(got: &[(PortId, Vec<u8>)], want: &[(PortId, Vec<u8>)]) {
    if let Some(diff) = frames_diff(got, want) {
        panic!("frames differ\n{diff}");
    }
}

fn finish(node: &Node) -> Counters {
    let c = node.worker.counters();
    assert!(c.balanced(), "counters do not balance: {c:?}");
    assert!(node.no_frame_leaked(), "a frame leaked from the arena");
    c
}

fn from_host(src: Ipv4Addr, dst: Ipv4Addr, ttl: u8) -> Vec<u8> {
    udp_frame(HOST_MAC, GATEWAY_MAC, src, dst, ttl, &PAYLOAD)
}

#[test]
fn the_kernels_arp_for_the_gateway_is_answered_with_the_ee_mac() {
    let mut node = node();
    let out = node.send(HOST, &frames::arp_request(HOST_MAC, NODE, GATEWAY_V4));
    #[rustfmt::skip]
    let want = vec![
        0x02, 0xb0, 0x00, 0x00, 0x00, 0x01, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x08, 0x06,
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02,
        0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 169, 254, 1, 1,
        0x02, 0xb0, 0x00, 0x00, 0x00, 0x01, 192, 168, 0, 1,
    ];
    assert_frames(&out, &[(HOST, want)]);
    // What the vrouter carries (a local pod, a remote block) is answered
    // too; what it would hand back to the kernel (the node's own address,
    // the outside) or drops (a blackhole) is not.
    for target in [POD_A, REMOTE_POD_IPIP] {
        let out = node.send(HOST, &frames::arp_request(HOST_MAC, NODE, target));
        assert_eq!(out.len(), 1, "{target} answered");
    }
    for target in [NODE, OUTSIDE, BLACKHOLED] {
        let out = node.send(HOST, &frames::arp_request(HOST_MAC, NODE, target));
        assert!(out.is_empty(), "{target} not answered: {out:?}");
    }
    let c = finish(&node);
    assert_eq!(c.arp_replies, 3);
    assert_eq!(c.drops_for(DropReason::NotForUs), 3);
}

#[test]
fn the_host_reaches_a_local_pod_from_any_source() {
    let mut node = node();
    // The node's address, and one the kernel forwards (outside → NodePort
    // → DNAT keeps the client's source): no anti-spoofing on the host port.
    for src in [NODE, OUTSIDE] {
        let out = node.send(HOST, &from_host(src, POD_A, 64));
        let want = udp_frame(GATEWAY_MAC, POD_A_MAC, src, POD_A, 63, &PAYLOAD);
        assert_frames(&out, &[(ports::POD_A, want)]);
    }
    let c = finish(&node);
    assert_eq!((c.forwarded, c.dropped()), (2, 0));
}

#[test]
fn the_host_reaches_a_remote_pod_through_the_tunnel() {
    let mut node = node();
    let out = node.send(HOST, &from_host(NODE, REMOTE_POD_IPIP, 64));
    let inner = udp_packet(NODE, REMOTE_POD_IPIP, 63, &PAYLOAD);
    let mut outer = ipv4_header(NODE, REMOTE_IPIP, 4, inner.len(), 63, 1, true, 0);
    outer.extend_from_slice(&inner);
    let want = frames::ethernet(UPLINK_MAC, REMOTE_IPIP_MAC, 0x0800, &outer);
    assert_frames(&out, &[(ports::UPLINK, want)]);
    assert_eq!(finish(&node).encap_ipip, 1);
}

#[test]
fn a_pod_reaches_the_node_and_beyond_through_the_host_port() {
    let mut node = node();
    for dst in [NODE, REMOTE_IPIP, OUTSIDE] {
        let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, 64, &PAYLOAD);
        let out = node.send(ports::POD_A, &f);
        let want = udp_frame(GATEWAY_MAC, HOST_MAC, POD_A, dst, 63, &PAYLOAD);
        assert_frames(&out, &[(HOST, want)]);
    }
    // A pod's forged source is dropped whatever the destination.
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_B, OUTSIDE, 64, &PAYLOAD);
    assert!(node.send(ports::POD_A, &f).is_empty());
    let c = finish(&node);
    assert_eq!(c.forwarded, 3);
    assert_eq!(c.drops_for(DropReason::Spoofed), 1);
}

#[test]
fn frames_to_the_host_follow_the_kernels_mac() {
    let mut node = node();
    let moved = [0x02, 0xb0, 0, 0, 0, 0x99];
    // Any frame from the kernel carries its MAC (here an ARP request).
    node.send(HOST, &frames::arp_request(moved, NODE, GATEWAY_V4));
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, OUTSIDE, 64, &PAYLOAD);
    let out = node.send(ports::POD_A, &f);
    let want = udp_frame(GATEWAY_MAC, moved, POD_A, OUTSIDE, 63, &PAYLOAD);
    assert_frames(&out, &[(HOST, want)]);
    finish(&node);
}

#[test]
fn what_the_host_routes_back_to_itself_is_a_counted_hairpin_drop() {
    let mut node = node();
    assert!(node.send(HOST, &from_host(NODE, OUTSIDE, 64)).is_empty());
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::HostHairpin), 1);
    assert_eq!(c.tx_packets, 0);
}

#[test]
fn tunnels_from_the_host_port_are_never_decapsulated() {
    let mut node = node();
    // IPIP and VXLAN to the node's address, as a local process (or a pod
    // behind the kernel) might forge them: never unwrapped into a pod.
    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 64, &PAYLOAD);
    let ipip = frames::ipip_frame(HOST_MAC, GATEWAY_MAC, REMOTE_IPIP, NODE, &inner);
    assert!(node.send(HOST, &ipip).is_empty());
    let inner_eth = udp_frame([2; 6], GATEWAY_MAC, REMOTE_POD_VXLAN, POD_A, 64, &PAYLOAD);
    let vxlan = frames::vxlan_frame(
        HOST_MAC,
        GATEWAY_MAC,
        REMOTE_VXLAN,
        NODE,
        40000,
        brindle_vrouter::demo::VNI,
        &inner_eth,
        0,
    );
    assert!(node.send(HOST, &vxlan).is_empty());
    let c = finish(&node);
    assert_eq!((c.decap_ipip, c.decap_vxlan), (0, 0));
    assert_eq!(c.drops_for(DropReason::HostHairpin), 2);
}

#[test]
fn ttl_expiry_from_the_host_is_answered_through_the_host_port() {
    let mut node = node();
    let sent = from_host(NODE, POD_A, 1);
    let out = node.send(HOST, &sent);
    let quoted = &sent[14..14 + 28];
    let error = Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit);
    let icmp = Icmpv4Header::with_checksum(error, quoted);
    let mut ip = ipv4_header(
        NODE,
        NODE,
        1,
        icmp.header_len() + quoted.len(),
        64,
        1,
        false,
        0xc0,
    );
    ip.extend_from_slice(&icmp.to_bytes());
    ip.extend_from_slice(quoted);
    let want = frames::ethernet(GATEWAY_MAC, HOST_MAC, 0x0800, &ip);
    assert_frames(&out, &[(HOST, want)]);
    assert_eq!(finish(&node).icmp_generated, 1);
}

#[test]
fn a_pods_packet_too_big_for_the_host_port_is_answered_with_its_mtu() {
    let mut node = node_with_mtu(1400);
    let big = [0u8; 1400];
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, OUTSIDE, 64, &big);
    let out = node.send(ports::POD_A, &f);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, ports::POD_A);
    let ip = &out[0].1[14..];
    // ICMP type 3 code 4, next-hop MTU 1400.
    assert_eq!((ip[20], ip[21]), (3, 4));
    assert_eq!(u16::from_be_bytes([ip[26], ip[27]]), 1400);
    let c = finish(&node);
    assert_eq!((c.icmp_generated, c.forwarded), (1, 0));
}

/// A ClusterIP, DNATed by the node's kernel (kube-proxy's rules).
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// The reply way of `udp_frame`'s datagram: ports swapped.
fn udp_reply(src_mac: [u8; 6], dst_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, ttl: u8) -> Vec<u8> {
    let (a, b) = frames::UDP_PORTS;
    let builder = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac)
        .ipv4(src.octets(), dst.octets(), ttl)
        .udp(b, a);
    let mut v = Vec::new();
    builder.write(&mut v, &PAYLOAD).unwrap();
    // As `udp_packet`: DF set, IP ID 0 (Linux with path MTU discovery).
    let mut ip = etherparse::Ipv4HeaderSlice::from_slice(&v[14..])
        .unwrap()
        .to_header();
    ip.dont_fragment = true;
    ip.header_checksum = ip.calc_header_checksum();
    v[14..34].copy_from_slice(&ip.to_bytes());
    v
}

#[test]
fn a_service_backends_reply_goes_back_through_the_kernel_to_be_un_dnated() {
    let mut node = node();
    // Pod A → ClusterIP: to the kernel.
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, CLUSTER_IP, 64, &PAYLOAD);
    let out = node.send(ports::POD_A, &f);
    let want = udp_frame(GATEWAY_MAC, HOST_MAC, POD_A, CLUSTER_IP, 63, &PAYLOAD);
    assert_frames(&out, &[(HOST, want)]);
    // The kernel DNATs to pod B on this node and hands it back.
    let out = node.send(HOST, &from_host(POD_A, POD_B, 63));
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 62, &PAYLOAD);
    assert_frames(&out, &[(ports::POD_B, want)]);
    // B's reply to A goes to the kernel, not straight to A.
    let reply = udp_reply(POD_B_MAC, GATEWAY_MAC, POD_B, POD_A, 64);
    let out = node.send(ports::POD_B, &reply);
    let want = udp_reply(GATEWAY_MAC, HOST_MAC, POD_B, POD_A, 63);
    assert_frames(&out, &[(HOST, want)]);
    // The kernel un-DNATs it (source: the ClusterIP) and sends it to A.
    let undone = udp_reply(HOST_MAC, GATEWAY_MAC, CLUSTER_IP, POD_A, 63);
    let out = node.send(HOST, &undone);
    let want = udp_reply(GATEWAY_MAC, POD_A_MAC, CLUSTER_IP, POD_A, 62);
    assert_frames(&out, &[(ports::POD_A, want)]);
    let c = finish(&node);
    assert_eq!((c.forwarded, c.dropped()), (4, 0));
}

#[test]
fn a_reply_of_a_pods_own_flow_goes_straight_back_to_the_pod() {
    let mut node = node();
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &PAYLOAD);
    assert_eq!(node.send(ports::POD_A, &f)[0].0, ports::POD_B);
    let reply = udp_reply(POD_B_MAC, GATEWAY_MAC, POD_B, POD_A, 64);
    let out = node.send(ports::POD_B, &reply);
    let want = udp_reply(GATEWAY_MAC, POD_A_MAC, POD_B, POD_A, 63);
    assert_frames(&out, &[(ports::POD_A, want)]);
    finish(&node);
}

#[test]
fn a_remote_backends_reply_from_the_tunnel_goes_back_through_the_kernel() {
    let mut node = node();
    // The kernel DNATed pod A's ClusterIP packet to a pod on another node.
    let out = node.send(HOST, &from_host(POD_A, REMOTE_POD_IPIP, 63));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ports::UPLINK);
    // The backend's reply arrives through the tunnel: to the kernel.
    let inner = &udp_reply([0; 6], [0; 6], REMOTE_POD_IPIP, POD_A, 63)[14..];
    let f = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, inner);
    let out = node.send(ports::UPLINK, &f);
    let want = udp_reply(GATEWAY_MAC, HOST_MAC, REMOTE_POD_IPIP, POD_A, 62);
    assert_frames(&out, &[(HOST, want)]);
    let c = finish(&node);
    assert_eq!((c.decap_ipip, c.dropped()), (1, 0));
}

/// TAP pod A's flows with the host port and the uplink kept by another
/// worker (`Flows::set_flow_home`, `set_spread`: A's queue on a worker that
/// is not its first): here the host port's packets to A (host -> A) and
/// from A to beyond the node (A -> Service -> a remote backend), and A's
/// packets to the host, are given away unprocessed (with no other worker
/// to take them, each is a counted `tx_ring_full`, no flow tracked), while
/// the host's packets to B and those between A and B (a Service DNATed
/// either way: a TAP pod's flows with veth pod B live on B's worker, this
/// one) and A's packets to B stay. With A's flows kept here again, the
/// same packets are tracked and sent here (the test fails if they were
/// given away regardless, or kept without the flow home).
#[test]
fn a_pods_flows_with_the_host_port_go_to_the_worker_that_keeps_them() {
    let mut node = node();
    let flows = node.worker.pipeline_mut().flows_mut();
    flows.set_flow_home(ports::POD_A, Some(1));
    flows.set_spread(ports::POD_A, true);
    let new_flows = |node: &Node| node.worker.pipeline().flows().stats().table.new;
    let a_to_service = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, CLUSTER_IP, 64, &PAYLOAD);
    let given = [
        (HOST, from_host(NODE, POD_A, 64)),
        (HOST, from_host(POD_A, REMOTE_POD_IPIP, 63)),
        (ports::POD_A, a_to_service),
    ];
    for (port, f) in &given {
        assert!(node.send(*port, f).is_empty(), "{port}: {f:?}");
    }
    assert_eq!(new_flows(&node), 0);
    let a_to_b = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &PAYLOAD);
    let kept = [
        (HOST, from_host(NODE, POD_B, 64), ports::POD_B),
        (HOST, from_host(POD_B, POD_A, 63), ports::POD_A),
        (HOST, from_host(POD_A, POD_B, 63), ports::POD_B),
        (ports::POD_A, a_to_b, ports::POD_B),
    ];
    for (port, f, to) in &kept {
        let out = node.send(*port, f);
        assert_eq!(out.len(), 1, "{port}: {f:?}");
        assert_eq!(out[0].0, *to);
    }
    // The last two are one flow (the kernel's copy of A -> B, then A's).
    assert_eq!(new_flows(&node), 3);
    assert_eq!(node.worker.counters().drops_for(DropReason::TxRingFull), 3);
    node.worker
        .pipeline_mut()
        .flows_mut()
        .set_flow_home(ports::POD_A, None);
    let to = [ports::POD_A, ports::UPLINK, HOST];
    for ((port, f), to) in given.iter().zip(to) {
        let out = node.send(*port, f);
        assert_eq!(out.len(), 1, "{port}: {f:?}");
        assert_eq!(out[0].0, to);
    }
    assert_eq!(new_flows(&node), 6);
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::TxRingFull), 3);
}

/// Two TAP pods (`Flows::set_spread`: either's kernel may send a flow's
/// packets on any worker's queue): a flow between them lives on the flow
/// home of the lower slot, A's, another worker here; so A -> B and B -> A,
/// from the pods and from the host port (after a DNAT), are given away
/// whichever pod sends, while B's flows with the host stay (B's home is
/// here). With A's home here they are all tracked and sent here (the test
/// fails if a direction stayed, or were given away regardless).
#[test]
fn flows_between_two_tap_pods_go_to_the_lower_slots_home_both_ways() {
    let mut node = node();
    let flows = node.worker.pipeline_mut().flows_mut();
    flows.set_flow_home(ports::POD_A, Some(1));
    for p in [ports::POD_A, ports::POD_B] {
        flows.set_spread(p, true);
    }
    let new_flows = |node: &Node| node.worker.pipeline().flows().stats().table.new;
    let pair = [
        (
            ports::POD_A,
            udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &PAYLOAD),
            ports::POD_B,
        ),
        (
            ports::POD_B,
            udp_reply(POD_B_MAC, GATEWAY_MAC, POD_B, POD_A, 64),
            ports::POD_A,
        ),
        (HOST, from_host(POD_B, POD_A, 63), ports::POD_A),
    ];
    for (port, f, _) in &pair {
        assert!(node.send(*port, f).is_empty(), "{port}: {f:?}");
    }
    assert_eq!(new_flows(&node), 0);
    let out = node.send(HOST, &from_host(NODE, POD_B, 64));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ports::POD_B);
    assert_eq!(new_flows(&node), 1);
    node.worker
        .pipeline_mut()
        .flows_mut()
        .set_flow_home(ports::POD_A, None);
    for (port, f, to) in &pair {
        let out = node.send(*port, f);
        assert_eq!(out.len(), 1, "{port}: {f:?}");
        assert_eq!(out[0].0, *to);
    }
    // A -> B and its reply are one flow.
    assert_eq!(new_flows(&node), 3);
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::TxRingFull), 3);
}

/// IPv6 meets the same rule: with TAP pod A's flows kept by another
/// worker, host -> A and A -> the host (fd00::/8 outside the pods, through
/// the default route) are given away; with A's flows kept here both are
/// tracked and sent.
#[test]
fn ipv6_flows_of_a_pod_with_the_host_port_go_to_the_worker_that_keeps_them() {
    let mut node = node();
    node.worker
        .pipeline_mut()
        .ports_mut()
        .get_mut(ports::POD_A)
        .unwrap()
        .addrs
        .push("fd00::2".parse().unwrap());
    node.fib.insert(
        "fd00::2/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_A },
    );
    node.fib.insert("::/0".parse().unwrap(), NextHop::Host);
    let flows = node.worker.pipeline_mut().flows_mut();
    flows.set_flow_home(ports::POD_A, Some(1));
    flows.set_spread(ports::POD_A, true);
    let sends = [
        (
            HOST,
            v6_frame(HOST_MAC, GATEWAY_MAC, "2001:db8::1", "fd00::2", 64),
            ports::POD_A,
        ),
        (
            ports::POD_A,
            v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "2001:db8::1", 64),
            HOST,
        ),
    ];
    for (port, f, _) in &sends {
        assert!(node.send(*port, f).is_empty(), "{port}: {f:?}");
    }
    node.worker
        .pipeline_mut()
        .flows_mut()
        .set_flow_home(ports::POD_A, None);
    for (port, f, to) in &sends {
        let out = node.send(*port, f);
        assert_eq!(out.len(), 1, "{port}: {f:?}");
        assert_eq!(out[0].0, *to);
    }
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::TxRingFull), 2);
    assert_eq!(node.worker.pipeline().flows().stats().table.new, 2);
}

/// Anti-spoofing on every frame a pod sends towards the host port (issue
/// 14, item 6): a source that is not the pod's (another pod's, or any
/// other) to the node, a ClusterIP or the outside, IPv4 and IPv6, is a
/// counted `spoofed` drop and nothing reaches the host port; the pod's own
/// sources pass (the test fails if the check were only on pod-to-pod).
#[test]
fn every_forged_source_towards_the_host_port_is_a_counted_spoofed_drop() {
    let mut node = node();
    node.worker
        .pipeline_mut()
        .ports_mut()
        .get_mut(ports::POD_A)
        .unwrap()
        .addrs
        .push("fd00::2".parse().unwrap());
    node.fib.insert("::/0".parse().unwrap(), NextHop::Host);
    let forged = Ipv4Addr::new(10, 65, 0, 99);
    let v4 = |src| udp_frame(POD_A_MAC, GATEWAY_MAC, src, OUTSIDE, 64, &PAYLOAD);
    let mut sends = Vec::new();
    for src in [forged, POD_B, NODE] {
        for dst in [NODE, CLUSTER_IP, OUTSIDE] {
            sends.push(udp_frame(POD_A_MAC, GATEWAY_MAC, src, dst, 64, &PAYLOAD));
        }
    }
    for src in ["fd00::3", "fd00::99", "2001:db8::7"] {
        sends.push(v6_frame(POD_A_MAC, GATEWAY_MAC, src, "2001:db8::1", 64));
    }
    for f in &sends {
        assert!(node.send(ports::POD_A, f).is_empty(), "{f:?}");
    }
    assert_eq!(
        node.worker.counters().drops_for(DropReason::Spoofed),
        sends.len() as u64
    );
    // The pod's own addresses reach the host.
    let own = [
        v4(POD_A),
        v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "2001:db8::1", 64),
    ];
    for f in &own {
        let out = node.send(ports::POD_A, f);
        assert_eq!(out.len(), 1, "{f:?}");
        assert_eq!(out[0].0, HOST);
    }
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::Spoofed), sends.len() as u64);
}

fn v6_frame(src_mac: [u8; 6], dst_mac: [u8; 6], src: &str, dst: &str, hop_limit: u8) -> Vec<u8> {
    let src: std::net::Ipv6Addr = src.parse().unwrap();
    let dst: std::net::Ipv6Addr = dst.parse().unwrap();
    let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac)
        .ipv6(src.octets(), dst.octets(), hop_limit)
        .udp(40000, 5000);
    let mut v = Vec::new();
    b.write(&mut v, &PAYLOAD).unwrap();
    v
}

#[test]
fn ipv6_through_the_host_port_ndp_both_ways_and_no_hairpin() {
    let mut node = node();
    node.worker
        .pipeline_mut()
        .ports_mut()
        .get_mut(ports::POD_A)
        .unwrap()
        .addrs
        .push("fd00::2".parse().unwrap());
    node.fib.insert(
        "fd00::2/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_A },
    );
    node.fib.insert("::/0".parse().unwrap(), NextHop::Host);
    // The kernel resolves the pods' IPv6 gateway on brindle0.
    let gw: std::net::Ipv6Addr = "fe80::ecee:eeff:feee:eeee".parse().unwrap();
    let mut ns = gw.octets().to_vec();
    ns.extend_from_slice(&[1, 1]);
    ns.extend_from_slice(&HOST_MAC);
    let b = etherparse::PacketBuilder::ethernet2(HOST_MAC, [0x33, 0x33, 0xff, 0xee, 0xee, 0xee])
        .ipv6(
            "fe80::b0:ff:fe00:1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            "ff02::1:ffee:eeee"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            255,
        )
        .icmpv6(etherparse::Icmpv6Type::NeighborSolicitation);
    let mut f = Vec::new();
    b.write(&mut f, &ns).unwrap();
    let out = node.send(HOST, &f);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, HOST);
    assert_eq!(&out[0].1[..12], &[HOST_MAC, GATEWAY_MAC].concat()[..]);
    assert_eq!(out[0].1[54], 136, "a neighbor advertisement");
    // Host → pod, pod → outside, and the host's hairpin.
    let out = node.send(
        HOST,
        &v6_frame(HOST_MAC, GATEWAY_MAC, "2001:db8::1", "fd00::2", 64),
    );
    let want = v6_frame(GATEWAY_MAC, POD_A_MAC, "2001:db8::1", "fd00::2", 63);
    assert_frames(&out, &[(ports::POD_A, want)]);
    let out = node.send(
        ports::POD_A,
        &v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "2001:db8::1", 64),
    );
    let want = v6_frame(GATEWAY_MAC, HOST_MAC, "fd00::2", "2001:db8::1", 63);
    assert_frames(&out, &[(HOST, want)]);
    let hairpin = v6_frame(HOST_MAC, GATEWAY_MAC, "2001:db8::1", "2001:db8::2", 64);
    assert!(node.send(HOST, &hairpin).is_empty());
    let c = finish(&node);
    assert_eq!((c.nd_adverts, c.forwarded), (1, 2));
    assert_eq!(c.drops_for(DropReason::HostHairpin), 1);
}
