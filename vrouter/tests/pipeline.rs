//! Pipeline tests on the demo node: exact bytes out for every behaviour,
//! drop counters, and no frame leaked from the arena after any test.
//!
//! Expected frames are built with etherparse (`brindle_vrouter::demo::frames`),
//! an implementation independent of `brindle-wire`, or written out byte by
//! byte.

use std::net::Ipv4Addr;
use std::time::Duration;

use brindle_vrouter::counters::{Counters, DropReason};
use brindle_vrouter::demo::frames::{self, ethernet, ipv4_header, udp_frame, udp_packet};
use brindle_vrouter::demo::{Node, VNI, addr::*, describe, frames_diff, ports};
use brindle_vrouter::endpoint::{GATEWAY_MAC, GATEWAY_V4};
use brindle_vrouter::fib::{Encap, NextHop};
use brindle_vrouter::frame::PortId;
use brindle_vrouter::neigh::ResolveRequest;
use brindle_vrouter::pipeline::{PipelineConfig, vtep_mac};
use etherparse::{Icmpv4Header, Icmpv4Type, icmpv4};

const PAYLOAD: [u8; 18] = [0x42; 18];

/// Fails with decoded frames rather than byte dumps.
fn assert_frames(got: &[(PortId, Vec<u8>)], want: &[(PortId, Vec<u8>)]) {
    if let Some(diff) = frames_diff(got, want) {
        panic!("frames differ\n{diff}");
    }
}

/// Every test ends here: counters balance and every chunk is free again.
fn finish(node: &Node) -> Counters {
    let c = node.worker.counters();
    assert!(c.balanced(), "counters do not balance: {c:?}");
    assert!(node.no_frame_leaked(), "a frame leaked from the arena");
    c
}

fn pod_a_udp(dst: Ipv4Addr, ttl: u8) -> Vec<u8> {
    udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, ttl, &PAYLOAD)
}

fn icmp_error_frame(error: Icmpv4Type, quoted: &[u8], ident: u16) -> Vec<u8> {
    let icmp = Icmpv4Header::with_checksum(error, quoted);
    let mut ip = ipv4_header(
        NODE,
        POD_A,
        1,
        icmp.header_len() + quoted.len(),
        64,
        ident,
        false,
        0xc0,
    );
    ip.extend_from_slice(&icmp.to_bytes());
    ip.extend_from_slice(quoted);
    ethernet(GATEWAY_MAC, POD_A_MAC, 0x0800, &ip)
}

#[test]
fn pod_to_pod_on_the_same_node_rewrites_macs_and_decrements_ttl() {
    let mut node = Node::new();
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 64));
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD);
    assert_frames(&out, &[(ports::POD_B, want)]);
    let c = finish(&node);
    assert_eq!((c.rx_packets, c.tx_packets, c.forwarded), (1, 1, 1));
}

/// The folded IPv4 pseudo-header sum of a UDP datagram, computed here
/// independently of the wire crate: what a pod's kernel leaves in the
/// checksum field when TX checksum offload is on (CHECKSUM_PARTIAL).
fn partial_udp_checksum(frame: &[u8]) -> u16 {
    let ip = &frame[14..34];
    let udp_len = u16::from_be_bytes([frame[38], frame[39]]);
    let mut sum: u32 = [&ip[12..14], &ip[14..16], &ip[16..18], &ip[18..20]]
        .iter()
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    sum += 17 + u32::from(udp_len);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[test]
fn a_checksum_left_to_offload_by_the_pod_is_completed() {
    let mut node = Node::new();
    let mut frame = pod_a_udp(POD_B, 64);
    let partial = partial_udp_checksum(&frame);
    frame[40..42].copy_from_slice(&partial.to_be_bytes());
    let out = node.send(ports::POD_A, &frame);
    // The same frame as with a complete checksum from the start.
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD);
    assert_ne!(
        &want[40..42],
        &partial.to_be_bytes(),
        "test needs a real fix"
    );
    assert_frames(&out, &[(ports::POD_B, want)]);
    finish(&node);
}

