//! Results: per-trial figures, the machine's description, CPU shares,
//! brindle/kernel ratios, the terminal table and the JSON file.

use std::fmt::Write;

use serde::Serialize;

use crate::forwarder::NullForwarderStats;
use crate::stats::LatencySummary;
use crate::traffic::ThreadCpu;

/// The machine a run was made on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Online CPUs.
    pub cores: usize,
    /// /proc/loadavg at the start of the run.
    pub load_at_start: String,
    /// /proc/loadavg at the end.
    pub load_at_end: String,
}

impl std::fmt::Display for Machine {
    /// The line printed under every results table.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel {}, {} x {}, load {} -> {}",
            self.kernel, self.cores, self.cpu_model, self.load_at_start, self.load_at_end
        )
    }
}

impl Machine {
    /// Reads /proc.
    pub fn describe() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_at_start: read("/proc/loadavg").trim().to_owned(),
            load_at_end: String::new(),
        }
    }
}

/// Jiffies of one CPU from /proc/stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice.
    pub user: u64,
    /// system.
    pub system: u64,
    /// irq + softirq.
    pub softirq: u64,
    /// idle + iowait.
    pub idle: u64,
    /// steal and the rest.
    pub other: u64,
}

/// Parses the `cpuN` lines of /proc/stat.
pub fn parse_proc_stat(text: &str) -> Vec<CpuTimes> {
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            let f = |i: usize| v.get(i).copied().unwrap_or(0);
            CpuTimes {
                user: f(0) + f(1),
                system: f(2),
                idle: f(3) + f(4),
                softirq: f(5) + f(6),
                other: f(7),
            }
        })
        .collect()
}

/// Reads /proc/stat now.
pub fn cpu_times() -> Vec<CpuTimes> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
}

/// CPU seconds (user + system) a task used so far, from /proc/<pid>/stat;
/// `None` if it is gone.
pub fn task_cpu_s(pid: i32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_task_cpu_ticks(&text).map(|t| t as f64 / clock_ticks())
}

/// utime + stime in clock ticks from a /proc/<pid>/stat line (fields 14
/// and 15; the command name in parentheses may contain spaces).
pub fn parse_task_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) is index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// utime and stime in clock ticks from a /proc/<pid>/stat line.
pub fn parse_task_user_system_ticks(stat: &str) -> Option<(u64, u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// User and system CPU seconds of a process (all its threads) so far.
pub fn process_cpu(pid: i32) -> Option<ThreadCpu> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (u, s) = parse_task_user_system_ticks(&text)?;
    Some(ThreadCpu {
        user_s: u as f64 / clock_ticks(),
        system_s: s as f64 / clock_ticks(),
    })
}

/// Seconds the CPUs `cpus` spent in interrupts and softirqs between two
/// /proc/stat readings: the kernel's packet work outside any thread (the
/// sink veth's receive, RPS backlogs).
pub fn softirq_seconds(before: &[CpuTimes], after: &[CpuTimes], cpus: &[usize]) -> f64 {
    cpus.iter()
        .filter_map(|&c| Some(after.get(c)?.softirq.saturating_sub(before.get(c)?.softirq)))
        .sum::<u64>() as f64
        / clock_ticks()
}

/// Where the forwarding cores' time went in a trial, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CoreTime {
    /// The forwarder's userspace time (null forwarder thread, brindle
    /// process): our own per-frame work.
    pub user_s: f64,
    /// The forwarder's system time: for AF_XDP copy mode, the kernel's
    /// transmit inside sendto (skb, copy, veth xmit, the sink's receive).
    pub system_s: f64,
    /// The first hop's NAPI threads: for the kernel its whole forwarding,
    /// for AF_XDP the XDP program and the copy into the UMEM.
    pub napi_s: f64,
    /// Softirq time on the forwarding CPUs (/proc/stat), outside threads.
    pub softirq_s: f64,
}

