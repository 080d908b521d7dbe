//! Frames to an underlay next hop whose MAC is not known yet: held (a few
//! per next hop), sent when the ARP reply is learned, counted when the
//! queue is full or the next hop never answers. Exact bytes, built with
//! etherparse (`brindle_vrouter::demo::frames`).

use std::net::Ipv4Addr;

use brindle_vrouter::counters::DropReason;
use brindle_vrouter::demo::frames::{self, ethernet, ipv4_header, udp_frame, udp_packet};
use brindle_vrouter::demo::{Node, addr::*, frames_diff, ports};
use brindle_vrouter::endpoint::GATEWAY_MAC;
use brindle_vrouter::fib::NextHop;
use brindle_vrouter::frame::PortId;
use brindle_vrouter::neigh::{UNRESOLVED_QUEUE_LEN, UNRESOLVED_TIMEOUT};

/// The MAC the unresolved remote node answers with.
const PEER_MAC: [u8; 6] = [0x02, 0, 0xc0, 0xa8, 0, 0x04];

fn assert_frames(got: &[(PortId, Vec<u8>)], want: &[(PortId, Vec<u8>)]) {
    if let Some(diff) = frames_diff(got, want) {
        panic!("frames differ\n{diff}");
    }
}

/// Pod A's UDP datagram number `n` (the payload says which).
fn pod_a_udp(dst: Ipv4Addr, n: u8) -> Vec<u8> {
    udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, 64, &[n; 18])
}

/// What leaves the uplink for datagram `n` once the remote node's MAC is
/// known: IPIP to it, outer TTL inherited, DF set, IP ID `ident`.
fn ipip_to_unresolved(n: u8, ident: u16) -> Vec<u8> {
    let inner = udp_packet(POD_A, REMOTE_POD_UNRESOLVED, 63, &[n; 18]);
    let mut outer = ipv4_header(NODE, REMOTE_UNRESOLVED, 4, inner.len(), 63, ident, true, 0);
    outer.extend_from_slice(&inner);
    ethernet(UPLINK_MAC, PEER_MAC, 0x0800, &outer)
}

/// The remote node's ARP reply to the node's request.
fn arp_reply_from_unresolved() -> Vec<u8> {
    let mut p = vec![0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02];
    p.extend_from_slice(&PEER_MAC);
    p.extend_from_slice(&REMOTE_UNRESOLVED.octets());
    p.extend_from_slice(&UPLINK_MAC);
    p.extend_from_slice(&NODE.octets());
    ethernet(PEER_MAC, UPLINK_MAC, 0x0806, &p)
}

/// Counters balance, with nothing held and every chunk free.
fn finish_with_nothing_held(node: &Node) -> brindle_vrouter::counters::Counters {
    let c = node.worker.counters();
    assert!(c.balanced(), "counters do not balance: {c:?}");
    assert_eq!(
        (c.neighbor_held, node.worker.pipeline().held_frames()),
        (0, 0)
    );
    assert!(node.all_frames_free(), "a frame leaked from the arena");
    c
}

