//! ICMPv4: view + accessors, Repr parse → emit → parse.
#![no_main]

use brindle_wire::{Icmpv4Packet, Icmpv4Repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Icmpv4Packet::new_checked(data) else {
        return;
    };
    let _ = (packet.msg_type(), packet.msg_code(), packet.checksum());
    let _ = (
        packet.echo_ident(),
        packet.echo_seq_no(),
        packet.next_hop_mtu(),
    );
    let _ = (packet.data(), packet.msg_type().is_error());
    let Ok(repr) = Icmpv4Repr::parse(&packet) else {
        return;
    };
    assert_eq!(repr.buffer_len(), data.len());
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]))
        .unwrap();
    let again = Icmpv4Packet::new_checked(&out[..]).unwrap();
    assert!(again.verify_checksum());
    assert_eq!(Icmpv4Repr::parse(&again), Ok(repr));
});