impl CoreTime {
    /// "user % / kernel % / softirq %" of the sum: userspace against
    /// everything the kernel did on the forwarding cores.
    pub fn split(&self) -> Option<(f64, f64, f64)> {
        let total = self.user_s + self.system_s + self.napi_s + self.softirq_s;
        (total > 0.0).then(|| {
            (
                100.0 * self.user_s / total,
                100.0 * (self.system_s + self.napi_s) / total,
                100.0 * self.softirq_s / total,
            )
        })
    }
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// Where one CPU's time went during a trial, as fractions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuShare {
    /// CPU number.
    pub cpu: usize,
    /// Userspace.
    pub user: f64,
    /// Kernel (system calls).
    pub system: f64,
    /// Interrupts and softirqs (the kernel's packet processing).
    pub softirq: f64,
    /// Idle.
    pub idle: f64,
}

/// Shares between two /proc/stat readings.
pub fn cpu_shares(before: &[CpuTimes], after: &[CpuTimes]) -> Vec<CpuShare> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .map(|(cpu, (b, a))| {
            let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
            let (u, s, si, id, o) = (
                d(b.user, a.user),
                d(b.system, a.system),
                d(b.softirq, a.softirq),
                d(b.idle, a.idle),
                d(b.other, a.other),
            );
            let total = (u + s + si + id + o).max(1.0);
            CpuShare {
                cpu,
                user: u / total,
                system: s / total,
                softirq: si / total,
                idle: id / total,
            }
        })
        .collect()
}

/// What a trial measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialKind {
    /// Offered at the maximum rate (or the fixed rate asked for).
    Throughput,
    /// Offered at a fraction of the measured maximum, for latency.
    Latency,
    /// One step of the zero-loss search.
    ZeroLossStep,
}

/// One trial.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// What it measured.
    pub kind: TrialKind,
    /// Forwarding cores (worker cores, or NAPI threads for the kernel).
    pub workers: usize,
    /// The generator that sent ("live" or "afxdp").
    pub generator: String,
    /// Frame size label ("64", "1500", "imix").
    pub frame_size: String,
    /// Mean frame size on the wire, bytes.
    pub mean_wire_size: f64,
    /// Rate asked for (pps), `None` for the maximum.
    pub target_pps: Option<f64>,
    /// Frames sent.
    pub sent: u64,
    /// Frames of the trial received by the sink.
    pub received: u64,
    /// Sent over the sending time.
    pub offered_pps: f64,
    /// Received over the sending time.
    pub rx_pps: f64,
    /// Received, in wire bits per second (frame + FCS + preamble + gap).
    pub rx_wire_gbps: f64,
    /// Frames lost.
    pub lost: u64,
    /// Lost over sent.
    pub loss_ratio: f64,
    /// Frames out of order.
    pub reordered: u64,
    /// Frames at the sink that were not this trial's.
    pub foreign: u64,
    /// Frames the sink's own socket dropped (must be 0 for the figure to
    /// be the forwarder's).
    pub sink_drops: u64,
    /// One-way latency.
    pub latency: Option<LatencySummary>,
    /// Sending time, seconds.
    pub elapsed_s: f64,
    /// The generator thread's CPU time.
    pub generator_cpu: ThreadCpu,
    /// The null forwarder's counters and CPU split, for its scenario.
    pub forwarder: Option<NullForwarderStats>,
    /// Every CPU's time during the trial.
    pub cpus: Vec<CpuShare>,
    /// CPU seconds of the first hop's NAPI thread (the kernel's receive
    /// and forwarding work, and the AF_XDP copy into the UMEM).
    pub napi_cpu_s: f64,
    /// CPU seconds of all forwarding work: NAPI thread + forwarder thread.
    pub forwarding_cpu_s: f64,
    /// Where the forwarding cores' time went.
    pub core_time: CoreTime,
    /// Forwarding CPU per received frame, ns: the figure that does not
    /// depend on how much CPU the other tenants of the machine left us.
    pub forwarding_ns_per_frame: Option<f64>,
    /// Generator CPU per sent frame, ns.
    pub generator_ns_per_frame: Option<f64>,
}

/// Whether a scenario ran.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status", content = "reason")]
pub enum Status {
    /// It ran.
    Ran,
    /// It could not run here (not a failure).
    NotAvailable(String),
    /// It failed.
    Failed(String),
}

