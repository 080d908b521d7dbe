//! `brindle-vrouter run` with two workers (`--cpu 0,1`) over one shared
//! UMEM: an uplink with two receive queues (one socket each, queue 0 on
//! worker 0, queue 1 on worker 1) and two pods, one per worker. An outside
//! host behind the uplink pings both pods from both CPUs, and XPS sends
//! what CPU 0 transmits on queue 0 and what CPU 1 transmits on queue 1, so
//! both uplink queues carry frames for both pods: each worker must hand
//! frames for the other's pod over, and the pods' replies leave through
//! the uplink queue of the worker that owns the pod.
//!
//! The outside host sits in 10.67.0.0/24, routed to the uplink, so that
//! the pods' replies are steered to the vrouter (the steering program
//! passes pod traffic to other destinations to the node's kernel).
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use anyhow::{Context, Result};
use common::{Netns, Vrouter, counter, pod, tcp_exchange, unique};

/// Echo replies in `ping`'s output (with `-w`, ping sends until it has
/// its count of replies, so more requests than the count may go out).
fn replies(out: &str) -> usize {
    out.lines().filter(|l| l.contains("bytes from")).count()
}

/// The `worker N:` line of `lines`.
fn worker_line(lines: &[String], n: usize) -> Result<&str> {
    lines
        .iter()
        .find(|l| l.starts_with(&format!("worker {n}:")))
        .map(String::as_str)
        .with_context(|| format!("no line for worker {n} in {lines:?}"))
}

#[test]
#[ignore = "requires root and network namespaces"]
fn two_workers_share_a_two_queue_uplink_and_hand_frames_to_each_others_pods() -> Result<()> {
    two_workers("adaptive")
}

#[test]
#[ignore = "requires root and network namespaces"]
fn two_workers_with_interrupt_polling_wake_each_other_for_handed_frames() -> Result<()> {
    // Idle workers block in poll(2); a frame handed over must wake its
    // owner through the mailbox (or wait out the 100 ms poll timeout).
    two_workers("interrupt")
}

fn two_workers(polling: &str) -> Result<()> {
    let node = Netns::new("vn")?;
    let ext = Netns::new("vx")?;
    let (ha, hb, up) = (unique("ha"), unique("hb"), unique("up"));
    let (mac_a, mac_b, mac_ext) = (
        "02:b3:00:00:00:02",
        "02:b3:00:00:00:03",
        "02:b3:00:00:00:09",
    );
    let pod_a = pod(&node, &ha, "10.66.0.2", mac_a)?;
    let pod_b = pod(&node, &hb, "10.66.0.3", mac_b)?;
    // The uplink: two queues each way (veth's RSS is the sender's TX queue).
    node.ip(&[
        "link",
        "add",
        &up,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &ext.name,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
    ])?;
    node.ip(&["addr", "add", "192.168.90.1/24", "dev", &up])?;
    node.ip(&["link", "set", &up, "up"])?;
    ext.ip(&["link", "set", "eth0", "address", mac_ext])?;
    ext.ip(&["addr", "add", "192.168.90.2/24", "dev", "eth0"])?;
    ext.ip(&["link", "set", "eth0", "up"])?;
    // A NIC-like sender: full checksums on the wire (the pipeline completes
    // offloaded checksums only for frames from pods).
    ext.exec(&["ethtool", "-K", "eth0", "tx", "off"])?;
    // The outside host's address is in a prefix the vrouter routes to the
    // uplink (so the pods' steering program sends replies to it to the
    // vrouter, not to the node's kernel), and it talks to the pods from it.
    ext.ip(&["addr", "add", "10.67.0.2/32", "dev", "eth0"])?;
    ext.ip(&[
        "route",
        "add",
        "10.66.0.0/24",
        "via",
        "192.168.90.1",
        "src",
        "10.67.0.2",
    ])?;
    // XPS: CPU 0 transmits on queue 0, CPU 1 on queue 1.
    for (q, mask) in [(0, "1"), (1, "2")] {
        ext.exec(&[
            "sh",
            "-c",
            &format!("echo {mask} > /sys/class/net/eth0/queues/tx-{q}/xps_cpus"),
        ])?;
    }
    let args: Vec<String> = [
        "run",
        "--io",
        "xdp",
        "--cpu",
        "0,1",
        "--polling",
        polling,
        "--node",
        "192.168.90.1",
    ]
    .into_iter()
    .map(String::from)
    .chain([
        "--port".into(),
        format!("{up}=uplink"),
        "--port".into(),
        format!("{ha}=pod:10.66.0.2"),
        "--port".into(),
        format!("{hb}=pod:10.66.0.3"),
        "--route".into(),
        format!("10.67.0.0/24={up}"),
        "--neighbor".into(),
        format!("10.67.0.2={mac_ext}@{up}"),
        "--neighbor".into(),
        format!("10.66.0.2={mac_a}"),
        "--neighbor".into(),
        format!("10.66.0.3={mac_b}"),
    ])
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vrouter = Vrouter::start(&node, &args)?;
    assert!(
        vrouter.ready_line().contains("2 worker(s)"),
        "{}",
        vrouter.ready_line()
    );
    // Several flows from both CPUs to both pods: both queues, both workers.
    // Failures are collected and asserted after the vrouter stopped, with
    // its per-worker counters in the message. `-w 10`, not `-W`: with -c,
    // ping stops waiting 2 x the largest RTT after its last request, and
    // on this loaded 2-core machine a worker's wake-up is sometimes late
    // by more than that; the deadline waits for the replies instead.
    let mut failed = Vec::new();
    for cpu in ["0", "1"] {
        for dst in ["10.66.0.2", "10.66.0.3"] {
            let out = ext.exec(&[
                "taskset", "-c", cpu, "ping", "-c", "3", "-i", "0.2", "-w", "10", dst,
            ]);
            match out {
                Ok(out) if replies(&out) >= 3 && out.contains("ttl=63") => {}
                other => failed.push(format!("CPU {cpu} to {dst}: {other:?}")),
            }
        }
    }
    // Pod to pod across workers, and TCP both ways through the uplink.
    match pod_a.exec(&["ping", "-c", "2", "-i", "0.2", "-w", "10", "10.66.0.3"]) {
        Ok(out) if replies(&out) >= 2 => {}
        other => failed.push(format!("pod A to pod B: {other:?}")),
    }
    if let Err(e) = tcp_exchange(&pod_a, &ext, "10.66.0.2") {
        failed.push(format!("TCP outside -> pod A: {e:#}"));
    }
    if let Err(e) = tcp_exchange(&ext, &pod_b, "10.67.0.2") {
        failed.push(format!("TCP pod B -> outside: {e:#}"));
    }

    let lines = vrouter.stop_lines()?;
    assert!(failed.is_empty(), "{failed:#?}\n{}", lines.join("\n"));
    eprintln!("{}", lines.join("\n"));
    let (w0, w1) = (worker_line(&lines, 0)?, worker_line(&lines, 1)?);
    for w in [w0, w1] {
        // Each worker forwarded (its uplink queue and its pod), handed
        // frames to the other's pod, and lost none on the way.
        assert!(counter(w, "forwarded") >= 6, "{w}");
        assert!(counter(w, "handoff_out") >= 3, "{w}");
        assert!(counter(w, "handoff_in") >= 3, "{w}");
        assert_eq!(counter(w, "handoff_drops"), 0, "{w}");
    }
    // The uplink is as it was: no program left.
    let link = node.ip(&["link", "show", &up])?;
    assert!(!link.contains("xdp"), "{link}");
    drop((pod_a, pod_b));
    Ok(())
}
