//! The lab smoke test: three nodes, two pods each, all-pairs ping through
//! the real daemons and CNI plugin, then nothing left behind.
//!
//! It execs the binaries `cargo xtask test` builds before the tests
//! (`cargo build --workspace --bins`: they sit beside this test's `deps/`
//! directory); cargo cannot be run from inside a test (the build lock).
//! `BRINDLE_LAB_BIN_DIR` picks another directory, e.g. `target/release`.

use std::path::PathBuf;
use std::process::Command;

use brindle_tests::lab::{self, LabConfig};

fn bin_dir() -> PathBuf {
    std::env::var_os("BRINDLE_LAB_BIN_DIR").map_or_else(
        || {
            let exe = std::env::current_exe().expect("the test's own path");
            // <target>/<profile>/deps/lab-<hash> -> <target>/<profile>
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("the test runs from <target>/<profile>/deps")
                .to_path_buf()
        },
        PathBuf::from,
    )
}

#[test]
#[ignore = "requires root and network namespaces"]
fn three_nodes_two_pods_all_pairs_ping_then_nothing_is_left() {
    let cfg = LabConfig {
        bin_dir: bin_dir(),
        nodes: 3,
        pods: 2,
        encap: "ipip".into(),
        throughput_secs: 0,
        keep: false,
    };
    let report = lab::run(&cfg).expect("the lab runs and tears down");
    assert_eq!(report.pods, 6, "{report:?}");
    assert_eq!(report.pairs_total, 30, "{report:?}");
    assert_eq!(report.pairs_ok, 30, "{report:?}");
    assert!(report.success(), "{report:?}");

    assert_eq!(lab::lab_namespaces(), Vec::<String>::new());
    assert!(!std::path::Path::new(lab::STATE_DIR).exists());
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(lab::PREFIX), "{links}");
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains(lab::STATE_DIR)),
        "processes left: {ps}"
    );
}
