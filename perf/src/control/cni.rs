//! CNI ADD/DEL latency: a plugin exec'd exactly as a runtime execs it
//! (the `CNI_*` environment, the network config on stdin, the result on
//! stdout, `prevResult` on DEL), from a thread that has entered the node's
//! namespace (as containerd runs in the host's), for N pod namespaces,
//! serially and with P at once. The same harness runs brindle (through the
//! real node daemon and vrouter) and the reference `bridge` + `host-local`
//! plugins, the kernel path a simple cluster uses.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

use crate::topo::{self, Netns};

/// A pass/fail check of the harness's own bookkeeping.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind it.
    pub detail: String,
}

impl Check {
    /// A check named `name` that holds when `passed`.
    pub fn new(name: impl Into<String>, passed: bool, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            passed,
            detail: detail.into(),
        }
    }
}

/// Percentiles of one command's exec wall times.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Execs measured.
    pub count: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// Mean, ms.
    pub mean_ms: f64,
}

impl Latency {
    /// From exec times (recorded in microseconds in an HdrHistogram).
    pub fn of(samples: &[Duration]) -> Latency {
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
        for s in samples {
            let us = u64::try_from(s.as_micros()).unwrap_or(u64::MAX).max(1);
            h.saturating_record(us);
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
            mean_ms: h.mean() / 1000.0,
        }
    }
}

/// One plugin, one concurrency: ADD then DEL of every pod.
#[derive(Clone, Debug, Serialize)]
pub struct CniRun {
    /// `brindle` or `bridge+host-local`.
    pub plugin: String,
    /// Execs in flight at once (1 = serial).
    pub parallel: usize,
    /// Pods.
    pub pods: usize,
    /// ADD exec times.
    pub add: Latency,
    /// DEL exec times.
    pub del: Latency,
    /// Pods added per second (all ADDs' wall time).
    pub add_pods_per_s: f64,
    /// Pods deleted per second.
    pub del_pods_per_s: f64,
    /// The harness's checks (addresses in the pods, nothing left after DEL).
    pub checks: Vec<Check>,
}

/// How to exec a plugin.
pub struct Plugin {
    /// Label in the report.
    pub label: String,
    /// The binary.
    pub binary: PathBuf,
    /// `CNI_PATH` (where its IPAM plugin is).
    pub cni_path: String,
    /// The network config the runtime hands it (without `prevResult`).
    pub conf: Value,
}

/// A pod: its namespace and the ADD result.
pub struct Pod {
    /// The pod's namespace.
    pub ns: Netns,
    /// The container ID the runtime passes.
    pub container_id: String,
    /// What ADD returned (the DEL's `prevResult`).
    pub result: Option<Value>,
}

/// Execs `plugin` for `command` and one pod; its wall time and result.
fn exec(plugin: &Plugin, command: &str, pod: &Pod) -> Result<(Duration, Value)> {
    let mut conf = plugin.conf.clone();
    if command == "DEL"
        && let (Some(prev), Some(obj)) = (&pod.result, conf.as_object_mut())
    {
        obj.insert("prevResult".into(), prev.clone());
    }
    let stdin = conf.to_string();
    let start = Instant::now();
    let mut child = Command::new(&plugin.binary)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &pod.container_id)
        .env("CNI_NETNS", format!("/var/run/netns/{}", pod.ns.name))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &plugin.cni_path)
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=perf;K8S_POD_NAME={}",
                pod.ns.name
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("exec {}", plugin.binary.display()))?;
    child
        .stdin
        .take()
        .context("plugin stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} {command} {}: {}: {} {}",
            plugin.label,
            pod.container_id,
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let result = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).context("plugin result is not JSON")?
    };
    Ok((took, result))
}

