//! What the fast path pays per frame for each wire operation.
//!
//! `cargo bench -p brindle-wire --bench wire -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::net::Ipv4Addr;

use brindle_wire::encap::{self, OuterHeader};
use brindle_wire::{
    EthernetFrame, IpProtocol, IpipEncap, Ipv4Packet, Ipv4Repr, MacAddr, UdpChecksum, VxlanEncap,
    arp, checksum,
};
use criterion::{Criterion, criterion_group, criterion_main};

/// A 64-byte Ethernet frame: IPv4/UDP with 18 bytes of payload.
fn frame64() -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..14].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
    Ipv4Repr {
        src_addr: Ipv4Addr::new(10, 244, 0, 5),
        dst_addr: Ipv4Addr::new(10, 244, 1, 9),
        protocol: IpProtocol::Udp,
        payload_len: 30,
        ttl: 64,
        tos: 0,
        ident: 1,
        dont_frag: true,
        more_frags: false,
        frag_offset: 0,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut f[14..]))
    .unwrap();
    f
}

fn outer() -> OuterHeader {
    OuterHeader {
        src_mac: MacAddr([2, 0, 0, 0, 0, 0x0a]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 0x1a]),
        src_addr: Ipv4Addr::new(192, 168, 100, 1),
        dst_addr: Ipv4Addr::new(192, 168, 100, 2),
        ttl: 64,
        tos: 0,
        dont_frag: false,
    }
}

fn benches(c: &mut Criterion) {
    let f = frame64();

    c.bench_function("parse eth+ipv4 (new_checked, 5 fields)", |b| {
        b.iter(|| {
            let eth = EthernetFrame::new_checked(black_box(&f[..])).unwrap();
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            black_box((
                eth.ethertype(),
                ip.dst_addr(),
                ip.src_addr(),
                ip.ttl(),
                ip.protocol(),
            ))
        })
    });

    c.bench_function("reference: etherparse SlicedPacket::from_ethernet", |b| {
        b.iter(|| {
            let p = etherparse::SlicedPacket::from_ethernet(black_box(&f[..])).unwrap();
            black_box(p.net.is_some())
        })
    });

    let mut e = f.clone();
    c.bench_function(
        "reference: etherparse TTL decrement (parse, modify, write back)",
        |b| {
            b.iter(|| {
                let (mut h, _) = etherparse::Ipv4Header::from_slice(black_box(&e[14..])).unwrap();
                h.time_to_live = h.time_to_live.wrapping_sub(1).max(1);
                h.header_checksum = h.calc_header_checksum();
                let len = h.header_len();
                e[14..14 + len].copy_from_slice(&h.to_bytes());
            })
        },
    );

    let mut g = f.clone();
    c.bench_function(
        "forward in place: MAC rewrite + TTL decrement (RFC 1624)",
        |b| {
            b.iter(|| {
                let mut eth = EthernetFrame::new_unchecked(black_box(&mut g[..]));
                eth.rewrite_addrs(MacAddr([0xee; 6]), MacAddr([2, 0, 0, 0, 0, 3]));
                let mut ip = Ipv4Packet::new_unchecked(&mut g[14..34]);
                if ip.decrement_ttl() == 0 {
                    ip.set_ttl(64);
                }
            })
        },
    );

    let mut ipip = [0u8; encap::IPIP_GROWTH + 64];
    ipip[encap::IPIP_HEADER_LEN..].copy_from_slice(&f[14..]);
    let t = IpipEncap { outer: outer() };
    c.bench_function("IPIP encap: outer Ethernet + IPv4 in place", |b| {
        b.iter(|| t.emit(black_box(&mut ipip[..]), 7).unwrap())
    });

    let mut vx = [0u8; encap::VXLAN_GROWTH + 64];
    vx[encap::VXLAN_HEADER_LEN..].copy_from_slice(&f);
    for (name, csum) in [
        ("VXLAN encap, UDP checksum 0", UdpChecksum::Zero),
        ("VXLAN encap, UDP checksum computed", UdpChecksum::Compute),
    ] {
        let t = VxlanEncap {
            outer: outer(),
            vni: 4096,
            dst_port: 4789,
            udp_checksum: csum,
        };
        c.bench_function(name, |b| {
            b.iter(|| t.emit(black_box(&mut vx[..]), 7, 49152).unwrap())
        });
    }
    c.bench_function("VXLAN decap: vxlan_inner", |b| {
        b.iter(|| encap::vxlan_inner(black_box(&vx[..]), 4789).unwrap())
    });

    let payload = vec![0x5au8; 1500];
    c.bench_function("RFC 1071 checksum over 1500 bytes", |b| {
        b.iter(|| checksum::data(black_box(&payload[..])))
    });

    let arp_payload = [0u8; 28];
    c.bench_function("ARP speculative target-IP test", |b| {
        b.iter(|| {
            arp::test_speculative_tpa(black_box(&arp_payload[..]), Ipv4Addr::new(169, 254, 1, 1))
        })
    });
}

criterion_group!(wire, benches);
criterion_main!(wire);
