//! Allocations per second: the memory store (the logic alone), the embedded
//! store held by one process (the daemon's case) on disk and on tmpfs, and a
//! loopback etcd; each single-threaded and 8-way concurrent (8 nodes).
//!
//! `cargo bench -p brindle-ipam --bench allocate -- --warm-up-time 1 --measurement-time 3`
//!
//! Each iteration allocates one address for a fresh handle; the addresses
//! are released after each sample, outside the timing.

#[path = "../tests/common/etcd.rs"]
mod etcd;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brindle_api::ipam::HandleId;
use brindle_ipam::model::Pool;
use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore, MemoryStore};
use brindle_ipam::{AllocateArgs, Ipam};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

static SEQ: AtomicU64 = AtomicU64::new(0);

fn setup<S: Datastore>(store: S) -> Arc<Ipam<S>> {
    let ipam = Ipam::new(store, "/bench");
    ipam.put_pool(&Pool::new("bench", "10.0.0.0/8".parse().unwrap()))
        .unwrap();
    Arc::new(ipam)
}

/// Allocates `n` addresses on `threads` threads (one node each) and returns
/// the time taken; releases them afterwards, untimed.
fn run<S: Datastore + 'static>(ipam: &Arc<Ipam<S>>, n: u64, threads: u64) -> Duration {
    let per = n.div_ceil(threads);
    let start = Instant::now();
    let handles: Vec<Vec<HandleId>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let ipam = ipam.clone();
                s.spawn(move || {
                    (0..per)
                        .map(|_| {
                            let h = HandleId {
                                network: "bench".into(),
                                container_id: format!("c{}", SEQ.fetch_add(1, Ordering::Relaxed)),
                                ifname: "eth0".into(),
                            };
                            ipam.allocate(&AllocateArgs::v4(h.clone(), &format!("node{t}")))
                                .expect("allocate");
                            h
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let took = start.elapsed();
    std::thread::scope(|s| {
        for hs in handles {
            let ipam = ipam.clone();
            s.spawn(move || {
                for h in hs {
                    ipam.release_handle(&h).unwrap();
                }
            });
        }
    });
    // Time per allocation times the iterations criterion asked for.
    took.mul_f64(n as f64 / (per * threads) as f64)
}

fn bench_store<S: Datastore + 'static>(c: &mut Criterion, name: &str, ipam: Arc<Ipam<S>>) {
    let mut g = c.benchmark_group(format!("allocate/{name}"));
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function("single", |b| b.iter_custom(|n| run(&ipam, n, 1)));
    g.bench_function("8-way", |b| b.iter_custom(|n| run(&ipam, n, 8)));
    g.finish();
}

fn allocations(c: &mut Criterion) {
    bench_store(c, "memory", setup(MemoryStore::new()));

    let disk = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = EmbeddedStore::open(
        disk.path().join("ipam.redb"),
        EmbeddedMode::Exclusive,
        Duration::from_secs(5),
    )
    .unwrap();
    bench_store(c, "embedded-disk", setup(store));

    if std::path::Path::new("/dev/shm").is_dir() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let store = EmbeddedStore::open(
            shm.path().join("ipam.redb"),
            EmbeddedMode::Exclusive,
            Duration::from_secs(5),
        )
        .unwrap();
        bench_store(c, "embedded-tmpfs", setup(store));
    }

    let cluster = etcd::EtcdCluster::start(1);
    bench_store(c, "etcd", setup(cluster.store()));
}

criterion_group!(benches, allocations);
criterion_main!(benches);
