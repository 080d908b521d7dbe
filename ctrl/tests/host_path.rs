//! The host path in a real kernel (issue 14): in a node namespace with a
//! TAP `brindle0` (standing in for the vrouter's), the programmer brings it
//! up with the pod MTU, routes pod prefixes into it with our protocol,
//! removes what a previous run left and what is withdrawn, and never
//! touches another protocol's route or another nftables table; and its
//! natOutgoing table masquerades a pod's TCP and ICMP to the outside while
//! traffic between pools keeps the pod's address.

mod common;

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use brindle_ctrl::hostpath::netlink::NetlinkKernel;
use brindle_ctrl::hostpath::{HostProgrammer, HostState, NatPools};
use common::{Netns, in_netns};
use ipnet::IpNet;

fn nets(list: &[&str]) -> BTreeSet<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn state(routes: &[&str]) -> HostState {
    HostState {
        port: "brindle0".into(),
        mtu: 1440,
        routes: nets(routes),
        nat: NatPools {
            masquerade: nets(&["10.244.0.0/16"]),
            pools: nets(&["10.244.0.0/16", "10.250.0.0/16"]),
        },
    }
}

/// Runs the programmer on a thread inside `ns` over the real kernel.
fn program(ns: &Netns, states: Vec<HostState>) -> Result<bool> {
    in_netns(ns, move || {
        let mut p = HostProgrammer::new(NetlinkKernel::open()?);
        for s in states {
            p.set(s);
        }
        Ok(p.in_sync())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the programmer panicked"))?
}

fn routes_of_ours(ns: &Netns) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for family in ["-4", "-6"] {
        let text = ns.ip(&[family, "route", "show", "proto", "73"])?;
        // A TAP nobody reads has no carrier: "linkdown" is not the point.
        out.extend(
            text.lines()
                .map(|l| l.replace(" linkdown", "").trim().to_owned()),
        );
    }
    Ok(out)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_prefixes_are_routed_into_brindle0_and_only_our_routes_and_table_are_touched() -> Result<()> {
    let ns = Netns::new("cthp")?;
    ns.ip(&["tuntap", "add", "brindle0", "mode", "tap"])?;
    ns.ip(&["tuntap", "add", "other0", "mode", "tap"])?;
    ns.ip(&["link", "set", "other0", "up"])?;
    // Left by a previous run: one wanted, one not. Another protocol's route
    // and another table must survive.
    ns.ip(&["link", "set", "brindle0", "up"])?;
    for p in ["10.244.1.0/26", "10.244.9.0/26"] {
        ns.ip(&[
            "route",
            "add",
            p,
            "via",
            "169.254.1.1",
            "dev",
            "brindle0",
            "onlink",
            "proto",
            "73",
        ])?;
    }
    ns.ip(&[
        "route",
        "add",
        "10.244.7.0/26",
        "dev",
        "other0",
        "proto",
        "static",
    ])?;
    ns.exec(&["nft", "add", "table", "inet", "someone"])?;

    let in_sync = program(
        &ns,
        vec![state(&["10.244.1.0/26", "10.244.2.0/26", "10.244.3.7/32"])],
    )?;
    ensure!(in_sync, "not in sync");
    assert_eq!(
        routes_of_ours(&ns)?,
        [
            "10.244.1.0/26 via 169.254.1.1 dev brindle0 onlink",
            "10.244.2.0/26 via 169.254.1.1 dev brindle0 onlink",
            "10.244.3.7 via 169.254.1.1 dev brindle0 onlink",
        ]
    );
    let link = ns.ip(&["-o", "link", "show", "brindle0"])?;
    assert!(link.contains("mtu 1440") && link.contains(",UP"), "{link}");
    assert_eq!(
        ns.exec(&["sysctl", "-n", "net.ipv4.ip_forward"])?.trim(),
        "1"
    );
    assert_eq!(
        ns.exec(&["sysctl", "-n", "net.ipv4.conf.brindle0.rp_filter"])?
            .trim(),
        "0"
    );
    let tables = ns.exec(&["nft", "list", "tables"])?;
    assert!(tables.contains("table inet someone"), "{tables}");
    assert!(tables.contains("table inet brindle"), "{tables}");
    let ours = ns.exec(&["nft", "list", "table", "inet", "brindle"])?;
    assert!(ours.contains("10.244.0.0/16"), "{ours}");
    assert!(
        ours.contains("ip saddr @masq_v4 ip daddr != @pools_v4 masquerade"),
        "{ours}"
    );
    let other = ns.ip(&["route", "show", "10.244.7.0/26"])?;
    assert!(other.contains("dev other0"), "{other}");

    // A block withdrawn, another learned, and IPv6; applied twice (the
    // table replaced atomically, not duplicated).
    let next = state(&["10.244.2.0/26", "10.244.4.0/26", "fd00:244::/122"]);
    ensure!(program(&ns, vec![next.clone(), next])?, "not in sync");
    assert_eq!(
        routes_of_ours(&ns)?,
        [
            "10.244.2.0/26 via 169.254.1.1 dev brindle0 onlink",
            "10.244.4.0/26 via 169.254.1.1 dev brindle0 onlink",
            "fd00:244::/122 via fe80::ecee:eeff:feee:eeee dev brindle0 metric 1024 pref medium",
        ]
    );
    let tables = ns.exec(&["nft", "list", "tables"])?;
    assert_eq!(tables.matches("table inet brindle").count(), 1, "{tables}");
    assert!(tables.contains("table inet someone"), "{tables}");
    Ok(())
}

/// A veth pair `a` (in `na`, address `addr_a`) ↔ `b` (in `nb`, `addr_b`).
fn veth(na: &Netns, a: &str, addr_a: &str, nb: &Netns, b: &str, addr_b: &str) -> Result<()> {
    let tmp = format!("{a}x");
    na.ip(&["link", "add", a, "type", "veth", "peer", "name", &tmp])?;
    na.ip(&["link", "set", &tmp, "netns", &nb.name])?;
    nb.ip(&["link", "set", &tmp, "name", b])?;
    na.ip(&["addr", "add", addr_a, "dev", a])?;
    nb.ip(&["addr", "add", addr_b, "dev", b])?;
    na.ip(&["link", "set", a, "up"])?;
    nb.ip(&["link", "set", b, "up"])?;
    Ok(())
}

/// The address a TCP client showed up with at a one-shot listener in `ns`.
fn peer_seen_by(server: &Netns, client: &Netns, addr: &str, port: u16) -> Result<String> {
    let listen = format!("TCP-LISTEN:{port},reuseaddr");
    let mut srv = std::process::Command::new("ip")
        .args(["netns", "exec", &server.name, "socat", "-T", "5", &listen])
        .arg("SYSTEM:echo $SOCAT_PEERADDR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let target = format!("TCP:{addr}:{port},retry=50,interval=0.1");
    let out = client.exec(&["timeout", "10", "socat", "-T", "5", "-", &target]);
    let _ = srv.kill();
    let _ = srv.wait();
    Ok(out.context("the TCP exchange")?.trim().to_owned())
}

/// The address a UDP datagram showed up with at a one-shot listener in
/// `ns`, as echoed back to the client (so the reply passed the NAT too).
fn udp_peer_seen_by(server: &Netns, client: &Netns, addr: &str, port: u16) -> Result<String> {
    let listen = format!("UDP-RECVFROM:{port},reuseaddr");
    let mut srv = std::process::Command::new("ip")
        .args(["netns", "exec", &server.name, "socat", "-T", "5", &listen])
        .arg("SYSTEM:echo $SOCAT_PEERADDR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    // socat binds the listener a moment after it starts: resend until an
    // answer comes (the client's -T ends it when none does).
    let mut seen = None;
    for _ in 0..20 {
        let target = format!("UDP:{addr}:{port}");
        let answer = client
            .exec(&[
                "sh",
                "-c",
                &format!("echo x | timeout 2 socat -T 1 - {target}"),
            ])
            .unwrap_or_default();
        if !answer.trim().is_empty() {
            seen = Some(answer.trim().to_owned());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = srv.kill();
    let _ = srv.wait();
    seen.context("no UDP answer through the masquerade")
}

#[test]
#[ignore = "requires root and network namespaces"]
fn nat_outgoing_masquerades_pods_to_the_outside_and_not_between_pools() -> Result<()> {
    // pod (10.244.1.5) ─ node (10.99.0.11 on eth0) ─ router (10.99.0.254);
    // a second pod (10.250.0.9, another pool) on the node too. The router
    // knows no pod route: only a masqueraded packet can be answered.
    let node = Netns::new("cthn")?;
    let pod = Netns::new("cthp")?;
    let pod2 = Netns::new("cthq")?;
    let router = Netns::new("cthr")?;
    veth(
        &node,
        "eth0",
        "10.99.0.11/24",
        &router,
        "rt0",
        "10.99.0.254/24",
    )?;
    veth(
        &node,
        "vpod1",
        "169.254.9.1/32",
        &pod,
        "eth0",
        "10.244.1.5/32",
    )?;
    veth(
        &node,
        "vpod2",
        "169.254.9.2/32",
        &pod2,
        "eth0",
        "10.250.0.9/32",
    )?;
    node.ip(&["route", "add", "10.244.1.5/32", "dev", "vpod1"])?;
    node.ip(&["route", "add", "10.250.0.9/32", "dev", "vpod2"])?;
    for (p, gw) in [(&pod, "169.254.9.1"), (&pod2, "169.254.9.2")] {
        p.ip(&["route", "add", gw, "dev", "eth0"])?;
        p.ip(&["route", "add", "default", "via", gw])?;
    }
    node.ip(&["tuntap", "add", "brindle0", "mode", "tap"])?;
    ensure!(program(&node, vec![state(&[])])?, "not in sync");

    // Outside: masqueraded to the node's address (TCP, ICMP echo).
    assert_eq!(
        peer_seen_by(&router, &pod, "10.99.0.254", 7101)?,
        "10.99.0.11"
    );
    pod.exec(&["ping", "-c", "1", "-W", "2", "10.99.0.254"])
        .context("ICMP echo to the outside, answered through the masquerade")?;
    // UDP likewise, and the reply comes back to the pod.
    assert_eq!(
        udp_peer_seen_by(&router, &pod, "10.99.0.254", 7103)?,
        "10.99.0.11"
    );
    // An ICMP error about a masqueraded flow (port unreachable from the
    // router, addressed to the node) is translated back to the pod: its
    // connected UDP socket reads ECONNREFUSED. The router has no pod route,
    // so nothing else could bring it.
    let refused = pod.exec(&[
        "sh",
        "-c",
        "echo x | timeout 10 socat -T 3 - UDP:10.99.0.254:7199",
    ]);
    let err = format!("{:#}", refused.expect_err("a closed UDP port answered"));
    ensure!(
        err.contains("Connection refused"),
        "no port unreachable reached the pod: {err}"
    );
    // Between pools: the pod's own address.
    assert_eq!(peer_seen_by(&pod2, &pod, "10.250.0.9", 7102)?, "10.244.1.5");
    // Without natOutgoing on the pool, the router sees (and cannot answer)
    // the pod's address.
    let mut off = state(&[]);
    off.nat.masquerade.clear();
    ensure!(program(&node, vec![off])?, "not in sync");
    ensure!(
        pod.exec(&["ping", "-c", "1", "-W", "1", "10.99.0.254"])
            .is_err(),
        "answered without natOutgoing"
    );
    Ok(())
}
