//! What a lab run proved ([`LabReport`], [`NodePath`]) and its summary
//! table.

use crate::node_ns;
use crate::{ConnectivityReport, DensityReport, LabConfig, PodBench, PolicyReport, Teardown};

/// The path one node's vrouter gives the traffic for another node's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePath {
    pub from: u8,
    pub to: u8,
    /// `native`, `ipip`, `vxlan`, or `missing` (no route).
    pub kind: String,
    /// The vrouter route, e.g. `10.244.16.128/26 native via 10.99.0.12 (eth0)`.
    pub route: String,
    /// What the encapsulation mode and topology call for.
    pub expected: String,
}

/// What the run proved.
#[derive(Debug, Clone, Default)]
pub struct LabReport {
    pub nodes: u8,
    pub pods: usize,
    pub pairs_ok: usize,
    pub pairs_total: usize,
    /// The pod pairs that did not answer, `from -> to`.
    pub failed_pairs: Vec<String>,
    /// For each ordered pair of nodes, the path its pods' traffic takes.
    pub paths: Vec<NodePath>,
    pub mbit_per_s: Option<f64>,
    /// The step that failed, if one did.
    pub failed_step: Option<String>,
    /// Every metric name node 1's brindle-ctrl and brindle-vrouter export
    /// (sample names, as a dashboard queries them), scraped after the
    /// traffic: the dashboard test checks deploy/grafana against them.
    pub metric_names: std::collections::BTreeSet<String>,
    /// The density step's figures, when it ran.
    pub density: Option<DensityReport>,
    /// The pod benchmark's table, when it ran.
    pub pod_bench: Option<PodBench>,
    /// The policy step's truth tables, when it ran.
    pub policy: Option<PolicyReport>,
    /// The connectivity tables of issue 14 (host, nodes, outside,
    /// Service): the lab's mode, then each of `LabConfig.then_encaps`.
    pub connectivity: Vec<ConnectivityReport>,
    /// The borrowed addresses' checks (`LabConfig.borrow`).
    pub borrow: Option<crate::BorrowReport>,
    /// The final teardown (none with `keep`).
    pub teardown: Option<Teardown>,
}

impl LabReport {
    pub fn success(&self) -> bool {
        self.failed_step.is_none()
            && self.pairs_ok == self.pairs_total
            && self.pairs_total > 0
            && self.paths.iter().all(|p| p.kind == p.expected)
            && self.density.as_ref().is_none_or(DensityReport::success)
            && self.policy.as_ref().is_none_or(PolicyReport::success)
            && self.connectivity.iter().all(ConnectivityReport::success)
            && self
                .borrow
                .as_ref()
                .is_none_or(crate::BorrowReport::success)
    }
}

pub(crate) fn print_paths(paths: &[NodePath]) {
    println!(
        "{:<18} {:<8} {:<8} vrouter route on the sender",
        "node pair", "path", "expected"
    );
    for p in paths {
        println!(
            "{:<18} {:<8} {:<8} {}{}",
            format!("{} -> {}", node_ns(p.from), node_ns(p.to)),
            p.kind,
            p.expected,
            p.route,
            if p.kind == p.expected { "" } else { "   WRONG" }
        );
    }
}

pub(crate) fn summary(cfg: &LabConfig, report: &mut LabReport) {
    let wrong: Vec<String> = report
        .paths
        .iter()
        .filter(|p| p.kind != p.expected)
        .map(|p| {
            format!(
                "{} -> {}: {} (expected {})",
                node_ns(p.from),
                node_ns(p.to),
                p.kind,
                p.expected
            )
        })
        .collect();
    println!(
        "| encap | pod interface | subnets | nodes | pods | pairs ok | paths as expected | throughput |\n\
         |---|---|---|---|---|---|---|---|\n| {} | {} | {} | {} | {} | {}/{} | {}/{} | {} |",
        cfg.encap,
        cfg.pod_interface.as_str(),
        cfg.subnets,
        report.nodes,
        report.pods,
        report.pairs_ok,
        report.pairs_total,
        report.paths.len() - wrong.len(),
        report.paths.len(),
        report
            .mbit_per_s
            .map(|m| format!("{m:.0} Mbit/s"))
            .unwrap_or_else(|| "not run".into())
    );
    for p in &report.failed_pairs {
        println!("FAIL ping {p}");
    }
    for w in &wrong {
        println!("WRONG path {w}");
    }
    // What failed, the connectivity first: it explains the rest.
    let mut failures = Vec::new();
    if report.pairs_ok != report.pairs_total {
        failures.push(format!(
            "ping: {} of {} pairs answered (the FAIL lines name the others)",
            report.pairs_ok, report.pairs_total
        ));
    }
    if !wrong.is_empty() {
        failures.push(format!("paths: {}", wrong.join(", ")));
    }
    failures.extend(report.failed_step.take());
    if !failures.is_empty() {
        report.failed_step = Some(failures.join("; "));
    }
}