#[test]
fn pod_to_remote_pod_over_ipip_has_the_exact_outer_header() {
    let mut node = Node::new();
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_IPIP, 64));
    let inner = udp_packet(POD_A, REMOTE_POD_IPIP, 63, &PAYLOAD);
    // Outer: TTL inherited from the inner packet, DF set, IP ID 1 (the
    // worker's first), protocol 4, node -> remote node.
    let mut outer = ipv4_header(NODE, REMOTE_IPIP, 4, inner.len(), 63, 1, true, 0);
    outer.extend_from_slice(&inner);
    let want = ethernet(UPLINK_MAC, REMOTE_IPIP_MAC, 0x0800, &outer);
    assert_frames(&out, &[(ports::UPLINK, want.clone())]);
    // The outer 34 bytes, written out.
    #[rustfmt::skip]
    let outer_bytes: [u8; 34] = [
        0x02, 0x00, 0xc0, 0xa8, 0x00, 0x02, 0x02, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0x08, 0x00,
        0x45, 0x00, 0x00, 0x42, 0x00, 0x01, 0x40, 0x00, 0x3f, 0x04, 0x00, 0x00,
        192, 168, 0, 1, 192, 168, 0, 2,
    ];
    let mut got_outer = out[0].1[..34].to_vec();
    got_outer[24..26].copy_from_slice(&[0, 0]); // checksum compared via `want`
    assert_eq!(got_outer, outer_bytes);
    let c = finish(&node);
    assert_eq!(c.encap_ipip, 1);
}

#[test]
fn pod_to_remote_pod_over_vxlan_has_the_exact_outer_headers() {
    let mut node = Node::new();
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_VXLAN, 64));
    assert_eq!(out.len(), 1, "{out:?}");
    let src_port = u16::from_be_bytes([out[0].1[34], out[0].1[35]]);
    assert!((32768..60999).contains(&src_port), "source port {src_port}");
    let inner = udp_frame(
        vtep_mac(NODE),
        vtep_mac(REMOTE_VXLAN),
        POD_A,
        REMOTE_POD_VXLAN,
        63,
        &PAYLOAD,
    );
    let want = frames::vxlan_frame(
        UPLINK_MAC,
        REMOTE_VXLAN_MAC,
        NODE,
        REMOTE_VXLAN,
        src_port,
        4096,
        &inner,
        1,
    );
    assert_frames(&out, &[(ports::UPLINK, want)]);
    // UDP checksum 0, VXLAN flags I, VNI 4096.
    assert_eq!(
        &out[0].1[40..50],
        &[0, 0, 0x08, 0, 0, 0, 0x00, 0x10, 0x00, 0x00]
    );
    // The same flow always gets the same source port (ECMP stickiness).
    let again = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_VXLAN, 64));
    assert_eq!(&again[0].1[34..36], &src_port.to_be_bytes());
    let c = finish(&node);
    assert_eq!(c.encap_vxlan, 2);
}

#[test]
fn vxlan_udp_checksum_is_computed_when_configured() {
    let mut cfg = PipelineConfig::new(NODE, 24);
    cfg.vxlan_udp_checksum = brindle_vrouter::wire::UdpChecksum::Compute;
    let mut node = Node::with_config(cfg);
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_VXLAN, 64));
    let f = &out[0].1;
    assert_ne!(&f[40..42], &[0, 0]);
    let udp = brindle_vrouter::wire::UdpPacket::new_checked(&f[34..]).unwrap();
    assert!(udp.verify_checksum(NODE, REMOTE_VXLAN));
    finish(&node);
}

#[test]
fn remote_to_pod_ipip_is_decapsulated() {
    let mut node = Node::new();
    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 63, &PAYLOAD);
    let f = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, &inner);
    let out = node.send(ports::UPLINK, &f);
    let want = udp_frame(GATEWAY_MAC, POD_A_MAC, REMOTE_POD_IPIP, POD_A, 62, &PAYLOAD);
    assert_frames(&out, &[(ports::POD_A, want)]);
    assert_eq!(finish(&node).decap_ipip, 1);
}

#[test]
fn remote_to_pod_vxlan_is_decapsulated_and_padding_dropped() {
    let mut node = Node::new();
    let inner = udp_frame(
        vtep_mac(REMOTE_VXLAN),
        vtep_mac(NODE),
        REMOTE_POD_VXLAN,
        POD_A,
        63,
        &PAYLOAD,
    );
    let mut f = frames::vxlan_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        REMOTE_VXLAN,
        NODE,
        50000,
        4096,
        &inner,
        9,
    );
    f.extend_from_slice(&[0; 6]); // Ethernet padding behind the outer packet
    let out = node.send(ports::UPLINK, &f);
    let want = udp_frame(
        GATEWAY_MAC,
        POD_A_MAC,
        REMOTE_POD_VXLAN,
        POD_A,
        62,
        &PAYLOAD,
    );
    assert_frames(&out, &[(ports::POD_A, want)]);
    assert_eq!(finish(&node).decap_vxlan, 1);
}

#[test]
fn vxlan_with_another_vni_or_port_is_not_for_us() {
    let mut node = Node::new();
    let inner = udp_frame([2; 6], [4; 6], REMOTE_POD_VXLAN, POD_A, 63, &PAYLOAD);
    let f = frames::vxlan_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        REMOTE_VXLAN,
        NODE,
        50000,
        7,
        &inner,
        1,
    );
    assert!(node.send(ports::UPLINK, &f).is_empty());
    // Plain UDP to the node (say DNS) is the kernel's, not ours.
    let dns = udp_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        REMOTE_VXLAN,
        NODE,
        64,
        &PAYLOAD,
    );
    assert!(node.send(ports::UPLINK, &dns).is_empty());
    assert_eq!(finish(&node).drops_for(DropReason::NotForUs), 2);
}

