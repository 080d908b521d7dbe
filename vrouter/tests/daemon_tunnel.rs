//! Two nodes, each with a vrouter in `run` mode, joined by an underlay veth
//! (192.168.77.1/24 and .2/24, the nodes' own kernel addresses): pod A on
//! node 1 pings pod B on node 2 over IPIP and over VXLAN. The outer headers
//! are checked with tcpdump on node 2's underlay while only node 1's
//! vrouter runs (with a program attached, the frames never reach the
//! kernel's taps). The node's own traffic (ping and a TCP exchange to its
//! underlay address) works while the vrouters run, after SIGKILL, and after
//! a restart.
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use anyhow::Result;
use common::{Capture, Netns, Vrouter, counter, pod, tcp_exchange, unique};

const U1_MAC: &str = "02:b4:00:00:00:01";
const U2_MAC: &str = "02:b4:00:00:00:02";

struct Node {
    ns: Netns,
    uplink: String,
    pod_if: String,
}

fn vrouter(
    n: &Node,
    me: &str,
    peer: &str,
    peer_mac: &str,
    pod_addr: &str,
    remote_block: &str,
    encap: &str,
) -> Result<Vrouter> {
    Vrouter::start(
        &n.ns,
        &[
            "run",
            "--io",
            "xdp",
            "--node",
            me,
            "--port",
            &format!("{}=uplink", n.uplink),
            "--port",
            &format!("{}=pod:{pod_addr}", n.pod_if),
            "--route",
            &format!("{remote_block}={encap}:{peer}"),
            "--neighbor",
            &format!("{peer}={peer_mac}@{}", n.uplink),
        ],
    )
}

fn two_nodes_over(encap: &str) -> Result<()> {
    let (ns1, ns2) = (Netns::new("vn")?, Netns::new("vn")?);
    let (u1, u2) = (unique("u"), unique("u"));
    ns1.ip(&[
        "link", "add", &u1, "type", "veth", "peer", "name", &u2, "netns", &ns2.name,
    ])?;
    ns1.ip(&["link", "set", &u1, "address", U1_MAC])?;
    ns2.ip(&["link", "set", &u2, "address", U2_MAC])?;
    ns1.ip(&["addr", "add", "192.168.77.1/24", "dev", &u1])?;
    ns2.ip(&["addr", "add", "192.168.77.2/24", "dev", &u2])?;
    ns1.ip(&["link", "set", &u1, "up"])?;
    ns2.ip(&["link", "set", &u2, "up"])?;
    let n1 = Node {
        ns: ns1,
        uplink: u1,
        pod_if: unique("ha"),
    };
    let n2 = Node {
        ns: ns2,
        uplink: u2,
        pod_if: unique("hb"),
    };
    let pod_a = pod(&n1.ns, &n1.pod_if, "10.66.1.2", "02:b4:00:00:01:02")?;
    let pod_b = pod(&n2.ns, &n2.pod_if, "10.66.2.2", "02:b4:00:00:02:02")?;
    let start1 = || {
        vrouter(
            &n1,
            "192.168.77.1",
            "192.168.77.2",
            U2_MAC,
            "10.66.1.2",
            "10.66.2.0/24",
            encap,
        )
    };
    let start2 = || {
        vrouter(
            &n2,
            "192.168.77.2",
            "192.168.77.1",
            U1_MAC,
            "10.66.2.2",
            "10.66.1.0/24",
            encap,
        )
    };
    // Pod B's MAC is learned from its first frame (no --neighbor for it),
    // so in step 2 B pings first.

    // 1. Only node 1's vrouter: what it puts on the underlay, seen by the
    // kernel of node 2 (no program there).
    let v1 = start1()?;
    let filter = if encap == "ipip" {
        "ip proto 4"
    } else {
        "udp port 4789"
    };
    let cap = Capture::start(&n2.ns, &n2.uplink, filter)?;
    let _ = pod_a.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "1", "10.66.2.2"]);
    let seen = cap.finish()?;
    assert!(
        seen.contains(&format!("{U1_MAC} > {U2_MAC}")),
        "outer MACs: {seen}"
    );
    let outer = if encap == "ipip" {
        "192.168.77.1 > 192.168.77.2:"
    } else {
        "> 192.168.77.2.4789: VXLAN"
    };
    assert!(
        seen.contains(outer) && seen.contains("    192.168.77.1"),
        "outer IPs: {seen}"
    );
    assert!(
        seen.contains("10.66.1.2 > 10.66.2.2: ICMP echo request"),
        "inner: {seen}"
    );
    if encap == "ipip" {
        assert!(seen.contains("proto IPIP (4)"), "{seen}");
    } else {
        assert!(
            seen.contains("VXLAN") && seen.contains("vni 4096"),
            "{seen}"
        );
    }

    // 2. Both vrouters: pod to pod.
    let v2 = start2()?;
    let out = pod_b.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.2"])?;
    assert!(out.contains("3 received"), "B to A over {encap}: {out}");
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.2.2"])?;
    assert!(out.contains("3 received"), "A to B over {encap}: {out}");

    // 3. The node's own traffic never enters the vrouter.
    let own = n1
        .ns
        .exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "192.168.77.2"])?;
    assert!(own.contains("2 received"), "{own}");
    tcp_exchange(&n2.ns, &n1.ns, "192.168.77.2")?;

    // 4. SIGKILL node 2's vrouter: the node stays reachable (fail-open,
    // the kernel drops the program with the process).
    v2.kill()?;
    let link = n2.ns.ip(&["link", "show", &n2.uplink])?;
    assert!(!link.contains("xdp"), "{link}");
    let own = n1
        .ns
        .exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "192.168.77.2"])?;
    assert!(own.contains("2 received"), "after SIGKILL: {own}");
    tcp_exchange(&n2.ns, &n1.ns, "192.168.77.2")?;

    // 5. Restart: pods and node both work again.
    let v2 = start2()?;
    let out = pod_b.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.2"])?;
    assert!(out.contains("3 received"), "after restart: {out}");
    tcp_exchange(&n2.ns, &n1.ns, "192.168.77.2")?;

    let c2 = v2.stop()?;
    let c1 = v1.stop()?;
    let (enc, dec) = if encap == "ipip" {
        ("encap_ipip", "decap_ipip")
    } else {
        ("encap_vxlan", "decap_vxlan")
    };
    assert!(
        counter(&c1, enc) >= 5 && counter(&c1, dec) >= 6,
        "node 1: {c1}"
    );
    assert!(
        counter(&c2, enc) >= 3 && counter(&c2, dec) >= 3,
        "node 2: {c2}"
    );
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pods_on_two_nodes_talk_over_ipip_and_the_nodes_own_traffic_survives() -> Result<()> {
    two_nodes_over("ipip")
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pods_on_two_nodes_talk_over_vxlan_and_the_nodes_own_traffic_survives() -> Result<()> {
    two_nodes_over("vxlan")
}
