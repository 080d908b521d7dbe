//! IPv6: view + accessors, hop-limit decrement, Repr round trip, the
//! ICMPv6 view on the payload, ICMPv6 errors and neighbor advertisements
//! built in place.
#![no_main]

use brindle_wire::icmpv6::{self, ErrorHeader, Icmpv6Error};
use brindle_wire::{Icmpv6Packet, Ipv6Packet, Ipv6Repr, MacAddr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Ipv6Packet::new_checked(data) else {
        return;
    };
    let _ = (
        packet.version(),
        packet.traffic_class(),
        packet.flow_label(),
    );
    let _ = (
        packet.payload_len(),
        packet.next_header(),
        packet.hop_limit(),
    );
    let _ = (packet.src_addr(), packet.dst_addr(), packet.payload());
    let repr = Ipv6Repr::parse(&packet).expect("a checked header parses");

    let mut out = vec![0u8; repr.buffer_len() + repr.payload_len];
    out[repr.buffer_len()..].copy_from_slice(packet.payload());
    repr.emit(&mut Ipv6Packet::new_unchecked(&mut out[..]))
        .unwrap();
    assert_eq!(&out[..], &data[..out.len()]);
    let again = Ipv6Packet::new_checked(&out[..]).unwrap();
    assert_eq!(Ipv6Repr::parse(&again), Ok(repr));

    let mut copy = data.to_vec();
    let mut p = Ipv6Packet::new_checked(&mut copy[..]).unwrap();
    assert_eq!(p.decrement_hop_limit(), repr.hop_limit.saturating_sub(1));

    if let Ok(icmp) = Icmpv6Packet::new_checked(packet.payload()) {
        let _ = (icmp.msg_type(), icmp.msg_code(), icmp.mtu(), icmp.data());
        let _ = icmp.verify_checksum(repr.src_addr, repr.dst_addr);
    }
    let _ = icmpv6::may_send_error_about(&packet);
    let speculative = icmpv6::speculative_ns_target(packet.payload());
    let mut frame = vec![0u8; 14 + data.len() + icmpv6::NEIGHBOR_ADVERT_FRAME_LEN];
    frame[14..14 + data.len()].copy_from_slice(data);
    if let Ok(len) = icmpv6::emit_neighbor_advert_in_place(&mut frame, 14, MacAddr([0xee; 6]), true)
    {
        // No false negatives: whatever is answered passed the prefilter.
        let na = Ipv6Packet::new_checked(&frame[14..len]).unwrap();
        assert_eq!(Some(na.src_addr()), speculative);
        let icmp = Icmpv6Packet::new_checked(na.payload()).unwrap();
        assert!(icmp.verify_checksum(na.src_addr(), na.dst_addr()));
    }
    for error in [
        Icmpv6Error::TimeExceeded,
        Icmpv6Error::PacketTooBig { mtu: 1450 },
    ] {
        let mut frame = vec![0u8; 14 + data.len() + 64];
        frame[14..14 + data.len()].copy_from_slice(data);
        let header = ErrorHeader {
            src_mac: MacAddr([0xee; 6]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_addr: "fe80::1".parse().unwrap(),
            hop_limit: 64,
            flow_label: 0,
        };
        let len = icmpv6::emit_error_in_place(&mut frame, 14, error, &header).unwrap();
        assert!(len <= 14 + icmpv6::MIN_MTU);
        let ip = Ipv6Packet::new_checked(&frame[14..len]).unwrap();
        let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum(ip.src_addr(), ip.dst_addr()));
    }
});
