//! GSO and GRO by the kernel's rules, on built super-packets: what each
//! segment carries, what GRO merges and where it stops, a round trip
//! (split then merge gives the super-packet back) as a property, and no
//! panic on any bytes.

mod common;

use brindle_wire::vnet::{DATA_VALID, GsoType, NEEDS_CSUM};
use brindle_wire::{Error, Gro, Gso, Push, VnetHdr, checksum};
use common::{ACK, CWR, FIN, PSH, Spec, build, segments};
use proptest::prelude::*;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// The transport checksum verifies over the segment (IPv4 or IPv6).
fn transport_verifies(f: &[u8], v6: bool) -> bool {
    let (l4, proto) = if v6 { (54, f[20]) } else { (34, f[23]) };
    let len = f.len() - l4;
    let mut pseudo = vec![];
    if v6 {
        pseudo.extend_from_slice(&f[22..54]);
        pseudo.extend_from_slice(&(len as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, proto]);
    } else {
        pseudo.extend_from_slice(&f[26..34]);
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(len as u16).to_be_bytes());
    }
    checksum::combine(&[checksum::data(&pseudo), checksum::data(&f[l4..])]) == 0xffff
}

#[test]
fn tcpv4_super_packet_becomes_mss_segments_with_ids_seqs_flags_and_checksums() {
    let mut s = Spec::tcp4(4000, 1448);
    s.flags = ACK | PSH | FIN | CWR;
    let (hdr, frame) = build(&s);
    let segs = segments(&hdr, &frame);
    assert_eq!(segs.len(), 3);
    let hl = 14 + 20 + 32;
    let sizes = [1448, 1448, 4000 - 2 * 1448];
    for (i, f) in segs.iter().enumerate() {
        assert_eq!(f.len(), hl + sizes[i]);
        assert_eq!(&f[..14], &frame[..14], "Ethernet header");
        assert_eq!(usize::from(be16(f, 16)), f.len() - 14, "IPv4 total length");
        assert_eq!(be16(f, 18), 0xfff0u16.wrapping_add(i as u16), "IP ID");
        assert!(checksum::verifies(&f[14..34]), "IPv4 header checksum");
        assert_eq!(be32(f, 38), s.seq.wrapping_add(1448 * i as u32), "seq");
        assert_eq!(be32(f, 42), be32(&frame, 42), "ack");
        let flags = f[47];
        assert_eq!(flags & CWR != 0, i == 0, "CWR on the first only");
        assert_eq!(flags & (PSH | FIN) != 0, i == 2, "PSH/FIN on the last only");
        assert_eq!(flags & ACK, ACK);
        assert_eq!(&f[54..hl], &frame[54..hl], "options");
        let off = hl + 1448 * i;
        assert_eq!(&f[hl..], &frame[off..off + sizes[i]], "payload");
        assert!(transport_verifies(f, false), "TCP checksum of segment {i}");
    }
}

#[test]
fn tcpv6_and_udp_super_packets_are_cut_with_their_lengths_and_checksums() {
    for (v6, tcp) in [(true, true), (false, false), (true, false)] {
        let s = Spec {
            v6,
            tcp,
            options: vec![],
            ..Spec::tcp4(3001, 1000)
        };
        let (hdr, frame) = build(&s);
        let segs = segments(&hdr, &frame);
        assert_eq!(segs.len(), 4, "v6 {v6} tcp {tcp}");
        for (i, f) in segs.iter().enumerate() {
            let l4 = if v6 { 54 } else { 34 };
            let hl = l4 + if tcp { 20 } else { 8 };
            let size = if i == 3 { 1 } else { 1000 };
            assert_eq!(f.len(), hl + size);
            if v6 {
                assert_eq!(usize::from(be16(f, 18)), f.len() - 54, "payload length");
            } else {
                assert_eq!(be16(f, 18), 0xfff0u16.wrapping_add(i as u16), "IP ID");
                assert!(checksum::verifies(&f[14..34]));
            }
            if !tcp {
                assert_eq!(usize::from(be16(f, l4 + 4)), f.len() - l4, "UDP length");
                assert_ne!(be16(f, l4 + 6), 0, "UDP checksum sent");
            }
            assert!(transport_verifies(f, v6), "v6 {v6} tcp {tcp} segment {i}");
        }
    }
}

