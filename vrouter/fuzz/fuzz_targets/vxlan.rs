//! VXLAN: the input as a VXLAN header (view, Repr round trip) and as a whole
//! frame for decapsulation; what decap finds is re-encapsulated and must
//! decapsulate to the same inner frame.
#![no_main]

use std::net::Ipv4Addr;

use brindle_wire::encap::{self, OuterHeader};
use brindle_wire::{MacAddr, UdpChecksum, VXLAN_PORT, VxlanEncap, VxlanPacket, VxlanRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = VxlanPacket::new_checked(data) {
        let _ = (
            packet.flags(),
            packet.has_vni(),
            packet.vni(),
            packet.payload(),
        );
        if let Ok(repr) = VxlanRepr::parse(&packet) {
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut VxlanPacket::new_unchecked(&mut out[..]))
                .unwrap();
            assert_eq!(
                VxlanRepr::parse(&VxlanPacket::new_checked(&out[..]).unwrap()),
                Ok(repr)
            );
        }
    }

    let Some(decap) = encap::vxlan_inner(data, VXLAN_PORT) else {
        return;
    };
    let inner = &data[decap.inner_offset..decap.inner_offset + decap.inner_len];
    let tunnel = VxlanEncap {
        outer: OuterHeader {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src_addr: decap.outer_dst,
            dst_addr: Ipv4Addr::new(192, 0, 2, 1),
            ttl: 64,
            tos: 0,
            dont_frag: false,
        },
        vni: decap.vni,
        dst_port: VXLAN_PORT,
        udp_checksum: UdpChecksum::Compute,
    };
    let mut out = vec![0u8; encap::VXLAN_HEADER_LEN + inner.len()];
    out[encap::VXLAN_HEADER_LEN..].copy_from_slice(inner);
    if tunnel.emit(&mut out, 1, 49152).is_err() {
        // Only an inner frame too long for a 16-bit IPv4 length fails.
        assert!(out.len() > 0xffff);
        return;
    }
    let again = encap::vxlan_inner(&out, VXLAN_PORT).expect("our own encap decapsulates");
    assert_eq!(again.vni, decap.vni);
    assert_eq!(
        &out[again.inner_offset..again.inner_offset + again.inner_len],
        inner
    );
});
