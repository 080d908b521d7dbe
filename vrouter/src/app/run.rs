//! `brindle-vrouter run`: the static appliance mode. Its flags become the
//! same requests the controller sends `serve` ([`RunConfig::requests`]),
//! applied to the same [`Control`] over one worker per core of `--cpu` (one
//! unpinned worker without it); then it forwards until SIGINT or SIGTERM,
//! stops cleanly and prints the counters.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::neighbors;
use super::signals::stop_on_signals;
use super::spec::RunConfig;
use crate::control::{Control, Daemon};
use crate::counters::{Counters, DropReason};
use crate::engine::{Dataplane, WorkerSnapshot};

/// The whole static mode: start the workers, program them, poll until a
/// signal, stop cleanly (ports release their frames, programs detach,
/// sockets close), and print the counters: the sum, then one line per
/// worker with its hand-off counts.
pub fn run(cfg: &RunConfig) -> anyhow::Result<()> {
    if cfg.ports.is_empty() {
        bail!("no ports: give at least one --port");
    }
    let requests = cfg.requests()?;
    let stop = stop_on_signals()?;
    let dataplane = Dataplane::open(&cfg.engine(), &cfg.pipeline(), &stop)?;
    let mut control: Daemon = Control::new(dataplane, cfg.pipeline());
    for request in requests {
        if let Err(e) = control.handle(request) {
            control.shutdown();
            bail!("{}", e.message);
        }
    }
    let names: Vec<&str> = cfg.ports.iter().map(|p| p.name.as_str()).collect();
    println!(
        "running: {} port(s) [{}], {} route(s), polling {:?}, {} worker(s) on cores {:?}",
        names.len(),
        names.join(", "),
        control.routes(),
        cfg.polling,
        control.effects().worker_count(),
        cfg.cores
    );
    let control = Arc::new(Mutex::new(control));
    let learner = neighbors::spawn_learner(control.clone(), stop.clone())
        .context("start the neighbour learner")?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = learner.join();
    let started = Instant::now();
    let snaps = control.lock().unwrap_or_else(|e| e.into_inner()).shutdown();
    tracing::info!(ms = started.elapsed().as_millis() as u64, "workers stopped");
    println!("stopped: {}", format_counters(&sum_counters(&snaps)));
    for (i, s) in snaps.iter().enumerate() {
        let line = worker_line(i, s);
        // Also on stderr, for harnesses that keep only the first stdout line.
        tracing::info!("{line}");
        println!("{line}");
    }
    Ok(())
}

fn worker_line(i: usize, s: &WorkerSnapshot) -> String {
    format!(
        "worker {i}: {} busy_polls={} idle_polls={} handoff_out={} handoff_in={} handoff_drops={} cpu_user_ms={} cpu_system_ms={}",
        format_counters(&s.counters),
        s.busy_polls,
        s.idle_polls,
        s.handoff.out,
        s.handoff.r#in,
        s.handoff.drops,
        s.cpu_user_us / 1000,
        s.cpu_system_us / 1000
    )
}

/// The counters of several workers added up.
pub fn sum_counters(snaps: &[WorkerSnapshot]) -> Counters {
    let mut t = Counters::default();
    for s in snaps {
        let c = &s.counters;
        t.rx_packets += c.rx_packets;
        t.rx_bytes += c.rx_bytes;
        t.tx_packets += c.tx_packets;
        t.tx_bytes += c.tx_bytes;
        t.forwarded += c.forwarded;
        t.arp_replies += c.arp_replies;
        t.nd_adverts += c.nd_adverts;
        t.arp_requests += c.arp_requests;
        t.arp_learned += c.arp_learned;
        t.icmp_generated += c.icmp_generated;
        t.encap_ipip += c.encap_ipip;
        t.encap_vxlan += c.encap_vxlan;
        t.decap_ipip += c.decap_ipip;
        t.decap_vxlan += c.decap_vxlan;
        t.generated += c.generated;
        t.consumed += c.consumed;
        t.neighbor_held += c.neighbor_held;
        t.neighbor_released += c.neighbor_released;
        t.super_whole += c.super_whole;
        t.super_cut += c.super_cut;
        t.gro_super += c.gro_super;
        t.gro_segments += c.gro_segments;
        for (sum, d) in t.drops.iter_mut().zip(c.drops) {
            *sum += d;
        }
    }
    t
}

/// Formats the counters as `key=value` pairs, non-zero drops by reason.
pub fn format_counters(c: &Counters) -> String {
    let mut s = format!(
        "rx_packets={} rx_bytes={} tx_packets={} tx_bytes={} forwarded={} arp_replies={} icmp_generated={} encap_ipip={} encap_vxlan={} decap_ipip={} decap_vxlan={}",
        c.rx_packets,
        c.rx_bytes,
        c.tx_packets,
        c.tx_bytes,
        c.forwarded,
        c.arp_replies,
        c.icmp_generated,
        c.encap_ipip,
        c.encap_vxlan,
        c.decap_ipip,
        c.decap_vxlan
    );
    for (k, v) in [
        ("super_whole", c.super_whole),
        ("super_cut", c.super_cut),
        ("gro_super", c.gro_super),
        ("gro_segments", c.gro_segments),
    ] {
        if v > 0 {
            s.push_str(&format!(" {k}={v}"));
        }
    }
    for r in DropReason::ALL {
        let n = c.drops_for(r);
        if n > 0 {
            s.push_str(&format!(" drop_{}={n}", r.name()));
        }
    }
    s
}
