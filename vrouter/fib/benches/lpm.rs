//! FIB lookup and update speed against a simple binary trie measured in the
//! same run.
//!
//! Run: `cargo bench -p brindle-fib --bench lpm -- --warm-up-time 1 --measurement-time 3`
//!
//! Route sets are generated from a seeded RNG, so every run measures the
//! same tables:
//! - `bgp`: a BGP-table-like length mix (mostly /24, many /16-/23, few
//!   shorter, none longer than /24, as in the default-free zone);
//! - `random`: uniformly random prefixes of /8 to /32.
//!
//! Destinations (65536 per iteration) are drawn inside the installed routes,
//! so every lookup finds a route and walks the deep paths. Under `cargo test
//! --benches` (debug build, each benchmark run once) the tables are small.

use std::collections::HashSet;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use brindle_fib::{Fib, FibChange, FibReader, NextHop};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Destinations per iteration.
const PROBES: usize = 1 << 16;
/// Frames per batch in the batch lookups (a typical RX burst).
const BATCH: usize = 64;

/// Route counts: the real ones in release builds, small ones when the
/// benchmarks run as tests.
fn v4_sizes() -> [usize; 3] {
    if cfg!(debug_assertions) {
        [1_000, 2_000, 4_000]
    } else {
        [1_000, 100_000, 1_000_000]
    }
}

fn v6_size() -> usize {
    if cfg!(debug_assertions) {
        2_000
    } else {
        100_000
    }
}

fn insert_size() -> usize {
    if cfg!(debug_assertions) {
        4_000
    } else {
        1_000_000
    }
}

// ===== route and destination generators =====

/// A few dozen next hops, as a node with many peers has.
fn next_hop(rng: &mut StdRng) -> NextHop {
    NextHop::Local {
        port: rng.random_range(0..64),
    }
}

/// A BGP-table-like prefix length: mostly /24, many /16-/23, few shorter.
fn bgp_len(rng: &mut StdRng) -> u8 {
    match rng.random_range(0..1000) {
        0..580 => 24,
        580..700 => 23,
        700..810 => 22,
        810..870 => 21,
        870..910 => 20,
        910..940 => 19,
        940..960 => 18,
        960..970 => 17,
        970..985 => 16,
        _ => rng.random_range(8..16),
    }
}

#[derive(Clone, Copy)]
enum Mix {
    Bgp,
    Random,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Bgp => "bgp",
            Mix::Random => "random",
        }
    }
}

fn v4_routes(n: usize, mix: Mix, seed: u64) -> Vec<(Ipv4Net, NextHop)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (addr, len) = match mix {
            // Unicast space, like a real table: first octet 1..=223.
            Mix::Bgp => (
                rng.random_range(0x0100_0000u32..0xe000_0000),
                bgp_len(&mut rng),
            ),
            Mix::Random => (rng.random::<u32>(), rng.random_range(8..=32)),
        };
        let Ok(net) = Ipv4Net::new(Ipv4Addr::from(addr), len) else {
            continue;
        };
        let net = net.trunc();
        if seen.insert(net) {
            out.push((net, next_hop(&mut rng)));
        }
    }
    out
}

fn v6_routes(n: usize, seed: u64) -> Vec<(Ipv6Net, NextHop)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        // Global unicast 2000::/3, lengths like an IPv6 BGP table.
        let addr = (0x2u128 << 124) | (rng.random::<u128>() >> 3);
        let len = match rng.random_range(0..100) {
            0..50 => 48,
            50..65 => 32,
            65..85 => rng.random_range(33..48),
            85..90 => rng.random_range(19..32),
            _ => rng.random_range(49..=64),
        };
        let Ok(net) = Ipv6Net::new(Ipv6Addr::from(addr), len) else {
            continue;
        };
        let net = net.trunc();
        if seen.insert(net) {
            out.push((net, next_hop(&mut rng)));
        }
    }
    out
}

/// Destinations inside random installed routes.
fn v4_probes(routes: &[(Ipv4Net, NextHop)], seed: u64) -> Vec<Ipv4Addr> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..PROBES)
        .map(|_| {
            let (net, _) = routes[rng.random_range(0..routes.len())];
            let host = rng.random::<u32>() & !u32::from(net.netmask());
            Ipv4Addr::from(u32::from(net.network()) | host)
        })
        .collect()
}

fn v6_probes(routes: &[(Ipv6Net, NextHop)], seed: u64) -> Vec<Ipv6Addr> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..PROBES)
        .map(|_| {
            let (net, _) = routes[rng.random_range(0..routes.len())];
            let host = rng.random::<u128>() & !u128::from(net.netmask());
            Ipv6Addr::from(u128::from(net.network()) | host)
        })
        .collect()
}

