//! Many idle TAP pods through `brindle-vrouter serve` (issue 17): a worker
//! reads only the TAP queues that have frames. Each idle pod's queue sits
//! in the worker's epoll set, not read; a frame wakes its queue alone,
//! which is read until empty and parked again. Asserted on the ports' own
//! read counters: a TAP port is read at most once more than its frames per
//! wake-up, so never more than twice its frames, whatever the timing (was:
//! every queue read on every loop, thousands of reads for an idle pod). The
//! first ping to each idle pod is answered (a parked queue wakes).
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result};
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::vrouter::{
    Changed, Hello, PortDevice, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
};
use common::{Netns, Vrouter, in_netns, tap_pod, unique};

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
        .map(|(i, (name, pod))| PortSpec {
            name: name.clone(),
            kind: PortKind::Pod,
            addresses: vec![addr(i).parse().unwrap()],
            peer_mac: None,
            endpoint: None,
            device: PortDevice::Tap {
                netns: Some(pod.path()),
                ifname: "eth0".into(),
                queues: 1,
            },
            workload: None,
        })
        .collect();
    let routes: Vec<Route> = names
        .iter()
        .enumerate()
        .map(|(i, name)| Route {
            prefix: format!("{}/32", addr(i)).parse().unwrap(),
            target: RouteTarget::Local { port: name.clone() },
        })
        .collect();
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let args = [
        "serve",
        "--socket",
        socket.to_str().context("path")?,
        "--metrics",
        METRICS,
    ];
    let vrouter = Vrouter::start(&node, &args)?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    let hello: Hello = c.call(&VrouterRequest::Hello {
        version: PROTOCOL_VERSION,
    })?;
    assert_eq!(hello.version, PROTOCOL_VERSION);
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
