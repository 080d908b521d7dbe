//! Many idle TAP pods through `brindle-vrouter serve` (issue 17): a worker
//! reads only the TAP queues that have frames. Each idle pod's queue sits
//! in the worker's epoll set, not read; a frame wakes its queue alone,
//! which is read until empty and parked again. Asserted on the ports' own
//! read counters: a TAP port is read at most once more than its frames per
//! wake-up, so never more than twice its frames, whatever the timing (was:
//! every queue read on every loop, thousands of reads for an idle pod). The
//! first ping to each idle pod is answered (a parked queue wakes). And
//! frames a pod sends on its own that the vrouter only consumes (router
//! solicitations, MLD reports) do not set the workers spinning: asserted
//! on the workers' poll counters.
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::Result;
use brindle_api::vrouter::{Changed, PortSpec, Route, RouteTarget, VrouterRequest};
use common::{Netns, in_netns, serve, tap_pod, tap_port, unique};

/// Pods on the node: enough that reading every queue each loop shows.
const PODS: usize = 16;

const METRICS: &str = "127.0.0.1:9092";

fn metrics(node: &Netns) -> Result<String> {
    in_netns(node, || -> Result<String> {
        let mut s = TcpStream::connect(METRICS)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("metrics thread panicked"))?
}

/// The sum of the series `brindle_vrouter_<series>` over the lines for
/// port `port`.
fn port_sum(metrics: &str, series: &str, port: &str) -> u64 {
    let prefix = format!("brindle_vrouter_{series}{{");
    let label = format!("port=\"{port}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Every port's (reads, frames received); each must have been read at
/// most twice per frame (a burst reads until the queue is empty: its
/// frames and one `EAGAIN`).
fn check_reads(m: &str, names: &[String]) -> Vec<(u64, u64)> {
    let got: Vec<(u64, u64)> = names
        .iter()
        .map(|n| {
            (
                port_sum(m, "port_tap_rx_reads_total", n),
                port_sum(m, "port_rx_packets_total", n),
            )
        })
        .collect();
    for (name, (reads, frames)) in names.iter().zip(&got) {
        assert!(
            reads <= &(2 * frames),
            "{name}: {reads} reads for {frames} frames (every port's: {got:?})"
        );
    }
    got
}

/// The sum of the series `brindle_vrouter_<series>` over every line.
fn sum(metrics: &str, series: &str) -> u64 {
    let prefix = format!("brindle_vrouter_{series}{{");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Router solicitations sent by the pod's eth0 through a packet socket
/// (what its kernel sends on its own with IPv6 on, from fe80::1 to
/// ff02::2, checksum right), `count` of them `gap_ms` apart.
const SEND_SOLICITATIONS: &str = r#"
import socket, struct, sys, time
count, gap = int(sys.argv[1]), int(sys.argv[2]) / 1000
mac = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
src = bytes.fromhex("fe80" + "00" * 13 + "01")
dst = bytes.fromhex("ff02" + "00" * 13 + "02")
icmp = bytearray(struct.pack("!BBHI", 133, 0, 0, 0))
pseudo = src + dst + struct.pack("!I3xB", len(icmp), 58) + icmp
total = sum(struct.unpack("!%dH" % (len(pseudo) // 2), pseudo))
while total >> 16:
    total = (total & 0xFFFF) + (total >> 16)
struct.pack_into("!H", icmp, 2, ~total & 0xFFFF)
ip = struct.pack("!IHBB", 0x60000000, len(icmp), 58, 255) + src + dst
frame = bytes.fromhex("333300000002") + mac + bytes.fromhex("86dd") + ip + bytes(icmp)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
for _ in range(count):
    s.send(frame)
    time.sleep(gap)
"#;

#[test]
#[ignore = "requires root and network namespaces"]
fn frames_only_consumed_do_not_keep_the_workers_spinning() -> Result<()> {
    const FRAMES: u64 = 50;
    let node = Netns::new("tc")?;
    let pod = tap_pod("10.66.10.2", "02:b4:00:00:0a:02")?;
    pod.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
    pod.exec(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"])?;
    let name = unique("tc");
    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS])?;
    let n: Changed = c.call(&VrouterRequest::AddPorts {
        ports: vec![tap_port(&name, &pod, "10.66.10.2")],
    })?;
    assert_eq!(n.changed, 1);
    // The workers settle into blocking (64 sleeps, ~60 ms, after the
    // attach's own polls).
    std::thread::sleep(Duration::from_millis(500));
    let before = metrics(&node)?;
    let gap = "20";
    pod.exec(&[
        "python3",
        "-c",
        SEND_SOLICITATIONS,
        &FRAMES.to_string(),
        gap,
    ])?;
    let after = metrics(&node)?;
    let received = port_sum(&after, "port_rx_packets_total", &name)
        - port_sum(&before, "port_rx_packets_total", &name);
    assert_eq!(received, FRAMES, "solicitations read from the pod's TAP");
    let sent = sum(&after, "worker_tx_packets_total") - sum(&before, "worker_tx_packets_total");
    assert_eq!(sent, 0, "a solicitation is not answered");
    let polls = |m: &str| sum(m, "worker_busy_polls_total") + sum(m, "worker_idle_polls_total");
    let polled = polls(&after) - polls(&before);
    eprintln!("{polled} polls for {received} consumed frames");
    // Spinning after each (1,024 polls, then 64 sleeps) would be over
    // 51,000 polls; blocking, each frame costs a poll or two, and each
    // worker wakes every 100 ms (about 1.5 s here).
    assert!(
        polled < FRAMES * 64,
        "{polled} polls for {FRAMES} consumed frames {gap} ms apart"
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn idle_tap_queues_are_not_read_and_a_first_ping_wakes_its_queue() -> Result<()> {
    let node = Netns::new("ti")?;
    let addr = |i: usize| format!("10.66.9.{}", i + 2);
    let pods = (0..PODS)
        .map(|i| tap_pod(&addr(i), &format!("02:b4:00:00:09:{:02x}", i + 2)))
        .collect::<Result<Vec<_>>>()?;
    // The pods send nothing of their own (no IPv6 router solicitations,
    // DAD, MLD), so every frame counted is the test's and the counters
    // read between pings are still.
    for pod in &pods {
        pod.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
        pod.exec(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"])?;
    }
    let names: Vec<String> = (0..PODS).map(|_| unique("ti")).collect();
    let ports: Vec<PortSpec> = names
        .iter()
        .zip(&pods)
        .enumerate()
        .map(|(i, (name, pod))| tap_port(name, pod, &addr(i)))
        .collect();
    let routes: Vec<Route> = names
        .iter()
        .enumerate()
        .map(|(i, name)| Route {
            prefix: format!("{}/32", addr(i)).parse().unwrap(),
            target: RouteTarget::Local { port: name.clone() },
        })
        .collect();
    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS])?;
    let n: Changed = c.call(&VrouterRequest::AddPorts { ports })?;
    assert_eq!(n.changed, PODS as u64);
    let n: Changed = c.call(&VrouterRequest::AddRoutes { routes })?;
    assert_eq!(n.changed, PODS as u64);

    // Two pods talk; the others stay idle while the workers spin and
    // back off around that traffic.
    let out = pods[0].exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &addr(1)])?;
    assert!(out.contains("3 received"), "{out}");
    let m = metrics(&node)?;
    let got = check_reads(&m, &names);
    assert!(got[0].0 > 0 && got[1].0 > 0, "the talking pods: {got:?}");

    // The first ping to every idle pod is answered: its queue wakes.
    for i in 2..PODS {
        let out = pods[0].exec(&["ping", "-c", "1", "-W", "2", &addr(i)])?;
        assert!(out.contains("1 received"), "pod {i}: {out}");
    }
    let m = metrics(&node)?;
    let got = check_reads(&m, &names);
    assert!(got.iter().all(|&(reads, _)| reads > 0), "{got:?}");
    drop(c);
    vrouter.stop()?;
    Ok(())
}
