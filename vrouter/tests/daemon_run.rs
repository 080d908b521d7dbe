//! `brindle-vrouter run` between real namespaces: two Calico-shaped pods
//! (a /32 on eth0, default via 169.254.1.1) whose veths end in a "node"
//! namespace where the vrouter forwards between them, over AF_XDP and over
//! the forced AF_PACKET fallback. A real `ping` must get its replies, and
//! the vrouter's counters must show it did the work.
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use anyhow::Result;
use common::{Netns, Vrouter, counter, pod_with_queues, unique};

fn pod_to_pod_ping(io: &str, polling: &str, queues: u32) -> Result<()> {
    let node = Netns::new("vn")?;
    let (ha, hb) = (unique("ha"), unique("hb"));
    let (mac_a, mac_b) = ("02:b2:00:00:00:02", "02:b2:00:00:00:03");
    let pod_a = pod_with_queues(&node, &ha, "10.65.0.2", mac_a, queues)?;
    let pod_b = pod_with_queues(&node, &hb, "10.65.0.3", mac_b, queues)?;
    let vrouter = Vrouter::start(
        &node,
        &[
            "run",
            "--io",
            io,
            "--polling",
            polling,
            "--node",
            "192.168.0.1",
            "--port",
            &format!("{ha}=pod:10.65.0.2"),
            "--port",
            &format!("{hb}=pod:10.65.0.3"),
            "--neighbor",
            &format!("10.65.0.3={mac_b}"),
        ],
    )?;
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.65.0.3"])?;
    assert!(
        out.contains("3 received"),
        "ping from pod A to pod B through {io}: {out}"
    );
    // The reply's TTL shows one routed hop (64 - 1).
    assert!(out.contains("ttl=63"), "{out}");
    // Pod B learned the gateway MAC by proxy ARP.
    let neigh = pod_b.ip(&["neigh", "show", "169.254.1.1"])?;
    assert!(neigh.contains("ee:ee:ee:ee:ee:ee"), "{neigh}");
    let counters = vrouter.stop()?;
    assert!(counter(&counters, "forwarded") >= 6, "{counters}");
    assert!(counter(&counters, "arp_replies") >= 2, "{counters}");
    // The program is detached on stop: the interface is as it was.
    let link = node.ip(&["link", "show", &ha])?;
    assert!(!link.contains("xdp"), "{link}");
    drop(pod_b);
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_to_pod_ping_through_af_xdp_ports() -> Result<()> {
    pod_to_pod_ping("xdp", "adaptive", 1)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_to_pod_ping_through_af_xdp_ports_with_interrupt_polling() -> Result<()> {
    // The pings are 200 ms apart: every one arrives at a worker blocked in
    // poll(2), so each is a wake-up.
    pod_to_pod_ping("xdp", "interrupt", 1)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_to_pod_ping_through_af_xdp_ports_on_a_non_zero_queue() -> Result<()> {
    // Four queues per veth, each pod transmitting on queue 3 only: the
    // frames arrive on the host ends' queue 3, which only a socket bound to
    // that queue receives (a queue without a socket passes to the kernel,
    // which does not forward here).
    pod_to_pod_ping("xdp", "interrupt", 4)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_to_pod_ping_through_forced_af_packet_ports() -> Result<()> {
    pod_to_pod_ping("packet", "interrupt", 1)
}

/// `run` with a UMEM larger than RLIMIT_MEMLOCK (8 MiB here), in a process
/// without CAP_IPC_LOCK: forced AF_XDP fails with an error naming the
/// limit; `auto` falls back to AF_PACKET with a log line saying why, and
/// runs.
#[test]
#[ignore = "requires root and network namespaces"]
fn umem_over_memlock_fails_naming_the_limit_or_falls_back_to_af_packet() -> Result<()> {
    let node = Netns::new("vn")?;
    let (a, b) = (unique("ma"), unique("mb"));
    node.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
    node.ip(&["link", "set", &a, "up"])?;
    node.ip(&["link", "set", &b, "up"])?;
    let bin = env!("CARGO_BIN_EXE_brindle-vrouter");
    let run = |io: &str| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &node.name, "timeout", "-s", "TERM", "3"])
            .args([
                "setpriv",
                "--bounding-set",
                "-ipc_lock",
                bin,
                "run",
                "--io",
                io,
            ])
            .args(["--umem-frames", "32768", "--port", &a, "--port", &b])
            .output()
    };
    let forced = run("xdp")?;
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(!forced.status.success(), "{stderr}");
    assert!(stderr.contains("RLIMIT_MEMLOCK"), "{stderr}");
    let auto = run("auto")?;
    let stdout = String::from_utf8_lossy(&auto.stdout);
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(
        stdout.contains("running:") && stdout.contains("stopped:"),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("falling back to AF_PACKET"), "{stderr}");
    assert!(
        stderr.contains("RLIMIT_MEMLOCK"),
        "the log line says why: {stderr}"
    );
    Ok(())
}

/// The pipeline's refusals, over real AF_XDP sockets: a spoofed source is
/// dropped and counted, a TTL of 1 gets "time exceeded" from the node
/// address, and a DF packet larger than the egress port's MTU gets
/// "fragmentation needed" with that MTU.
#[test]
#[ignore = "requires root and network namespaces"]
fn spoofing_ttl_and_mtu_are_enforced_through_af_xdp_ports() -> Result<()> {
    let node = Netns::new("vn")?;
    let (ha, hb) = (unique("ha"), unique("hb"));
    let (mac_a, mac_b) = ("02:b7:00:00:00:02", "02:b7:00:00:00:03");
    let pod_a = pod_with_queues(&node, &ha, "10.69.0.2", mac_a, 1)?;
    let _pod_b = pod_with_queues(&node, &hb, "10.69.0.3", mac_b, 1)?;
    // Pod B's side of the vrouter carries at most 1400-byte packets.
    node.ip(&["link", "set", &hb, "mtu", "1400"])?;
    // An address pod A is not allowed to use.
    pod_a.ip(&["addr", "add", "10.69.9.9/32", "dev", "eth0"])?;
    let vrouter = Vrouter::start(
        &node,
        &[
            "run",
            "--io",
            "xdp",
            "--node",
            "192.168.0.1",
            "--port",
            &format!("{ha}=pod:10.69.0.2"),
            "--port",
            &format!("{hb}=pod:10.69.0.3"),
            "--neighbor",
            &format!("10.69.0.3={mac_b}"),
        ],
    )?;
    let spoofed = pod_a.exec(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "1",
        "-I",
        "10.69.9.9",
        "10.69.0.3",
    ]);
    assert!(
        spoofed.is_err(),
        "a spoofed source must not get through: {spoofed:?}"
    );
    let ttl = pod_a.exec(&["ping", "-c", "1", "-W", "2", "-t", "1", "10.69.0.3"]);
    let ttl = format!("{ttl:?}");
    assert!(
        ttl.contains("From 192.168.0.1") && ttl.contains("Time to live exceeded"),
        "{ttl}"
    );
    let big = pod_a.exec(&[
        "ping",
        "-c",
        "1",
        "-W",
        "2",
        "-M",
        "do",
        "-s",
        "1450",
        "10.69.0.3",
    ]);
    let big = format!("{big:?}");
    assert!(big.contains("mtu = 1400"), "{big}");
    let ok = pod_a.exec(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "2",
        "-s",
        "1300",
        "10.69.0.3",
    ])?;
    assert!(ok.contains("2 received"), "{ok}");
    let c = vrouter.stop()?;
    assert!(counter(&c, "drop_spoofed") >= 2, "{c}");
    // The expired and the oversized packet each became an ICMP error.
    assert!(counter(&c, "icmp_generated") >= 2, "{c}");
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_to_pod_ping_through_af_xdp_ports_with_preferred_busy_polling() -> Result<()> {
    let node = Netns::new("vn")?;
    let (ha, hb) = (unique("ha"), unique("hb"));
    let (mac_a, mac_b) = ("02:b2:00:00:01:02", "02:b2:00:00:01:03");
    let pod_a = pod_with_queues(&node, &ha, "10.65.1.2", mac_a, 1)?;
    let _pod_b = pod_with_queues(&node, &hb, "10.65.1.3", mac_b, 1)?;
    let napi = |knob: &str| -> Result<String> {
        Ok(node
            .exec(&["cat", &format!("/sys/class/net/{ha}/{knob}")])?
            .trim()
            .to_owned())
    };
    assert_eq!(napi("napi_defer_hard_irqs")?, "0");
    let vrouter = Vrouter::start(
        &node,
        &[
            "run",
            "--io",
            "xdp",
            "--polling",
            "busy-poll",
            "--port",
            &format!("{ha}=pod:10.65.1.2"),
            "--port",
            &format!("{hb}=pod:10.65.1.3"),
            "--neighbor",
            &format!("10.65.1.3={mac_b}"),
        ],
    )?;
    // Busy polling takes over the queue only with NAPI deferral on: the
    // port sets it while it runs.
    assert_eq!(napi("napi_defer_hard_irqs")?, "2");
    assert_eq!(napi("gro_flush_timeout")?, "200000");
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.65.1.3"])?;
    assert!(out.contains("3 received"), "{out}");
    let counters = vrouter.stop()?;
    assert!(counter(&counters, "forwarded") >= 6, "{counters}");
    // ... and puts the interface back as it was.
    assert_eq!(napi("napi_defer_hard_irqs")?, "0");
    assert_eq!(napi("gro_flush_timeout")?, "0");
    Ok(())
}
