//! Pod density (issue 17): N more pods on node 1 made by parallel ADDs
//! through the whole chain (as a runtime starting a node's pods at once),
//! each probed from a pod on node 2 and from a pod on node 1 with no
//! warm-up (the first packets count), the IPAM blocks node 1 claimed and
//! kept, the vrouter's idle cost with every pod in place, then parallel
//! DELs.

use std::fmt;
use std::fs;
use std::process::Stdio;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cni::{Pod, cni_add, cni_add_list, cni_del, cni_del_list};
use crate::exec::{finish, in_ns, ip};
use crate::{LabConfig, PREFIX, brindlectl_json, node_ns, scrape, state, worker_counters};

/// Probes run at once (each a `ping` in a pod): enough to keep the run
/// short, few enough to stay a light load.
const PROBERS: usize = 8;

/// What the density step measured.
#[derive(Debug, Clone, Default)]
pub struct DensityReport {
    pub pods: usize,
    /// Wall time of all ADDs, started at once.
    pub add: Duration,
    /// The slowest single ADD.
    pub add_slowest: Duration,
    pub add_failures: Vec<String>,
    pub distinct_addresses: usize,
    pub del: Duration,
    pub del_failures: Vec<String>,
    /// CPU time the ADDs and the DELs cost, by part.
    pub add_cpu: CpuSplit,
    pub del_cpu: CpuSplit,
    /// Pods that lost at least one of 3 pings (0.2 s apart) from a pod on
    /// node 2, and from a pod on node 1 (one ping): the first packets.
    pub remote_lossy: Vec<String>,
    pub local_lost: Vec<String>,
    /// Blocks with node 1's affinity before the ADDs, after them, and
    /// after the DELs.
    pub blocks_before: usize,
    pub blocks_claimed: usize,
    pub blocks_kept: usize,
    /// Node 1's vrouter with every pod in place and no traffic.
    pub idle_cpu_percent: f64,
    pub rss_kib: u64,
    pub fds: usize,
    pub ports: usize,
    /// The vrouter's drops by reason during the probes (`drop:<reason>`).
    pub probe_drops: Vec<(String, u64)>,
    /// Endpoints node 1 still lists after the DELs beyond those before.
    pub endpoints_left: usize,
    /// The kernel-only reference chain's batch in the same run, if asked
    /// (`LabConfig::density_reference`).
    pub reference: Option<Reference>,
}

/// The same parallel ADDs and DELs through Debian's bridge + host-local,
/// tuning, bandwidth, portmap in node 1's namespace.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    pub add: Duration,
    pub del: Duration,
    pub add_cpu: CpuSplit,
    pub del_cpu: CpuSplit,
    pub failures: Vec<String>,
}

impl DensityReport {
    /// Every pod made, reachable from both sides, deleted, nothing left.
    pub fn success(&self) -> bool {
        self.add_failures.is_empty()
            && self.del_failures.is_empty()
            && self.remote_lossy.is_empty()
            && self.local_lost.is_empty()
            && self.distinct_addresses == self.pods
            && self.endpoints_left == 0
    }
}

impl fmt::Display for DensityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.pods;
        writeln!(f, "| figure | {n} pods on node 1 |\n|---|---|")?;
        writeln!(
            f,
            "| {n} parallel ADDs, whole chain | {:.2} s (slowest {:.2} s), {} failures, {} distinct addresses |",
            self.add.as_secs_f64(),
            self.add_slowest.as_secs_f64(),
            self.add_failures.len(),
            self.distinct_addresses
        )?;
        writeln!(
            f,
            "| {n} parallel DELs | {:.2} s, {} failures, {} endpoints left |",
            self.del.as_secs_f64(),
            self.del_failures.len(),
            self.endpoints_left
        )?;
        writeln!(
            f,
            "| CPU per ADD: the runtime side (the lab's client, netns, every plugin), node 1's ctrl, vrouter, etcd; whole machine | {} |",
            self.add_cpu.per_pod(n)
        )?;
        writeln!(
            f,
            "| CPU per DEL: the same parts | {} |",
            self.del_cpu.per_pod(n)
        )?;
        writeln!(
            f,
            "| pods losing some of 3 pings from a pod on node 2 (0.2 s apart, no warm-up) | {} / {n} |",
            self.remote_lossy.len()
        )?;
        writeln!(
            f,
            "| pods not answering one ping from a pod on node 1 | {} / {n} |",
            self.local_lost.len()
        )?;
        let drops: Vec<String> = self
            .probe_drops
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(
            f,
            "| vrouter drops during the probes | {} |",
            if drops.is_empty() {
                "none".into()
            } else {
                drops.join(" ")
            }
        )?;
        writeln!(
            f,
            "| blocks with node 1's affinity: before, after the ADDs, after the DELs | {}, {}, {} |",
            self.blocks_before, self.blocks_claimed, self.blocks_kept
        )?;
        write!(
            f,
            "| vrouter idle with {} ports | {:.2} % of a core, {} MiB RSS, {} fds |",
            self.ports,
            self.idle_cpu_percent,
            self.rss_kib / 1024,
            self.fds
        )?;
        if let Some(r) = &self.reference {
            write!(
                f,
                "\n| reference chain (bridge + host-local, tuning, bandwidth, portmap), {n} parallel ADDs, DELs | {:.2} s, {:.2} s, {} failures |\n\
                 | reference CPU per ADD, per DEL: the runtime side (every plugin), whole machine | {:.1}, {:.1} ms; {:.1}, {:.1} ms |",
                r.add.as_secs_f64(),
                r.del.as_secs_f64(),
                r.failures.len(),
                per_pod(r.add_cpu.chain, n),
                per_pod(r.add_cpu.machine, n),
                per_pod(r.del_cpu.chain, n),
                per_pod(r.del_cpu.machine, n)
            )?;
        }
        Ok(())
    }
}