#[test]
fn the_uplink_does_not_carry_transit_traffic() {
    let mut node = Node::new();
    let f = udp_frame(
        REMOTE_IPIP_MAC,
        UPLINK_MAC,
        REMOTE_POD_IPIP,
        REMOTE_POD_VXLAN,
        64,
        &PAYLOAD,
    );
    assert!(node.send(ports::UPLINK, &f).is_empty());
    // But a native frame to a local pod (cross-subnet peers) is delivered.
    let f = udp_frame(
        REMOTE_IPIP_MAC,
        UPLINK_MAC,
        REMOTE_POD_IPIP,
        POD_B,
        64,
        &PAYLOAD,
    );
    let out = node.send(ports::UPLINK, &f);
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, REMOTE_POD_IPIP, POD_B, 63, &PAYLOAD);
    assert_frames(&out, &[(ports::POD_B, want)]);
    assert_eq!(finish(&node).drops_for(DropReason::NotForUs), 1);
}

#[test]
fn proxy_arp_reply_bytes() {
    let mut node = Node::new();
    let out = node.send(
        ports::POD_B,
        &frames::arp_request(POD_B_MAC, POD_B, GATEWAY_V4),
    );
    #[rustfmt::skip]
    let want = vec![
        0x0a, 0x58, 0x0a, 0x41, 0x00, 0x03, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x08, 0x06,
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02,
        0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 169, 254, 1, 1,
        0x0a, 0x58, 0x0a, 0x41, 0x00, 0x03, 10, 65, 0, 3,
    ];
    assert_frames(&out, &[(ports::POD_B, want)]);
    // Any other address is answered too; the pod's own is not.
    assert_eq!(
        node.send(ports::POD_B, &frames::arp_request(POD_B_MAC, POD_B, POD_A))
            .len(),
        1
    );
    assert!(
        node.send(ports::POD_B, &frames::arp_request(POD_B_MAC, POD_B, POD_B))
            .is_empty()
    );
    let c = finish(&node);
    assert_eq!(c.arp_replies, 2);
}

#[test]
fn the_uplink_never_answers_arp() {
    let mut node = Node::new();
    for target in [NODE, POD_A, GATEWAY_V4] {
        let req = frames::arp_request(REMOTE_IPIP_MAC, REMOTE_IPIP, target);
        assert!(
            node.send(ports::UPLINK, &req).is_empty(),
            "answered {target}"
        );
    }
    let c = finish(&node);
    assert_eq!(c.arp_replies, 0);
}

#[test]
fn spoofed_source_is_dropped_and_counted() {
    let mut node = Node::new();
    let f = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_B, REMOTE_POD_IPIP, 64, &PAYLOAD);
    assert!(node.send(ports::POD_A, &f).is_empty());
    let f = udp_frame(
        POD_A_MAC,
        GATEWAY_MAC,
        Ipv4Addr::new(8, 8, 8, 8),
        POD_B,
        64,
        &PAYLOAD,
    );
    assert!(node.send(ports::POD_A, &f).is_empty());
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::Spoofed), 2);
    assert_eq!(c.tx_packets, 0);
}

#[test]
fn ttl_expiry_is_answered_with_icmp_time_exceeded() {
    let mut node = Node::new();
    let sent = pod_a_udp(POD_B, 1);
    let out = node.send(ports::POD_A, &sent);
    // Quote: the original IPv4 header and 8 bytes (the UDP header), TTL 1.
    let quoted = &sent[14..14 + 28];
    let want = icmp_error_frame(
        Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit),
        quoted,
        1,
    );
    assert_frames(&out, &[(ports::POD_A, want)]);
    let c = finish(&node);
    assert_eq!((c.icmp_generated, c.forwarded), (1, 0));
}

#[test]
fn ttl_expiry_of_a_decapsulated_packet_goes_back_through_the_tunnel() {
    let mut node = Node::new();
    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 1, &PAYLOAD);
    let f = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, &inner);
    let out = node.send(ports::UPLINK, &f);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ports::UPLINK);
    let d = describe(&out[0].1);
    assert!(
        d.contains("192.168.0.1 > 192.168.0.2") && d.contains("ICMP time exceeded"),
        "{d}"
    );
    finish(&node);
}

