//! etherparse as the independent implementation: what we emit, etherparse
//! reads with the same values (and valid checksums), and what etherparse
//! builds, we read with the same values. Random headers by proptest.
//!
//! This is where 802.1Q tags and IPIP get an independent check, since the
//! test machine's kernel has neither the 8021q nor the ipip module.

use std::net::{Ipv4Addr, Ipv6Addr};

use brindle_wire::encap::{self, OuterHeader};
use brindle_wire::ethernet::TagProtocol;
use brindle_wire::{
    ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetFrame, EthernetRepr, IpProtocol,
    IpipEncap, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, MacAddr, UdpChecksum, UdpPacket,
    VlanTag, VxlanEncap,
};
use proptest::prelude::*;

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

proptest! {
    #[test]
    fn our_tagged_ethernet_header_reads_the_same_in_etherparse(
        src in mac(), dst in mac(), vid in 0u16..4096, pcp in 0u8..8, dei: bool,
        ethertype: u16,
    ) {
        let repr = EthernetRepr {
            src_addr: src,
            dst_addr: dst,
            vlan: Some(VlanTag { tpid: TagProtocol::Dot1Q, pcp, dei, vid }),
            ethertype: EtherType::from(ethertype),
        };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut EthernetFrame::new_unchecked(&mut out[..])).unwrap();
        let (eth, rest) = etherparse::Ethernet2Header::from_slice(&out).unwrap();
        prop_assert_eq!(eth.source, src.0);
        prop_assert_eq!(eth.destination, dst.0);
        prop_assert_eq!(eth.ether_type, etherparse::EtherType::VLAN_TAGGED_FRAME);
        let (vlan, _) = etherparse::SingleVlanHeader::from_slice(rest).unwrap();
        prop_assert_eq!(vlan.vlan_id.value(), vid);
        prop_assert_eq!(vlan.pcp.value(), pcp);
        prop_assert_eq!(vlan.drop_eligible_indicator, dei);
        prop_assert_eq!(vlan.ether_type.0, ethertype);
    }

    #[test]
    fn etherparse_tagged_frames_read_the_same_in_our_view(
        src in mac(), dst in mac(), vid in 0u16..4096, pcp in 0u8..8, dei: bool,
        ethertype: u16,
    ) {
        let eth = etherparse::Ethernet2Header {
            source: src.0,
            destination: dst.0,
            ether_type: etherparse::EtherType::VLAN_TAGGED_FRAME,
        };
        let vlan = etherparse::SingleVlanHeader {
            pcp: etherparse::VlanPcp::try_new(pcp).unwrap(),
            drop_eligible_indicator: dei,
            vlan_id: etherparse::VlanId::try_new(vid).unwrap(),
            ether_type: etherparse::EtherType(ethertype),
        };
        let mut bytes = eth.to_bytes().to_vec();
        bytes.extend_from_slice(&vlan.to_bytes());
        bytes.extend_from_slice(&[1, 2, 3]);
        let f = EthernetFrame::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(f.src_addr(), src);
        prop_assert_eq!(f.dst_addr(), dst);
        prop_assert_eq!(f.vlan(), Some(VlanTag { tpid: TagProtocol::Dot1Q, pcp, dei, vid }));
        prop_assert_eq!(u16::from(f.ethertype()), ethertype);
        prop_assert_eq!(f.payload(), &[1u8, 2, 3][..]);
    }

    #[test]
    fn our_arp_reads_the_same_in_etherparse(
        op in 1u16..3, sha in mac(), spa in ipv4(), tha in mac(), tpa in ipv4(),
    ) {
        let repr = ArpRepr {
            operation: ArpOperation::from(op),
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_hardware_addr: tha,
            target_protocol_addr: tpa,
        };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut ArpPacket::new_unchecked(&mut out[..])).unwrap();
        let theirs = etherparse::ArpPacket::from_slice(&out).unwrap();
        let eth_ipv4 = theirs.try_eth_ipv4().unwrap();
        prop_assert_eq!(theirs.operation.0, op);
        prop_assert_eq!(eth_ipv4.sender_mac, sha.0);
        prop_assert_eq!(eth_ipv4.sender_ipv4, spa.octets());
        prop_assert_eq!(eth_ipv4.target_mac, tha.0);
        prop_assert_eq!(eth_ipv4.target_ipv4, tpa.octets());
    }

    #[test]
    fn etherparse_ipv4_udp_packets_read_the_same_in_our_views(
        src in ipv4(), dst in ipv4(), ttl: u8, sport: u16, dport: u16,
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src.octets(), dst.octets(), ttl)
            .udp(sport, dport);
        let mut frame = Vec::new();
        builder.write(&mut frame, &payload).unwrap();

        let eth = EthernetFrame::new_checked(&frame[..]).unwrap();
        prop_assert_eq!(eth.ethertype(), EtherType::Ipv4);
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        let repr = Ipv4Repr::parse(&ip).unwrap();
        prop_assert_eq!(repr.src_addr, src);
        prop_assert_eq!(repr.dst_addr, dst);
        prop_assert_eq!(repr.ttl, ttl);
        prop_assert_eq!(repr.protocol, IpProtocol::Udp);
        prop_assert_eq!(repr.payload_len, 8 + payload.len());
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        prop_assert!(udp.verify_checksum(src, dst));
        prop_assert_eq!(udp.src_port(), sport);
        prop_assert_eq!(udp.dst_port(), dport);
        prop_assert_eq!(udp.payload(), &payload[..]);

        // TTL decrement in place: etherparse recomputes the same checksum.
        let mut frame = frame.clone();
        let mut ip = Ipv4Packet::new_checked(&mut frame[14..]).unwrap();
        ip.decrement_ttl();
        let (theirs, _) = etherparse::Ipv4Header::from_slice(&frame[14..]).unwrap();
        prop_assert_eq!(theirs.header_checksum, theirs.calc_header_checksum());
    }

    #[test]
    fn etherparse_ipv6_headers_read_the_same_in_our_view(
        src: [u8; 16], dst: [u8; 16], tc: u8, flow in 0u32..0x10_0000, hop: u8, next: u8,
        len in 0u16..64,
    ) {
        let theirs = etherparse::Ipv6Header {
            traffic_class: tc,
            flow_label: etherparse::Ipv6FlowLabel::try_new(flow).unwrap(),
            payload_length: len,
            next_header: etherparse::IpNumber(next),
            hop_limit: hop,
            source: src,
            destination: dst,
        };
        let mut bytes = theirs.to_bytes().to_vec();
        bytes.resize(40 + usize::from(len), 0);
        let repr = Ipv6Repr::parse(&Ipv6Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        prop_assert_eq!(repr, Ipv6Repr {
            src_addr: Ipv6Addr::from(src),
            dst_addr: Ipv6Addr::from(dst),
            next_header: IpProtocol::from(next),
            payload_len: usize::from(len),
            hop_limit: hop,
            traffic_class: tc,
            flow_label: flow,
        });
    }

    #[test]
    fn our_ipip_frames_read_the_same_in_etherparse(
        osrc in ipv4(), odst in ipv4(), isrc in ipv4(), idst in ipv4(), ttl in 1u8..=255,
        ident: u16, df: bool, payload_len in 0usize..64,
    ) {
        let inner = Ipv4Repr {
            src_addr: isrc, dst_addr: idst, protocol: IpProtocol::Udp,
            payload_len, ttl: 64, tos: 0, ident: 1, dont_frag: true,
            more_frags: false, frag_offset: 0,
        };
        let mut frame = vec![0xa5; encap::IPIP_HEADER_LEN + 20 + payload_len];
        inner.emit(&mut Ipv4Packet::new_unchecked(&mut frame[encap::IPIP_HEADER_LEN..])).unwrap();
        let outer = OuterHeader {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]), dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src_addr: osrc, dst_addr: odst, ttl, tos: 0, dont_frag: df,
        };
        IpipEncap { outer }.emit(&mut frame, ident).unwrap();

        let (eth, rest) = etherparse::Ethernet2Header::from_slice(&frame).unwrap();
        prop_assert_eq!(eth.ether_type, etherparse::EtherType::IPV4);
        let (o, rest) = etherparse::Ipv4Header::from_slice(rest).unwrap();
        prop_assert_eq!(o.protocol, etherparse::IpNumber::IPV4);
        prop_assert_eq!(o.source, osrc.octets());
        prop_assert_eq!(o.destination, odst.octets());
        prop_assert_eq!(o.time_to_live, ttl);
        prop_assert_eq!(o.identification, ident);
        prop_assert_eq!(o.dont_fragment, df);
        prop_assert_eq!(o.header_checksum, o.calc_header_checksum());
        prop_assert_eq!(usize::from(o.total_len), 20 + 20 + payload_len);
        let (i, _) = etherparse::Ipv4Header::from_slice(rest).unwrap();
        prop_assert_eq!(i.source, isrc.octets());
        prop_assert_eq!(i.destination, idst.octets());
        prop_assert_eq!(encap::ipip_inner_offset(&frame), Some(34));
    }

    #[test]
    fn our_vxlan_frames_read_the_same_in_etherparse(
        osrc in ipv4(), odst in ipv4(), vni in 0u32..=0xff_ffff, sport: u16, csum: bool,
        inner in proptest::collection::vec(any::<u8>(), 14..80),
    ) {
        let tunnel = VxlanEncap {
            outer: OuterHeader {
                src_mac: MacAddr([2, 0, 0, 0, 0, 1]), dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
                src_addr: osrc, dst_addr: odst, ttl: 64, tos: 0, dont_frag: false,
            },
            vni,
            dst_port: 4789,
            udp_checksum: if csum { UdpChecksum::Compute } else { UdpChecksum::Zero },
        };
        let mut frame = vec![0xa5; encap::VXLAN_HEADER_LEN + inner.len()];
        frame[encap::VXLAN_HEADER_LEN..].copy_from_slice(&inner);
        tunnel.emit(&mut frame, 0, sport).unwrap();

        let sliced = etherparse::SlicedPacket::from_ethernet(&frame).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = sliced.net else {
            return Err(TestCaseError::fail("not IPv4"));
        };
        let h = ip.header().to_header();
        prop_assert_eq!(h.header_checksum, h.calc_header_checksum());
        let Some(etherparse::TransportSlice::Udp(udp)) = sliced.transport else {
            return Err(TestCaseError::fail("not UDP"));
        };
        prop_assert_eq!(udp.source_port(), sport);
        prop_assert_eq!(udp.destination_port(), 4789);
        let payload = udp.payload();
        prop_assert_eq!(payload[0], 0x08);
        prop_assert_eq!(u32::from_be_bytes([0, payload[4], payload[5], payload[6]]), vni);
        prop_assert_eq!(&payload[8..], &inner[..]);
        if csum {
            let expected = udp.to_header().calc_checksum_ipv4(&h, payload).unwrap();
            prop_assert_eq!(udp.checksum(), expected);
        } else {
            prop_assert_eq!(udp.checksum(), 0);
        }
    }
}
