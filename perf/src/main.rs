//! `brindle-perf`: the throughput and latency harness. See `perf/README.md`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use brindle_perf::frame::FrameSize;
use brindle_perf::report::{Machine, Report, Status, ratios, table};
use brindle_perf::runner::{RunOptions, Scenario, run_scenario_with};
use brindle_perf::traffic::{GeneratorKind, Rate};
use brindle_perf::{plot, selftest, topo};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "brindle-perf",
    about = "Throughput and latency of the vrouter beside the kernel, in one run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios back to back; print a table, write JSON and SVG plots.
    Run(Box<RunArgs>),
    /// Check the harness itself on real veths: exact counts, detected loss,
    /// sane latency.
    Selftest,
    /// Measure the control path: CNI ADD/DEL latency, BGP route learning.
    Control(brindle_perf::control::ControlArgs),
    /// Pod traffic (iperf3) through lab runs of Brindle beside the kernel's
    /// Calico-shaped path built in each run; as root, one lab at a time.
    Pods(brindle_perf::pods::PodsArgs),
}

#[derive(Parser)]
struct RunArgs {
    /// Scenarios, in order (repeat or comma-separate); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    scenario: Vec<Scenario>,
    /// Frame sizes on the wire, FCS included: 64..=1518 or "imix".
    #[arg(long, value_delimiter = ',', default_value = "64,1500")]
    frame_size: Vec<FrameSize>,
    /// Seconds per trial.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// UDP flows (source ports).
    #[arg(long, default_value_t = 16)]
    flows: u16,
    /// Offered rate of the throughput trial: "max" or frames per second.
    #[arg(long, default_value = "max")]
    rate: String,
    /// Also search the zero-loss throughput (RFC 2544 binary search).
    #[arg(long)]
    zero_loss: bool,
    /// Loss a zero-loss trial may have, as a fraction.
    #[arg(long, default_value_t = 0.0)]
    loss_tolerance: f64,
    /// Trials of the zero-loss search, at most, per frame size.
    #[arg(long, default_value_t = 8)]
    zero_loss_trials: u32,
    /// Latency trial at this fraction of the measured maximum (0 = none).
    #[arg(long, default_value_t = 0.5)]
    latency_fraction: f64,
    /// Whose maximum the latency fraction is of: a scenario that ran
    /// earlier (the same offered load for all that follow), or "own".
    #[arg(long, default_value = "kernel")]
    latency_reference: String,
    /// CPU of the generator.
    #[arg(long, default_value_t = 0)]
    gen_cpu: usize,
    /// How the generator sends: "live" (BPF_PROG_TEST_RUN live frames, the
    /// kernel's XDP frame path) or "afxdp" (AF_XDP TX, copy mode).
    #[arg(long, value_enum, default_value = "live")]
    generator: GeneratorKind,
    /// CPU of the forwarder (null AF_XDP, brindle).
    #[arg(long, default_value_t = 1)]
    fwd_cpu: usize,
    /// brindle-vrouter binary for the brindle scenario.
    #[arg(long, default_value = "brindle-vrouter")]
    brindle_binary: PathBuf,
    /// Workload endpoints of the Calico-style rule set.
    #[arg(long, default_value_t = 50)]
    calico_endpoints: usize,
    /// Leave the first hop's receive work in the softirq of the sending CPU
    /// (the generator's) instead of a NAPI thread on the forwarder's CPU.
    #[arg(long)]
    no_threaded_napi: bool,
    /// Forwarding core counts to run each scenario with (1 and 2 here):
    /// with more than one, the router's veths get that many queues, the
    /// generator one thread per queue, the kernel one NAPI thread per
    /// queue (RSS) and brindle `--cpu 0,1`. Scenarios with one forwarding
    /// thread only (null-afxdp, the two-node paths) run with 1.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    workers: Vec<usize>,
    /// Directory for report.json and the plots.
    #[arg(long, default_value = "perf-out")]
    out: PathBuf,
}

const CAVEAT: &str = "Measured on a shared 2-core VM while other builds ran: absolute figures are noisy lower bounds; compare scenarios of the same run by their ratios.";

fn main() -> Result<()> {
    topo::install_signal_watcher().context("install the Ctrl-C handler")?;
    match Cli::parse().command {
        Command::Run(args) => run(*args),
        Command::Selftest => selftest_command(),
        Command::Control(args) => brindle_perf::control::run(args),
        Command::Pods(args) => brindle_perf::pods::run(args),
    }
}