#[test]
fn oversized_df_packet_is_answered_with_fragmentation_needed() {
    for (dst, mtu) in [
        (POD_B, 1500u16),
        (REMOTE_POD_IPIP, 1480),
        (REMOTE_POD_VXLAN, 1450),
    ] {
        let mut node = Node::new();
        let too_big = usize::from(mtu) + 1 - 28;
        let sent = udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, 64, &vec![0; too_big]);
        let out = node.send(ports::POD_A, &sent);
        let want = icmp_error_frame(
            Icmpv4Type::DestinationUnreachable(
                icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: mtu },
            ),
            &sent[14..14 + 28],
            1,
        );
        assert_frames(&out, &[(ports::POD_A, want)]);
        // One byte less fits.
        let fits = udp_frame(
            POD_A_MAC,
            GATEWAY_MAC,
            POD_A,
            dst,
            64,
            &vec![0; too_big - 1],
        );
        assert_eq!(node.send(ports::POD_A, &fits).len(), 1, "to {dst}");
        let c = finish(&node);
        assert_eq!((c.icmp_generated, c.forwarded), (1, 1));
    }
}

#[test]
fn oversized_packet_without_df_is_dropped_as_mtu() {
    let mut node = Node::new();
    let inner = {
        let payload = vec![0u8; 1481 - 20];
        let mut p = ipv4_header(POD_A, REMOTE_POD_IPIP, 253, payload.len(), 64, 5, false, 0);
        p.extend_from_slice(&payload);
        p
    };
    let f = ethernet(POD_A_MAC, GATEWAY_MAC, 0x0800, &inner);
    assert!(node.send(ports::POD_A, &f).is_empty());
    assert_eq!(finish(&node).drops_for(DropReason::Mtu), 1);
}

#[test]
fn unknown_ethertype_is_dropped_and_counted() {
    let mut node = Node::new();
    for ethertype in [0x88cc_u16, 0x8847, 0x9000] {
        let f = ethernet(POD_A_MAC, GATEWAY_MAC, ethertype, &[0u8; 46]);
        assert!(node.send(ports::POD_A, &f).is_empty());
    }
    assert_eq!(finish(&node).drops_for(DropReason::UnknownEthertype), 3);
}

#[test]
fn a_vlan_tagged_frame_is_forwarded_untagged() {
    let mut node = Node::new();
    let plain = pod_a_udp(POD_B, 64);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
    tagged.extend_from_slice(&plain[12..]);
    let out = node.send(ports::POD_A, &tagged);
    let want = udp_frame(GATEWAY_MAC, POD_B_MAC, POD_A, POD_B, 63, &PAYLOAD);
    assert_frames(&out, &[(ports::POD_B, want)]);
    finish(&node);
}

#[test]
fn truncated_frames_at_every_length_are_parse_errors() {
    let inner_vx = udp_frame(
        vtep_mac(REMOTE_VXLAN),
        vtep_mac(NODE),
        REMOTE_POD_VXLAN,
        POD_A,
        63,
        &PAYLOAD,
    );
    let cases: Vec<(PortId, Vec<u8>)> = vec![
        (ports::POD_A, pod_a_udp(POD_B, 64)),
        (ports::POD_A, pod_a_udp(REMOTE_POD_VXLAN, 64)),
        (
            ports::POD_A,
            frames::arp_request(POD_A_MAC, POD_A, GATEWAY_V4),
        ),
        (
            ports::UPLINK,
            frames::ipip_frame(
                REMOTE_IPIP_MAC,
                UPLINK_MAC,
                REMOTE_IPIP,
                NODE,
                &udp_packet(REMOTE_POD_IPIP, POD_A, 63, &PAYLOAD),
            ),
        ),
        (
            ports::UPLINK,
            frames::vxlan_frame(
                REMOTE_VXLAN_MAC,
                UPLINK_MAC,
                REMOTE_VXLAN,
                NODE,
                50000,
                4096,
                &inner_vx,
                1,
            ),
        ),
    ];
    for (port, frame) in cases {
        let mut node = Node::new();
        for n in 0..frame.len() {
            let out = node.send(port, &frame[..n]);
            assert!(
                out.is_empty(),
                "{n} bytes of {} were forwarded",
                describe(&frame)
            );
            let c = node.worker.counters();
            assert_eq!(
                c.drops_for(DropReason::ParseError),
                n as u64 + 1,
                "length {n}"
            );
        }
        assert_eq!(node.send(port, &frame).len(), 1, "the whole frame forwards");
        finish(&node);
    }
}

#[test]
fn a_bad_ip_checksum_is_a_parse_error() {
    let mut node = Node::new();
    let mut f = pod_a_udp(POD_B, 64);
    f[24] ^= 0xff;
    assert!(node.send(ports::POD_A, &f).is_empty());
    assert_eq!(finish(&node).drops_for(DropReason::ParseError), 1);
}