/// One scenario's results.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// Its name.
    pub scenario: String,
    /// Forwarding cores it ran with.
    pub workers: usize,
    /// What it is.
    pub description: String,
    /// Whether it ran.
    pub status: Status,
    /// Its trials.
    pub trials: Vec<Trial>,
    /// Zero-loss throughput per frame size (pps), when searched.
    pub zero_loss_pps: Vec<(String, f64)>,
    /// Extra facts (e.g. the iptables rule count).
    pub notes: Vec<String>,
}

impl ScenarioResult {
    /// The throughput trial of a frame size.
    pub fn throughput(&self, size: &str) -> Option<&Trial> {
        self.trials
            .iter()
            .find(|t| t.kind == TrialKind::Throughput && t.frame_size == size)
    }

    /// The latency trial of a frame size.
    pub fn latency(&self, size: &str) -> Option<&Trial> {
        self.trials
            .iter()
            .find(|t| t.kind == TrialKind::Latency && t.frame_size == size)
    }
}

/// A ratio of two scenarios' received rates at one frame size.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    /// "a / b".
    pub name: String,
    /// Frame size.
    pub frame_size: String,
    /// rx_pps(a) / rx_pps(b).
    pub value: f64,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The command line.
    pub command: String,
    /// Seconds since the epoch at the start.
    pub started_unix_s: u64,
    /// The machine.
    pub machine: Machine,
    /// Per scenario.
    pub scenarios: Vec<ScenarioResult>,
    /// Ratios between scenarios.
    pub ratios: Vec<Ratio>,
    /// Caveat printed with every table.
    pub caveat: String,
}

/// The ratios the issue asks for, where both sides ran.
pub const RATIO_PAIRS: [(&str, &str); 17] = [
    ("brindle-vxlan", "kernel-vxlan"),
    ("brindle-vxlan", "brindle"),
    ("null-afxdp", "kernel"),
    ("kernel-calico", "kernel"),
    ("null-afxdp", "kernel-vxlan"),
    ("null-afxdp", "kernel-ipip"),
    ("null-afxdp", "kernel-native"),
    ("brindle", "null-afxdp"),
    ("brindle", "kernel"),
    ("brindle", "kernel-vxlan"),
    ("brindle", "kernel-calico"),
    ("kernel", "generator"),
    ("brindle-policy", "kernel-calico"),
    ("brindle-policy-new", "kernel-calico"),
    ("brindle-policy", "brindle-daemon"),
    ("brindle-policy-new", "brindle-daemon"),
    ("brindle-daemon", "brindle"),
];

/// Computes [`RATIO_PAIRS`] for every frame size and worker count where
/// both sides ran with it, and brindle's 2-core against its 1-core rate.
pub fn ratios(scenarios: &[ScenarioResult]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let mut workers: Vec<usize> = scenarios.iter().map(|s| s.workers).collect();
    workers.sort_unstable();
    workers.dedup();
    for w in workers {
        let find = |n: &str| scenarios.iter().find(|s| s.scenario == n && s.workers == w);
        let suffix = if w > 1 {
            format!(" ({w} workers)")
        } else {
            String::new()
        };
        for (a, b) in RATIO_PAIRS {
            let (Some(sa), Some(sb)) = (find(a), find(b)) else {
                continue;
            };
            pair_ratios(a, b, sa, sb, &suffix, &mut out);
        }
    }
    for name in ["brindle", "kernel"] {
        let one = scenarios
            .iter()
            .find(|s| s.scenario == name && s.workers == 1);
        for more in scenarios
            .iter()
            .filter(|s| s.scenario == name && s.workers > 1)
        {
            if let Some(one) = one {
                for ta in more
                    .trials
                    .iter()
                    .filter(|t| t.kind == TrialKind::Throughput)
                {
                    if let Some(tb) = one.throughput(&ta.frame_size)
                        && tb.rx_pps > 0.0
                    {
                        out.push(Ratio {
                            name: format!("{name} {} workers / 1 worker", more.workers),
                            frame_size: ta.frame_size.clone(),
                            value: ta.rx_pps / tb.rx_pps,
                        });
                    }
                }
            }
        }
    }
    out
}

