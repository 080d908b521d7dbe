//! The host port for real (issue 14): `brindle-vrouter serve` in a node
//! netns, programmed as the node daemon does it, with the persistent TAP
//! `brindle0` as its host port (created by the vrouter when missing), the
//! kernel routing the pods' block into it via 169.254.1.1 onlink, and a
//! default route `host` in the vrouter. Checked with the kernel's own
//! tools: host → pod (ping, TCP), pod → the node's address and an address
//! beyond the node (the kernel forwards), and a DNAT rule in the node's
//! kernel (kube-proxy's shape, in nftables) to a pod on the same node whose
//! reply goes back through the kernel to be un-DNATed, the two pods on
//! different workers; forged sources from a pod to a pod, the node, the
//! ClusterIP and the outside are counted `spoofed` drops that never arrive.
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use anyhow::{Context, Result};
use brindle_api::framing::Client;
use brindle_api::vrouter::{
    Changed, PortDevice, PortKind, PortSpec, PortStatus, Route, RouteTarget, VrouterRequest,
};
use common::{Netns, pod, route_via_brindle0, serve, tcp_exchange, tcp_through, unique};

fn port(name: &str, kind: PortKind, addr: Option<&str>, mac: Option<&str>) -> PortSpec {
    PortSpec {
        name: name.to_owned(),
        kind,
        addresses: addr.iter().map(|a| a.parse().unwrap()).collect(),
        peer_mac: mac.map(|m| m.parse().unwrap()),
        endpoint: None,
        device: Default::default(),
        workload: None,
    }
}

/// The host port: the persistent TAP `brindle0` on the node, `queues`
/// queues (created by the vrouter when missing).
fn brindle0(queues: u16) -> PortSpec {
    PortSpec {
        device: PortDevice::Tap {
            netns: None,
            ifname: "brindle0".into(),
            queues,
        },
        ..port("brindle0", PortKind::Host, None, None)
    }
}

fn route(prefix: &str, target: RouteTarget) -> Route {
    Route {
        prefix: prefix.parse().unwrap(),
        target,
    }
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_host_port_carries_host_to_pod_pod_to_outside_and_a_dnat_both_ways() -> Result<()> {
    let node = Netns::new("vh")?;
    let outside = Netns::new("vo")?;
    let (ha, hb, up) = (unique("ha"), unique("hb"), unique("up"));
    let (mac_a, mac_b) = ("02:b6:00:00:00:02", "02:b6:00:00:00:03");
    let pod_a = pod(&node, &ha, "10.68.0.2", mac_a)?;
    let pod_b = pod(&node, &hb, "10.68.0.3", mac_b)?;
    // The node's underlay and, behind it, the outside (which routes the
    // pods' block back to the node, as a router with BGP would).
    node.ip(&[
        "link",
        "add",
        &up,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &outside.name,
    ])?;
    node.ip(&["addr", "add", "203.0.113.1/24", "dev", &up])?;
    node.ip(&["link", "set", &up, "up"])?;
    outside.ip(&["addr", "add", "203.0.113.2/24", "dev", "eth0"])?;
    outside.ip(&["link", "set", "eth0", "up"])?;
    outside.ip(&["route", "add", "10.68.0.0/24", "via", "203.0.113.1"])?;
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;

    // Two workers: the pods sit on different ones (asserted below), so the
    // DNATed packet and its reply cross workers by hand-off.
    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", "", "--cores", "0-1"])?;
    let ports = vec![
        port(&ha, PortKind::Pod, Some("10.68.0.2"), Some(mac_a)),
        port(&hb, PortKind::Pod, Some("10.68.0.3"), Some(mac_b)),
        brindle0(2),
    ];
    let changed: Changed = c.call(&VrouterRequest::AddPorts { ports })?;
    assert_eq!(changed.changed, 3);
    let routes = vec![
        route("10.68.0.2/32", RouteTarget::Local { port: ha.clone() }),
        route("10.68.0.3/32", RouteTarget::Local { port: hb.clone() }),
        route("0.0.0.0/0", RouteTarget::Host),
    ];
    let changed: Changed = c.call(&VrouterRequest::AddRoutes { routes })?;
    assert_eq!(changed.changed, 3);
    let status: Vec<PortStatus> = c.call(&VrouterRequest::DumpPorts)?;
    let worker = |name: &str| {
        status
            .iter()
            .find(|p| p.spec.name == name)
            .map(|p| p.worker)
    };
    assert_ne!(worker(&ha), worker(&hb), "{status:?}");
    // The kernel's side (ctrl's, helper hostk): brindle0 up, the block
    // into it via the pods' gateway.
    node.ip(&["link", "set", "brindle0", "up"])?;
    route_via_brindle0(&node, "10.68.0.0/24")?;

    // Host → pod: ping and TCP (a kubelet probe, a host process).
    let out = node.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.68.0.2"])?;
    assert!(out.contains("3 received"), "host → pod: {out}");
    tcp_exchange(&pod_a, &node, "10.68.0.2").context("host → pod TCP")?;
    // Pod → the node's address, and beyond it (the kernel forwards).
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "203.0.113.1"])?;
    assert!(out.contains("3 received"), "pod → node: {out}");
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "203.0.113.2"])?;
    assert!(out.contains("3 received"), "pod → outside: {out}");
    tcp_exchange(&outside, &pod_a, "203.0.113.2").context("pod → outside TCP")?;

    // A Service: the node's kernel DNATs 10.96.0.10:80 to pod B's 8080, as
    // kube-proxy's KUBE-SEP rule does. Pod A dials the ClusterIP; B's
    // reply must cross the kernel again to come from the ClusterIP.
    node.exec(&[
        "nft",
        "add table ip svc; \
         add chain ip svc pre { type nat hook prerouting priority -100; }; \
         add rule ip svc pre ip daddr 10.96.0.10 tcp dport 80 dnat to 10.68.0.3:8080",
    ])?;
    let seen = tcp_through(&pod_b, "10.68.0.3:8080", &pod_a, "10.96.0.10:80")
        .context("pod → ClusterIP → pod on the same node")?;
    assert_eq!(seen.ip().to_string(), "10.68.0.2", "no SNAT on the way");

    // Anti-spoofing whatever the destination (issue 14, item 6a): pod A
    // sends from an address that is not its own to a pod, the node, the
    // ClusterIP and the outside: each is a counted `spoofed` drop, and
    // neither pod B nor the node's kernel (which carries the node, Service
    // and outside classes) ever sees the forged source.
    let count_forged = "add table ip forged; \
         add chain ip forged pre { type filter hook prerouting priority -300; }; \
         add rule ip forged pre ip saddr 10.68.0.99 counter";
    node.exec(&["nft", count_forged])?;
    pod_b.exec(&["nft", count_forged])?;
    let spoofed = |c: &mut Client| -> Result<u64> {
        let stats: brindle_api::vrouter::Stats = c.call(&VrouterRequest::GetStats)?;
        Ok(stats
            .workers
            .iter()
            .filter_map(|w| w.drops.get("spoofed"))
            .sum())
    };
    let before = spoofed(&mut c)?;
    pod_a.ip(&["addr", "add", "10.68.0.99/32", "dev", "eth0"])?;
    let targets = ["10.68.0.3", "203.0.113.1", "10.96.0.10", "203.0.113.2"];
    for dst in targets {
        let out = pod_a.exec(&["ping", "-c", "1", "-W", "1", "-I", "10.68.0.99", dst]);
        assert!(out.is_err(), "forged source to {dst} answered: {out:?}");
    }
    let after = spoofed(&mut c)?;
    assert!(
        after - before >= targets.len() as u64,
        "spoofed {before} -> {after}"
    );
    for ns in [&node, &pod_b] {
        let rules = ns.exec(&["nft", "list", "table", "ip", "forged"])?;
        assert!(
            rules.contains("counter packets 0 bytes 0"),
            "a forged source arrived in {}: {rules}",
            ns.name
        );
    }

    let last = vrouter.stop()?;
    assert!(!last.is_empty());
    Ok(())
}

