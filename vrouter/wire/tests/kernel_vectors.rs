//! Frames the Linux kernel produced (see `tests/vectors/README.md`), parsed
//! by our views and reproduced by our emitters byte for byte.
//!
//! Fields that are legitimately random and therefore taken from the capture
//! rather than predicted: the outer IPv4 identification (Linux picks it per
//! packet when DF is clear), the VXLAN UDP source port (a hash of the
//! inner flow with a per-boot seed), the IP ID of ICMP errors and the flow
//! label of ICMPv6 errors.

use std::net::Ipv4Addr;

use brindle_wire::encap::{self, OuterHeader};
use brindle_wire::icmpv4::{self, ErrorHeader, Quote};
use brindle_wire::icmpv6::{self, Icmpv6Error};
use brindle_wire::{
    ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetFrame, Icmpv4Error, Icmpv4Packet,
    Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, MacAddr, UdpChecksum,
    UdpPacket, VxlanEncap, VxlanPacket, VxlanRepr,
};

const A_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
const R_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x1a]);
const A_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
const R_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 254);

fn frames(text: &str) -> Vec<Vec<u8>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| hex::decode(l.trim()).expect("hex"))
        .collect()
}

fn ethertype(frame: &[u8]) -> EtherType {
    EthernetFrame::new_checked(frame).unwrap().ethertype()
}

#[test]
fn kernel_arp_request_parses_and_our_in_place_reply_equals_the_kernels() {
    let frames = frames(include_str!("vectors/arp_icmp_echo.hex"));
    let arp: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|f| ethertype(f) == EtherType::Arp)
        .collect();
    assert_eq!(arp.len(), 2, "one request, one reply");
    let (request, reply) = (arp[0], arp[1]);

    let eth = EthernetFrame::new_checked(&request[..]).unwrap();
    assert!(eth.dst_addr().is_broadcast());
    let payload = eth.payload();
    assert_eq!(
        brindle_wire::arp::speculative_target_ip(payload),
        Some(R_IP)
    );
    let repr = ArpRepr::parse(&ArpPacket::new_checked(payload).unwrap()).unwrap();
    assert_eq!(
        repr,
        ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: A_MAC,
            source_protocol_addr: A_IP,
            target_hardware_addr: MacAddr::ZERO,
            target_protocol_addr: R_IP,
        }
    );

    // Answer in place, as proxy ARP does, with R's MAC: exactly the
    // kernel's reply.
    let mut answer = request.clone();
    let mut eth = EthernetFrame::new_checked(&mut answer[..]).unwrap();
    let requester = eth.src_addr();
    eth.rewrite_addrs(R_MAC, requester);
    ArpPacket::new_checked(eth.payload_mut())
        .unwrap()
        .make_reply_in_place(R_MAC);
    assert_eq!(&answer, reply);
}

#[test]
fn kernel_icmp_echo_parses_and_reemits_identically() {
    let frames = frames(include_str!("vectors/arp_icmp_echo.hex"));
    let mut seen = 0;
    for f in frames.iter().filter(|f| ethertype(f) == EtherType::Ipv4) {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        let ip_repr = Ipv4Repr::parse(&ip).unwrap();
        assert_eq!(ip_repr.protocol, IpProtocol::Icmp);
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        let icmp_repr = Icmpv4Repr::parse(&icmp).unwrap();
        assert!(matches!(
            icmp_repr,
            Icmpv4Repr::EchoRequest { .. } | Icmpv4Repr::EchoReply { .. }
        ));

        let mut out = vec![0xa5; f.len()];
        out[..14].copy_from_slice(&f[..14]);
        ip_repr
            .emit(&mut Ipv4Packet::new_unchecked(&mut out[14..]))
            .unwrap();
        icmp_repr
            .emit(&mut Icmpv4Packet::new_unchecked(&mut out[34..]))
            .unwrap();
        assert_eq!(&out, f);
        seen += 1;
    }
    assert_eq!(seen, 2);
}