/// Runs `command` for every pod with `parallel` threads inside `node_ns`;
/// the exec times and the wall time of the whole phase. ADD results are
/// stored in the pods.
pub fn phase(
    node_ns: &str,
    plugin: &Plugin,
    command: &str,
    pods: &mut [Pod],
    parallel: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Value>>> = pods.iter().map(|_| Mutex::new(None)).collect();
    let pods_ref: &[Pod] = pods;
    let start = Instant::now();
    let times = std::thread::scope(|s| -> Result<Vec<Duration>> {
        let workers: Vec<_> = (0..parallel.max(1))
            .map(|_| {
                s.spawn(|| -> Result<Vec<Duration>> {
                    // Children inherit this thread's namespace.
                    topo::enter(node_ns)?;
                    let mut times = Vec::new();
                    loop {
                        if topo::STOP.load(Ordering::Relaxed) {
                            bail!("interrupted");
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(pod) = pods_ref.get(i) else {
                            return Ok(times);
                        };
                        let (took, result) = exec(plugin, command, pod)?;
                        times.push(took);
                        *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut first_error = None;
        for w in workers {
            match w.join().map_err(|_| anyhow!("a CNI worker panicked"))? {
                Ok(t) => all.extend(t),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(all),
        }
    });
    let wall = start.elapsed();
    if command == "ADD" {
        for (pod, r) in pods.iter_mut().zip(results) {
            if let Some(v) = r.into_inner().unwrap_or_else(|e| e.into_inner()) {
                pod.result = Some(v);
            }
        }
    }
    Ok((times?, wall))
}

/// The IPv4 address of `ips[0]` in an ADD result.
pub fn result_address(result: &Value) -> Option<Ipv4Addr> {
    result["ips"][0]["address"]
        .as_str()?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// IPv4 addresses on `eth0` inside a pod.
fn pod_addresses(pod: &Netns) -> Vec<Ipv4Addr> {
    pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "inet")?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

/// After ADD: every pod holds on `eth0` the address its result gave, and
/// all addresses differ.
pub fn check_added(label: &str, pods: &[Pod]) -> Check {
    let mut bad = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for p in pods {
        let want = p.result.as_ref().and_then(result_address);
        let have = pod_addresses(&p.ns);
        match want {
            Some(a) if have.contains(&a) => {
                seen.insert(a);
            }
            _ => bad.push(format!("{}: result {want:?}, eth0 {have:?}", p.ns.name)),
        }
    }
    Check::new(
        format!("{label}: every pod has its address on eth0"),
        bad.is_empty() && seen.len() == pods.len(),
        if bad.is_empty() {
            format!("{} pods, {} distinct addresses", pods.len(), seen.len())
        } else {
            bad.into_iter().take(3).collect::<Vec<_>>().join("; ")
        },
    )
}

/// After DEL: no pod has an `eth0`, and the node has no veth but `keep`.
pub fn check_deleted(label: &str, node: &Netns, keep: &[&str], pods: &[Pod]) -> Vec<Check> {
    let with_eth0: Vec<&str> = pods
        .iter()
        .filter(|p| p.ns.ip(&["link", "show", "dev", "eth0"]).is_ok())
        .map(|p| p.ns.name.as_str())
        .collect();
    let veths: Vec<String> = node
        .ip(&["-o", "link", "show", "type", "veth"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let name = l.split(':').nth(1)?.trim();
            Some(name.split('@').next()?.to_owned())
        })
        .filter(|n| !keep.contains(&n.as_str()))
        .collect();
    vec![
        Check::new(
            format!("{label}: DEL removed every pod's eth0"),
            with_eth0.is_empty(),
            format!(
                "{} pods still with eth0 {:?}",
                with_eth0.len(),
                &with_eth0[..with_eth0.len().min(3)]
            ),
        ),
        Check::new(
            format!("{label}: DEL left no host veth"),
            veths.is_empty(),
            format!("{} left {:?}", veths.len(), &veths[..veths.len().min(3)]),
        ),
    ]
}

/// Files host-local still holds (one per allocated address) in `dir`.
pub fn host_local_allocations(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<Ipv4Addr>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

/// The config of the anchor: the reference `bridge` plugin with
/// `host-local` IPAM keeping its state in `data_dir`.
pub fn bridge_conf(network: &str, data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": network,
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "ipMasq": false,
        "mtu": 1480,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.250.0.0/16"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": data_dir.display().to_string()
        }
    })
}

/// Makes `n` pod namespaces.
pub fn make_pods(n: usize, round: usize) -> Result<Vec<Pod>> {
    (0..n)
        .map(|i| {
            let ns = Netns::new("p")?;
            Ok(Pod {
                container_id: format!("perf{}r{round}p{i}", std::process::id()),
                ns,
                result: None,
            })
        })
        .collect()
}
