//! Property tests: every `Repr` survives emit → parse unchanged, and no
//! parser panics on any prefix of a real frame or on random bytes.

use std::net::{Ipv4Addr, Ipv6Addr};

use brindle_wire::ethernet::TagProtocol;
use brindle_wire::{
    ArpOperation, ArpPacket, ArpRepr, Error, EtherType, EthernetFrame, EthernetRepr, Icmpv4Packet,
    Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, MacAddr, UdpChecksum,
    UdpPacket, UdpRepr, VlanTag, VxlanPacket, VxlanRepr, arp, encap,
};
use proptest::prelude::*;

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

fn ethernet_repr() -> impl Strategy<Value = EthernetRepr> {
    let tag = prop_oneof![
        Just(None),
        (any::<bool>(), 0u8..8, any::<bool>(), 0u16..4096).prop_map(|(ad, pcp, dei, vid)| Some(
            VlanTag {
                tpid: if ad {
                    TagProtocol::Dot1Ad
                } else {
                    TagProtocol::Dot1Q
                },
                pcp,
                dei,
                vid
            }
        )),
    ];
    (mac(), mac(), tag, any::<u16>()).prop_filter_map(
        "an untagged frame cannot say 'tag follows'",
        |(src_addr, dst_addr, vlan, et)| {
            let ethertype = EtherType::from(et);
            if vlan.is_none() && matches!(ethertype, EtherType::Vlan | EtherType::QinQ) {
                return None;
            }
            Some(EthernetRepr {
                src_addr,
                dst_addr,
                vlan,
                ethertype,
            })
        },
    )
}

fn ipv4_repr() -> impl Strategy<Value = Ipv4Repr> {
    (
        (
            ipv4(),
            ipv4(),
            any::<u8>(),
            0usize..128,
            any::<u8>(),
            any::<u8>(),
        ),
        (any::<u16>(), any::<bool>(), any::<bool>(), 0u16..0x2000),
    )
        .prop_map(
            |((src_addr, dst_addr, p, payload_len, ttl, tos), (ident, df, mf, off))| Ipv4Repr {
                src_addr,
                dst_addr,
                protocol: IpProtocol::from(p),
                payload_len,
                ttl,
                tos,
                ident,
                dont_frag: df,
                more_frags: mf,
                frag_offset: off << 3,
            },
        )
}

