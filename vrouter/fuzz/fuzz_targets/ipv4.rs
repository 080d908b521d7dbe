//! IPv4: view + accessors, TTL decrement (the checksum must stay valid),
//! Repr round trip, the ICMP errors built in place, and IPIP decap offsets
//! on the input read as an Ethernet frame.
#![no_main]

use std::net::Ipv4Addr;

use brindle_wire::icmpv4::{self, ErrorHeader, Quote};
use brindle_wire::{Icmpv4Error, Ipv4Packet, Ipv4Repr, MacAddr, encap};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(off) = encap::ipip_inner_offset(data) {
        assert!(off <= data.len());
    }
    let Ok(packet) = Ipv4Packet::new_checked(data) else {
        return;
    };
    let _ = (
        packet.version(),
        packet.header_len(),
        packet.dscp(),
        packet.ecn(),
    );
    let _ = (
        packet.total_len(),
        packet.ident(),
        packet.dont_frag(),
        packet.more_frags(),
    );
    let _ = (
        packet.frag_offset(),
        packet.ttl(),
        packet.protocol(),
        packet.checksum(),
    );
    let _ = (
        packet.src_addr(),
        packet.dst_addr(),
        packet.options(),
        packet.payload(),
    );
    let quote = packet.icmp_quote().len();
    assert!(quote <= icmpv4::MAX_QUOTE_LEN);
    let valid = packet.verify_checksum();

    let mut copy = data.to_vec();
    let mut p = Ipv4Packet::new_checked(&mut copy[..]).unwrap();
    let ttl = p.ttl();
    assert_eq!(p.decrement_ttl(), ttl.saturating_sub(1));
    assert_eq!(p.verify_checksum(), valid);

    if let Ok(repr) = Ipv4Repr::parse(&packet) {
        let mut out = vec![0u8; repr.buffer_len() + repr.payload_len];
        out[repr.buffer_len()..].copy_from_slice(packet.payload());
        repr.emit(&mut Ipv4Packet::new_unchecked(&mut out[..]))
            .unwrap();
        let again = Ipv4Packet::new_checked(&out[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&again), Ok(repr));
        assert_eq!(again.payload(), packet.payload());
    }

    for (error, q) in [
        (Icmpv4Error::TimeExceeded, Quote::HeaderPlus8),
        (
            Icmpv4Error::FragmentationNeeded { next_hop_mtu: 1450 },
            Quote::Rfc1812,
        ),
    ] {
        let mut frame = vec![0u8; 14 + data.len() + 64];
        frame[14..14 + data.len()].copy_from_slice(data);
        let header = ErrorHeader {
            src_mac: MacAddr([0xee; 6]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_addr: Ipv4Addr::new(169, 254, 1, 1),
            ttl: 64,
            ident: 0,
        };
        let len = icmpv4::emit_error_in_place_with(&mut frame, 14, error, &header, q).unwrap();
        let ip = Ipv4Packet::new_checked(&frame[14..len]).unwrap();
        assert!(ip.verify_checksum());
        assert!(checksum_ok(ip.payload()));
    }
});

fn checksum_ok(icmp: &[u8]) -> bool {
    brindle_wire::checksum::verifies(icmp)
}
