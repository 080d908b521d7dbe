//! The lab smoke test: three nodes, two pods each, all-pairs ping through
//! the real daemons and CNI plugin, then nothing left behind.
//!
//! It execs the binaries `cargo xtask test` builds before the tests
//! (`cargo build --workspace --bins`: they sit beside this test's `deps/`
//! directory); cargo cannot be run from inside a test (the build lock).
//! `BRINDLE_LAB_BIN_DIR` picks another directory, e.g. `target/release`.

use std::path::PathBuf;
use std::process::Command;

use brindle_lab::{self as lab, LabConfig};

fn bin_dir() -> PathBuf {
    brindle_testkit::built_binaries("BRINDLE_LAB_BIN_DIR")
}

/// Runs the lab and checks that it proved connectivity and left nothing:
/// no namespace, interface, process, bpffs pin or file.
fn run_and_check_nothing_is_left(cfg: &LabConfig) -> lab::LabReport {
    let report = lab::run(cfg).expect("the lab runs and tears down");
    let pods = usize::from(cfg.nodes) * usize::from(cfg.pods);
    assert_eq!(report.pods, pods, "{report:?}");
    assert_eq!(report.pairs_total, pods * (pods - 1), "{report:?}");
    assert_eq!(report.failed_pairs, Vec::<String>::new(), "{report:?}");
    assert_eq!(report.pairs_ok, report.pairs_total, "{report:?}");
    assert!(report.success(), "{report:?}");

    assert_eq!(lab::lab_namespaces(), Vec::<String>::new());
    assert!(!std::path::Path::new(lab::STATE_DIR).exists());
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(lab::PREFIX), "{links}");
    let pins: Vec<String> = std::fs::read_dir("/sys/fs/bpf")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(lab::PREFIX))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(pins, Vec::<String>::new());
    // The chained tuning plugin keeps a file per attachment until its DEL.
    let tuning: Vec<String> = std::fs::read_dir("/run/cni/tuning")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(lab::PREFIX))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(tuning, Vec::<String>::new());
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains(lab::STATE_DIR)),
        "processes left: {ps}"
    );
    report
}

#[test]
#[ignore = "requires root and network namespaces"]
fn three_nodes_two_pods_all_pairs_ping_then_nothing_is_left() {
    // What `cargo xtask lab` runs: IPIP, node 3 behind the router.
    let cfg = LabConfig {
        throughput_secs: 0,
        ..LabConfig::new(bin_dir())
    };
    assert_eq!((cfg.encap.as_str(), cfg.subnets), ("ipip", 2));
    let report = run_and_check_nothing_is_left(&cfg);
    assert_eq!(report.paths.len(), 6, "{report:?}");
    assert!(report.paths.iter().all(|p| p.kind == "ipip"), "{report:?}");
}

#[test]
#[ignore = "requires root and network namespaces"]
fn cross_subnet_is_native_on_one_subnet_and_ipip_across_the_router() {
    // Nodes 1 and 2 on 10.99.0.0/24, node 3 on 10.99.1.0/24.
    let cfg = LabConfig {
        encap: "cross-subnet".into(),
        subnets: 2,
        throughput_secs: 0,
        ..LabConfig::new(bin_dir())
    };
    let report = run_and_check_nothing_is_left(&cfg);
    let kinds: Vec<(u8, u8, &str)> = report
        .paths
        .iter()
        .map(|p| (p.from, p.to, p.kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, 2, "native"),
            (1, 3, "ipip"),
            (2, 1, "native"),
            (2, 3, "ipip"),
            (3, 1, "ipip"),
            (3, 2, "ipip"),
        ],
        "{report:?}"
    );
}
