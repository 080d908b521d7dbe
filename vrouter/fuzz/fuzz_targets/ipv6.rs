//! IPv6: view + accessors, hop-limit decrement, Repr round trip.
#![no_main]

use brindle_wire::{Ipv6Packet, Ipv6Repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Ipv6Packet::new_checked(data) else {
        return;
    };
    let _ = (packet.version(), packet.traffic_class(), packet.flow_label());
    let _ = (packet.payload_len(), packet.next_header(), packet.hop_limit());
    let _ = (packet.src_addr(), packet.dst_addr(), packet.payload());
    let repr = Ipv6Repr::parse(&packet).expect("a checked header parses");

    let mut out = vec![0u8; repr.buffer_len() + repr.payload_len];
    out[repr.buffer_len()..].copy_from_slice(packet.payload());
    repr.emit(&mut Ipv6Packet::new_unchecked(&mut out[..])).unwrap();
    assert_eq!(&out[..], &data[..out.len()]);
    let again = Ipv6Packet::new_checked(&out[..]).unwrap();
    assert_eq!(Ipv6Repr::parse(&again), Ok(repr));

    let mut copy = data.to_vec();
    let mut p = Ipv6Packet::new_checked(&mut copy[..]).unwrap();
    assert_eq!(p.decrement_hop_limit(), repr.hop_limit.saturating_sub(1));
});
