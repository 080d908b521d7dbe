//! The local lab: N "nodes" as network namespaces on an underlay of one or
//! two IPv4 subnets joined by a router namespace, each node running the
//! release `brindle-vrouter serve` and `brindle-ctrl` against one etcd, P
//! pods per node made by exec'ing the plugins of the conflist deploy/ ships
//! (the real `brindle` CNI plugin first) as a runtime does, then all-pairs
//! ping, the path each node pair's traffic takes, and a throughput run.
//!
//! ```text
//!                    brl-underlay: the router (ip_forward) and etcd
//!          br0 10.99.0.254/24 ─── kernel routing ─── br1 10.99.1.254/24
//!            │               │                            │
//!      brl-n1 eth0     brl-n2 eth0                  brl-n3 eth0
//!      10.99.0.11      10.99.0.12                   10.99.1.13
//!      vrouter, ctrl   vrouter, ctrl                vrouter, ctrl
//!       │       │       │       │                    │       │
//!   brl-n1p1 brl-n1p2 brl-n2p1 brl-n2p2          brl-n3p1 brl-n3p2
//! ```
//!
//! With one subnet every node hangs off `br0`. Each node's default route
//! is the router's address on its subnet, so BGP (node to node, full mesh),
//! etcd and tunnels to the other subnet are routed by the kernel of the
//! router namespace, as by a top-of-rack router.
//!
//! Everything the lab creates carries the prefix `brl-` (namespaces, bpffs
//! pins) or lives under the state directory, so [`down`] can always remove
//! a lab interrupted at any point: it kills every process in a `brl-`
//! namespace, deletes the namespaces and the state directory.
//!
//! Modules: [`config`] (what is asked), [`setup`] (underlay, etcd, the
//! nodes' daemons), [`cni`] (pods), [`traffic`] (ping matrix, throughput),
//! [`inspect`] (brindlectl, paths, metrics), [`report`] (the outcome),
//! then one module per optional step ([`hostpath`], [`policy`],
//! [`density`], [`podbench`]) and [`teardown`].
#![forbid(unsafe_code)]

use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail};
pub use brindle_cni::config::InterfaceKind;

mod borrow;
mod cni;
mod config;
mod density;
mod exec;
mod hostpath;
mod inspect;
mod podbench;
mod policy;
mod report;
mod setup;
mod teardown;
mod traffic;

pub use borrow::BorrowReport;
use cni::{CONFLIST, Pod, cni_add, cni_conf_dir, cni_del, install_cni};
pub use config::LabConfig;
pub use density::DensityReport;
use exec::wait_for;
pub use hostpath::{ConnRow, ConnectivityReport};
pub use inspect::metric_names;
use inspect::{
    brindlectl, brindlectl_json, counters_line, path_to, paths, scrape, worker_counters,
};
pub use podbench::{BenchRow, Figure, PodBench, PodBenchSpec};
pub use policy::PolicyReport;
pub use report::{LabReport, NodePath};
use report::{print_paths, summary};
use setup::{nodes, underlay};
use teardown::{OWNER, process_identity, running_owner};
pub use teardown::{Stopped, Teardown, down, lab_namespaces};
use traffic::{ping_matrix, throughput};

/// The prefix of every namespace and pin the lab makes.
pub const PREFIX: &str = "brl-";
/// Where the lab keeps configs, logs, sockets and pid files.
pub const STATE_DIR: &str = "/run/brindle-lab";
const UNDERLAY_NS: &str = "brl-underlay";
/// The router's address on the first subnet; etcd listens there.
const ETCD_ADDR: &str = "10.99.0.254";
/// Held for the whole of [`run`]: two labs in one process (two tests of
/// one test binary run on parallel threads) would share every name.
static RUNNING: Mutex<()> = Mutex::new(());

fn node_ns(n: u8) -> String {
    format!("{PREFIX}n{n}")
}

fn state() -> PathBuf {
    PathBuf::from(STATE_DIR)
}

fn node_dir(n: u8) -> PathBuf {
    state().join(format!("n{n}"))
}

fn step(name: &str) {
    eprintln!("\n==== lab: {name} ====");
}

