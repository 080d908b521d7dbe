//! The connection table's per-packet cost on established flows (what
//! policy costs a packet once its flow is tracked): tables of 1,000 (in
//! cache) and 100,000 UDP flows (18 MiB of slots: cache misses), a packet
//! of one of them (original and reply direction).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::classify::{Decision, Verdict};
use brindle_policy::conntrack::{ConnTable, Seen, Timeouts, Tuple};
use criterion::{Criterion, criterion_group, criterion_main};

fn seen(i: u32, reply: bool) -> Seen {
    let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
    let b = IpAddr::V4(Ipv4Addr::new(10, 201, 0, 2));
    let t = Tuple {
        src: a,
        dst: b,
        protocol: 17,
        src_port: 40000,
        dst_port: 53,
    };
    let t = if reply {
        Tuple {
            src: t.dst,
            dst: t.src,
            protocol: 17,
            src_port: t.dst_port,
            dst_port: t.src_port,
        }
    } else {
        t
    };
    Seen::new(t, 0, None)
}

const ALLOW: Verdict = Verdict {
    allow: true,
    decision: Decision::NoPolicy,
    logged: None,
};

fn bench(c: &mut Criterion) {
    for flows in [1_000u32, 100_000] {
        let mut table = ConnTable::new(flows as usize * 2, Timeouts::default());
        for i in 0..flows {
            table.process(&seen(i, false), 0, 1, |_| ALLOW);
        }
        let mut i = 0u32;
        c.bench_function(&format!("conntrack/{flows}_flows/tracked_original"), |b| {
            b.iter(|| {
                i = (i + 7919) % flows;
                black_box(table.process(&seen(i, false), 1, 1, |_| ALLOW))
            })
        });
        c.bench_function(&format!("conntrack/{flows}_flows/tracked_reply"), |b| {
            b.iter(|| {
                i = (i + 7919) % flows;
                black_box(table.process(&seen(i, true), 1, 1, |_| ALLOW))
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