#[test]
fn the_first_frame_to_an_unresolved_next_hop_leaves_when_the_reply_arrives() {
    let mut node = Node::new();
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 1));
    let request = frames::arp_request(UPLINK_MAC, NODE, REMOTE_UNRESOLVED);
    assert_frames(&out, &[(ports::UPLINK, request)]);
    let c = node.worker.counters();
    assert_eq!((c.neighbor_held, c.dropped(), c.forwarded), (1, 0, 0));
    assert!(c.balanced());
    assert!(!node.all_frames_free(), "the frame waits in its chunk");

    let out = node.send(ports::UPLINK, &arp_reply_from_unresolved());
    assert_frames(&out, &[(ports::UPLINK, ipip_to_unresolved(1, 1))]);
    let c = finish_with_nothing_held(&node);
    assert_eq!(
        (
            c.forwarded,
            c.neighbor_released,
            c.arp_learned,
            c.encap_ipip
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(c.dropped(), 0);
}

#[test]
fn the_fifth_frame_to_an_unresolved_next_hop_is_counted_and_four_leave_in_order() {
    let mut node = Node::new();
    for n in 1..=5u8 {
        let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, n));
        // One ARP request (the first miss); the rest wait for its answer.
        assert_eq!(out.len(), usize::from(n == 1), "frame {n}");
    }
    let c = node.worker.counters();
    assert_eq!(UNRESOLVED_QUEUE_LEN, 4);
    assert_eq!(c.neighbor_held, 4);
    assert_eq!(c.drops_for(DropReason::NeighborQueueFull), 1);
    assert_eq!(c.dropped(), 1);
    assert!(c.balanced());

    let out = node.send(ports::UPLINK, &arp_reply_from_unresolved());
    // Datagrams 1-4, in the order sent, with the IP IDs they got when they
    // were encapsulated.
    let want: Vec<_> = (1..=4u8)
        .map(|n| (ports::UPLINK, ipip_to_unresolved(n, u16::from(n))))
        .collect();
    assert_frames(&out, &want);
    let c = finish_with_nothing_held(&node);
    assert_eq!((c.forwarded, c.neighbor_released), (4, 4));
    assert_eq!(
        DropReason::NeighborQueueFull.name(),
        "neighbor_queue_full",
        "the metrics label"
    );
}

#[test]
fn frames_of_a_next_hop_that_never_resolves_are_freed_after_the_timeout() {
    let mut node = Node::new();
    node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 1));
    node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 2));
    assert_eq!(node.worker.pipeline().held_frames(), 2);
    assert!(node.no_frame_leaked(), "held frames are accounted for");

    // Just before the timeout, the frames still wait.
    node.now += UNRESOLVED_TIMEOUT - std::time::Duration::from_millis(10);
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 3));
    assert_eq!(out.len(), 1, "pod to pod meanwhile");
    assert_eq!(node.worker.pipeline().held_frames(), 2);

    // After it, the next burst frees them: dropped and counted, no chunk
    // lost, and nothing sent to the unresolved node.
    node.now += std::time::Duration::from_millis(20);
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 4));
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &[4; 18]);
    assert_frames(&out, &[(ports::POD_B, want)]);
    let c = finish_with_nothing_held(&node);
    assert_eq!(c.drops_for(DropReason::NeighborTimeout), 2);
    assert_eq!(c.dropped(), 2);
    assert_eq!(c.neighbor_released, 0);
    assert_eq!(DropReason::NeighborTimeout.name(), "neighbor_timeout");

    // A late reply finds nothing to send.
    let out = node.send(ports::UPLINK, &arp_reply_from_unresolved());
    assert!(out.is_empty());
    finish_with_nothing_held(&node);
}

#[test]
fn a_gateway_entry_set_by_the_control_side_releases_the_held_frames() {
    // A native route via an underlay gateway (cross-subnet mode's routes to
    // nodes on the same subnet, or a top-of-rack route), resolved not by
    // the vrouter's ARP but by the control side (the kernel's table).
    let mut node = Node::new();
    let gw = Ipv4Addr::new(192, 168, 0, 9);
    let gw_mac = [0x02, 0, 0, 0, 0, 0x09];
    let far = Ipv4Addr::new(10, 70, 0, 1);
    node.fib.insert(
        "10.70.0.0/26".parse().unwrap(),
        NextHop::Gateway {
            via: gw.into(),
            port: ports::UPLINK,
        },
    );
    let out = node.send(ports::POD_A, &pod_a_udp(far, 1));
    assert_frames(
        &out,
        &[(ports::UPLINK, frames::arp_request(UPLINK_MAC, NODE, gw))],
    );
    node.worker
        .pipeline_mut()
        .neigh_mut()
        .insert(ports::UPLINK, gw.into(), gw_mac);
    // The next burst (any frame, here pod to pod) sends the held one first.
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 2));
    assert_frames(
        &out,
        &[
            (
                ports::POD_B,
                udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &[2; 18]),
            ),
            (
                ports::UPLINK,
                udp_frame(UPLINK_MAC, gw_mac, POD_A, far, 63, &[1; 18]),
            ),
        ],
    );
    let c = finish_with_nothing_held(&node);
    assert_eq!((c.forwarded, c.neighbor_released), (2, 1));
}