fn pair_ratios(
    a: &str,
    b: &str,
    sa: &ScenarioResult,
    sb: &ScenarioResult,
    suffix: &str,
    out: &mut Vec<Ratio>,
) {
    for ta in sa.trials.iter().filter(|t| t.kind == TrialKind::Throughput) {
        let Some(tb) = sb.throughput(&ta.frame_size) else {
            continue;
        };
        if tb.rx_pps <= 0.0 {
            continue;
        }
        out.push(Ratio {
            name: format!("{a} / {b}{suffix}"),
            frame_size: ta.frame_size.clone(),
            value: ta.rx_pps / tb.rx_pps,
        });
        if let (Some(ca), Some(cb)) = (ta.forwarding_ns_per_frame, tb.forwarding_ns_per_frame)
            && ca > 0.0
            // The generator scenario forwards nothing: its NAPI time is
            // the sink's receive work, not comparable.
            && b != "generator"
        {
            out.push(Ratio {
                name: format!("{a} / {b} per forwarding core-second{suffix}"),
                frame_size: ta.frame_size.clone(),
                value: cb / ca,
            });
        }
    }
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// The terminal table (also used in README.md: it is Markdown). One row
/// per scenario, worker count and frame size: the throughput trial's
/// figures, the latency trial's percentiles, where the forwarding cores'
/// time went (forwarder user / kernel / softirq) and, for brindle, the
/// share of its poll loops that found frames.
pub fn table(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| scenario | workers | frame | gen | offered Mpps | received Mpps | Gbit/s | loss % | reordered | sink drops | lat. offered Mpps | p50 µs | p99 µs | p99.9 µs | zero-loss Mpps | fwd ns/frame | core usr/krn/si % | busy polls % |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for sc in &report.scenarios {
        if let Status::NotAvailable(why) | Status::Failed(why) = &sc.status
            && sc.trials.is_empty()
        {
            let what = if matches!(sc.status, Status::Failed(_)) {
                "FAILED"
            } else {
                "not available"
            };
            let _ = writeln!(
                s,
                "| {} | {} | – | {what}: {why} | | | | | | | | | | | | | | |",
                sc.scenario, sc.workers
            );
            continue;
        }
        for t in sc.trials.iter().filter(|t| t.kind == TrialKind::Throughput) {
            let lat_trial = sc.latency(&t.frame_size);
            let lat = lat_trial
                .and_then(|l| l.latency.as_ref())
                .or(t.latency.as_ref());
            let (p50, p99, p999) = lat.map_or(("–".into(), "–".into(), "–".into()), |l| {
                (us(l.p50_ns), us(l.p99_ns), us(l.p999_ns))
            });
            let lat_offered =
                lat_trial.map_or("–".into(), |l| format!("{:.3}", l.offered_pps / 1e6));
            let zl = sc
                .zero_loss_pps
                .iter()
                .find(|(f, _)| f == &t.frame_size)
                .map_or("–".into(), |(_, p)| format!("{:.3}", p / 1e6));
            let split = t.core_time.split().map_or("–".into(), |(u, k, si)| {
                format!("{u:.0} / {k:.0} / {si:.0}")
            });
            let busy = t
                .forwarder
                .as_ref()
                .and_then(|f| f.busy_share())
                .map_or("–".into(), |b| format!("{:.0}", 100.0 * b));
            let cost = t
                .forwarding_ns_per_frame
                .map_or("–".into(), |c| format!("{c:.0}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {} | {} | {lat_offered} | {p50} | {p99} | {p999} | {zl} | {cost} | {split} | {busy} |",
                sc.scenario,
                t.workers,
                t.frame_size,
                t.generator,
                t.offered_pps / 1e6,
                t.rx_pps / 1e6,
                t.rx_wire_gbps,
                100.0 * t.loss_ratio,
                t.reordered,
                t.sink_drops,
            );
        }
    }
    if !report.ratios.is_empty() {
        let _ = writeln!(s, "\n| ratio | frame | value |\n|---|---|---|");
        for r in &report.ratios {
            let _ = writeln!(s, "| {} | {} | {:.2} |", r.name, r.frame_size, r.value);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(size: &str, rx_pps: f64) -> Trial {
        Trial {
            kind: TrialKind::Throughput,
            workers: 1,
            generator: "live".into(),
            core_time: CoreTime::default(),
            frame_size: size.into(),
            mean_wire_size: 64.0,
            target_pps: None,
            sent: 1000,
            received: 900,
            offered_pps: rx_pps * 1.1,
            rx_pps,
            rx_wire_gbps: 0.5,
            lost: 100,
            loss_ratio: 0.1,
            reordered: 0,
            foreign: 0,
            sink_drops: 0,
            latency: None,
            elapsed_s: 1.0,
            generator_cpu: ThreadCpu::default(),
            forwarder: None,
            cpus: vec![],
            napi_cpu_s: 0.0,
            forwarding_cpu_s: 0.0,
            forwarding_ns_per_frame: None,
            generator_ns_per_frame: None,
        }
    }

    fn scenario(name: &str, trials: Vec<Trial>) -> ScenarioResult {
        ScenarioResult {
            scenario: name.into(),
            workers: 1,
            description: String::new(),
            status: Status::Ran,
            trials,
            zero_loss_pps: vec![],
            notes: vec![],
        }
    }

    #[test]
    fn ratios_pair_scenarios_by_frame_size() {
        let s = vec![
            scenario(
                "kernel",
                vec![trial("64", 1_000_000.0), trial("1500", 500_000.0)],
            ),
            scenario("null-afxdp", vec![trial("64", 800_000.0)]),
        ];
        let r = ratios(&s);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "null-afxdp / kernel");
        assert_eq!(r[0].frame_size, "64");
        assert!((r[0].value - 0.8).abs() < 1e-12);
    }

    #[test]
    fn per_core_ratios_compare_forwarding_cpu_per_frame_but_never_against_the_generator() {
        let costly = |size: &str, pps: f64, ns: f64| Trial {
            forwarding_ns_per_frame: Some(ns),
            ..trial(size, pps)
        };
        let s = vec![
            scenario("generator", vec![costly("64", 2e6, 500.0)]),
            scenario("kernel", vec![costly("64", 1e6, 1000.0)]),
            scenario("null-afxdp", vec![costly("64", 5e5, 1250.0)]),
        ];
        let r = ratios(&s);
        let by = |n: &str| r.iter().find(|x| x.name == n).map(|x| x.value);
        assert_eq!(by("null-afxdp / kernel"), Some(0.5));
        assert_eq!(
            by("null-afxdp / kernel per forwarding core-second"),
            Some(0.8)
        );
        assert_eq!(by("kernel / generator"), Some(0.5));
        assert_eq!(by("kernel / generator per forwarding core-second"), None);
    }

    #[test]
    fn report_json_holds_every_figure_and_the_machine() {
        let mut unavailable = scenario("brindle", vec![]);
        unavailable.status = Status::NotAvailable("no run mode".into());
        let report = Report {
            command: "brindle-perf run".into(),
            started_unix_s: 1,
            machine: Machine {
                kernel: "6.18.0".into(),
                cpu_model: "Test CPU".into(),
                cores: 2,
                load_at_start: "1.0".into(),
                load_at_end: "2.0".into(),
            },
            scenarios: vec![scenario("kernel", vec![trial("64", 1e6)]), unavailable],
            ratios: vec![],
            caveat: "noisy".into(),
        };
        let v: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(v["machine"]["kernel"], "6.18.0");
        assert_eq!(v["machine"]["cores"], 2);
        let t = &v["scenarios"][0]["trials"][0];
        assert_eq!(t["kind"], "throughput");
        assert_eq!(t["rx_pps"], 1e6);
        assert_eq!(t["lost"], 100);
        assert_eq!(v["scenarios"][1]["status"]["status"], "not-available");
        assert_eq!(v["scenarios"][1]["status"]["reason"], "no run mode");
        let table = table(&report);
        assert!(
            table.contains("| kernel | 1 | 64 | live | 1.100 | 1.000 |"),
            "{table}"
        );
        assert!(
            table.contains("| brindle | 1 | – | not available: no run mode"),
            "{table}"
        );
        assert_eq!(t["workers"], 1);
        assert_eq!(t["core_time"]["softirq_s"], 0.0);
    }

    #[test]
    fn task_stat_gives_user_plus_system_ticks_even_with_spaces_in_the_name() {
        let line = "8455 (napi/y0 333) S 2 0 0 0 -1 2129984 0 0 0 0 17 42 0 0 20 0 1 0 1000 0 0";
        assert_eq!(parse_task_cpu_ticks(line), Some(59));
        assert_eq!(parse_task_cpu_ticks("garbage"), None);
        assert_eq!(parse_task_cpu_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_task_user_system_ticks(line), Some((17, 42)));
        assert_eq!(parse_task_user_system_ticks("garbage"), None);
    }

    #[test]
    fn ratios_pair_only_equal_worker_counts_and_scale_brindle_over_workers() {
        let with = |name: &str, workers: usize, rx: f64| ScenarioResult {
            workers,
            ..scenario(
                name,
                vec![Trial {
                    workers,
                    ..trial("64", rx)
                }],
            )
        };
        let s = vec![
            with("kernel", 1, 1e6),
            with("brindle", 1, 5e5),
            with("kernel", 2, 2e6),
            with("brindle", 2, 1.5e6),
        ];
        let r = ratios(&s);
        let get = |n: &str| r.iter().find(|x| x.name == n).map(|x| x.value);
        assert_eq!(get("brindle / kernel"), Some(0.5));
        assert_eq!(get("brindle / kernel (2 workers)"), Some(0.75));
        assert_eq!(get("brindle 2 workers / 1 worker"), Some(3.0));
        assert_eq!(get("kernel 2 workers / 1 worker"), Some(2.0));
        assert_eq!(r.len(), 4, "{r:?}");
    }

    #[test]
    fn core_time_splits_user_kernel_and_softirq() {
        let t = CoreTime {
            user_s: 0.1,
            system_s: 0.5,
            napi_s: 0.3,
            softirq_s: 0.1,
        };
        let (u, k, si) = t.split().unwrap();
        assert!((u - 10.0).abs() < 1e-9 && (k - 80.0).abs() < 1e-9 && (si - 10.0).abs() < 1e-9);
        assert_eq!(CoreTime::default().split(), None);
    }

    #[test]
    fn softirq_seconds_sum_only_the_forwarding_cpus() {
        let at = |si: u64| CpuTimes {
            softirq: si,
            ..CpuTimes::default()
        };
        let before = [at(10), at(100)];
        let after = [at(10 + 1_000), at(100 + 50)];
        let ticks = clock_ticks();
        assert!((softirq_seconds(&before, &after, &[1]) - 50.0 / ticks).abs() < 1e-9);
        assert!((softirq_seconds(&before, &after, &[0, 1, 7]) - 1050.0 / ticks).abs() < 1e-9);
    }

    #[test]
    fn proc_stat_parses_per_cpu_lines_and_shares_sum_to_one() {
        let before = parse_proc_stat(
            "cpu  10 0 10 10 0 0 0 0\ncpu0 1 1 2 10 0 0 1 0 0 0\ncpu1 0 0 0 0 0 0 0 0\nintr 5\n",
        );
        assert_eq!(before.len(), 2);
        assert_eq!(before[0].user, 2);
        let after = parse_proc_stat("cpu0 3 1 4 14 0 1 2 0\ncpu1 0 0 0 10 0 0 0 0\n");
        let s = cpu_shares(&before, &after);
        assert_eq!(s.len(), 2);
        assert!((s[0].user - 0.2).abs() < 1e-9);
        assert!((s[0].system - 0.2).abs() < 1e-9);
        assert!((s[0].softirq - 0.2).abs() < 1e-9);
        assert!((s[0].idle - 0.4).abs() < 1e-9);
        assert!((s[1].idle - 1.0).abs() < 1e-9);
    }
}
