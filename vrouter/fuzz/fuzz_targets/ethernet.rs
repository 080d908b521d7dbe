//! Ethernet (with 802.1Q): view + accessors, Repr parse → emit → parse,
//! and in-place MAC rewrites that must leave the payload alone.
#![no_main]

use brindle_wire::{EthernetFrame, EthernetRepr, MacAddr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = EthernetFrame::new_checked(data) else {
        return;
    };
    let _ = (frame.dst_addr(), frame.src_addr(), frame.outer_ethertype());
    let _ = (frame.ethertype(), frame.vlan(), frame.header_len());
    let payload = frame.payload();
    let repr = EthernetRepr::parse(&frame).expect("a checked frame parses");

    let mut out = vec![0u8; repr.buffer_len() + payload.len()];
    repr.emit(&mut EthernetFrame::new_unchecked(&mut out[..]))
        .expect("buffer_len is enough");
    out[repr.buffer_len()..].copy_from_slice(payload);
    let again = EthernetFrame::new_checked(&out[..]).expect("emitted frame checks");
    assert_eq!(EthernetRepr::parse(&again), Ok(repr));
    assert_eq!(again.payload(), payload);

    let mut copy = data.to_vec();
    let mut f = EthernetFrame::new_checked(&mut copy[..]).unwrap();
    f.rewrite_addrs(MacAddr([0xee; 6]), MacAddr::BROADCAST);
    f.swap_addrs();
    assert_eq!(f.src_addr(), MacAddr::BROADCAST);
    assert_eq!(&copy[12..], &data[12..]);
});
