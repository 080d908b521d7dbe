//! The control-path harness counts right: with 5 pods every ADD and DEL is
//! counted, every pod has its address and nothing is left after DEL, for
//! brindle and for bridge + host-local; with 10k routes every route GoBGP
//! announced is found in the vrouter's FIB, exactly. Needs root and the
//! workspace's binaries, built before the tests (`cargo build --workspace
//! --bins`, as `cargo xtask test` does): they are looked for in
//! `$BRINDLE_BIN_DIR`, else beside this test (`<target>/<profile>`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use brindle_perf::control::{bgp, cni_runs};
use brindle_perf::topo;

/// One test at a time: each ends by checking that this process left no
/// namespace, which another test's live ones would fail.
static SERIAL: Mutex<()> = Mutex::new(());

fn bin_dir() -> PathBuf {
    brindle_testkit::built_binaries("BRINDLE_BIN_DIR")
}

#[test]
#[ignore = "requires root and network namespaces"]
fn five_pods_are_counted_addressed_and_removed_for_both_plugins() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runs = cni_runs(&bin_dir(), Path::new("/usr/lib/cni"), 5, 2).expect("CNI runs");
    let labels: Vec<(&str, usize)> = runs
        .iter()
        .map(|r| (r.plugin.as_str(), r.parallel))
        .collect();
    assert_eq!(
        labels,
        [
            ("brindle", 1),
            ("brindle", 2),
            ("bridge+host-local", 1),
            ("bridge+host-local", 2)
        ]
    );
    for r in &runs {
        assert_eq!(
            (r.add.count, r.del.count),
            (5, 5),
            "{} x{}",
            r.plugin,
            r.parallel
        );
        assert!(r.add.p50_ms > 0.0 && r.add.max_ms >= r.add.p99_ms);
        for c in &r.checks {
            assert!(c.passed, "{}: {}", c.name, c.detail);
        }
        // Addresses in the pods, nothing left after DEL, plus the
        // plugin's own leftovers: every check ran.
        assert!(r.checks.len() >= 6, "{:?}", r.checks);
    }
    assert!(topo::none_left(), "namespaces left behind");
}

#[test]
#[ignore = "requires root and network namespaces"]
fn every_route_gobgp_announces_is_counted_in_the_fib() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = bgp::learn(&bin_dir(), 10_000, Duration::from_secs(240), &mut |l| {
        eprintln!("{l}")
    })
    .expect("learning run");
    assert!(run.complete, "{run:?}");
    assert!(run.routes_announced >= 10_000, "{run:?}");
    assert_eq!(run.routes_in_fib, run.routes_announced);
    assert!(run.start_to_established_s.is_some());
    // The count and the exact prefix set (the dump fits at this size).
    assert_eq!(run.checks.len(), 2, "{:?}", run.checks);
    for c in &run.checks {
        assert!(c.passed, "{}: {}", c.name, c.detail);
    }
    assert!(topo::none_left(), "namespaces left behind");
}