/// Reproduces every VXLAN frame of a capture from its inner frame.
fn check_vxlan_capture(text: &str, port: u16, vni: u32, csum: UdpChecksum) {
    let frames = frames(text);
    assert!(frames.len() >= 3, "a capture with traffic");
    for f in &frames {
        let decap = encap::vxlan_inner(f, port).expect("a VXLAN frame");
        assert_eq!(decap.vni, vni);
        assert_eq!(decap.inner_offset, 50);
        assert_eq!(decap.inner_len, f.len() - 50);

        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let outer_ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert!(outer_ip.verify_checksum());
        let udp = UdpPacket::new_checked(outer_ip.payload()).unwrap();
        assert!(udp.verify_checksum(outer_ip.src_addr(), outer_ip.dst_addr()));
        assert_eq!(
            VxlanRepr::parse(&VxlanPacket::new_checked(udp.payload()).unwrap()),
            Ok(VxlanRepr { vni })
        );

        // The random fields, taken from the capture.
        let ident = outer_ip.ident();
        let src_port = udp.src_port();
        let inner = &f[50..];
        let inner_tos = match EthernetFrame::new_checked(inner).unwrap().ethertype() {
            EtherType::Ipv4 => Ipv4Packet::new_checked(&inner[14..]).unwrap().tos(),
            _ => 0,
        };
        let tunnel = VxlanEncap {
            outer: OuterHeader {
                src_mac: eth.src_addr(),
                dst_mac: eth.dst_addr(),
                src_addr: outer_ip.src_addr(),
                dst_addr: outer_ip.dst_addr(),
                ttl: 64,
                tos: encap::outer_tos(0, inner_tos),
                dont_frag: false,
            },
            vni,
            dst_port: port,
            udp_checksum: csum,
        };
        let mut out = vec![0xa5; f.len()];
        out[50..].copy_from_slice(inner);
        tunnel.emit(&mut out, ident, src_port).unwrap();
        assert_eq!(hex::encode(&out), hex::encode(f));
    }
}

#[test]
fn kernel_vxlan_noudpcsum_outer_headers_are_reproduced_byte_for_byte() {
    check_vxlan_capture(
        include_str!("vectors/vxlan_arp_icmp_echo.hex"),
        4789,
        4096,
        UdpChecksum::Zero,
    );
}

#[test]
fn kernel_vxlan_default_udpcsum_outer_headers_are_reproduced_byte_for_byte() {
    check_vxlan_capture(
        include_str!("vectors/vxlan_default_csum_icmp_echo.hex"),
        8472,
        4097,
        UdpChecksum::Compute,
    );
}

#[test]
fn kernel_ipv6_frames_parse_and_reemit_identically() {
    let frames = frames(include_str!("vectors/ipv6_icmp_echo.hex"));
    assert!(!frames.is_empty());
    for f in &frames {
        assert_eq!(ethertype(f), EtherType::Ipv6);
        let ip = Ipv6Packet::new_checked(&f[14..]).unwrap();
        let repr = Ipv6Repr::parse(&ip).unwrap();
        assert_eq!(repr.next_header, IpProtocol::Icmpv6);
        assert_eq!(repr.payload_len, f.len() - 54);
        assert!(repr.hop_limit == 64 || repr.hop_limit == 255);
        let mut out = vec![0xa5; f.len()];
        out[..14].copy_from_slice(&f[..14]);
        out[54..].copy_from_slice(&f[54..]);
        repr.emit(&mut Ipv6Packet::new_unchecked(&mut out[14..]))
            .unwrap();
        assert_eq!(&out, f);

        // The ICMPv6 message verifies, and re-emits identically.
        let icmp = brindle_wire::Icmpv6Packet::new_checked(ip.payload()).unwrap();
        let icmp_repr =
            brindle_wire::Icmpv6Repr::parse(&icmp, repr.src_addr, repr.dst_addr).unwrap();
        let mut msg = vec![0xa5; icmp_repr.buffer_len()];
        icmp_repr
            .emit(
                &mut brindle_wire::Icmpv6Packet::new_unchecked(&mut msg[..]),
                repr.src_addr,
                repr.dst_addr,
            )
            .unwrap();
        assert_eq!(&msg[..], ip.payload());
    }
}