#[test]
fn no_route_and_blackhole_are_counted() {
    let mut node = Node::new();
    assert!(
        node.send(ports::POD_A, &pod_a_udp(Ipv4Addr::new(172, 16, 0, 1), 64))
            .is_empty()
    );
    assert!(
        node.send(ports::POD_A, &pod_a_udp(BLACKHOLED, 64))
            .is_empty()
    );
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::NoRoute), 1);
    assert_eq!(c.drops_for(DropReason::Blackhole), 1);
}

#[test]
fn host_next_hop_without_a_host_port_is_a_counted_drop() {
    let mut node = Node::new();
    node.fib.insert("0.0.0.0/0".parse().unwrap(), NextHop::Host);
    assert!(
        node.send(ports::POD_A, &pod_a_udp(Ipv4Addr::new(1, 1, 1, 1), 64))
            .is_empty()
    );
    assert_eq!(finish(&node).drops_for(DropReason::NoHostPort), 1);
}

#[test]
fn neighbour_miss_sends_one_arp_request_then_learns_the_reply() {
    let mut node = Node::new();
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 64));
    let want = frames::arp_request(UPLINK_MAC, NODE, REMOTE_UNRESOLVED);
    assert_frames(&out, &[(ports::UPLINK, want)]);
    // Within the resolve interval: held too, no second request.
    assert!(
        node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 64))
            .is_empty()
    );
    let events: Vec<_> = node
        .worker
        .pipeline_mut()
        .neigh_mut()
        .drain_resolve()
        .collect();
    assert_eq!(
        events,
        vec![ResolveRequest {
            port: ports::UPLINK,
            addr: REMOTE_UNRESOLVED.into()
        }]
    );
    // The reply, addressed to the node, is learned.
    let peer_mac = [0x02, 0, 0xc0, 0xa8, 0, 0x04];
    let mut reply = frames::arp_request(peer_mac, REMOTE_UNRESOLVED, NODE);
    reply[..6].copy_from_slice(&UPLINK_MAC);
    reply[21] = 2;
    reply[32..38].copy_from_slice(&UPLINK_MAC);
    // The two held frames leave with it (exact bytes: tests/pipeline_neigh.rs).
    let out = node.send(ports::UPLINK, &reply);
    assert_eq!(out.len(), 2);
    assert!(
        out.iter()
            .all(|(p, f)| *p == ports::UPLINK && f[..6] == peer_mac)
    );
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 64));
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0].1[..6], &peer_mac);
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::NoNeighbour), 0);
    assert_eq!((c.neighbor_held, c.neighbor_released), (0, 2));
    assert_eq!(
        (c.arp_requests, c.generated, c.arp_learned, c.consumed),
        (1, 1, 1, 1)
    );
    // After the interval a new miss asks again.
    node.now += Duration::from_secs(2);
    node.worker
        .pipeline_mut()
        .neigh_mut()
        .remove(ports::UPLINK, REMOTE_UNRESOLVED.into());
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_UNRESOLVED, 64));
    assert_eq!(out.len(), 1, "a new ARP request");
    finish(&node);
}

#[test]
fn a_full_tx_ring_is_a_counted_drop_and_leaks_nothing() {
    let mut node = Node::new();
    node.handles[ports::POD_B as usize].set_tx_room(Some(0));
    assert!(node.send(ports::POD_A, &pod_a_udp(POD_B, 64)).is_empty());
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::TxRingFull), 1);
}

#[test]
fn cross_subnet_mode_routes_on_link_nodes_natively() {
    let mut cfg = PipelineConfig::new(NODE, 24);
    cfg.cross_subnet = true;
    cfg.underlay_gateway = Some(Ipv4Addr::new(192, 168, 0, 254));
    let mut node = Node::with_config(cfg);
    let out = node.send(ports::POD_A, &pod_a_udp(REMOTE_POD_IPIP, 64));
    let want = udp_frame(
        UPLINK_MAC,
        REMOTE_IPIP_MAC,
        POD_A,
        REMOTE_POD_IPIP,
        63,
        &PAYLOAD,
    );
    assert_frames(&out, &[(ports::UPLINK, want)]);
    // A node on another subnet is still encapsulated, via the gateway.
    let far = Ipv4Addr::new(10, 0, 9, 9);
    node.fib.insert(
        "10.65.9.0/26".parse().unwrap(),
        NextHop::Encap {
            encap: Encap::Ipip,
            remote: far,
        },
    );
    let gw_mac = [0x02, 0, 0, 0, 0, 0xfe];
    node.worker.pipeline_mut().neigh_mut().insert(
        ports::UPLINK,
        Ipv4Addr::new(192, 168, 0, 254).into(),
        gw_mac,
    );
    let out = node.send(ports::POD_A, &pod_a_udp(Ipv4Addr::new(10, 65, 9, 1), 64));
    assert_eq!(out.len(), 1);
    let f = &out[0].1;
    assert_eq!(&f[..6], &gw_mac);
    assert_eq!(f[23], 4, "IPIP");
    assert_eq!(&f[30..34], &far.octets());
    finish(&node);
}

