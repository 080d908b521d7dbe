//! GSO and GRO of one 64 KB TCPv4 super-packet (MSS 1448, 45 segments):
//! the cost the vrouter pays per super-packet between a TAP pod and the
//! uplink. `cargo bench -p brindle-wire --bench gso`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use brindle_wire::{Gro, Gso};
use common::{Spec, build, segments};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn benches(c: &mut Criterion) {
    let (hdr, frame) = build(&Spec::tcp4(64000, 1448));
    let segs = segments(&hdr, &frame);
    let mut g = c.benchmark_group("64 KB TCPv4 super-packet, MSS 1448");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    let mut out = vec![0u8; 2048];
    g.bench_function("GSO: 45 segments written (copy + checksums)", |b| {
        b.iter(|| {
            let gso = Gso::new(black_box(&hdr), black_box(&frame)).unwrap();
            for i in 0..gso.count() {
                black_box(gso.write(i, &mut out).unwrap());
            }
        })
    });
    let mut gro = Gro::new();
    g.bench_function("GRO: 45 segments merged (checksum verify + copy)", |b| {
        b.iter(|| {
            for s in &segs {
                black_box(gro.push(black_box(s)));
            }
            black_box(gro.take().map(|c| c.bytes.len()));
        })
    });
    g.finish();
}

criterion_group!(gso, benches);
criterion_main!(gso);
