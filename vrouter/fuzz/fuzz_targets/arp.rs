//! ARP: the speculative prefilter must agree with the full parse (no false
//! negatives), Repr round trip, and the in-place reply.
#![no_main]

use brindle_wire::arp::{self, ArpRepr, Packet};
use brindle_wire::{ArpOperation, MacAddr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let speculative = arp::speculative_target_ip(data);
    let Ok(packet) = Packet::new_checked(data) else {
        assert!(speculative.is_none() || data.len() >= arp::PACKET_LEN);
        return;
    };
    let _ = (
        packet.hardware_type(),
        packet.protocol_type(),
        packet.operation(),
    );
    let _ = (packet.hardware_len(), packet.protocol_len());
    let Ok(repr) = ArpRepr::parse(&packet) else {
        return;
    };
    // No false negatives: every parsed packet passes the prefilter.
    assert_eq!(speculative, Some(repr.target_protocol_addr));
    assert!(arp::test_speculative_tpa(data, repr.target_protocol_addr));

    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
    assert_eq!(
        ArpRepr::parse(&Packet::new_checked(&out[..]).unwrap()),
        Ok(repr)
    );
    assert_eq!(&out[..], &data[..arp::PACKET_LEN]);

    let mut reply = out.clone();
    Packet::new_unchecked(&mut reply[..]).make_reply_in_place(MacAddr([0xee; 6]));
    let r = ArpRepr::parse(&Packet::new_checked(&reply[..]).unwrap()).unwrap();
    assert_eq!(r.operation, ArpOperation::Reply);
    assert_eq!(r.source_protocol_addr, repr.target_protocol_addr);
    assert_eq!(r.target_protocol_addr, repr.source_protocol_addr);
    assert_eq!(r.target_hardware_addr, repr.source_hardware_addr);
});