#[test]
fn a_pods_mac_is_learned_when_not_configured() {
    let mut node = Node::new();
    node.worker
        .pipeline_mut()
        .ports_mut()
        .get_mut(ports::POD_B)
        .unwrap()
        .peer_mac = None;
    assert!(node.send(ports::POD_A, &pod_a_udp(POD_B, 64)).is_empty());
    // Pod B speaks (an ARP for its gateway): now its MAC is known.
    node.send(
        ports::POD_B,
        &frames::arp_request(POD_B_MAC, POD_B, GATEWAY_V4),
    );
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 64));
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0].1[..6], &POD_B_MAC);
    assert_eq!(finish(&node).drops_for(DropReason::NoNeighbour), 1);
}

#[test]
fn a_pods_mac_that_changes_is_followed_but_never_a_multicast_one() {
    let mut node = Node::new();
    let new_mac = [0x02, 0xbb, 0, 0, 0, 0x42];
    // Pod B's MAC changed after ADD: it speaks from the new one.
    node.send(
        ports::POD_B,
        &frames::arp_request(new_mac, POD_B, GATEWAY_V4),
    );
    let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 64));
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0].1[..6], &new_mac, "sent to the MAC the pod uses now");
    // A multicast (or zero) source is not learned.
    for bad in [[0x03, 0xbb, 0, 0, 0, 0x43], [0; 6]] {
        node.send(ports::POD_B, &frames::arp_request(bad, POD_B, GATEWAY_V4));
        let out = node.send(ports::POD_A, &pod_a_udp(POD_B, 64));
        assert_eq!(&out[0].1[..6], &new_mac, "{bad:02x?} not learned");
    }
    finish(&node);
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

fn dual_stack_node() -> Node {
    let mut node = Node::new();
    let ports_table = node.worker.pipeline_mut().ports_mut();
    ports_table
        .get_mut(ports::POD_A)
        .unwrap()
        .addrs
        .push("fd00::2".parse().unwrap());
    ports_table
        .get_mut(ports::POD_B)
        .unwrap()
        .addrs
        .push("fd00::3".parse().unwrap());
    node.fib.insert(
        "fd00::2/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_A },
    );
    node.fib.insert(
        "fd00::3/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_B },
    );
    node
}

#[test]
fn ipv6_pod_to_pod_is_routed_natively_with_a_hop_limit_decrement() {
    let mut node = dual_stack_node();
    let out = node.send(
        ports::POD_A,
        &v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd00::3", 64),
    );
    let want = v6_frame(GATEWAY_MAC, POD_B_MAC, "fd00::2", "fd00::3", 63);
    assert_frames(&out, &[(ports::POD_B, want)]);
    assert_eq!(finish(&node).forwarded, 1);
}

#[test]
fn ipv6_spoofing_hop_limit_and_link_local_are_counted_drops() {
    let mut node = dual_stack_node();
    let sends = [
        v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::3", "fd00::2", 64),
        v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd00::3", 1),
        v6_frame(POD_A_MAC, GATEWAY_MAC, "fe80::1", "ff02::1:ff00:1", 255),
        v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd01::1", 64),
    ];
    for f in &sends {
        assert!(node.send(ports::POD_A, f).is_empty(), "{}", describe(f));
    }
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::Spoofed), 1);
    assert_eq!(c.drops_for(DropReason::Ttl), 1);
    assert_eq!(c.drops_for(DropReason::Unsupported), 1);
    assert_eq!(c.drops_for(DropReason::NoRoute), 1);
    // Truncated IPv6 at every length is a parse error.
    let full = v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd00::3", 64);
    let before = node.worker.counters().drops_for(DropReason::ParseError);
    for n in 14..full.len() {
        assert!(node.send(ports::POD_A, &full[..n]).is_empty());
    }
    let after = node.worker.counters().drops_for(DropReason::ParseError);
    assert_eq!(after - before, (full.len() - 14) as u64);
    finish(&node);
}

fn icmpv6_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    hop_limit: u8,
    icmp: etherparse::Icmpv6Type,
    payload: &[u8],
) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac)
        .ipv6(src.octets(), dst.octets(), hop_limit)
        .icmpv6(icmp);
    let mut v = Vec::new();
    b.write(&mut v, payload).unwrap();
    v
}