#[test]
fn a_payload_that_fits_one_segment_gives_one_segment() {
    let (hdr, frame) = build(&Spec::tcp4(100, 1448));
    let segs = segments(&hdr, &frame);
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].len(), frame.len());
    assert!(transport_verifies(&segs[0], false));
}

#[test]
fn gso_refuses_what_does_not_match_its_header_with_a_clear_error() {
    let (hdr, frame) = build(&Spec::tcp4(3000, 1448));
    let with = |h: VnetHdr| Gso::new(&h, &frame).map(|g| g.count());
    assert_eq!(with(hdr), Ok(3));
    let plain = VnetHdr {
        gso_type: GsoType::None,
        ..hdr
    };
    assert_eq!(with(plain), Err(Error::Unsupported));
    let ufo = VnetHdr {
        gso_type: GsoType::Ufo,
        ..hdr
    };
    assert_eq!(with(ufo), Err(Error::Unsupported));
    let v6_on_v4 = VnetHdr {
        gso_type: GsoType::TcpV6,
        ..hdr
    };
    assert_eq!(with(v6_on_v4), Err(Error::Malformed));
    assert_eq!(with(VnetHdr { gso_size: 0, ..hdr }), Err(Error::Malformed));
    assert_eq!(
        with(VnetHdr {
            csum_start: 14,
            ..hdr
        }),
        Err(Error::Malformed)
    );
    assert_eq!(
        with(VnetHdr {
            csum_offset: 6,
            ..hdr
        }),
        Err(Error::Malformed)
    );
    // Without NEEDS_CSUM the csum fields are not looked at.
    assert_eq!(
        with(VnetHdr {
            flags: 0,
            csum_start: 0,
            ..hdr
        }),
        Ok(3)
    );
    for cut in 0..66 {
        assert!(Gso::new(&hdr, &frame[..cut]).is_err(), "cut at {cut}");
    }
    let (h0, empty) = build(&Spec::tcp4(0, 1448));
    assert_eq!(
        Gso::new(&h0, &empty).map(|g| g.count()),
        Err(Error::Malformed)
    );

    let gso = Gso::new(&hdr, &frame).unwrap();
    let mut small = vec![0; gso.segment_len(0) - 1];
    assert_eq!(gso.write(0, &mut small), Err(Error::BufferTooSmall));
    assert_eq!(gso.write(3, &mut [0; 2000]), Err(Error::Malformed));
    assert_eq!(gso.segment_len(3), 0);
}

/// Pushes every frame; returns the verdicts.
fn push_all(gro: &mut Gro, frames: &[Vec<u8>]) -> Vec<Push> {
    frames.iter().map(|f| gro.push(f)).collect()
}

#[test]
fn gro_merges_the_segments_back_into_the_super_packet() {
    for v6 in [false, true] {
        let s = Spec {
            v6,
            ..Spec::tcp4(20000, 1448)
        };
        let (hdr, frame) = build(&s);
        let segs = segments(&hdr, &frame);
        let mut gro = Gro::new();
        let verdicts = push_all(&mut gro, &segs);
        let last = verdicts.len() - 1;
        for (i, v) in verdicts.iter().enumerate() {
            assert_eq!(*v, Push::Merged { flush: i == last }, "segment {i}");
        }
        let out = gro.take().expect("held");
        assert_eq!(out.segments as usize, segs.len());
        assert_eq!(out.header, hdr);
        assert_eq!(out.frame(), &frame[..], "v6 {v6}");
        assert_eq!(VnetHdr::parse(out.bytes).unwrap(), out.header);
        assert!(gro.take().is_none());
    }
}

#[test]
fn one_held_segment_comes_out_unchanged_and_marked_valid() {
    let (hdr, frame) = build(&Spec::tcp4(3000, 1448));
    let segs = segments(&hdr, &frame);
    let mut gro = Gro::new();
    assert_eq!(gro.push(&segs[0]), Push::Merged { flush: false });
    let out = gro.take().unwrap();
    assert_eq!(out.segments, 1);
    assert_eq!(out.header.flags, DATA_VALID);
    assert!(!out.header.is_gso());
    assert_eq!(out.frame(), &segs[0][..]);
}