fn load(fib: &mut Fib, routes: impl Iterator<Item = (IpNet, NextHop)>) {
    fib.apply(routes.map(|(prefix, next_hop)| FibChange::Upsert { prefix, next_hop }))
        .unwrap();
}

// ===== baseline: a plain binary trie =====

/// One bit per level, nodes in an arena: the textbook LPM the FIB is
/// measured against.
struct BinaryTrie {
    /// Children (0 = none; node 0 is the root, never a child).
    children: Vec<[u32; 2]>,
    /// Next hop of the route ending at each node.
    hops: Vec<Option<NextHop>>,
}

impl BinaryTrie {
    fn new() -> BinaryTrie {
        BinaryTrie {
            children: vec![[0, 0]],
            hops: vec![None],
        }
    }

    /// `key` is left-aligned in 128 bits (IPv4 addresses shifted by 96).
    fn insert(&mut self, key: u128, len: u8, hop: NextHop) {
        let mut node = 0usize;
        for depth in 0..u32::from(len) {
            let bit = ((key >> (127 - depth)) & 1) as usize;
            if self.children[node][bit] == 0 {
                self.children.push([0, 0]);
                self.hops.push(None);
                self.children[node][bit] = (self.children.len() - 1) as u32;
            }
            node = self.children[node][bit] as usize;
        }
        self.hops[node] = Some(hop);
    }

    #[inline]
    fn lookup(&self, key: u128, bits: u32) -> Option<NextHop> {
        let mut node = 0usize;
        let mut best = self.hops[0];
        for depth in 0..bits {
            let bit = ((key >> (127 - depth)) & 1) as usize;
            let next = self.children[node][bit];
            if next == 0 {
                break;
            }
            node = next as usize;
            if let Some(hop) = self.hops[node] {
                best = Some(hop);
            }
        }
        best
    }
}

// ===== benchmarks =====

fn ipv4_lookup(c: &mut Criterion) {
    ipv4_lookup_group(c, "ipv4_lookup", &[Mix::Bgp, Mix::Random], &v4_sizes());
}

fn ipv4_lookup_group<M: Measurement>(
    c: &mut Criterion<M>,
    name: &str,
    mixes: &[Mix],
    sizes: &[usize],
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(PROBES as u64));
    // The baseline takes ~0.1 s per iteration at 1M routes: fewer samples
    // keep the whole run to a few minutes.
    group.sample_size(30);
    for &mix in mixes {
        for &size in sizes {
            let routes = v4_routes(size, mix, 1);
            let probes = v4_probes(&routes, 2);
            let (mut fib, reader) = Fib::new();
            load(&mut fib, routes.iter().map(|(n, h)| (IpNet::V4(*n), *h)));
            eprintln!("ipv4 {} {size}: {:?}", mix.name(), fib.memory());
            let mut trie = BinaryTrie::new();
            for (net, hop) in &routes {
                trie.insert(
                    u128::from(u32::from(net.network())) << 96,
                    net.prefix_len(),
                    *hop,
                );
            }
            let id = |what: &str| BenchmarkId::new(format!("{what}/{}", mix.name()), size);

            group.bench_function(id("fib_batch64"), |b| {
                let mut out = vec![None; PROBES];
                b.iter(|| {
                    for (dsts, out) in probes.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
                        reader.lookup_v4_batch(dsts, out);
                    }
                    black_box(&out);
                })
            });
            group.bench_function(id("fib_snapshot_single"), |b| {
                b.iter(|| {
                    for dsts in probes.chunks(BATCH) {
                        let snapshot = reader.snapshot();
                        for dst in dsts {
                            black_box(snapshot.lookup_v4(*dst));
                        }
                    }
                })
            });
            group.bench_function(id("fib_single"), |b| {
                b.iter(|| {
                    for dst in &probes {
                        black_box(reader.lookup_v4(*dst));
                    }
                })
            });
            group.bench_function(id("binary_trie"), |b| {
                b.iter(|| {
                    for dst in &probes {
                        black_box(trie.lookup(u128::from(u32::from(*dst)) << 96, 32));
                    }
                })
            });
            // The tables of this size are dropped before the next are built.
            drop((fib, reader, trie));
        }
    }
    group.finish();
}

fn ipv6_lookup(c: &mut Criterion) {
    ipv6_lookup_group(c, "ipv6_lookup");
}

