//! The control-path mode, `brindle-perf control`: how long the node takes
//! to bring a pod up and down (CNI ADD/DEL through the real plugin, beside
//! the reference `bridge` + `host-local` plugins) and to learn routes over
//! BGP from GoBGP into the vrouter's FIB. Real release binaries, one node
//! in network namespaces; see `perf/README.md`, "Control path".

pub mod bgp;
pub mod cni;
pub mod mrt;
pub mod node;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};

use self::bgp::{LearnRun, ProbeRun};
use self::cni::{Check, CniRun, Latency, Plugin};
use self::node::{Node, NodeOptions};
use crate::report::Machine;
use crate::topo::Netns;

/// Options of `brindle-perf control`.
#[derive(Parser, Debug, Clone)]
pub struct ControlArgs {
    /// Directory of the release binaries (brindle-vrouter, brindle-ctrl,
    /// brindle, brindle-ipam); default: this executable's directory.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Pods per CNI run.
    #[arg(long, default_value_t = 100)]
    pub pods: usize,
    /// Execs in flight at once in the parallel CNI run.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Directory of the reference plugins (bridge, host-local).
    #[arg(long, default_value = "/usr/lib/cni")]
    pub reference_cni_dir: PathBuf,
    /// Routes GoBGP announces, one learning run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    pub routes: Vec<u32>,
    /// Seconds a learning run may take before it is reported as incomplete.
    #[arg(long, default_value_t = 300)]
    pub bgp_timeout: u64,
    /// Routes loaded (in batches) by the programming probe; 0: no probe.
    #[arg(long, default_value_t = 100_000)]
    pub probe_load: u32,
    /// One-route requests the probe times on the empty and the loaded FIB.
    #[arg(long, default_value_t = 500)]
    pub probe_sample: u32,
    /// Skip the CNI runs.
    #[arg(long)]
    pub skip_cni: bool,
    /// Skip the BGP runs.
    #[arg(long)]
    pub skip_bgp: bool,
    /// Where to write the JSON report.
    #[arg(long, default_value = "perf-out/control.json")]
    pub json: PathBuf,
}

const CAVEAT: &str = "Measured on a shared, noisy 2-core VM while other builds ran: absolute figures are noisy upper bounds on latency; compare brindle with the anchor of the same run by their ratios.";

/// brindle / anchor ratios of one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct CniRatio {
    /// Execs in flight.
    pub parallel: usize,
    /// ADD p50, brindle / bridge+host-local.
    pub add_p50: f64,
    /// ADD p99.
    pub add_p99: f64,
    /// DEL p50.
    pub del_p50: f64,
    /// DEL p99.
    pub del_p99: f64,
    /// ADD pods/s, brindle / anchor (above 1: brindle is faster).
    pub add_pods_per_s: f64,
}

/// Everything one `brindle-perf control` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ControlReport {
    /// The command line.
    pub command: String,
    /// Unix seconds at the start.
    pub started_unix_s: u64,
    /// Kernel, CPU, cores, load.
    pub machine: Machine,
    /// CNI runs: per plugin, serial and parallel.
    pub cni: Vec<CniRun>,
    /// brindle / anchor.
    pub cni_ratios: Vec<CniRatio>,
    /// BGP learning runs.
    pub bgp: Vec<LearnRun>,
    /// The programming API alone.
    pub probe: Option<ProbeRun>,
    /// Where the time goes, from the figures above.
    pub diagnosis: Vec<String>,
    /// What to keep in mind.
    pub caveat: String,
}

impl ControlReport {
    /// Every check of every run.
    pub fn checks(&self) -> impl Iterator<Item = &Check> {
        self.cni
            .iter()
            .flat_map(|r| r.checks.iter())
            .chain(self.bgp.iter().flat_map(|r| r.checks.iter()))
    }
}

fn progress(line: &str) {
    eprintln!("control: {line}");
}

/// The brindle plugin's config, as the conflist installed on a node
/// renders it (`brindle_cni::conflist::render`), first plugin of the list.
fn brindle_conf(node: &Node) -> Result<Value> {
    let sock = node.ctrl_socket().display().to_string();
    let params = brindle_cni::conflist::ConflistParams {
        mtu: 1480,
        encapsulation: "ipip".into(),
        ctrl_socket: sock.clone(),
        require_daemon: true,
        ipam: json!({"type": "brindle-ipam", "mode": "daemon", "socket": sock, "node": node.name}),
        ..Default::default()
    };
    brindle_cni::conflist::render(&params)
        .context("render the conflist")?
        .plugin_conf(0, &serde_json::Map::new(), None)
        .context("the conflist has no plugin")
}