/// Segments of a stream, then one changed by `edit`: the changed one
/// must not join (GRO asks to flush first), and after the flush it is
/// held or passed on as `then` says.
fn stops_on(edit: impl Fn(&mut Vec<u8>), then: Push) {
    let (hdr, frame) = build(&Spec::tcp4(5000, 1000));
    let mut segs = segments(&hdr, &frame);
    edit(&mut segs[2]);
    let mut gro = Gro::new();
    assert_eq!(gro.push(&segs[0]), Push::Merged { flush: false });
    assert_eq!(gro.push(&segs[1]), Push::Merged { flush: false });
    assert_eq!(gro.push(&segs[2]), Push::Flush);
    assert_eq!(gro.take().unwrap().segments, 2);
    assert_eq!(gro.push(&segs[2]), then);
}

/// Recomputes the TCP checksum of an IPv4 segment after an edit.
fn fix_tcp4(f: &mut [u8]) {
    f[50..52].copy_from_slice(&[0, 0]);
    let mut pseudo = f[26..34].to_vec();
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
    let c = checksum::result(checksum::combine(&[
        checksum::data(&pseudo),
        checksum::data(&f[34..]),
    ]));
    f[50..52].copy_from_slice(&c.to_be_bytes());
}

const HELD: Push = Push::Merged { flush: false };

#[test]
fn gro_stops_where_the_kernel_does() {
    // A gap in the sequence.
    stops_on(
        |f| {
            let seq = be32(f, 38).wrapping_add(1);
            f[38..42].copy_from_slice(&seq.to_be_bytes());
            fix_tcp4(f);
        },
        HELD,
    );
    // Another ACK number.
    stops_on(
        |f| {
            f[45] ^= 1;
            fix_tcp4(f);
        },
        HELD,
    );
    // Other options (a later timestamp).
    stops_on(
        |f| {
            f[61] ^= 1;
            fix_tcp4(f);
        },
        HELD,
    );
    // Another window.
    stops_on(
        |f| {
            f[49] ^= 1;
            fix_tcp4(f);
        },
        HELD,
    );
    // CWR: does not join, but may start a super-packet.
    stops_on(
        |f| {
            f[47] |= CWR;
            fix_tcp4(f);
        },
        HELD,
    );
    // SYN/RST/URG: never held.
    for flag in [0x02, 0x04, 0x20] {
        stops_on(
            move |f| {
                f[47] |= flag;
                fix_tcp4(f);
            },
            Push::Bypass,
        );
    }
    // A bad TCP checksum: passed on for the pod's kernel to drop.
    stops_on(|f| f[100] ^= 0xff, Push::Bypass);
    // An IP ID that does not follow on (DF set, not fixed either).
    stops_on(
        |f| {
            f[19] ^= 0x10;
            f[24..26].copy_from_slice(&[0, 0]);
            let c = checksum::checksum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
        },
        HELD,
    );
    // Another TTL.
    stops_on(
        |f| {
            f[22] -= 1;
            f[24..26].copy_from_slice(&[0, 0]);
            let c = checksum::checksum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
        },
        HELD,
    );
}

#[test]
fn psh_fin_and_a_short_segment_join_and_end_the_super_packet() {
    let (hdr, frame) = build(&Spec::tcp4(2500, 1000));
    let segs = segments(&hdr, &frame); // 1000, 1000, 500 (PSH on the last)
    let mut gro = Gro::new();
    assert_eq!(
        push_all(&mut gro, &segs),
        [HELD, HELD, Push::Merged { flush: true }]
    );
    // PSH on a middle segment.
    let mut s = Spec::tcp4(3000, 1000);
    s.flags = ACK;
    let (hdr, frame) = build(&s);
    let mut segs = segments(&hdr, &frame);
    segs[1][47] |= PSH;
    fix_tcp4(&mut segs[1]);
    let mut gro = Gro::new();
    assert_eq!(gro.push(&segs[0]), HELD);
    assert_eq!(gro.push(&segs[1]), Push::Merged { flush: true });
    let out = gro.take().unwrap();
    assert_eq!(out.frame()[47] & PSH, PSH, "PSH carried into the header");
    // A lone segment with PSH is not held.
    assert_eq!(gro.push(&segs[1]), Push::Bypass);
    // A segment larger than the first does not join.
    let (hdr, frame) = build(&Spec::tcp4(3000, 1000));
    let small = segments(&hdr, &frame);
    let (hdr, frame) = build(&Spec::tcp4(3000, 1200));
    let mut big = segments(&hdr, &frame)[0].clone();
    big[38..42].copy_from_slice(&be32(&small[0], 38).wrapping_add(1000).to_be_bytes());
    fix_tcp4(&mut big);
    let mut gro = Gro::new();
    assert_eq!(gro.push(&small[0]), HELD);
    assert_eq!(gro.push(&big), Push::Flush);
}

