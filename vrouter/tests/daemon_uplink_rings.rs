//! The uplink's fill ring follows the kernel's demand (issue 13: other-node
//! pod TCP lost thousands of segments as `fill_ring_empty` at the receiving
//! uplink). A burst arrives while the vrouter is stopped (SIGSTOP), so the
//! kernel takes every frame of the uplink's fill ring and drops the rest;
//! once the vrouter runs again its fill target must have grown, and the same
//! burst again loses nothing. Before, the target grew only when the worker
//! itself read three quarters of it between two refills, and it reads at
//! most a burst (64) per poll: a 256-frame target never grew, however often
//! the kernel found the ring empty.
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_uplink_rings --
//! --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use brindle_api::vrouter::{
    Changed, NodeConfig, PortKind, PortSpec, Route, RouteTarget, VrouterRequest, VxlanConfig,
};
use common::{Netns, in_netns, run, serve, tap_pod, tap_port, unique};

const METRICS: &str = "127.0.0.1:9092";

/// The vrouter's metrics text, read in `node`.
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

/// The value of `brindle_vrouter_<series>` for `port` (summed over
/// workers).
fn port_value(m: &str, series: &str, port: &str) -> u64 {
    let prefix = format!("brindle_vrouter_{series}{{");
    let label = format!("port=\"{port}\"");
    m.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// SIGSTOPs a process; SIGCONT when dropped (also when the test fails, so
/// the vrouter's own guard can stop it).
struct Paused(u32);

impl Paused {
    fn new(pid: u32) -> Result<Paused> {
        run(&["kill", "-STOP", &pid.to_string()])?;
        Ok(Paused(pid))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = run(&["kill", "-CONT", &self.0.to_string()]);
    }
}

/// `n` UDP datagrams from `peer` to `to`, as fast as the socket takes them.
fn burst(peer: &Netns, to: &'static str, n: usize) -> Result<()> {
    in_netns(peer, move || -> Result<()> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..n {
            s.send_to(&[0x5a; 1000], to)?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender panicked"))?
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_burst_that_empties_the_uplinks_fill_ring_grows_it_and_the_next_one_is_not_lost() -> Result<()>
{
    let (node, peer) = (Netns::new("rn")?, Netns::new("rk")?);
    let (u1, u2) = (unique("u"), unique("u"));
    node.ip(&[
        "link", "add", &u1, "type", "veth", "peer", "name", &u2, "netns", &peer.name,
    ])?;
    node.ip(&["addr", "add", "192.168.83.1/24", "dev", &u1])?;
    peer.ip(&["addr", "add", "192.168.83.2/24", "dev", &u2])?;
    node.ip(&["link", "set", &u1, "up"])?;
    peer.ip(&["link", "set", &u2, "up"])?;
    // The pod network behind the node, natively routed (steered to the
    // vrouter by the uplink's program).
    peer.ip(&["route", "add", "10.68.5.0/24", "via", "192.168.83.1"])?;
    let pod = tap_pod("10.68.5.2", "02:b6:00:00:05:02")?;
    let pp = unique("tp");

    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS])?;
    let _: Changed = c.call(&VrouterRequest::SetNode {
        node: NodeConfig {
            address_v4: Some("192.168.83.1".parse()?),
            address_v6: None,
            underlay_subnet: Some("192.168.83.0/24".parse()?),
            underlay_gateway: None,
            vxlan: VxlanConfig::default(),
            tunnel_peers: vec![],
        },
    })?;
    let uplink = PortSpec {
        name: u1.clone(),
        kind: PortKind::Uplink,
        addresses: vec![],
        peer_mac: None,
        endpoint: None,
        device: Default::default(),
        workload: None,
    };
    let tap = tap_port(&pp, &pod, "10.68.5.2");
    let _: Changed = c.call(&VrouterRequest::AddPorts {
        ports: vec![uplink, tap],
    })?;
    let _: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: vec![Route {
            prefix: "10.68.5.2/32".parse()?,
            target: RouteTarget::Local { port: pp.clone() },
        }],
    })?;
    // The peer knows the node's MAC before the vrouter stops (ARP for the
    // node is the kernel's).
    peer.exec(&["ping", "-c", "1", "-W", "2", "192.168.83.1"])?;
    let m = metrics(&node)?;
    let start = port_value(&m, "port_xsk_fill_target", &u1);
    ensure!(start > 0, "no fill target for {u1}\n{m}");
    let pid = vrouter.pid().context("vrouter pid")?;

    // 1. Twice the fill ring arrives while nobody refills it.
    let n = 2 * start as usize;
    {
        let _paused = Paused::new(pid)?;
        burst(&peer, "10.68.5.2:9", n)?;
    }
    // Until the worker has read the burst (a guard against a hang, not a
    // timing assertion).
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = metrics(&node)?;
        if port_value(&m, "port_rx_packets_total", &u1) >= start || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let empty = port_value(&m, "port_xsk_fill_ring_empty_total", &u1);
    let grown = port_value(&m, "port_xsk_fill_target", &u1);
    eprintln!(
        "fill target {start}, {n} frames while stopped: {empty} dropped (fill ring empty), target now {grown}"
    );
    ensure!(empty > 0, "the burst did not empty the fill ring\n{m}");
    ensure!(
        grown > start,
        "the fill target stayed at {start} after {empty} drops\n{m}"
    );

    // 2. Let the worker fill the grown ring (a guard: refills happen every
    // poll), then a burst of the old target again: nothing lost.
    std::thread::sleep(Duration::from_millis(300));
    let again = start as usize + start as usize / 2;
    {
        let _paused = Paused::new(pid)?;
        burst(&peer, "10.68.5.2:9", again)?;
    }
    let rx_before = port_value(&m, "port_rx_packets_total", &u1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = metrics(&node)?;
        let rx = port_value(&m, "port_rx_packets_total", &u1);
        if rx >= rx_before + again as u64 || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        port_value(&m, "port_xsk_fill_ring_empty_total", &u1),
        empty,
        "the second burst ({again} frames, target {grown}) lost frames\n{m}"
    );
    assert!(
        port_value(&m, "port_rx_packets_total", &u1) >= rx_before + again as u64,
        "{m}"
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}