proptest! {
    #[test]
    fn ethernet_repr_round_trips(repr in ethernet_repr()) {
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut EthernetFrame::new_unchecked(&mut out[..])).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&EthernetFrame::new_checked(&out[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn arp_repr_round_trips(op: u16, sha in mac(), spa in ipv4(), tha in mac(), tpa in ipv4()) {
        let repr = ArpRepr {
            operation: ArpOperation::from(op),
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_hardware_addr: tha,
            target_protocol_addr: tpa,
        };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut ArpPacket::new_unchecked(&mut out[..])).unwrap();
        prop_assert_eq!(arp::speculative_target_ip(&out), Some(tpa));
        prop_assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&out[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn ipv4_repr_round_trips(repr in ipv4_repr()) {
        let mut out = vec![0xa5; repr.buffer_len() + repr.payload_len];
        repr.emit(&mut Ipv4Packet::new_unchecked(&mut out[..])).unwrap();
        let p = Ipv4Packet::new_checked(&out[..]).unwrap();
        prop_assert!(p.verify_checksum());
        prop_assert_eq!(Ipv4Repr::parse(&p), Ok(repr));
    }

    #[test]
    fn ipv4_ttl_decrement_equals_a_full_recomputation(repr in ipv4_repr()) {
        let mut out = vec![0; repr.buffer_len() + repr.payload_len];
        repr.emit(&mut Ipv4Packet::new_unchecked(&mut out[..])).unwrap();
        let mut p = Ipv4Packet::new_checked(&mut out[..]).unwrap();
        p.decrement_ttl();
        let incremental = p.checksum();
        p.fill_checksum();
        prop_assert_eq!(incremental, p.checksum());
    }

    #[test]
    fn ipv6_repr_round_trips(
        src: [u8; 16], dst: [u8; 16], nh: u8, len in 0usize..128, hop: u8, tc: u8,
        flow in 0u32..0x10_0000,
    ) {
        let repr = Ipv6Repr {
            src_addr: Ipv6Addr::from(src),
            dst_addr: Ipv6Addr::from(dst),
            next_header: IpProtocol::from(nh),
            payload_len: len,
            hop_limit: hop,
            traffic_class: tc,
            flow_label: flow,
        };
        let mut out = vec![0xa5; repr.buffer_len() + len];
        repr.emit(&mut Ipv6Packet::new_unchecked(&mut out[..])).unwrap();
        prop_assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&out[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn icmpv4_repr_round_trips(
        kind in 0u8..5, a: u16, b: u16, code: u8, t: u8,
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let repr = match kind {
            0 => Icmpv4Repr::EchoRequest { ident: a, seq_no: b, data: &data },
            1 => Icmpv4Repr::EchoReply { ident: a, seq_no: b, data: &data },
            2 => Icmpv4Repr::DstUnreachable { code, next_hop_mtu: a, data: &data },
            3 => Icmpv4Repr::TimeExceeded { code, data: &data },
            _ => {
                // Other keeps only types without a variant of their own.
                let msg_type = if matches!(t, 0 | 3 | 8 | 11) { 13 } else { t };
                Icmpv4Repr::Other {
                    msg_type,
                    code,
                    rest_of_header: (u32::from(a) << 16) | u32::from(b),
                    data: &data,
                }
            }
        };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..])).unwrap();
        prop_assert_eq!(Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&out[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn icmpv6_repr_round_trips(
        kind in 0u8..5, a: u16, b: u16, code: u8, t: u8, src: [u8; 16], dst: [u8; 16],
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        use brindle_wire::{Icmpv6Packet, Icmpv6Repr};
        let rest = (u32::from(a) << 16) | u32::from(b);
        let repr = match kind {
            0 => Icmpv6Repr::EchoRequest { ident: a, seq_no: b, data: &data },
            1 => Icmpv6Repr::EchoReply { ident: a, seq_no: b, data: &data },
            2 => Icmpv6Repr::PacketTooBig { mtu: rest, data: &data },
            3 => Icmpv6Repr::TimeExceeded { code, data: &data },
            _ => {
                let msg_type = if matches!(t, 2 | 3 | 128 | 129) { 135 } else { t };
                Icmpv6Repr::Other { msg_type, code, rest_of_header: rest, data: &data }
            }
        };
        let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut Icmpv6Packet::new_unchecked(&mut out[..]), src, dst).unwrap();
        prop_assert_eq!(
            Icmpv6Repr::parse(&Icmpv6Packet::new_checked(&out[..]).unwrap(), src, dst),
            Ok(repr)
        );
    }

    #[test]
    fn udp_repr_round_trips(
        src in ipv4(), dst in ipv4(), sp: u16, dp: u16, csum: bool,
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let repr = UdpRepr { src_port: sp, dst_port: dp, payload_len: payload.len() };
        let mode = if csum { UdpChecksum::Compute } else { UdpChecksum::Zero };
        let mut out = vec![0xa5; 8 + payload.len()];
        out[8..].copy_from_slice(&payload);
        repr.emit(&mut UdpPacket::new_unchecked(&mut out[..]), src, dst, mode).unwrap();
        let p = UdpPacket::new_checked(&out[..]).unwrap();
        prop_assert_eq!(p.checksum() == 0, !csum);
        prop_assert_eq!(UdpRepr::parse(&p, src, dst), Ok(repr));
    }

    #[test]
    fn vxlan_repr_round_trips(vni in 0u32..=0xff_ffff) {
        let repr = VxlanRepr { vni };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut VxlanPacket::new_unchecked(&mut out[..])).unwrap();
        prop_assert_eq!(VxlanRepr::parse(&VxlanPacket::new_checked(&out[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn no_parser_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        parse_everything(&bytes);
    }
}

/// Runs every view and parser over `bytes`, reading every field of what
/// checks. Returns whether the Ethernet view accepted it.
fn parse_everything(bytes: &[u8]) -> bool {
    let _ = encap::vxlan_inner(bytes, 4789);
    let _ = encap::ipip_inner_offset(bytes);
    let _ = arp::speculative_target_ip(bytes);
    if let Ok(p) = Ipv4Packet::new_checked(bytes) {
        let _ = (
            p.payload(),
            p.options(),
            p.icmp_quote(),
            Ipv4Repr::parse(&p),
        );
    }
    if let Ok(p) = Ipv6Packet::new_checked(bytes) {
        let _ = (p.payload(), Ipv6Repr::parse(&p));
        let _ = brindle_wire::icmpv6::may_send_error_about(&p);
    }
    if let Ok(p) = brindle_wire::Icmpv6Packet::new_checked(bytes) {
        let _ = (p.data(), p.mtu(), p.msg_type().is_error());
        let _ = p.verify_checksum(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST);
    }
    if let Ok(p) = Icmpv4Packet::new_checked(bytes) {
        let _ = (p.data(), Icmpv4Repr::parse(&p));
    }
    if let Ok(p) = UdpPacket::new_checked(bytes) {
        let _ = (
            p.payload(),
            UdpRepr::parse(&p, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST),
        );
    }
    if let Ok(p) = VxlanPacket::new_checked(bytes) {
        let _ = (p.payload(), VxlanRepr::parse(&p));
    }
    if let Ok(p) = ArpPacket::new_checked(bytes) {
        let _ = ArpRepr::parse(&p);
    }
    match EthernetFrame::new_checked(bytes) {
        Ok(f) => {
            let _ = (f.payload(), f.vlan(), EthernetRepr::parse(&f));
            parse_everything_l3(f.payload());
            true
        }
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            false
        }
    }
}

fn parse_everything_l3(payload: &[u8]) {
    if let Ok(ip) = Ipv4Packet::new_checked(payload) {
        if let Ok(icmp) = Icmpv4Packet::new_checked(ip.payload()) {
            let _ = Icmpv4Repr::parse(&icmp);
        }
        if let Ok(udp) = UdpPacket::new_checked(ip.payload()) {
            let _ = UdpRepr::parse(&udp, ip.src_addr(), ip.dst_addr());
        }
    }
}

#[test]
fn every_prefix_of_every_kernel_frame_parses_or_errors_without_panicking() {
    let files = [
        include_str!("vectors/arp_icmp_echo.hex"),
        include_str!("vectors/vxlan_arp_icmp_echo.hex"),
        include_str!("vectors/vxlan_default_csum_icmp_echo.hex"),
        include_str!("vectors/ipv6_icmp_echo.hex"),
        include_str!("vectors/icmp_time_exceeded.hex"),
        include_str!("vectors/icmp_frag_needed.hex"),
        include_str!("vectors/icmpv6_time_exceeded.hex"),
        include_str!("vectors/icmpv6_packet_too_big.hex"),
        include_str!("vectors/ipv4_options.hex"),
    ];
    let mut frames = 0;
    for line in files.iter().flat_map(|f| f.lines()) {
        let frame = hex::decode(line.trim()).unwrap();
        frames += 1;
        for n in 0..=frame.len() {
            let prefix = &frame[..n];
            assert_eq!(parse_everything(prefix), n >= 14, "ethernet at {n}");
            // The full L3 packet is needed: every shorter prefix is an error.
            let l3 = &prefix[14.min(n)..];
            let full_l3 = frame.len() - 14;
            match u16::from_be_bytes([frame[12], frame[13]]) {
                0x0800 => {
                    let total = usize::from(Ipv4Packet::new_unchecked(&frame[14..]).total_len());
                    assert_eq!(
                        Ipv4Packet::new_checked(l3).is_ok(),
                        l3.len() >= total,
                        "{n}"
                    );
                }
                0x86dd => {
                    assert_eq!(
                        Ipv6Packet::new_checked(l3).is_ok(),
                        l3.len() == full_l3,
                        "{n}"
                    );
                }
                0x0806 => {
                    assert_eq!(ArpPacket::new_checked(l3).is_ok(), l3.len() >= 28, "{n}");
                }
                other => panic!("unexpected ethertype {other:#x}"),
            }
            if let Some(d) = encap::vxlan_inner(&frame, 4789).or(encap::vxlan_inner(&frame, 8472)) {
                let port = if encap::vxlan_inner(&frame, 4789).is_some() {
                    4789
                } else {
                    8472
                };
                assert_eq!(
                    encap::vxlan_inner(prefix, port).is_some(),
                    n >= d.inner_offset + d.inner_len,
                    "vxlan at {n}"
                );
            }
        }
    }
    assert!(frames >= 20);
}