/// Adds `cfg.density` pods to node 1, probes, measures, deletes them.
/// Pods made are pushed on `pods` until deleted, so the lab's teardown
/// deletes them if a later part fails.
pub(crate) fn run(cfg: &LabConfig, pods: &mut Vec<Pod>) -> Result<DensityReport> {
    let n = usize::from(cfg.density);
    let remote = pods
        .iter()
        .find(|p| p.node == 2)
        .context("density needs a pod on node 2")?
        .name
        .clone();
    let local = pods
        .iter()
        .find(|p| p.node == 1)
        .context("density needs a pod on node 1")?
        .name
        .clone();
    let mut report = DensityReport {
        pods: n,
        blocks_before: node1_blocks(cfg)?,
        ..DensityReport::default()
    };
    let endpoints_before = brindlectl_json(cfg, 1, &["endpoints"])?.len();

    // Every ADD starts at once, as a runtime starting a node's pods does.
    let made = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());
    let slowest = Mutex::new(Duration::ZERO);
    let cpu = Cpu::sample();
    let start = Instant::now();
    thread::scope(|s| {
        for i in 1..=n {
            let (made, failures, slowest) = (&made, &failures, &slowest);
            s.spawn(move || {
                let name = format!("{PREFIX}n1d{i}");
                let t = Instant::now();
                match cni_add(1, &name) {
                    Ok(pod) => lock(made).push(pod),
                    Err(e) => lock(failures).push(format!("{name}: {e:#}")),
                }
                let took = t.elapsed();
                let mut m = lock(slowest);
                *m = (*m).max(took);
            });
        }
    });
    report.add = start.elapsed();
    report.add_cpu = Cpu::sample().since(&cpu);
    report.add_slowest = *lock(&slowest);
    report.add_failures = failures.into_inner().unwrap_or_default();
    let mut made = made.into_inner().unwrap_or_default();
    made.sort_by_key(|p| p.ip);
    let mut addrs: Vec<_> = made.iter().map(|p| p.ip).collect();
    addrs.dedup();
    report.distinct_addresses = addrs.len();
    let first = pods.len();
    pods.extend(made);
    report.blocks_claimed = node1_blocks(cfg)?;

    // The first packets: nothing has talked to these pods yet.
    let before = drops(1);
    let targets: Vec<(String, String)> = pods[first..]
        .iter()
        .map(|p| (p.name.clone(), p.ip.to_string()))
        .collect();
    report.remote_lossy = probe(&remote, &targets, 3);
    report.local_lost = probe(&local, &targets, 1);
    let after = drops(1);
    report.probe_drops = after
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.iter().find(|(b, _)| *b == k).map_or(0, |b| b.1));
            (d > 0).then_some((k, d))
        })
        .collect();

    idle(cfg, &mut report)?;

    let cpu = Cpu::sample();
    let start = Instant::now();
    let del_failures = Mutex::new(Vec::new());
    thread::scope(|s| {
        for pod in &pods[first..] {
            let del_failures = &del_failures;
            s.spawn(move || {
                if let Err(e) = cni_del(pod) {
                    lock(del_failures).push(format!("{}: {e:#}", pod.name));
                }
            });
        }
    });
    report.del = start.elapsed();
    report.del_cpu = Cpu::sample().since(&cpu);
    report.del_failures = del_failures.into_inner().unwrap_or_default();
    for pod in pods.drain(first..) {
        let _ = ip(&["netns", "del", &pod.name]);
    }
    report.blocks_kept = node1_blocks(cfg)?;
    report.endpoints_left = brindlectl_json(cfg, 1, &["endpoints"])?
        .len()
        .saturating_sub(endpoints_before);
    if cfg.density_reference {
        report.reference = Some(reference(n)?);
    }
    Ok(report)
}

