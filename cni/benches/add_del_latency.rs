//! ADD and DEL latency of the built `brindle` binary, exec'd as a runtime
//! does (environment + config on stdin), with Debian's host-local as IPAM
//! and the stand-in node daemon of the tests. 200 pods, serial and 16-way
//! parallel; p50/p99 of the wall time of each exec.
//!
//! As root: `cargo bench -p brindle-cni --bench add_del_latency`.
//! The benchmark moves itself into a fresh network namespace first (the
//! "host" for the plugin), so the real host's interfaces are never touched.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brindle_cni::conflist::{ConflistParams, render};
use common::*;
use nix::sched::{CloneFlags, unshare};
use serde_json::{Map, Value};

const PODS: usize = 200;
const PARALLEL: usize = 16;

fn exec(inv: &Invocation, conf: &Value) -> Result<Duration> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let start = Instant::now();
    let mut child = Command::new(brindle())
        .env_clear()
        .env("CNI_COMMAND", &inv.command)
        .env("CNI_CONTAINERID", &inv.container_id)
        .env("CNI_NETNS", &inv.netns)
        .env("CNI_IFNAME", &inv.ifname)
        .env("CNI_PATH", &inv.cni_path)
        .env("CNI_ARGS", &inv.args)
        .env("BRINDLE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{} {} failed: {}",
        inv.command,
        inv.container_id,
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(took)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(label: &str, mut samples: Vec<Duration>, wall: Duration) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label:<22} n={:<4} p50={:>6.2} ms  p99={:>6.2} ms  max={:>6.2} ms  all in {:>6.2} s",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap()),
        wall.as_secs_f64(),
    );
}

/// Runs `command` for every pod with `workers` threads; returns each time.
fn run_all(
    command: &str,
    pods: &[Netns],
    workers: usize,
    cni_path: &str,
    conf: &Value,
) -> Result<Vec<Duration>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<Vec<Duration>> {
                    let mut times = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(pod) = pods.get(i) else {
                            return Ok(times);
                        };
                        let inv =
                            Invocation::new(command, &format!("bench{i}"), &pod.path(), cni_path);
                        times.push(exec(&inv, conf)?);
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??);
        }
        Ok(all)
    })
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    if !nix::unistd::Uid::effective().is_root() {
        println!("add_del_latency: needs root (network namespaces); skipped");
        return Ok(());
    }
    // Before any thread exists: this process becomes the plugin's "host".
    unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
    let daemon = StandInDaemon::start()?;
    let ipam_dir = tempfile::tempdir()?;
    let params = ConflistParams {
        cni_version: "1.0.0".into(),
        network_name: unique("bench"),
        mtu: 1450,
        ctrl_socket: daemon.path.display().to_string(),
        ipam: host_local(ipam_dir.path(), "10.250.0.0/23", None),
        // The figures in cni/README.md are veth pods'.
        interface_kind: brindle_cni::config::InterfaceKind::Veth,
        ..Default::default()
    };
    let conf = render(&params)?
        .plugin_conf(0, &Map::new(), None)
        .context("conf")?;
    let cni_path = "/usr/lib/cni".to_string();
    let pods: Vec<Netns> = (0..PODS)
        .map(|_| Netns::new("bcb"))
        .collect::<Result<_>>()?;

    println!("brindle ADD/DEL latency, {PODS} pods, host-local IPAM, stand-in daemon");
    for workers in [1, PARALLEL] {
        let start = Instant::now();
        let adds = run_all("ADD", &pods, workers, &cni_path, &conf)?;
        let add_wall = start.elapsed();
        let start = Instant::now();
        let dels = run_all("DEL", &pods, workers, &cni_path, &conf)?;
        let del_wall = start.elapsed();
        let mode = if workers == 1 {
            "serial".to_string()
        } else {
            format!("{workers}-way parallel")
        };
        report(&format!("ADD {mode}"), adds, add_wall);
        report(&format!("DEL {mode}"), dels, del_wall);
    }
    Ok(())
}