/// Veth pods behind a host port keep a pod's small fill ring: their
/// programs send the vrouter every frame (steering role `All`, as an
/// appliance), and sized as an uplink (256 frames each) the first 16 pods
/// of a worker took its 4,096-frame UMEM and every later pod lost its
/// frames (`fill_ring_empty`; the lab's 110 veth pods: 97 lossy). 24 pods
/// on one worker: each answers the node's first ping through `brindle0`.
#[test]
#[ignore = "requires root and network namespaces"]
fn twenty_four_veth_pods_behind_a_host_port_on_one_worker_each_answer_the_first_ping() -> Result<()>
{
    const PODS: u8 = 24;
    let node = Netns::new("vd")?;
    let mut pods = Vec::new();
    let mut ports = Vec::new();
    let mut routes = Vec::new();
    for i in 0..PODS {
        let (host_if, addr) = (unique("hd"), format!("10.68.1.{}", i + 2));
        let mac = format!("02:b6:00:00:01:{:02x}", i + 2);
        pods.push(pod(&node, &host_if, &addr, &mac)?);
        ports.push(port(&host_if, PortKind::Pod, Some(&addr), Some(&mac)));
        routes.push(route(
            &format!("{addr}/32"),
            RouteTarget::Local { port: host_if },
        ));
    }
    // The replies go back to the node's address through the host port.
    routes.push(route("0.0.0.0/0", RouteTarget::Host));
    node.ip(&["addr", "add", "192.0.2.1/32", "dev", "lo"])?;
    node.ip(&["link", "set", "lo", "up"])?;
    let (_dir, _vrouter, mut c) = serve(&node, &["--metrics", "", "--cores", "0"])?;
    ports.push(brindle0(1));
    let changed: Changed = c.call(&VrouterRequest::AddPorts { ports })?;
    assert_eq!(changed.changed, u64::from(PODS) + 1);
    let changed: Changed = c.call(&VrouterRequest::AddRoutes { routes })?;
    assert_eq!(changed.changed, u64::from(PODS) + 1);
    node.ip(&["link", "set", "brindle0", "up"])?;
    route_via_brindle0(&node, "10.68.1.0/24")?;
    let silent: Vec<String> = (0..PODS)
        .map(|i| format!("10.68.1.{}", i + 2))
        .filter(|addr| {
            !node
                .exec(&["ping", "-c", "1", "-W", "2", "-I", "192.0.2.1", addr])
                .is_ok_and(|out| out.contains("1 received"))
        })
        .collect();
    assert!(
        silent.is_empty(),
        "{} of {PODS} pods did not answer their first ping: {silent:?}",
        silent.len()
    );
    Ok(())
}
