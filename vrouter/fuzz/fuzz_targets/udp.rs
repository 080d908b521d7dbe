//! UDP: the first 8 bytes are the pseudo-header addresses, the rest is the
//! datagram. View + accessors, checksum, Repr round trip with both
//! checksum modes.
#![no_main]

use std::net::Ipv4Addr;

use brindle_wire::{UdpChecksum, UdpPacket, UdpRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let src = Ipv4Addr::new(data[0], data[1], data[2], data[3]);
    let dst = Ipv4Addr::new(data[4], data[5], data[6], data[7]);
    let data = &data[8..];
    let Ok(packet) = UdpPacket::new_checked(data) else {
        return;
    };
    let _ = (
        packet.src_port(),
        packet.dst_port(),
        packet.len(),
        packet.is_empty(),
    );
    let _ = (packet.checksum(), packet.payload());
    let Ok(repr) = UdpRepr::parse(&packet, src, dst) else {
        return;
    };
    for csum in [UdpChecksum::Zero, UdpChecksum::Compute] {
        let mut out = vec![0u8; repr.buffer_len() + repr.payload_len];
        out[8..].copy_from_slice(packet.payload());
        repr.emit(&mut UdpPacket::new_unchecked(&mut out[..]), src, dst, csum)
            .unwrap();
        let again = UdpPacket::new_checked(&out[..]).unwrap();
        assert!(again.verify_checksum(src, dst));
        assert_eq!(UdpRepr::parse(&again, src, dst), Ok(repr));
    }
});