/// `n` parallel ADDs, then DELs, through the kernel-only reference chain
/// in node 1's namespace (its own bridge and subnet, host-local's files
/// in the lab's state): what the same batch costs without Brindle.
fn reference(n: usize) -> Result<Reference> {
    let list: brindle_api::cni::NetConfList = serde_json::from_value(serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "brl-reference",
        "plugins": [
            {"type": "bridge", "bridge": "brlref0", "isGateway": true, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.251.0.0/16"}]],
                      "dataDir": state().join("reference-ipam")}},
            {"type": "tuning"},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    }))?;
    let made = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());
    let cpu = Cpu::sample();
    let start = Instant::now();
    thread::scope(|s| {
        for i in 1..=n {
            let (made, failures, list) = (&made, &failures, &list);
            s.spawn(move || {
                let name = format!("{PREFIX}n1r{i}");
                match cni_add_list(1, &name, ("lab", &name), list) {
                    Ok(pod) => lock(made).push(pod),
                    Err(e) => {
                        lock(failures).push(format!("{name}: {e:#}"));
                        let _ = ip(&["netns", "del", &name]);
                    }
                }
            });
        }
    });
    let mut r = Reference {
        add: start.elapsed(),
        add_cpu: Cpu::sample().since(&cpu),
        ..Reference::default()
    };
    let made = made.into_inner().unwrap_or_default();
    let cpu = Cpu::sample();
    let start = Instant::now();
    thread::scope(|s| {
        for pod in &made {
            let (failures, list) = (&failures, &list);
            s.spawn(move || {
                if let Err(e) = cni_del_list(pod, list) {
                    lock(failures).push(format!("{} DEL: {e:#}", pod.name));
                }
            });
        }
    });
    r.del = start.elapsed();
    r.del_cpu = Cpu::sample().since(&cpu);
    for pod in &made {
        let _ = ip(&["netns", "del", &pod.name]);
    }
    r.failures = failures.into_inner().unwrap_or_default();
    Ok(r)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Blocks whose affinity is node 1.
fn node1_blocks(cfg: &LabConfig) -> Result<usize> {
    let blocks = brindlectl_json(cfg, 1, &["ipam", "blocks"])?;
    let node = node_ns(1);
    Ok(blocks
        .iter()
        .filter(|b| b["affinity"].as_str() == Some(node.as_str()))
        .count())
}

/// The names of the targets that did not answer all `count` pings from
/// pod `from` (0.2 s apart), a few probes at a time.
fn probe(from: &str, targets: &[(String, String)], count: u32) -> Vec<String> {
    let next = Mutex::new(targets.iter());
    let lossy = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..PROBERS {
            s.spawn(|| {
                loop {
                    let Some((name, addr)) = lock(&next).next() else {
                        return;
                    };
                    let got = ping_received(from, addr, count);
                    if got < count {
                        lock(&lossy).push(format!("{name} ({addr}): {got}/{count}"));
                    }
                }
            });
        }
    });
    let mut out = lossy.into_inner().unwrap_or_default();
    out.sort();
    out
}

/// How many of `count` pings from pod `from` to `addr` were answered.
fn ping_received(from: &str, addr: &str, count: u32) -> u32 {
    let child = in_ns(from, "ping")
        .args(["-c", &count.to_string(), "-i", "0.2", "-W", "2", "-q", addr])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(out) = child
        .map_err(anyhow::Error::from)
        .and_then(|c| finish(c, "ping", Duration::from_secs(10 + u64::from(count))))
    else {
        return 0;
    };
    received(&out.stdout)
}

/// The `N received` of ping's summary.
fn received(summary: &str) -> u32 {
    summary
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" received")?.parse().ok())
        .unwrap_or(0)
}

/// Node `n`'s vrouter drop counters by reason.
fn drops(n: u8) -> Vec<(String, u64)> {
    scrape(n, 9092)
        .map(|t| {
            worker_counters(&t)
                .into_iter()
                .filter(|(k, _)| k.starts_with("drop:"))
                .collect()
        })
        .unwrap_or_default()
}