/// Runs the whole lab; tears it down at the end unless `keep`.
pub fn run(cfg: &LabConfig) -> Result<LabReport> {
    cfg.check()?;
    let _one_lab_per_process = RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(owner) = running_owner() {
        // A lab whose run is still going (another shell, another test):
        // tearing it down would fail that run for no reason of its own.
        bail!(
            "another lab run (pid {owner}) is in progress: wait for it, or remove it with `cargo xtask lab down`"
        );
    }
    let mut report = LabReport {
        nodes: cfg.nodes,
        ..LabReport::default()
    };
    let mut pods = Vec::new();
    let result = run_steps(cfg, &mut report, &mut pods);
    if let Err(e) = &result {
        eprintln!("lab: FAILED: {e:#}");
        if report.failed_step.is_none() {
            report.failed_step = Some(format!("{e:#}"));
        }
    }
    if !cfg.keep {
        step("teardown");
        for pod in pods.iter().rev() {
            if let Err(e) = cni_del(pod) {
                eprintln!("CNI DEL {}: {e:#}", pod.name);
                report
                    .failed_step
                    .get_or_insert_with(|| format!("CNI DEL {}: {e:#}", pod.name));
            }
        }
        let t = down()?;
        eprintln!("{t}");
        report.teardown = Some(t);
    } else {
        if let Some(p) = pods.first() {
            eprintln!(
                "\nthe lab keeps running. Enter a pod:  ip netns exec {} bash   (its address {})",
                p.name, p.ip
            );
        }
        eprintln!(
            "a node:  ip netns exec {n1} bash   (its conflist: {conf})\n\
             logs, sockets, configs: {STATE_DIR}\n\
             brindlectl:  ip netns exec {n1} {bin}/brindlectl --ctrl-socket {STATE_DIR}/n1/ctrl.sock \
             --vrouter-socket {STATE_DIR}/n1/vrouter.sock bgp peers   (or: vrouter routes, vrouter stats, endpoints)\n\
             remove it:  cargo xtask lab down",
            n1 = node_ns(1),
            conf = cni_conf_dir(1).join(CONFLIST).display(),
            bin = cfg.bin_dir.display()
        );
    }
    Ok(report)
}

