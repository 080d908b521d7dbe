//! The live-frames generator's own ceiling (needs root): 64-byte frames
//! from namespace G into a veth whose peer in namespace S takes them with
//! GRO (NAPI) and drops them in the kernel (no listener). It prints the
//! rate the program ran at, what reached the peer (its rx_packets), and
//! what the veth refused because the peer's ring was full.
//!
//! `cargo run -p brindle-xsk --release --example live_bench -- [seconds] [pps, 0 = max] [threaded]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brindle_xsk::{LiveFrameConfig, LiveFrameGenerator, ifindex};
use common::{Enter, Netns, mac, udp_frame, veth};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

fn stat(ns: &Netns, dev: &str, name: &str) -> u64 {
    ns.exec(&["ethtool", "-S", dev])
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k.trim() == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

fn rx_packets(ns: &Netns, dev: &str) -> u64 {
    ns.exec(&[
        "cat",
        &format!("/sys/class/net/{dev}/statistics/rx_packets"),
    ])
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(Ok(2.0), |s| s.parse())?;
    let pps: f64 = args.next().map_or(Ok(0.0), |s| s.parse())?;
    let threaded = args.next().is_some_and(|s| s == "threaded");
    let ns_g = Netns::new("bg")?;
    let ns_s = Netns::new("bs")?;
    veth(&ns_g, "g0", mac(5, 1), None, &ns_s, "s0", mac(5, 2), None)?;
    ns_s.exec(&["ethtool", "-K", "s0", "gro", "on"])?;
    if threaded {
        ns_s.exec(&["sh", "-c", "echo 1 > /sys/class/net/s0/threaded"])?;
    }
    let frame = udp_frame(
        mac(5, 2),
        mac(5, 1),
        Ipv4Addr::new(10, 209, 0, 1),
        Ipv4Addr::new(10, 209, 0, 2),
        4000,
        9,
        &[0u8; 18],
    );
    let (ran, elapsed) = ns_g.enter(|| -> Result<(u64, Duration)> {
        let mut set = CpuSet::new();
        set.set(0)?;
        sched_setaffinity(Pid::from_raw(0), &set)?;
        let mut generator = LiveFrameGenerator::new(
            &frame,
            LiveFrameConfig {
                egress_ifindex: ifindex("g0")?,
                ingress_ifindex: 0,
                rx_queue: 0,
                batch_size: 64,
                seq_offset: Some(42),
                timestamp_offset: Some(50),
                flows: None,
            },
        )
        .context("load the generator")?;
        generator.set_rate((pps > 0.0).then_some(pps), 64)?;
        let start = Instant::now();
        let sent = generator.send_for(Duration::from_secs_f64(seconds), &|| false)?;
        Ok((sent, start.elapsed()))
    })?;
    std::thread::sleep(Duration::from_millis(200));
    let secs = elapsed.as_secs_f64();
    println!(
        "sent {ran} frames in {secs:.2} s: {:.2} Mpps (target {}, peer NAPI {})",
        ran as f64 / secs / 1e6,
        if pps > 0.0 {
            format!("{pps} pps")
        } else {
            "max".into()
        },
        if threaded {
            "threaded"
        } else {
            "in the sender's softirq"
        }
    );
    println!(
        "peer rx_packets {}, refused by the veth (xdp_xmit_errors) {}",
        rx_packets(&ns_s, "s0"),
        stat(&ns_g, "g0", "tx_queue_0_xdp_xmit_errors")
    );
    Ok(())
}