/// Node 1's vrouter, every pod in place, no traffic: CPU over
/// `cfg.density_idle_secs` (after as long to settle), RSS, open fds, ports.
fn idle(cfg: &LabConfig, report: &mut DensityReport) -> Result<()> {
    let pid: u32 = fs::read_to_string(state().join("n1-vrouter.pid"))?
        .trim()
        .parse()?;
    let secs = cfg.density_idle_secs.max(1);
    // Let the probes' last replies, the ADDs' programming and the new
    // pods' own start-up chatter (IPv6 router solicitations, DAD) settle:
    // as long as the sample.
    thread::sleep(Duration::from_secs(u64::from(secs)));
    let t0 = cpu_ticks(pid)?;
    let start = Instant::now();
    thread::sleep(Duration::from_secs(u64::from(secs)));
    let ticks = cpu_ticks(pid)? - t0;
    // USER_HZ is 100 on Linux.
    report.idle_cpu_percent = ticks as f64 / 100.0 / start.elapsed().as_secs_f64() * 100.0;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    report.rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    report.fds = fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    report.ports = brindlectl_json(cfg, 1, &["endpoints"])?.len() + 1;
    Ok(())
}

/// User plus system time of a process and its threads, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    stat_ticks(&format!("/proc/{pid}/stat"), 11)
}

/// The sum of a `/proc/<pid>/stat` file's two tick fields from index
/// `first` (counted from field 3): 11 is utime+stime, 13 the reaped
/// children's cutime+cstime.
fn stat_ticks(path: &str, first: usize) -> Result<u64> {
    let stat = fs::read_to_string(path)?;
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    match (f.get(first), f.get(first + 1)) {
        (Some(u), Some(s)) => Ok(u.parse::<u64>()? + s.parse::<u64>()?),
        _ => bail!("{path} too short"),
    }
}

/// Busy ticks of the whole machine (every CPU, all but idle and iowait).
fn machine_ticks() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().unwrap_or("");
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    Ok(f.iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum())
}

/// CPU ticks so far of the parts a pod's ADD or DEL runs in: the plugin
/// chain (the lab's runtime-side client, every plugin and the IPAM plugin
/// it execs, counted once reaped by this process), node 1's ctrl and vrouter, etcd,
/// and the whole machine (the other helpers' builds included).
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    chain: u64,
    ctrl: u64,
    vrouter: u64,
    etcd: u64,
    machine: u64,
}

impl Cpu {
    fn sample() -> Self {
        let daemon = |name: &str| {
            fs::read_to_string(state().join(format!("{name}.pid")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .and_then(|pid| cpu_ticks(pid).ok())
                .unwrap_or(0)
        };
        Cpu {
            chain: stat_ticks("/proc/self/stat", 13).unwrap_or(0),
            ctrl: daemon("n1-ctrl"),
            vrouter: daemon("n1-vrouter"),
            etcd: daemon("etcd"),
            machine: machine_ticks().unwrap_or(0),
        }
    }

    fn since(&self, before: &Cpu) -> CpuSplit {
        // USER_HZ is 100 on Linux.
        let secs = |a: u64, b: u64| Duration::from_millis(a.saturating_sub(b) * 10);
        CpuSplit {
            chain: secs(self.chain, before.chain),
            ctrl: secs(self.ctrl, before.ctrl),
            vrouter: secs(self.vrouter, before.vrouter),
            etcd: secs(self.etcd, before.etcd),
            machine: secs(self.machine, before.machine),
        }
    }
}

/// Milliseconds of `d` per pod of a batch of `pods`.
fn per_pod(d: Duration, pods: usize) -> f64 {
    d.as_secs_f64() * 1000.0 / pods.max(1) as f64
}

/// CPU time spent by each part over a batch of ADDs or DELs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSplit {
    pub chain: Duration,
    pub ctrl: Duration,
    pub vrouter: Duration,
    pub etcd: Duration,
    pub machine: Duration,
}

impl CpuSplit {
    /// Milliseconds of CPU per pod of a batch of `pods`.
    fn per_pod(&self, pods: usize) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0 / pods.max(1) as f64;
        format!(
            "{:.1}, {:.1}, {:.1}, {:.1}, {:.1} ms",
            ms(self.chain),
            ms(self.ctrl),
            ms(self.vrouter),
            ms(self.etcd),
            ms(self.machine)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_received_count_comes_from_pings_summary() {
        let out = "--- 10.0.0.1 ping statistics ---\n\
                   3 packets transmitted, 2 received, 33.3333% packet loss, time 402ms\n";
        assert_eq!(received(out), 2);
        let out = "1 packets transmitted, 1 received, +1 duplicates, 0% packet loss\n";
        assert_eq!(received(out), 1);
        assert_eq!(received("3 packets transmitted, 0 received, +3 errors"), 0);
        assert_eq!(received(""), 0);
    }
}