fn run_steps(cfg: &LabConfig, report: &mut LabReport, pods: &mut Vec<Pod>) -> Result<()> {
    for bin in [
        "brindle-vrouter",
        "brindle-ctrl",
        "brindlectl",
        "brindle",
        "brindle-ipam",
    ] {
        if !cfg.bin_dir.join(bin).exists() {
            bail!(
                "{} missing: build the release binaries",
                cfg.bin_dir.join(bin).display()
            );
        }
    }
    step("remove leftovers of an earlier lab");
    let t = down()?;
    if !t.stopped.is_empty() {
        eprintln!("{t}");
    }
    fs::create_dir_all(state())?;
    fs::write(state().join(OWNER), process_identity(std::process::id())?)?;

    underlay(cfg)?;
    nodes(cfg)?;

    step("BGP: every node Established with every other");
    let want = usize::from(cfg.nodes - 1);
    wait_for("BGP full mesh Established", Duration::from_secs(60), || {
        (1..=cfg.nodes).all(|n| {
            brindlectl_json(cfg, n, &["bgp", "peers"]).is_ok_and(|peers| {
                peers
                    .iter()
                    .filter(|p| p["state"].as_str() == Some("Established"))
                    .count()
                    == want
            })
        })
    })?;

    step("pods: the conflist's plugins exec'd like a runtime (libcni)");
    install_cni(cfg)?;
    for n in 1..=cfg.nodes {
        for p in 1..=cfg.pods {
            let pod = cni_add(n, &format!("{PREFIX}n{n}p{p}"))?;
            eprintln!("{} on {}: {}", pod.name, node_ns(n), pod.ip);
            pods.push(pod);
        }
    }
    report.pods = pods.len();

    step("routes: every vrouter has a route to every other node's block");
    // Each node announces one block; its peers' vrouters get a route each.
    wait_for("routes to every block", Duration::from_secs(30), || {
        (1..=cfg.nodes).all(|n| {
            let routes = brindlectl_json(cfg, n, &["vrouter", "routes"]).unwrap_or_default();
            (1..=cfg.nodes)
                .filter(|&m| m != n)
                .all(|m| path_to(cfg, &routes, m).0 != "missing")
        })
    })
    .unwrap_or_else(|e| eprintln!("{e:#}: the path table shows which"));
    report.paths = paths(cfg)?;
    print_paths(&report.paths);

    step("all-pairs ping (3 each)");
    ping_matrix(pods, report);

    if cfg.borrow {
        step("borrowed addresses: node 3's pods from another node's block, /32s on every node");
        let b = borrow::run(cfg, pods)?;
        println!("{b}");
        if !b.success() {
            report
                .failed_step
                .get_or_insert_with(|| format!("borrowed addresses: {b}"));
        }
        report.borrow = Some(b);
    }

    if cfg.host_port {
        step("connectivity: host, nodes, the outside (natOutgoing), a kube-proxy Service");
        let start = std::time::Instant::now();
        let c = hostpath::run(cfg, pods, true)?;
        println!("{c} in {:.1} s", start.elapsed().as_secs_f64());
        report.connectivity.push(c);
        for encap in &cfg.then_encaps {
            step(&format!(
                "the pool's encapsulation switched to {encap}: the connectivity table again"
            ));
            let start = std::time::Instant::now();
            let next = hostpath::switch_encap(cfg, encap)?;
            let c = hostpath::run(&next, pods, false)?;
            println!("{c} in {:.1} s", start.elapsed().as_secs_f64());
            report.connectivity.push(c);
        }
    }

    if cfg.policy_cases > 0 {
        step("network policy: 3 namespaces x 3 pods, TCP and UDP on 80 and 81, all pairs per case");
        let p = policy::run(cfg, pods, cfg.policy_cases)?;
        if !p.success() {
            report.failed_step.get_or_insert_with(|| format!("{p}"));
        }
        report.policy = Some(p);
    }

    if cfg.density > 0 {
        step(&format!(
            "density: {} more pods on node 1 by parallel ADDs, each pinged from node 2 and node 1",
            cfg.density
        ));
        let d = density::run(cfg, pods)?;
        println!("{d}");
        for p in d.add_failures.iter().chain(&d.del_failures) {
            println!("FAIL {p}");
        }
        for p in &d.remote_lossy {
            println!("LOSS from node 2: {p}");
        }
        for p in &d.local_lost {
            println!("LOSS from node 1: {p}");
        }
        if !d.success() {
            report.failed_step.get_or_insert_with(|| {
                format!(
                    "density: {} of {} pods lost pings from node 2, {} from node 1, {} ADD and {} DEL failures",
                    d.remote_lossy.len(),
                    d.pods,
                    d.local_lost.len(),
                    d.add_failures.len(),
                    d.del_failures.len()
                )
            });
        }
        report.density = Some(d);
    }

    if cfg.throughput_secs > 0 && cfg.nodes >= 2 {
        step("throughput: TCP between pods on node 1 and node 2");
        let from = pods
            .iter()
            .find(|p| p.node == 1)
            .context("no pod on node 1")?;
        let to = pods
            .iter()
            .find(|p| p.node == 2)
            .context("no pod on node 2")?;
        let pinged = !report.failed_pairs.iter().any(|p| {
            p.starts_with(&format!("{} (", from.name)) && p.ends_with(&format!("({})", to.ip))
        });
        if !pinged {
            // The ping failure already says what is wrong.
            println!("not run: {} does not answer {}", to.name, from.name);
        } else {
            match throughput(from, to, cfg.throughput_secs) {
                Ok(m) => report.mbit_per_s = Some(m),
                Err(e) => report.failed_step = Some(format!("throughput: {e:#}")),
            }
        }
    }

    if let Some(spec) = cfg.pod_bench {
        step("pod benchmark: iperf3 between pods, the kernel's Calico-shaped path beside");
        let b = podbench::run(pods, spec, cfg.pod_interface.as_str(), &cfg.encap)?;
        println!("{b}");
        report.pod_bench = Some(b);
    }

    step("brindlectl on node 1");
    for args in [
        &["bgp", "peers"][..],
        &["bgp", "routes"],
        &["vrouter", "routes"],
        &["endpoints"],
    ] {
        println!("$ brindlectl {}", args.join(" "));
        println!(
            "{}",
            brindlectl(cfg, 1, args).unwrap_or_else(|e| format!("{e:#}"))
        );
    }
    step("vrouter counters per node (encapsulated, decapsulated, dropped)");
    for n in 1..=cfg.nodes {
        println!("{}: {}", node_ns(n), counters_line(n));
    }
    // Not a step that can fail the run: a daemon that does not answer
    // leaves its names out, which the dashboard test reports.
    for port in [9091, 9092] {
        match scrape(1, port) {
            Ok(text) => report.metric_names.extend(metric_names(&text)),
            Err(e) => eprintln!("lab: {e:#}"),
        }
    }
    summary(cfg, report);
    Ok(())
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
