//! GRO: the input is a sequence of frames, each prefixed by a 2-byte
//! length. Any bytes are pushed without a panic; every coalesced
//! super-packet has a consistent virtio-net header and cuts back (GSO)
//! into as many segments as were merged.
#![no_main]

use brindle_wire::{Gro, Gso, Push, VnetHdr};
use libfuzzer_sys::fuzz_target;

fn check(gro: &mut Gro) {
    let Some(out) = gro.take() else {
        return;
    };
    assert_eq!(VnetHdr::parse(out.bytes).unwrap(), out.header);
    if out.segments > 1 {
        let gso = Gso::new(&out.header, out.frame()).unwrap();
        assert_eq!(gso.count(), usize::from(out.segments));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut gro = Gro::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let frame = &rest[2..2 + len];
        rest = &rest[2 + len..];
        match gro.push(frame) {
            Push::Merged { flush: true } => check(&mut gro),
            Push::Flush => {
                check(&mut gro);
                assert_ne!(gro.push(frame), Push::Flush);
            }
            _ => {}
        }
    }
    check(&mut gro);
});