fn endpoints_listed(node: &Node) -> Result<usize> {
    let v = node::ctrl_call(&node.ctrl_socket(), &json!({"op": "list_endpoints"}))?;
    Ok(match &v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o
            .values()
            .find_map(|x| x.as_array().map(Vec::len))
            .unwrap_or(0),
        _ => 0,
    })
}

/// One plugin, one concurrency: fresh pods, ADD all, check, DEL all,
/// check; `after_del` adds the plugin's own leftover checks.
fn cni_run(
    node_ns: &Netns,
    plugin: &Plugin,
    pods_n: usize,
    parallel: usize,
    round: usize,
    after_del: &mut dyn FnMut() -> Vec<Check>,
) -> Result<CniRun> {
    let label = format!("{} x{parallel}", plugin.label);
    let mut pods = cni::make_pods(pods_n, round)?;
    progress(&format!("{label}: ADD {pods_n} pods"));
    let (adds, add_wall) = cni::phase(&node_ns.name, plugin, "ADD", &mut pods, parallel)?;
    let mut checks = vec![
        Check::new(
            format!("{label}: ADDs == pods"),
            adds.len() == pods_n,
            format!("{} ADDs for {pods_n} pods", adds.len()),
        ),
        cni::check_added(&label, &pods),
    ];
    progress(&format!("{label}: DEL {pods_n} pods"));
    let (dels, del_wall) = cni::phase(&node_ns.name, plugin, "DEL", &mut pods, parallel)?;
    checks.push(Check::new(
        format!("{label}: DELs == pods"),
        dels.len() == pods_n,
        format!("{} DELs for {pods_n} pods", dels.len()),
    ));
    checks.extend(cni::check_deleted(&label, node_ns, &["eth0"], &pods));
    checks.extend(after_del());
    Ok(CniRun {
        plugin: plugin.label.clone(),
        parallel,
        pods: pods_n,
        add: Latency::of(&adds),
        del: Latency::of(&dels),
        add_pods_per_s: pods_n as f64 / add_wall.as_secs_f64(),
        del_pods_per_s: pods_n as f64 / del_wall.as_secs_f64(),
        checks,
    })
}

/// CNI ADD/DEL of `pods` pods, serial and `parallel`-way, for brindle and
/// for bridge + host-local.
pub fn cni_runs(
    bin_dir: &Path,
    reference: &Path,
    pods: usize,
    parallel: usize,
) -> Result<Vec<CniRun>> {
    let modes: Vec<usize> = if parallel > 1 {
        vec![1, parallel]
    } else {
        vec![1]
    };
    let mut runs = Vec::new();

    progress("brindle: starting brindle-vrouter and brindle-ctrl");
    let opts = NodeOptions {
        bin_dir: bin_dir.to_path_buf(),
        bgp_peers: Vec::new(),
        ctrl: true,
    };
    let (mut node, ()) = Node::start(&opts, |_, _| Ok(()))?;
    node.wait_ready()?;
    let plugin = Plugin {
        label: "brindle".into(),
        binary: bin_dir.join("brindle"),
        cni_path: bin_dir.display().to_string(),
        conf: brindle_conf(&node)?,
    };
    let ports_before = node::vrouter_stats(&node.vrouter_socket())?.ports;
    for (round, &p) in modes.iter().enumerate() {
        let vsock = node.vrouter_socket();
        let mut after = || {
            let ports = node::vrouter_stats(&vsock).map(|s| s.ports);
            let listed = endpoints_listed(&node);
            vec![
                Check::new(
                    format!("brindle x{p}: the vrouter's ports are back to the uplink's"),
                    ports.as_ref().is_ok_and(|n| *n == ports_before),
                    format!("{ports:?} ports, {ports_before} before"),
                ),
                Check::new(
                    format!("brindle x{p}: the daemon lists no endpoint"),
                    listed.as_ref().is_ok_and(|n| *n == 0),
                    format!("{listed:?} endpoints"),
                ),
            ]
        };
        let r =
            cni_run(&node.ns, &plugin, pods, p, round, &mut after).with_context(|| node.logs())?;
        runs.push(r);
    }
    drop(node);

    progress("bridge+host-local: a node namespace with the reference plugins");
    let node_ns = Netns::new("k")?;
    node_ns.sysctl(&["net.ipv4.ip_forward=1"])?;
    // The same shape as brindle's node: an uplink veth that stays.
    let upstream = Netns::new("u")?;
    node_ns.ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &upstream.name,
    ])?;
    let data = node::StateDir::new("h")?;
    let network = "perf-bridge";
    let plugin = Plugin {
        label: "bridge+host-local".into(),
        binary: reference.join("bridge"),
        cni_path: reference.display().to_string(),
        conf: cni::bridge_conf(network, &data.0),
    };
    for (round, &p) in modes.iter().enumerate() {
        let alloc_dir = data.0.join(network);
        let mut after = || {
            let left = cni::host_local_allocations(&alloc_dir);
            vec![Check::new(
                format!("bridge+host-local x{p}: host-local holds no address"),
                left == 0,
                format!("{left} allocations left"),
            )]
        };
        runs.push(cni_run(&node_ns, &plugin, pods, p, 10 + round, &mut after)?);
    }
    Ok(runs)
}

