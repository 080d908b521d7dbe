//! Writers churn routes while readers look up probe addresses whose possible
//! answers are known: every answer must be one of the legal ones (the next
//! hop of some route that may hold the address at that moment), never a torn
//! value, a stale index reused for another next hop, or "no route" where a
//! stable covering route exists.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use brindle_fib::{Fib, FibChange, FibReader, NextHop};
use ipnet::IpNet;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn local(port: u16) -> NextHop {
    NextHop::Local { port }
}

/// Each churned prefix always maps to one of two next hops.
struct Churned {
    prefix: IpNet,
    hops: [NextHop; 2],
}

fn churned() -> Vec<Churned> {
    let gw = |a: &str, port| NextHop::Gateway {
        via: a.parse().unwrap(),
        port,
    };
    vec![
        Churned {
            prefix: net("10.1.0.0/16"),
            hops: [local(1), local(11)],
        },
        Churned {
            prefix: net("10.1.2.0/24"),
            hops: [local(2), local(12)],
        },
        Churned {
            prefix: net("10.1.2.128/25"),
            hops: [local(3), local(13)],
        },
        Churned {
            prefix: net("10.1.2.200/32"),
            hops: [gw("10.1.2.200", 4), gw("10.1.2.201", 14)],
        },
        Churned {
            prefix: net("fd00:1::/32"),
            hops: [local(21), local(31)],
        },
        Churned {
            prefix: net("fd00:1:2::/48"),
            hops: [local(22), local(32)],
        },
        Churned {
            prefix: net("fd00:1:2:3::/64"),
            hops: [local(23), local(33)],
        },
        Churned {
            prefix: net("fd00:1:2:3::200/128"),
            hops: [gw("fd00::1", 24), gw("fd00::2", 34)],
        },
    ]
}

/// A probe and every answer it may legally get: the stable covering route's
/// next hop or a next hop of any churned route holding it.
fn probes() -> Vec<(IpAddr, Vec<Option<NextHop>>)> {
    let stable_v4 = Some(NextHop::Blackhole);
    let stable_v6 = Some(NextHop::Host);
    let churned = churned();
    let legal = |addr: IpAddr, stable: Option<NextHop>| {
        let mut answers = vec![stable];
        for c in &churned {
            if c.prefix.contains(&addr) {
                answers.extend(c.hops.iter().map(|h| Some(*h)));
            }
        }
        (addr, answers)
    };
    let mut out: Vec<_> = [
        "10.1.2.200",
        "10.1.2.201",
        "10.1.2.100",
        "10.1.9.9",
        "10.2.0.0",
    ]
    .iter()
    .map(|a| legal(a.parse().unwrap(), stable_v4))
    .collect();
    out.extend(
        [
            "fd00:1:2:3::200",
            "fd00:1:2:3::201",
            "fd00:1:2:4::1",
            "fd00:1:3::1",
            "fd00:2::1",
        ]
        .iter()
        .map(|a| legal(a.parse().unwrap(), stable_v6)),
    );
    // Outside every route, stable or churned: never an answer.
    out.push(("11.0.0.1".parse().unwrap(), vec![None]));
    out.push(("fe80::1".parse().unwrap(), vec![None]));
    out
}

fn check(addr: IpAddr, got: Option<NextHop>, legal: &[Option<NextHop>]) {
    assert!(
        legal.contains(&got),
        "{addr}: got {got:?}, legal answers {legal:?}"
    );
}

fn reader_loop(reader: FibReader, stop: &AtomicBool, lookups: &AtomicU64) {
    let probes = probes();
    let v4: Vec<Ipv4Addr> = probes
        .iter()
        .filter_map(|(a, _)| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6: Vec<Ipv6Addr> = probes
        .iter()
        .filter_map(|(a, _)| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
        .collect();
    let mut out4 = vec![None; v4.len()];
    let mut out6 = vec![None; v6.len()];
    let mut count = 0u64;
    // At least one pass, however fast the writers are.
    loop {
        for (addr, legal) in &probes {
            check(*addr, reader.lookup(*addr), legal);
        }
        let snapshot = reader.snapshot();
        snapshot.lookup_v4_batch(&v4, &mut out4);
        snapshot.lookup_v6_batch(&v6, &mut out6);
        let batch_answers = out4.iter().chain(out6.iter());
        let batch_addrs = v4
            .iter()
            .map(|a| IpAddr::V4(*a))
            .chain(v6.iter().map(|a| IpAddr::V6(*a)));
        for (addr, got) in batch_addrs.zip(batch_answers) {
            let legal = &probes.iter().find(|(a, _)| *a == addr).unwrap().1;
            check(addr, *got, legal);
        }
        count += 2 * probes.len() as u64;
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    lookups.fetch_add(count, Ordering::Relaxed);
}

fn writer_loop(fib: &Mutex<Fib>, seed: u64, rounds: usize) {
    let churned = churned();
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let mut fib = fib.lock().unwrap();
        let c = &churned[rng.random_range(0..churned.len())];
        match rng.random_range(0..4) {
            0 => {
                fib.remove(&c.prefix);
            }
            1 | 2 => {
                fib.insert(c.prefix, c.hops[rng.random_range(0..2)]);
            }
            _ => {
                // Unrelated routes with next hops of their own: they force
                // chunk copies, tbl8 groups and trie nodes to be allocated and
                // freed, and next-hop indices to be reused.
                let octet = rng.random_range(0..=255u32);
                let port = 1000 + (round % 50) as u16;
                let v4 = IpNet::V4(
                    ipnet::Ipv4Net::new(Ipv4Addr::from(0x1400_0000 | (octet << 8) | octet), 32)
                        .unwrap(),
                );
                let v6 = IpNet::V6(
                    ipnet::Ipv6Net::new(Ipv6Addr::new(0xfd00, 9, octet as u16, 0, 0, 0, 0, 1), 64)
                        .unwrap(),
                );
                if rng.random_bool(0.5) {
                    fib.apply([
                        FibChange::Upsert {
                            prefix: v4,
                            next_hop: local(port),
                        },
                        FibChange::Upsert {
                            prefix: v6,
                            next_hop: local(port),
                        },
                    ])
                    .unwrap();
                } else {
                    fib.apply([
                        FibChange::Remove { prefix: v4 },
                        FibChange::Remove { prefix: v6 },
                    ])
                    .unwrap();
                }
            }
        }
    }
}

#[test]
fn readers_see_only_legal_answers_while_writers_churn_routes() {
    let (mut fib, reader) = Fib::new();
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("fd00::/16"), NextHop::Host);
    let fib = Arc::new(Mutex::new(fib));
    let stop = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(AtomicU64::new(0));

    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (reader, stop, lookups) = (reader.clone(), stop.clone(), lookups.clone());
            thread::spawn(move || reader_loop(reader, &stop, &lookups))
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|seed| {
            let fib = fib.clone();
            thread::spawn(move || writer_loop(&fib, seed, 20_000))
        })
        .collect();
    let writer_results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader saw an illegal answer");
    }
    for w in writer_results {
        w.expect("writer panicked");
    }
    assert!(lookups.load(Ordering::Relaxed) > 0);

    // After the churn, the FIB still answers exactly what its routes say.
    let fib = fib.lock().unwrap();
    for (addr, _) in probes() {
        let expected = fib
            .routes()
            .filter(|(p, _)| p.contains(&addr))
            .max_by_key(|(p, _)| p.prefix_len())
            .map(|(_, h)| h);
        assert_eq!(reader.lookup(addr), expected, "{addr}");
    }
}
