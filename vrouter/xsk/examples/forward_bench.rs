//! A first throughput figure (needs root): 64-byte frames from an AF_XDP
//! generator in namespace A, forwarded in namespace F to namespace B, once
//! by the kernel's IPv4 forwarding and once by the test forwarder (shared
//! UMEM, descriptor hand-over, MAC and TTL rewrite), same topology, same run.
//! The rate is what arrives on B's veth (its rx_packets counter).
//!
//! `cargo run -p brindle-xsk --release --example forward_bench -- [seconds]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brindle_xsk::{
    Desc, Role, Steering, SteeringConfig, Umem, UmemConfig, XdpMode, XskConfig, XskSocket, ifindex,
};
use common::{Enter, Netns, mac, mac_str, udp_frame, veth};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

fn pin(cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

fn config() -> XskConfig {
    XskConfig {
        rx_size: 2048,
        tx_size: 2048,
        fill_size: 2048,
        comp_size: 2048,
        // One sendto() in copy mode sends at most this many frames (kernel
        // default 32): below the RX batch, the TX ring fills up and holds
        // the frames the fill ring needs.
        max_tx_skb_budget: std::env::var("TX_BUDGET")
            .ok()
            .and_then(|v| v.parse().ok())
            .or(Some(256)),
        ..XskConfig::default()
    }
}

/// Sends `frame` as fast as the TX ring takes it until `stop`; returns frames sent.
fn generate(mut umem: Umem, mut sock: XskSocket, frame: &[u8], stop: &AtomicBool) -> Result<u64> {
    pin(0)?;
    let mut free: Vec<u64> = (0..umem.frame_count())
        .map(|i| umem.frame_addr(i))
        .collect();
    for &addr in &free {
        umem.data_mut(Desc {
            addr,
            len: frame.len() as u32,
        })
        .context("frame")?
        .copy_from_slice(frame);
    }
    let mut batch = [Desc::default(); 64];
    let mut done = [0u64; 256];
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let n = sock.reap_completions(&mut done);
        free.extend_from_slice(&done[..n]);
        let m = free.len().min(batch.len());
        for (d, &addr) in batch.iter_mut().zip(&free[free.len() - m..]) {
            *d = Desc {
                addr,
                len: frame.len() as u32,
            };
        }
        let taken = sock.tx_burst(&batch[..m]);
        free.truncate(free.len() - taken);
        sent += taken as u64;
        sock.kick_tx()?;
    }
    Ok(sent)
}

fn rx_packets(ns: &Netns, dev: &str) -> Result<u64> {
    Ok(ns
        .exec(&[
            "cat",
            &format!("/sys/class/net/{dev}/statistics/rx_packets"),
        ])?
        .trim()
        .parse()?)
}

/// Runs the generator for `secs`; returns (offered, arrived) packets per second.
fn measure(ns_a: &Netns, ns_b: &Netns, frame: &[u8], secs: f64) -> Result<(f64, f64)> {
    let (umem, sock) = ns_a.enter(|| -> Result<_> {
        let umem = Umem::new(UmemConfig {
            frame_count: 2048,
            ..UmemConfig::default()
        })?;
        let sock = XskSocket::bind(&umem, ifindex("va")?, 0, &config())?;
        Ok((umem, sock))
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let gen_stop = stop.clone();
    let frame = frame.to_vec();
    let generator = std::thread::spawn(move || generate(umem, sock, &frame, &gen_stop));
    // Warm up, then count.
    std::thread::sleep(Duration::from_millis(500));
    let before = rx_packets(ns_b, "vb")?;
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let arrived = rx_packets(ns_b, "vb")? - before;
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let sent = generator.join().expect("generator panicked")?;
    Ok((sent as f64 / (elapsed + 0.5), arrived as f64 / elapsed))
}

fn main() -> Result<()> {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3.0);
    let ns_a = Netns::new("ba")?;
    let ns_f = Netns::new("bf")?;
    let ns_b = Netns::new("bb")?;
    veth(
        &ns_a,
        "va",
        mac(9, 1),
        Some("10.209.1.2/24"),
        &ns_f,
        "fa",
        mac(9, 2),
        Some("10.209.1.1/24"),
    )?;
    veth(
        &ns_b,
        "vb",
        mac(9, 3),
        Some("10.209.2.2/24"),
        &ns_f,
        "fb",
        mac(9, 4),
        Some("10.209.2.1/24"),
    )?;
    ns_f.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    ns_f.ip(&[
        "neigh",
        "add",
        "10.209.2.2",
        "lladdr",
        &mac_str(mac(9, 3)),
        "dev",
        "fb",
    ])?;
    // 60 bytes + FCS = a 64-byte frame on the wire.
    let frame = udp_frame(
        mac(9, 2),
        mac(9, 1),
        Ipv4Addr::new(10, 209, 1, 2),
        Ipv4Addr::new(10, 209, 2, 2),
        1234,
        9,
        &[0u8; 18],
    );
    assert_eq!(frame.len(), 60);

    let (offered_k, kernel) = measure(&ns_a, &ns_b, &frame, secs)?;

    let (umem, sock_a, sock_b, steering, att_a, att_b) = ns_f.enter(|| -> Result<_> {
        let umem = Umem::new(UmemConfig {
            frame_count: 4096,
            ..UmemConfig::default()
        })?;
        let (ia, ib) = (ifindex("fa")?, ifindex("fb")?);
        let sock_a = XskSocket::bind(&umem, ia, 0, &config())?;
        let sock_b = XskSocket::bind(&umem, ib, 0, &config())?;
        let steering = Steering::new(SteeringConfig::default())?;
        let att_a = steering.attach(ia, Role::All, XdpMode::Native)?;
        let att_b = steering.attach(ib, Role::All, XdpMode::Native)?;
        att_a.set_socket(&sock_a)?;
        att_b.set_socket(&sock_b)?;
        Ok((umem, sock_a, sock_b, steering, att_a, att_b))
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let fwd_stop = stop.clone();
    let forwarder = std::thread::spawn(move || -> Result<_> {
        pin(1)?;
        common::forward(
            umem,
            sock_a,
            sock_b,
            (mac(9, 1), mac(9, 2)),
            (mac(9, 3), mac(9, 4)),
            &fwd_stop,
        )
    });
    let (offered_x, xsk) = measure(&ns_a, &ns_b, &frame, secs)?;
    stop.store(true, Ordering::Relaxed);
    let (forwarded, stats) = forwarder.join().expect("forwarder panicked")?;
    drop((att_a, att_b, steering));

    println!("64-byte frames, {secs} s each, generator pinned to CPU 0");
    println!(
        "kernel IPv4 forwarding : offered {:.3} Mpps, arrived {:.3} Mpps",
        offered_k / 1e6,
        kernel / 1e6
    );
    println!(
        "AF_XDP test forwarder  : offered {:.3} Mpps, arrived {:.3} Mpps (forwarder on CPU 1, {forwarded} frames)",
        offered_x / 1e6,
        xsk / 1e6
    );
    println!("ratio AF_XDP / kernel  : {:.2}", xsk / kernel);
    println!("forwarder RX socket    : {:?}", stats[0]);
    Ok(())
}
