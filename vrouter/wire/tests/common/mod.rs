//! Super-packets as a pod's kernel hands them to a TAP reader: Ethernet,
//! IPv4 (DF) or IPv6, TCP or UDP, the transport checksum field holding the
//! pseudo-header sum with `NEEDS_CSUM` (as `tcp_v4_send_check` leaves it
//! for an offloading device).

#![allow(dead_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

use brindle_wire::IpProtocol;
use brindle_wire::checksum;
use brindle_wire::vnet::{GsoType, NEEDS_CSUM, VnetHdr};

pub const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x02];
pub const SRC4: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 1);
pub const DST4: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 2);
pub const SRC6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x65, 0, 0, 0, 0, 0, 1);
pub const DST6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x65, 0, 0, 0, 0, 0, 2);

pub const ACK: u8 = 0x10;
pub const PSH: u8 = 0x08;
pub const FIN: u8 = 0x01;
pub const CWR: u8 = 0x80;

/// What to build.
#[derive(Debug, Clone)]
pub struct Spec {
    pub v6: bool,
    pub tcp: bool,
    pub payload: usize,
    pub mss: u16,
    pub flags: u8,
    /// TCP options (a multiple of 4 bytes).
    pub options: Vec<u8>,
    pub ident: u16,
    pub seq: u32,
    /// Seeds the payload bytes.
    pub seed: u8,
}

impl Spec {
    pub fn tcp4(payload: usize, mss: u16) -> Spec {
        Spec {
            v6: false,
            tcp: true,
            payload,
            mss,
            flags: ACK | PSH,
            // NOP NOP timestamps, as Linux sends on every segment.
            options: vec![1, 1, 8, 10, 0, 0x12, 0x34, 0x56, 0x00, 0xab, 0xcd, 0xef],
            ident: 0xfff0,
            seq: 0xffff_f000,
            seed: 7,
        }
    }
}

/// Builds the super-packet and its virtio-net header.
pub fn build(s: &Spec) -> (VnetHdr, Vec<u8>) {
    let l4_hdr = if s.tcp { 20 + s.options.len() } else { 8 };
    let l3 = 14;
    let ip_hdr = if s.v6 { 40 } else { 20 };
    let l4 = l3 + ip_hdr;
    let end = l4 + l4_hdr + s.payload;
    let mut f = vec![0u8; end];
    f[0..6].copy_from_slice(&DST_MAC);
    f[6..12].copy_from_slice(&SRC_MAC);
    let proto = if s.tcp {
        IpProtocol::Tcp
    } else {
        IpProtocol::Udp
    };
    if s.v6 {
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[l3..l3 + 4].copy_from_slice(&[0x60, 0x01, 0x23, 0x45]);
        f[l3 + 4..l3 + 6].copy_from_slice(&((end - l4) as u16).to_be_bytes());
        f[l3 + 6] = u8::from(proto);
        f[l3 + 7] = 64;
        f[l3 + 8..l3 + 24].copy_from_slice(&SRC6.octets());
        f[l3 + 24..l3 + 40].copy_from_slice(&DST6.octets());
    } else {
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[l3] = 0x45;
        f[l3 + 2..l3 + 4].copy_from_slice(&((end - l3) as u16).to_be_bytes());
        f[l3 + 4..l3 + 6].copy_from_slice(&s.ident.to_be_bytes());
        f[l3 + 6] = 0x40; // DF
        f[l3 + 8] = 64;
        f[l3 + 9] = u8::from(proto);
        f[l3 + 12..l3 + 16].copy_from_slice(&SRC4.octets());
        f[l3 + 16..l3 + 20].copy_from_slice(&DST4.octets());
        let c = checksum::checksum(&f[l3..l4]);
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    f[l4..l4 + 2].copy_from_slice(&40000u16.to_be_bytes());
    f[l4 + 2..l4 + 4].copy_from_slice(&5201u16.to_be_bytes());
    if s.tcp {
        f[l4 + 4..l4 + 8].copy_from_slice(&s.seq.to_be_bytes());
        f[l4 + 8..l4 + 12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        f[l4 + 12] = ((l4_hdr / 4) as u8) << 4;
        f[l4 + 13] = s.flags;
        f[l4 + 14..l4 + 16].copy_from_slice(&502u16.to_be_bytes());
        f[l4 + 20..l4 + l4_hdr].copy_from_slice(&s.options);
    } else {
        f[l4 + 4..l4 + 6].copy_from_slice(&((end - l4) as u16).to_be_bytes());
    }
    let mut x = s.seed;
    for b in &mut f[l4 + l4_hdr..] {
        x = x.wrapping_mul(29).wrapping_add(11);
        *b = x;
    }
    let len = end - l4;
    let pseudo = if s.v6 {
        checksum::pseudo_header_v6(SRC6, DST6, proto, len as u32)
    } else {
        checksum::pseudo_header_v4(SRC4, DST4, proto, len as u16)
    };
    let at = l4 + if s.tcp { 16 } else { 6 };
    f[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    let hdr = VnetHdr {
        flags: NEEDS_CSUM,
        gso_type: match (s.tcp, s.v6) {
            (true, false) => GsoType::TcpV4,
            (true, true) => GsoType::TcpV6,
            (false, _) => GsoType::UdpL4,
        },
        ecn: s.tcp && s.flags & CWR != 0,
        hdr_len: (l4 + l4_hdr) as u16,
        gso_size: s.mss,
        csum_start: l4 as u16,
        csum_offset: if s.tcp { 16 } else { 6 },
        num_buffers: 0,
    };
    (hdr, f)
}

/// Every segment of a super-packet, each in its own buffer.
pub fn segments(hdr: &VnetHdr, frame: &[u8]) -> Vec<Vec<u8>> {
    let gso = brindle_wire::Gso::new(hdr, frame).expect("gso");
    (0..gso.count())
        .map(|i| {
            let mut out = vec![0xa5; gso.segment_len(i) + 7];
            let n = gso.write(i, &mut out).expect("write");
            assert_eq!(n, gso.segment_len(i));
            assert!(
                out[n..].iter().all(|&b| b == 0xa5),
                "wrote past the segment"
            );
            out.truncate(n);
            out
        })
        .collect()
}