/// brindle / anchor for each concurrency both ran.
pub fn cni_ratios(runs: &[CniRun]) -> Vec<CniRatio> {
    runs.iter()
        .filter(|r| r.plugin == "brindle")
        .filter_map(|b| {
            let k = runs
                .iter()
                .find(|k| k.plugin != "brindle" && k.parallel == b.parallel)?;
            let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
            Some(CniRatio {
                parallel: b.parallel,
                add_p50: div(b.add.p50_ms, k.add.p50_ms),
                add_p99: div(b.add.p99_ms, k.add.p99_ms),
                del_p50: div(b.del.p50_ms, k.del.p50_ms),
                del_p99: div(b.del.p99_ms, k.del.p99_ms),
                add_pods_per_s: div(b.add_pods_per_s, k.add_pods_per_s),
            })
        })
        .collect()
}

/// Where the learning time goes, in sentences built from the figures.
pub fn diagnose(bgp: &[LearnRun], probe: Option<&ProbeRun>) -> Vec<String> {
    let mut out = Vec::new();
    for r in bgp {
        if let Some(req) = r.vrouter_requests {
            out.push(format!(
                "{} routes: the daemon sent {req} requests to the vrouter for {} routes in the FIB ({:.2} routes per request), mean {:.3} ms each; CPU: brindle-ctrl {:.1} s, brindle-vrouter {:.1} s",
                r.routes_requested,
                r.routes_in_fib,
                r.routes_in_fib as f64 / req.max(1) as f64,
                r.vrouter_request_mean_s.unwrap_or(0.0) * 1e3,
                r.ctrl_cpu_s.unwrap_or(0.0),
                r.vrouter_cpu_s.unwrap_or(0.0),
            ));
        }
        if let (Some(first), Some(last)) = (r.rate_by_tenth.first(), r.rate_by_tenth.last())
            && r.rate_by_tenth.len() > 1
        {
            out.push(format!(
                "{} routes: {first:.0} routes/s into the FIB over the first tenth of the {} that reached it, {last:.0} over the last",
                r.routes_requested,
                r.routes_in_fib
            ));
        }
    }
    if let Some(p) = probe {
        out.push(format!(
            "vrouter API alone: a one-route AddRoutes costs {:.3} ms on an empty FIB and {:.3} ms with {} routes in it; GetStats {:.3} ms; batches of {} load {:.0} routes/s",
            p.single_route_request_empty_ms,
            p.single_route_request_loaded_ms,
            p.loaded_fib_routes,
            p.get_stats_loaded_ms,
            p.batch_size,
            p.batched_routes_per_s
        ));
    }
    out
}