fn run(args: RunArgs) -> Result<()> {
    let rate = if args.rate == "max" {
        Rate::Max
    } else {
        Rate::Pps(
            args.rate
                .parse()
                .context("--rate: \"max\" or frames per second")?,
        )
    };
    if !(args.duration > 0.0 && args.duration <= 600.0) {
        bail!("--duration must be in (0, 600] seconds");
    }
    let options = RunOptions {
        scenarios: if args.scenario.is_empty() {
            Scenario::ALL.to_vec()
        } else {
            args.scenario.clone()
        },
        sizes: args.frame_size.clone(),
        duration: Duration::from_secs_f64(args.duration),
        flows: args.flows.max(1),
        rate,
        zero_loss: args.zero_loss,
        loss_tolerance: args.loss_tolerance,
        zero_loss_trials: args.zero_loss_trials,
        latency_fraction: (args.latency_fraction > 0.0).then_some(args.latency_fraction.min(1.0)),
        latency_reference: match args.latency_reference.as_str() {
            "own" => None,
            name => Some(
                <Scenario as clap::ValueEnum>::from_str(name, true)
                    .map_err(|e| anyhow::anyhow!("--latency-reference: {e}"))?,
            ),
        },
        gen_cpu: args.gen_cpu,
        fwd_cpu: args.fwd_cpu,
        generator: args.generator,
        brindle_binary: args.brindle_binary.clone(),
        calico_endpoints: args.calico_endpoints,
        threaded_napi: !args.no_threaded_napi,
        workers: args.workers.iter().map(|&w| w.max(1)).collect(),
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut report = Report {
        command,
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: Machine::describe(),
        scenarios: Vec::new(),
        ratios: Vec::new(),
        caveat: CAVEAT.into(),
    };
    // Every scenario with one worker first, so the 1-worker kernel maximum
    // (the latency reference) exists before anything else runs.
    let runs: Vec<(usize, Scenario)> = options
        .workers
        .iter()
        .flat_map(|&w| {
            options
                .scenarios
                .iter()
                .filter(move |s| s.supports_workers(w))
                .map(move |&s| (w, s))
        })
        .collect();
    let total = runs.len();
    for (i, &(workers, scenario)) in runs.iter().enumerate() {
        let mut progress = |line: &str| eprintln!("[{}/{total}] {line}", i + 1);
        let result = run_scenario_with(
            scenario,
            workers,
            &options,
            &report.scenarios,
            &mut progress,
        );
        report.scenarios.push(result);
        if topo::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
    }
    report.machine.load_at_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned();
    report.ratios = ratios(&report.scenarios);
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let json = args.out.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", json.display()))?;
    for (name, draw) in [
        (
            "throughput.svg",
            plot::throughput_vs_frame_size
                as fn(&Report, &std::path::Path) -> Result<(), plot::PlotError>,
        ),
        ("latency-cdf.svg", plot::latency_cdf),
    ] {
        if let Err(e) = draw(&report, &args.out.join(name)) {
            eprintln!("brindle-perf: {e}");
        }
    }
    println!("\n{}\n", report.machine);
    print!("{}", table(&report));
    for s in &report.scenarios {
        for n in &s.notes {
            println!("{}: {n}", s.scenario);
        }
    }
    println!(
        "\n{CAVEAT}\nwrote {}, throughput.svg, latency-cdf.svg in {}",
        json.display(),
        args.out.display()
    );
    if report
        .scenarios
        .iter()
        .any(|s| matches!(s.status, Status::Failed(_)))
    {
        bail!("some scenarios failed (see the table)");
    }
    if topo::STOP.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("interrupted");
    }
    Ok(())
}

fn selftest_command() -> Result<()> {
    let mut failed = 0;
    for (name, result) in [
        (
            "plain veth, low rate, live generator",
            selftest::exact_count_on_a_plain_veth(GeneratorKind::Live).map(|r| r.0),
        ),
        (
            "plain veth, low rate, AF_XDP generator",
            selftest::exact_count_on_a_plain_veth(GeneratorKind::Afxdp).map(|r| r.0),
        ),
        (
            "routed, one flow dropped",
            selftest::loss_of_one_dropped_flow_is_counted().map(|r| r.0),
        ),
    ] {
        let checks = result.with_context(|| name.to_owned())?;
        for c in checks {
            println!(
                "{} {name}: {} ({})",
                if c.passed { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
            failed += usize::from(!c.passed);
        }
    }
    if failed > 0 {
        bail!("{failed} checks failed");
    }
    println!("selftest passed");
    Ok(())
}