/// Builds the ICMP error R sent about `original` and compares.
fn check_icmp_error(text: &str, error: Icmpv4Error) {
    let frames = frames(text);
    assert_eq!(frames.len(), 2, "the original and R's error");
    let (original, kernel_error) = (&frames[0], &frames[1]);
    let kernel_ip = Ipv4Packet::new_checked(&kernel_error[14..]).unwrap();
    assert!(kernel_ip.verify_checksum());
    let header = ErrorHeader {
        src_mac: R_MAC,
        dst_mac: A_MAC,
        src_addr: R_IP,
        ttl: 64,
        ident: kernel_ip.ident(),
    };

    // Linux quotes as much as fits in 576 bytes (RFC 1812).
    let mut buf = original.clone();
    buf.resize(buf.len().max(600), 0xa5);
    let len =
        icmpv4::emit_error_in_place_with(&mut buf, 14, error, &header, Quote::Rfc1812).unwrap();
    assert_eq!(hex::encode(&buf[..len]), hex::encode(kernel_error));

    // The default quote: header + 8 bytes.
    let mut buf = original.clone();
    buf.resize(buf.len().max(100), 0xa5);
    let len = icmpv4::emit_error_in_place(&mut buf, 14, error, &header).unwrap();
    assert_eq!(len, 14 + 20 + 8 + 28);
    let ip = Ipv4Packet::new_checked(&buf[14..len]).unwrap();
    assert!(ip.verify_checksum());
    assert_eq!(ip.dst_addr(), A_IP);
    assert_eq!(ip.src_addr(), R_IP);
    assert_eq!(ip.tos(), 0xc0);
    let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum());
    assert_eq!(icmp.data(), &original[14..42]);
    let repr = Icmpv4Repr::parse(&icmp).unwrap();
    match (error, repr) {
        (Icmpv4Error::TimeExceeded, Icmpv4Repr::TimeExceeded { code: 0, .. }) => {}
        (
            Icmpv4Error::FragmentationNeeded { next_hop_mtu },
            Icmpv4Repr::DstUnreachable {
                code: 4,
                next_hop_mtu: m,
                ..
            },
        ) if m == next_hop_mtu => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn kernel_time_exceeded_is_reproduced_byte_for_byte() {
    check_icmp_error(
        include_str!("vectors/icmp_time_exceeded.hex"),
        Icmpv4Error::TimeExceeded,
    );
}

#[test]
fn kernel_fragmentation_needed_is_reproduced_byte_for_byte() {
    check_icmp_error(
        include_str!("vectors/icmp_frag_needed.hex"),
        Icmpv4Error::FragmentationNeeded { next_hop_mtu: 1300 },
    );
}

#[test]
fn kernel_ipv4_options_are_skipped_and_ttl_decrement_keeps_the_checksum() {
    let frames = frames(include_str!("vectors/ipv4_options.hex"));
    for f in &frames {
        let mut f = f.clone();
        let mut ip = Ipv4Packet::new_checked(&mut f[14..]).unwrap();
        assert_eq!(ip.header_len(), 60);
        let ttl = ip.ttl();
        assert_eq!(ip.decrement_ttl(), ttl - 1);
        assert!(ip.verify_checksum());
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum());
        // etherparse agrees on where the payload starts.
        let (eh, rest) = etherparse::Ipv4Header::from_slice(&f[14..]).unwrap();
        assert_eq!(eh.header_len(), 60);
        assert_eq!(rest, ip.payload());
    }
}

/// Builds the ICMPv6 error R sent about `original` and compares.
fn check_icmpv6_error(text: &str, error: Icmpv6Error) {
    let frames = frames(text);
    assert_eq!(frames.len(), 2, "the original and R's error");
    let (original, kernel_error) = (&frames[0], &frames[1]);
    let kernel_ip = Ipv6Packet::new_checked(&kernel_error[14..]).unwrap();
    let r_ip: std::net::Ipv6Addr = "fd00::fe".parse().unwrap();
    let a_ip: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    assert_eq!(kernel_ip.src_addr(), r_ip);
    let kernel_icmp = brindle_wire::Icmpv6Packet::new_checked(kernel_ip.payload()).unwrap();
    assert!(kernel_icmp.verify_checksum(r_ip, a_ip));

    let orig_ip = Ipv6Packet::new_checked(&original[14..]).unwrap();
    assert!(icmpv6::may_send_error_about(&orig_ip));
    let header = icmpv6::ErrorHeader {
        src_mac: R_MAC,
        dst_mac: A_MAC,
        src_addr: r_ip,
        hop_limit: 64,
        flow_label: kernel_ip.flow_label(),
    };
    let mut buf = original.clone();
    buf.resize(buf.len().max(1300), 0xa5);
    let len = icmpv6::emit_error_in_place(&mut buf, 14, error, &header).unwrap();
    assert!(len <= 14 + 1280);
    assert_eq!(hex::encode(&buf[..len]), hex::encode(kernel_error));
    assert!(!icmpv6::may_send_error_about(
        &Ipv6Packet::new_checked(&buf[14..len]).unwrap()
    ));
}

#[test]
fn kernel_icmpv6_time_exceeded_is_reproduced_byte_for_byte() {
    check_icmpv6_error(
        include_str!("vectors/icmpv6_time_exceeded.hex"),
        Icmpv6Error::TimeExceeded,
    );
}

#[test]
fn kernel_icmpv6_packet_too_big_is_reproduced_byte_for_byte() {
    check_icmpv6_error(
        include_str!("vectors/icmpv6_packet_too_big.hex"),
        Icmpv6Error::PacketTooBig { mtu: 1300 },
    );
}

#[test]
fn kernel_neighbor_solicitation_answered_in_place_equals_the_kernels_advert() {
    let frames = frames(include_str!("vectors/ipv6_icmp_echo.hex"));
    let ns = frames
        .iter()
        .find(|f| f.get(54) == Some(&135))
        .expect("a neighbor solicitation");
    let na = frames
        .iter()
        .find(|f| f.get(54) == Some(&136))
        .expect("a neighbor advertisement");
    let target: std::net::Ipv6Addr = "fd00::fe".parse().unwrap();
    assert_eq!(icmpv6::speculative_ns_target(&ns[54..]), Some(target));

    let mut buf = ns.clone();
    buf.resize(128, 0xa5);
    // R forwards, so its advertisement has the router flag.
    let len = icmpv6::emit_neighbor_advert_in_place(&mut buf, 14, R_MAC, true).unwrap();
    assert_eq!(hex::encode(&buf[..len]), hex::encode(na));
}