fn f(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The terminal table.
pub fn table(report: &ControlReport) -> String {
    let mut s = String::new();
    if !report.cni.is_empty() {
        let _ = writeln!(
            s,
            "| plugin | parallel | pods | ADD p50 | p90 | p99 | max | ADD pods/s | DEL p50 | p90 | p99 | max | DEL pods/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &report.cni {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} ms | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} ms | {:.1} | {:.1} | {:.1} | {:.0} |",
                r.plugin,
                r.parallel,
                r.pods,
                r.add.p50_ms,
                r.add.p90_ms,
                r.add.p99_ms,
                r.add.max_ms,
                r.add_pods_per_s,
                r.del.p50_ms,
                r.del.p90_ms,
                r.del.p99_ms,
                r.del.max_ms,
                r.del_pods_per_s
            );
        }
        let _ = writeln!(
            s,
            "\n| brindle / bridge+host-local | ADD p50 | ADD p99 | DEL p50 | DEL p99 | ADD pods/s |\n|---|---|---|---|---|---|"
        );
        for r in &report.cni_ratios {
            let _ = writeln!(
                s,
                "| parallel {} | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
                r.parallel, r.add_p50, r.add_p99, r.del_p50, r.del_p99, r.add_pods_per_s
            );
        }
    }
    if !report.bgp.is_empty() {
        let _ = writeln!(
            s,
            "\n| routes announced | in FIB | complete | start → Established | Established → all in RIB | Established → first in FIB | Established → all in FIB | start → all in FIB | routes/s | UPDATEs | UPDATEs/s | vrouter requests | GoBGP load |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &report.bgp {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} s | {} s | {} s | {} s | {} s | {:.0} | {} | {:.0} | {} | {:.1} s |",
                r.routes_announced,
                r.routes_in_fib,
                if r.complete { "yes" } else { "no (timeout)" },
                f(r.start_to_established_s),
                f(r.established_to_all_in_rib_s),
                f(r.established_to_first_in_fib_s),
                f(r.established_to_all_in_fib_s),
                f(r.start_to_all_in_fib_s),
                r.routes_per_s,
                r.updates_in,
                r.updates_per_s,
                r.vrouter_requests.map_or("-".into(), |v| v.to_string()),
                r.gobgp_load_s
            );
        }
    }
    for d in &report.diagnosis {
        let _ = writeln!(s, "- {d}");
    }
    s
}

/// Runs the control-path measurements.
pub fn run(args: ControlArgs) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("brindle-perf control needs root (network namespaces, XDP)");
    }
    let bin_dir = args.bin_dir.clone().unwrap_or_else(bgp::default_bin_dir);
    let mut report = ControlReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: Machine::describe(),
        cni: Vec::new(),
        cni_ratios: Vec::new(),
        bgp: Vec::new(),
        probe: None,
        diagnosis: Vec::new(),
        caveat: CAVEAT.into(),
    };
    let mut failures = Vec::new();
    if !args.skip_cni && args.pods > 0 {
        match cni_runs(&bin_dir, &args.reference_cni_dir, args.pods, args.parallel) {
            Ok(runs) => report.cni = runs,
            Err(e) => failures.push(format!("CNI: {e:#}")),
        }
        report.cni_ratios = cni_ratios(&report.cni);
    }
    if !args.skip_bgp {
        for &n in &args.routes {
            match bgp::learn(
                &bin_dir,
                n,
                Duration::from_secs(args.bgp_timeout),
                &mut |l| progress(l),
            ) {
                Ok(r) => report.bgp.push(r),
                Err(e) => failures.push(format!("BGP {n}: {e:#}")),
            }
        }
        if args.probe_load > 0 {
            progress(&format!(
                "probe: the vrouter's API alone, {} routes",
                args.probe_load
            ));
            match bgp::probe(&bin_dir, args.probe_load, args.probe_sample.max(1), 10_000) {
                Ok(p) => report.probe = Some(p),
                Err(e) => failures.push(format!("probe: {e:#}")),
            }
        }
        report.diagnosis = diagnose(&report.bgp, report.probe.as_ref());
    }
    report.machine.load_at_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned();
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", args.json.display()))?;
    println!("\n{}\n", report.machine);
    print!("{}", table(&report));
    let failed: Vec<&Check> = report.checks().filter(|c| !c.passed).collect();
    for c in report.checks() {
        println!(
            "{} {}: {}",
            if c.passed { "ok  " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    println!("\n{CAVEAT}\nwrote {}", args.json.display());
    for f in &failures {
        eprintln!("brindle-perf control: {f}");
    }
    if !failures.is_empty() || !failed.is_empty() {
        bail!(
            "{} runs failed, {} checks failed",
            failures.len(),
            failed.len()
        );
    }
    Ok(())
}