fn ipv6_lookup_group<M: Measurement>(c: &mut Criterion<M>, name: &str) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(PROBES as u64));
    group.sample_size(30);
    let size = v6_size();
    let routes = v6_routes(size, 3);
    let probes = v6_probes(&routes, 4);
    let (mut fib, reader) = Fib::new();
    load(&mut fib, routes.iter().map(|(n, h)| (IpNet::V6(*n), *h)));
    eprintln!("ipv6 {size}: {:?}", fib.memory());
    let mut trie = BinaryTrie::new();
    for (net, hop) in &routes {
        trie.insert(u128::from(net.network()), net.prefix_len(), *hop);
    }
    group.bench_function(BenchmarkId::new("fib_batch64/bgp", size), |b| {
        let mut out = vec![None; PROBES];
        b.iter(|| {
            for (dsts, out) in probes.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
                reader.lookup_v6_batch(dsts, out);
            }
            black_box(&out);
        })
    });
    group.bench_function(BenchmarkId::new("fib_single/bgp", size), |b| {
        b.iter(|| {
            for dst in &probes {
                black_box(reader.lookup_v6(*dst));
            }
        })
    });
    group.bench_function(BenchmarkId::new("binary_trie/bgp", size), |b| {
        b.iter(|| {
            for dst in &probes {
                black_box(trie.lookup(u128::from(*dst), 128));
            }
        })
    });
    group.finish();
}

fn ipv4_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("ipv4_update");
    let size = insert_size();
    let routes = v4_routes(size, Mix::Bgp, 5);

    // Load a full table into an empty FIB in one batch.
    group.sample_size(10);
    group.throughput(Throughput::Elements(size as u64));
    group.bench_function(BenchmarkId::new("apply_batch/bgp", size), |b| {
        b.iter_batched(
            Fib::new,
            |(mut fib, reader)| {
                load(&mut fib, routes.iter().map(|(n, h)| (IpNet::V4(*n), *h)));
                (fib, reader)
            },
            BatchSize::PerIteration,
        )
    });

    // One route at a time into the full table, each change published on
    // its own (what a BGP UPDATE or a pod start costs): add and remove a /24
    // and a /32.
    let (mut fib, _reader): (Fib, FibReader) = Fib::new();
    load(&mut fib, routes.iter().map(|(n, h)| (IpNet::V4(*n), *h)));
    let changes: Vec<IpNet> = ["198.18.7.0/24", "198.18.9.77/32"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    group.sample_size(20);
    group.throughput(Throughput::Elements(2 * changes.len() as u64));
    group.bench_function(BenchmarkId::new("insert_remove_single/bgp", size), |b| {
        b.iter(|| {
            for prefix in &changes {
                fib.insert(*prefix, NextHop::Host);
            }
            for prefix in &changes {
                fib.remove(prefix);
            }
        })
    });

    // The worst single change for DIR-24-8: a default route over the full
    // table rewrites every entry of every chunk (then removing it restores
    // them).
    let default_route: IpNet = "0.0.0.0/0".parse().unwrap();
    group.sample_size(10);
    group.throughput(Throughput::Elements(2));
    group.bench_function(
        BenchmarkId::new("default_route_add_remove/bgp", size),
        |b| {
            b.iter(|| {
                fib.insert(default_route, NextHop::Host);
                fib.remove(&default_route);
            })
        },
    );
    group.finish();
}

// ===== on-CPU time =====

/// Measures the benchmark thread's on-CPU time instead of wall time: on a
/// shared machine the wall clock also counts the time other processes held
/// the core. (Cache and memory-bandwidth interference still counts.)
struct CpuTime;

fn thread_cpu_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("CLOCK_THREAD_CPUTIME_ID");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuTimeFormatter
    }
}

struct CpuTimeFormatter;

impl ValueFormatter for CpuTimeFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (divisor, unit) = match typical {
            t if t < 1e3 => (1.0, "ns cpu"),
            t if t < 1e6 => (1e3, "us cpu"),
            t if t < 1e9 => (1e6, "ms cpu"),
            _ => (1e9, "s cpu"),
        };
        values.iter_mut().for_each(|v| *v /= divisor);
        unit
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let per_iteration = match throughput {
            Throughput::Elements(n) => *n as f64,
            _ => 1.0,
        };
        // Millions of elements per second of CPU time.
        values
            .iter_mut()
            .for_each(|v| *v = per_iteration * 1e9 / *v / 1e6);
        "Melem/cpu-s"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn cpu_time(c: &mut Criterion<CpuTime>) {
    let sizes = v4_sizes();
    ipv4_lookup_group(c, "ipv4_lookup_cpu", &[Mix::Bgp], &sizes[1..]);
    ipv6_lookup_group(c, "ipv6_lookup_cpu");
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = ipv4_lookup, ipv6_lookup, ipv4_update
}
criterion_group! {
    name = benches_cpu_time;
    config = Criterion::default()
        .with_measurement(CpuTime)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = cpu_time
}
criterion_main!(benches, benches_cpu_time);
