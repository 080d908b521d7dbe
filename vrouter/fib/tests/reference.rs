//! The FIB against a naive reference LPM (a scan of every route) under random
//! sequences of inserts, removals, batches and lookups, IPv4 and IPv6 mixed.
//!
//! Prefixes come from a few anchor addresses with biased lengths, so routes
//! nest, overlap, replace each other and cross the structures' internal
//! boundaries (/12 chunks and /24 tbl8 groups in IPv4, 6-bit strides in IPv6).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use brindle_fib::{Fib, FibChange, NextHop};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::prelude::*;

/// The reference: every route in a Vec; lookup scans them all.
#[derive(Default)]
struct Reference {
    routes: Vec<(IpNet, NextHop)>,
}

impl Reference {
    fn insert(&mut self, prefix: IpNet, hop: NextHop) -> Option<NextHop> {
        let prefix = prefix.trunc();
        match self.routes.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, h)) => Some(std::mem::replace(h, hop)),
            None => {
                self.routes.push((prefix, hop));
                None
            }
        }
    }

    fn remove(&mut self, prefix: &IpNet) -> Option<NextHop> {
        let prefix = prefix.trunc();
        let at = self.routes.iter().position(|(p, _)| *p == prefix)?;
        Some(self.routes.swap_remove(at).1)
    }

    fn lookup(&self, addr: IpAddr) -> Option<NextHop> {
        self.routes
            .iter()
            .filter(|(p, _)| p.contains(&addr))
            .max_by_key(|(p, _)| p.prefix_len())
            .map(|(_, h)| *h)
    }
}

const V4_ANCHORS: [u32; 6] = [
    0x0a01_0203, // 10.1.2.3
    0x0a01_82c7, // 10.1.130.199
    0x0a10_0001, // 10.16.0.1: the next /12 chunk
    0xc0a8_01ff, // 192.168.1.255
    0x0000_0000,
    0xffff_ffff,
];

const V6_ANCHORS: [u128; 5] = [
    0x2001_0db8_0000_0001_0000_0000_0000_0001,
    0x2001_0db8_0000_0001_8000_0000_0000_00ff,
    0xfd00_0000_0000_0000_0000_0000_0000_0000,
    0,
    u128::MAX,
];

fn v4_len() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(vec![0u8, 1, 8, 11, 12, 13, 16, 20, 23, 24, 25, 26, 30, 31, 32]),
        1 => 0u8..=32,
    ]
}

fn v6_len() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(vec![0u8, 5, 6, 7, 12, 32, 47, 48, 49, 63, 64, 65, 120, 126, 127, 128]),
        1 => 0u8..=128,
    ]
}

/// An address near an anchor: the anchor with a few low bits flipped.
fn v4_addr() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        4 => (prop::sample::select(V4_ANCHORS.to_vec()), 0u32..4, 0u32..32)
            .prop_map(|(a, flips, bit)| Ipv4Addr::from(a ^ ((flips & 1) << bit))),
        1 => any::<u32>().prop_map(Ipv4Addr::from),
    ]
}

fn v6_addr() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        4 => (prop::sample::select(V6_ANCHORS.to_vec()), 0u32..4, 0u32..128)
            .prop_map(|(a, flips, bit)| Ipv6Addr::from(a ^ (u128::from(flips & 1) << bit))),
        1 => any::<u128>().prop_map(Ipv6Addr::from),
    ]
}

fn prefix() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (v4_addr(), v4_len()).prop_map(|(a, l)| IpNet::V4(Ipv4Net::new(a, l).unwrap())),
        (v6_addr(), v6_len()).prop_map(|(a, l)| IpNet::V6(Ipv6Net::new(a, l).unwrap())),
    ]
}

/// Few distinct next hops, so they are shared, freed and reused.
fn next_hop() -> impl Strategy<Value = NextHop> {
    prop_oneof![
        (0u16..4).prop_map(|port| NextHop::Local { port }),
        Just(NextHop::Blackhole),
        Just(NextHop::Host),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Insert(IpNet, NextHop),
    Remove(IpNet),
    Batch(Vec<(IpNet, Option<NextHop>)>),
    Lookup(IpAddr),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (prefix(), next_hop()).prop_map(|(p, h)| Op::Insert(p, h)),
        3 => prefix().prop_map(Op::Remove),
        1 => prop::collection::vec((prefix(), prop::option::of(next_hop())), 0..8).prop_map(Op::Batch),
        2 => prop_oneof![v4_addr().prop_map(IpAddr::V4), v6_addr().prop_map(IpAddr::V6)]
            .prop_map(Op::Lookup),
    ]
}