#[test]
fn a_pods_router_solicitations_and_mld_reports_are_consumed_not_errors() {
    let mut node = dual_stack_node();
    let pod_ll: std::net::Ipv6Addr = "fe80::858:aff:fe41:2".parse().unwrap();
    let all_routers: std::net::Ipv6Addr = "ff02::2".parse().unwrap();
    let mld_routers: std::net::Ipv6Addr = "ff02::16".parse().unwrap();
    let rs = icmpv6_frame(
        POD_A_MAC,
        [0x33, 0x33, 0, 0, 0, 2],
        pod_ll,
        all_routers,
        255,
        etherparse::Icmpv6Type::RouterSolicitation,
        &[],
    );
    assert!(node.send(ports::POD_A, &rs).is_empty());
    // An MLDv2 report (143) behind the hop-by-hop router alert.
    let mut mld = icmpv6_frame(
        POD_A_MAC,
        [0x33, 0x33, 0, 0, 0, 0x16],
        pod_ll,
        mld_routers,
        1,
        etherparse::Icmpv6Type::Unknown {
            type_u8: 143,
            code_u8: 0,
            bytes5to8: [0, 0, 0, 0],
        },
        &[],
    );
    mld[14 + 6] = 0;
    let plen = u16::from_be_bytes([mld[18], mld[19]]) + 8;
    mld[18..20].copy_from_slice(&plen.to_be_bytes());
    mld.splice(54..54, [58, 0, 5, 2, 0, 0, 1, 0]);
    assert!(node.send(ports::POD_A, &mld).is_empty());
    let c = finish(&node);
    assert_eq!((c.consumed, c.dropped()), (2, 0), "{c:?}");
}

#[test]
fn proxy_ndp_answers_the_pods_gateway_with_the_ee_mac() {
    let mut node = dual_stack_node();
    let pod_ll: std::net::Ipv6Addr = "fe80::858:aff:fe41:2".parse().unwrap();
    // Calico's IPv6 gateway: the link-local address of ee:ee:ee:ee:ee:ee.
    let gw: std::net::Ipv6Addr = "fe80::ecee:eeff:feee:eeee".parse().unwrap();
    let solicited_node: std::net::Ipv6Addr = "ff02::1:ffee:eeee".parse().unwrap();
    let mut ns_payload = gw.octets().to_vec();
    ns_payload.extend_from_slice(&[1, 1]);
    ns_payload.extend_from_slice(&POD_A_MAC);
    let ns = icmpv6_frame(
        POD_A_MAC,
        [0x33, 0x33, 0xff, 0xee, 0xee, 0xee],
        pod_ll,
        solicited_node,
        255,
        etherparse::Icmpv6Type::NeighborSolicitation,
        &ns_payload,
    );
    let out = node.send(ports::POD_A, &ns);
    let mut na_payload = gw.octets().to_vec();
    na_payload.extend_from_slice(&[2, 1]);
    na_payload.extend_from_slice(&GATEWAY_MAC);
    let want = icmpv6_frame(
        GATEWAY_MAC,
        POD_A_MAC,
        gw,
        pod_ll,
        255,
        etherparse::Icmpv6Type::NeighborAdvertisement(
            etherparse::icmpv6::NeighborAdvertisementHeader {
                router: true,
                solicited: true,
                r#override: true,
            },
        ),
        &na_payload,
    );
    assert_frames(&out, &[(ports::POD_A, want)]);
    // A solicitation for the pod's own address is not answered.
    let own: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    let mut own_payload = own.octets().to_vec();
    own_payload.extend_from_slice(&[1, 1]);
    own_payload.extend_from_slice(&POD_A_MAC);
    let ns_own = icmpv6_frame(
        POD_A_MAC,
        [0x33, 0x33, 0xff, 0, 0, 2],
        pod_ll,
        "ff02::1:ff00:2".parse().unwrap(),
        255,
        etherparse::Icmpv6Type::NeighborSolicitation,
        &own_payload,
    );
    assert!(node.send(ports::POD_A, &ns_own).is_empty());
    let c = finish(&node);
    assert_eq!(c.nd_adverts, 1);
}

