//! `brindle-perf pods`: pod traffic through Brindle beside the kernel's
//! Calico-shaped path (issue 13). Each (pod interface, encapsulation) pair
//! is one lab run (`brindle_lab::run`: `serve` and ctrl per node, pods by
//! real CNI ADDs) whose pod benchmark also builds and measures the kernel's
//! path in the same run (lab/src/podbench.rs); this mode runs them back to
//! back and writes `pods.json`, the table and `pods.svg` (brindle/kernel
//! per case).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use brindle_lab::{InterfaceKind, LabConfig, PodBench, PodBenchSpec};
use clap::Parser;
use plotters::prelude::*;
use serde::Serialize;

use crate::report::Machine;

/// Options of `brindle-perf pods`.
#[derive(Debug, Parser)]
pub struct PodsArgs {
    /// Directory of the release binaries (brindle-vrouter, brindle-ctrl,
    /// brindlectl, brindle, brindle-ipam).
    #[arg(long, default_value = "target/release")]
    pub bin_dir: PathBuf,
    /// Seconds of each iperf3 run.
    #[arg(long, default_value_t = 5)]
    pub secs: u32,
    /// Brindle's pod interfaces to run.
    #[arg(long, value_delimiter = ',', default_value = "veth,tap")]
    pub pod_interface: Vec<String>,
    /// Encapsulations between the two nodes (none = native).
    #[arg(long, value_delimiter = ',', default_value = "none,ipip,vxlan")]
    pub encap: Vec<String>,
    /// Workers per vrouter (the lab's `vrouter_workers`; 0: one per CPU).
    /// 1 by default: the two nodes' vrouters then take one CPU each of a
    /// 2-CPU machine, and a TAP pod's flows to another node keep their
    /// state on one worker (with two, a reply that arrives from the uplink
    /// on the other worker was dropped as `conntrack_invalid` before
    /// 3912724; not re-measured since).
    #[arg(long, default_value_t = 1)]
    pub vrouter_workers: u16,
    /// Directory for pods.json and pods.svg.
    #[arg(long, default_value = "perf-out")]
    pub out: PathBuf,
}

/// What `pods.json` holds.
#[derive(Debug, Serialize)]
pub struct PodsReport {
    /// The command line.
    pub command: String,
    /// The machine and its load.
    pub machine: Machine,
    /// One lab run each.
    pub runs: Vec<PodBench>,
    /// Lab runs that failed, with the reason.
    pub failed: Vec<String>,
}

/// Runs every pair, back to back.
pub fn run(args: PodsArgs) -> Result<()> {
    let bin_dir = std::fs::canonicalize(&args.bin_dir)
        .with_context(|| format!("--bin-dir {}", args.bin_dir.display()))?;
    let mut report = PodsReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine::describe(),
        runs: Vec::new(),
        failed: Vec::new(),
    };
    for kind in &args.pod_interface {
        let kind: InterfaceKind = kind.parse().map_err(anyhow::Error::msg)?;
        for encap in &args.encap {
            let cfg = LabConfig {
                nodes: 2,
                pods: 2,
                subnets: 1,
                encap: encap.clone(),
                throughput_secs: 0,
                pod_interface: kind,
                vrouter_workers: args.vrouter_workers,
                // The figures are pod to pod without the host port (the
                // lab's default since issue 14: its tracked flows cost).
                host_port: false,
                pod_bench: Some(PodBenchSpec {
                    secs: args.secs,
                    plumbing_only: false,
                }),
                ..LabConfig::new(bin_dir.clone())
            };
            eprintln!("\n==== pods: {} pods, {encap} ====", kind.as_str());
            match brindle_lab::run(&cfg) {
                Ok(r) => match (r.pod_bench, r.failed_step) {
                    (Some(b), None) => report.runs.push(b),
                    (_, step) => report.failed.push(format!(
                        "{} {encap}: {}",
                        kind.as_str(),
                        step.unwrap_or_else(|| "no figures".into())
                    )),
                },
                Err(e) => report
                    .failed
                    .push(format!("{} {encap}: {e:#}", kind.as_str())),
            }
        }
    }
    report.machine.load_at_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned();
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join("pods.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    if let Err(e) = plot(&report.runs, &args.out.join("pods.svg")) {
        eprintln!("brindle-perf: plot: {e:#}");
    }
    println!("\n{}\n", report.machine);
    for b in &report.runs {
        println!("{b}");
    }
    println!("wrote {} and pods.svg", json.display());
    if !report.failed.is_empty() {
        bail!("lab runs failed: {}", report.failed.join("; "));
    }
    Ok(())
}

/// Brindle/kernel per case, one line per lab run.
fn plot(runs: &[PodBench], path: &Path) -> Result<()> {
    let cases: Vec<String> = runs
        .first()
        .map(|b| {
            b.rows
                .iter()
                .map(|r| format!("{}, {}", r.case, r.place))
                .collect()
        })
        .unwrap_or_default();
    let series: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|b| {
            let pts = b
                .rows
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let (k, v) = (r.kernel?.rate, r.brindle?.rate);
                    (k > 0.0).then(|| (i as f64, v / k))
                })
                .collect();
            (format!("{} pods, {}", b.pod_interface, b.encap), pts)
        })
        .collect();
    let max_y = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1.2f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = cases.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Pod traffic: Brindle / kernel (Calico-shaped), same run",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(120)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..max_y)?;
    chart
        .configure_mesh()
        .x_labels(cases.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                cases.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(
            ("sans-serif", 12)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .y_desc("brindle / kernel")
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(-0.5, 1.0), (n - 0.5, 1.0)],
        BLACK.mix(0.4),
    ))?;
    const COLOURS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