/// Addresses whose answers may differ: anchors, their neighbours, and the
/// first and last address of every prefix the case used.
fn probes(ops: &[Op]) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for a in V4_ANCHORS {
        for d in [0u32, 1, 255, 256] {
            out.push(IpAddr::V4(Ipv4Addr::from(a.wrapping_add(d))));
            out.push(IpAddr::V4(Ipv4Addr::from(a.wrapping_sub(d))));
        }
    }
    for a in V6_ANCHORS {
        for d in [0u128, 1, 1 << 64] {
            out.push(IpAddr::V6(Ipv6Addr::from(a.wrapping_add(d))));
            out.push(IpAddr::V6(Ipv6Addr::from(a.wrapping_sub(d))));
        }
    }
    for op in ops {
        let prefixes: Vec<IpNet> = match op {
            Op::Insert(p, _) | Op::Remove(p) => vec![*p],
            Op::Batch(changes) => changes.iter().map(|(p, _)| *p).collect(),
            Op::Lookup(a) => {
                out.push(*a);
                Vec::new()
            }
        };
        for p in prefixes {
            out.push(p.network());
            out.push(p.broadcast());
        }
    }
    out
}

fn check_all(fib: &Fib, reader: &brindle_fib::FibReader, reference: &Reference, probes: &[IpAddr]) {
    for &addr in probes {
        assert_eq!(reader.lookup(addr), reference.lookup(addr), "lookup {addr}");
    }
    // The batch lookups (blocks of 32, lanes of 8) give the same answers.
    let v4: Vec<Ipv4Addr> = probes
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6: Vec<Ipv6Addr> = probes
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
        .collect();
    let mut out = vec![Some(NextHop::Host); v4.len()];
    reader.lookup_v4_batch(&v4, &mut out);
    for (addr, got) in v4.iter().zip(&out) {
        assert_eq!(*got, reference.lookup(IpAddr::V4(*addr)), "batch {addr}");
    }
    let mut out = vec![Some(NextHop::Host); v6.len()];
    reader.snapshot().lookup_v6_batch(&v6, &mut out);
    for (addr, got) in v6.iter().zip(&out) {
        assert_eq!(*got, reference.lookup(IpAddr::V6(*addr)), "batch {addr}");
    }
    assert_eq!(fib.len(), reference.routes.len());
    let mut ours: Vec<_> = fib.routes().collect();
    let mut theirs = reference.routes.clone();
    ours.sort_by_key(|(p, _)| *p);
    theirs.sort_by_key(|(p, _)| *p);
    assert_eq!(ours, theirs);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fib_matches_a_naive_longest_prefix_scan(ops in prop::collection::vec(op(), 1..48)) {
        let (mut fib, reader) = Fib::new();
        let mut reference = Reference::default();
        let probes = probes(&ops);
        for op in &ops {
            match op {
                Op::Insert(p, h) => {
                    prop_assert_eq!(fib.insert(*p, *h), reference.insert(*p, *h), "insert {}", p);
                }
                Op::Remove(p) => {
                    prop_assert_eq!(fib.remove(p), reference.remove(p), "remove {}", p);
                }
                Op::Batch(changes) => {
                    let snapshot = reader.snapshot();
                    let before: Vec<_> = probes.iter().map(|a| snapshot.lookup(*a)).collect();
                    fib.apply(changes.iter().map(|&(prefix, hop)| match hop {
                        Some(next_hop) => FibChange::Upsert { prefix, next_hop },
                        None => FibChange::Remove { prefix },
                    }))
                    .unwrap();
                    for &(p, h) in changes {
                        match h {
                            Some(h) => reference.insert(p, h),
                            None => reference.remove(&p),
                        };
                    }
                    // A snapshot taken before the batch is not changed by it.
                    let after: Vec<_> = probes.iter().map(|a| snapshot.lookup(*a)).collect();
                    prop_assert_eq!(before, after);
                }
                Op::Lookup(a) => {
                    prop_assert_eq!(reader.lookup(*a), reference.lookup(*a), "lookup {}", a);
                }
            }
            check_all(&fib, &reader, &reference, &probes);
        }
        // Remove everything: both tables must end empty and answer nothing.
        for (p, _) in reference.routes.clone() {
            prop_assert!(fib.remove(&p).is_some());
            reference.remove(&p);
        }
        check_all(&fib, &reader, &reference, &probes);
        prop_assert_eq!(fib.memory().next_hops, 0);
    }
}