#[test]
fn ipv6_hop_limit_expiry_and_too_big_are_answered_with_icmpv6() {
    let mut cfg = PipelineConfig::new(NODE, 24);
    let node_v6: std::net::Ipv6Addr = "fd00:ff::1".parse().unwrap();
    cfg.node_v6 = Some(node_v6);
    let mut node = Node::with_config(cfg);
    let ports_table = node.worker.pipeline_mut().ports_mut();
    ports_table
        .get_mut(ports::POD_A)
        .unwrap()
        .addrs
        .push("fd00::2".parse().unwrap());
    node.fib.insert(
        "fd00::2/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_A },
    );
    node.fib.insert(
        "fd00::3/128".parse().unwrap(),
        NextHop::Local { port: ports::POD_B },
    );
    let sent = v6_frame(POD_A_MAC, GATEWAY_MAC, "fd00::2", "fd00::3", 1);
    let out = node.send(ports::POD_A, &sent);
    let want = icmpv6_frame(
        GATEWAY_MAC,
        POD_A_MAC,
        node_v6,
        "fd00::2".parse().unwrap(),
        64,
        etherparse::Icmpv6Type::TimeExceeded(
            etherparse::icmpv6::TimeExceededCode::HopLimitExceeded,
        ),
        &sent[14..],
    );
    assert_frames(&out, &[(ports::POD_A, want)]);
    // 1501 bytes to pod B (MTU 1500): packet too big, MTU 1500.
    let src: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    let dst: std::net::Ipv6Addr = "fd00::3".parse().unwrap();
    let big = {
        let b = etherparse::PacketBuilder::ethernet2(POD_A_MAC, GATEWAY_MAC)
            .ipv6(src.octets(), dst.octets(), 64)
            .udp(40000, 5000);
        let mut v = Vec::new();
        b.write(&mut v, &vec![0u8; 1501 - 48]).unwrap();
        v
    };
    let out = node.send(ports::POD_A, &big);
    assert_eq!(out.len(), 1);
    let f = &out[0].1;
    assert_eq!(f[20], 58, "ICMPv6");
    assert_eq!(&f[54..56], &[2, 0], "packet too big");
    assert_eq!(&f[58..62], &1500u32.to_be_bytes());
    assert!(f.len() <= 14 + 1280, "the error fits the IPv6 minimum MTU");
    let c = finish(&node);
    assert_eq!(c.icmp_generated, 2);
}

#[test]
fn with_the_peer_allow_list_only_known_nodes_may_tunnel() {
    let mut node = Node::new();
    node.worker
        .pipeline_mut()
        .set_tunnel_peers(Some([REMOTE_IPIP]));
    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 63, &PAYLOAD);
    let known = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, &inner);
    assert_eq!(node.send(ports::UPLINK, &known).len(), 1);
    let stranger = Ipv4Addr::new(192, 168, 0, 66);
    let unknown = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, stranger, NODE, &inner);
    assert!(node.send(ports::UPLINK, &unknown).is_empty());
    node.worker.pipeline_mut().add_tunnel_peer(stranger);
    assert_eq!(node.send(ports::UPLINK, &unknown).len(), 1);
    node.worker.pipeline_mut().remove_tunnel_peer(stranger);
    assert!(node.send(ports::UPLINK, &unknown).is_empty());
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::UnknownTunnelPeer), 2);
}

/// An empty allow-list (ctrl's list with no other live node) accepts no
/// tunnel from anyone (issue 14, item 6): IPIP and VXLAN from a node that
/// was a peer, and from a stranger, are counted `unknown_tunnel_peer`
/// drops; with no list at all (before ctrl's first SetNode) both pass.
#[test]
fn an_empty_peer_allow_list_accepts_no_tunnel_ipip_or_vxlan() {
    let mut node = Node::new();
    let inner = udp_packet(REMOTE_POD_IPIP, POD_A, 63, &PAYLOAD);
    let ipip = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, REMOTE_IPIP, NODE, &inner);
    let stranger = Ipv4Addr::new(192, 168, 0, 66);
    let ipip_stranger = frames::ipip_frame(REMOTE_IPIP_MAC, UPLINK_MAC, stranger, NODE, &inner);
    let inner_eth = udp_frame(
        vtep_mac(REMOTE_VXLAN),
        vtep_mac(NODE),
        REMOTE_POD_VXLAN,
        POD_A,
        63,
        &PAYLOAD,
    );
    let vxlan = |from| {
        frames::vxlan_frame(
            REMOTE_VXLAN_MAC,
            UPLINK_MAC,
            from,
            NODE,
            50000,
            VNI,
            &inner_eth,
            0,
        )
    };
    let all = [ipip, ipip_stranger, vxlan(REMOTE_VXLAN), vxlan(stranger)];
    for f in &all {
        assert_eq!(node.send(ports::UPLINK, f).len(), 1, "{}", describe(f));
    }
    node.worker
        .pipeline_mut()
        .set_tunnel_peers(Some(std::iter::empty()));
    for f in &all {
        assert!(node.send(ports::UPLINK, f).is_empty(), "{}", describe(f));
    }
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::UnknownTunnelPeer), 4);
    assert_eq!((c.decap_ipip, c.decap_vxlan), (2, 2));
}

#[test]
fn the_peer_allow_list_leaves_other_udp_to_the_node_alone() {
    let mut node = Node::new();
    node.worker
        .pipeline_mut()
        .set_tunnel_peers(Some([REMOTE_IPIP]));
    let dns = udp_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        Ipv4Addr::new(192, 168, 0, 66),
        NODE,
        64,
        &PAYLOAD,
    );
    assert!(node.send(ports::UPLINK, &dns).is_empty());
    let c = finish(&node);
    assert_eq!(c.drops_for(DropReason::NotForUs), 1);
}