#[test]
fn udp_pure_acks_and_other_traffic_pass_through() {
    let mut gro = Gro::new();
    let (hdr, frame) = build(&Spec {
        tcp: false,
        ..Spec::tcp4(3000, 1000)
    });
    for f in segments(&hdr, &frame) {
        assert_eq!(gro.push(&f), Push::Bypass);
    }
    let (_, ack) = build(&Spec::tcp4(0, 1000));
    let mut ack = ack;
    fix_tcp4(&mut ack);
    assert_eq!(gro.push(&ack), Push::Bypass);
    assert_eq!(gro.push(&[0u8; 10]), Push::Bypass);
    assert!(!gro.is_holding());
}

#[test]
fn gro_stays_below_64k() {
    // Two contiguous streams of full 1000-byte segments, 80 in all.
    let s1 = Spec {
        flags: ACK,
        ..Spec::tcp4(40000, 1000)
    };
    let s2 = Spec {
        seq: s1.seq.wrapping_add(40000),
        ident: s1.ident.wrapping_add(40),
        ..s1.clone()
    };
    let (h1, f1) = build(&s1);
    let (h2, f2) = build(&s2);
    let mut segs = segments(&h1, &f1);
    segs.extend(segments(&h2, &f2));
    let mut gro = Gro::new();
    let verdicts = push_all(&mut gro, &segs[..66]);
    assert!(verdicts[..65].iter().all(|v| *v == HELD));
    assert_eq!(verdicts[65], Push::Flush);
    let out = gro.take().unwrap();
    assert_eq!(out.segments, 65);
    assert_eq!(out.frame().len() - 14, 20 + 32 + 65 * 1000);
    assert_eq!(usize::from(be16(out.frame(), 16)), 65052);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Split then merge gives back the super-packet, byte for byte, with
    /// the header GRO gives it.
    #[test]
    fn split_then_merge_is_the_identity(
        v6 in any::<bool>(),
        payload in 1usize..60000,
        mss in 536u16..9000,
        psh in any::<bool>(),
        fin in any::<bool>(),
        cwr in any::<bool>(),
        ts in any::<bool>(),
        ident in any::<u16>(),
        seq in any::<u32>(),
        seed in any::<u8>(),
    ) {
        let base = Spec::tcp4(payload, mss);
        let s = Spec {
            v6,
            flags: ACK | if psh { PSH } else { 0 } | if fin { FIN } else { 0 } | if cwr { CWR } else { 0 },
            options: if ts { base.options.clone() } else { vec![] },
            ident,
            seq,
            seed,
            ..base
        };
        let (hdr, frame) = build(&s);
        let segs = segments(&hdr, &frame);
        let mut gro = Gro::new();
        if segs.len() == 1 && (psh || fin) {
            // A lone segment with PSH or FIN is not held (the kernel's rule).
            prop_assert_eq!(gro.push(&segs[0]), Push::Bypass);
            return Ok(());
        }
        let mut merged = 0;
        for f in &segs {
            match gro.push(f) {
                Push::Merged { .. } => merged += 1,
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(merged, segs.len());
        let out = gro.take().unwrap();
        if segs.len() > 1 {
            prop_assert_eq!(out.frame(), &frame[..]);
            prop_assert_eq!(out.header.flags, NEEDS_CSUM);
            prop_assert_eq!(out.header.gso_size, mss);
            prop_assert_eq!(out.header.ecn, cwr);
            // And cutting the merged packet again gives the same segments.
            prop_assert_eq!(segments(&out.header, out.frame()), segs);
        } else {
            prop_assert_eq!(out.frame(), &segs[0][..]);
        }
    }

    /// Any bytes with any header: an error or segments, never a panic;
    /// GRO takes any bytes.
    #[test]
    fn no_panic_on_any_input(hdr in proptest::collection::vec(any::<u8>(), 12), frame in proptest::collection::vec(any::<u8>(), 0..200)) {
        let h = VnetHdr::parse(&hdr).unwrap();
        if let Ok(g) = Gso::new(&h, &frame) {
            let mut out = vec![0; 300];
            for i in 0..g.count().min(50) {
                g.write(i, &mut out).unwrap();
            }
        }
        let mut gro = Gro::new();
        let _ = gro.push(&frame);
        let _ = gro.push(&frame);
        let _ = gro.take();
    }
}
