//! A pod's flows through the host port with two workers (issue 14): every
//! frame of a flow between the host port and a pod meets ONE flow table,
//! although the host port (`brindle0`, a TAP with a queue per worker), a
//! TAP pod's queues and the uplink's RSS pick workers on their own.
//!
//! A served node with two workers pinned to CPUs 0 and 1: a TAP pod and a
//! veth pod (both policed: ingress TCP 8080 from the underlay only;
//! egress to the remote block, the Services' range and the underlay), the
//! host port with the kernel routing the node's and the peer's blocks into
//! it, and an uplink to a peer that is Calico's kernel VXLAN path with a
//! "remote pod" (`common::peer`). The node's kernel has kube-proxy's DNAT
//! shapes in nftables: a ClusterIP whose backend is the remote pod, a
//! NodePort to the TAP pod, and natOutgoing's masquerade. Each case opens
//! several connections (other source ports: the kernel's hash spreads
//! them over brindle0's queues):
//!
//! - host -> each pod (a kubelet probe): SYN from brindle0;
//! - each pod -> ClusterIP -> the remote pod: the DNATed SYN comes back
//!   from brindle0 on either queue, the SYN/ACK by the uplink; without the
//!   pod's worker keeping the flow (`Pipeline::keeper`) the SYN is tracked
//!   where brindle0's queue was read, the SYN/ACK meets no entry on the
//!   pod's worker and is dropped `conntrack_invalid`: connections time out;
//! - the peer -> NodePort -> the TAP pod;
//! - the TAP pod -> the peer's node address (masqueraded by the kernel).
//!
//! All complete with `conntrack_invalid` 0 and frames handed between
//! workers unprocessed; host -> the TAP pod on a port its policy does not
//! allow is a counted `policy_denied` drop, and the TAP pod's frames with a
//! forged source to the node and beyond are counted `spoofed` drops.
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_host_flows -- --include-ignored`.

mod common;

use anyhow::{Context, Result};
use brindle_api::vrouter::{
    Changed, PolicyEndpoint, PortDevice, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::resource::parse_documents;
use common::peer::{self, metric_sum, metrics, vxlan_peer};
use common::{Netns, drops, pod, route_via_brindle0, serve, tap_pod, tcp_ok, tcp_through, unique};

const POLICY: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: t, namespace: demo, labels: {app: p}}
---
apiVersion: v1
kind: Pod
metadata: {name: v, namespace: demo, labels: {app: p}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: demo}
spec:
  podSelector: {matchLabels: {app: p}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ipBlock: {cidr: 192.168.78.0/24}}]
    ports: [{protocol: TCP, port: 8080}]
  egress:
  - to:
    - {ipBlock: {cidr: 10.66.9.0/24}}
    - {ipBlock: {cidr: 10.96.0.0/12}}
    - {ipBlock: {cidr: 192.168.78.0/24}}
"#;

const METRICS: &str = "127.0.0.1:9096";
const TAP_POD: &str = "10.66.6.2";
const VETH_POD: &str = "10.66.6.3";
/// Connections per case.
const EACH: usize = 8;

fn pod_port(name: &str, addr: &str, workload: &str, device: PortDevice) -> Result<PortSpec> {
    Ok(PortSpec {
        name: name.to_owned(),
        kind: PortKind::Pod,
        addresses: vec![addr.parse()?],
        peer_mac: None,
        endpoint: None,
        device,
        workload: Some(PolicyEndpoint::new("demo", workload)),
    })
}

/// `EACH` TCP exchanges from `client` dialling `dial` to `server`
/// listening on `listen`, each on a new source port.
fn connections(server: &Netns, listen: &str, client: &Netns, dial: &str, what: &str) -> Result<()> {
    for i in 0..EACH {
        tcp_through(server, listen, client, dial)
            .with_context(|| format!("{what}, connection {i}"))?;
    }
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_pods_flows_through_the_host_port_meet_one_table_whichever_queue_reads_them() -> Result<()> {
    anyhow::ensure!(
        std::thread::available_parallelism()?.get() >= 2,
        "needs two CPUs (two workers)"
    );
    let node = Netns::new("hf")?;
    let underlay = vxlan_peer(&node)?;
    let remote = &underlay.peer;
    let tap = tap_pod(TAP_POD, "02:b4:00:00:06:02")?;
    let hv = unique("hv");
    let veth = pod(&node, &hv, VETH_POD, "02:b4:00:00:06:03")?;
    for p in [&tap, &veth] {
        p.ip(&["link", "set", "eth0", "mtu", "1450"])?;
    }
    let tp = unique("tp");

    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS, "--cores", "0-1"])?;
    underlay.serve(&node, &mut c)?;
    let tap_device = PortDevice::Tap {
        netns: Some(tap.path()),
        ifname: "eth0".into(),
        queues: 1,
    };
    let host = PortSpec {
        name: "brindle0".into(),
        kind: PortKind::Host,
        addresses: vec![],
        peer_mac: None,
        endpoint: None,
        device: PortDevice::Tap {
            netns: None,
            ifname: "brindle0".into(),
            queues: 2,
        },
        workload: None,
    };
    let ports = vec![
        pod_port(&tp, TAP_POD, "t", tap_device)?,
        pod_port(&hv, VETH_POD, "v", Default::default())?,
        host,
    ];
    let _: Changed = c.call(&VrouterRequest::AddPorts { ports })?;
    let route = |prefix: &str, target| -> Result<Route> {
        Ok(Route {
            prefix: prefix.parse()?,
            target,
        })
    };
    let _: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: vec![
            route(
                &format!("{TAP_POD}/32"),
                RouteTarget::Local { port: tp.clone() },
            )?,
            route(
                &format!("{VETH_POD}/32"),
                RouteTarget::Local { port: hv.clone() },
            )?,
            route("0.0.0.0/0", RouteTarget::Host)?,
        ],
    })?;
    let mut compiler = Compiler::new();
    let mut changes: Vec<Change> = parse_documents(POLICY)?
        .into_iter()
        .map(Change::Apply)
        .collect();
    for (name, addr) in [("t", TAP_POD), ("v", VETH_POD)] {
        changes.push(Change::Endpoint(
            PolicyEndpoint::new("demo", name),
            Some(EndpointInfo {
                addrs: vec![addr.parse()?],
                local: true,
            }),
        ));
    }
    let _: Changed = c.call(&VrouterRequest::ApplyPolicy {
        update: compiler.apply(changes),
    })?;

    // The kernel's side, as ctrl and kube-proxy program it: brindle0 up
    // without rp_filter, the node's and the peer's blocks into it, a
    // ClusterIP whose backend is the remote pod, a NodePort to the TAP
    // pod, natOutgoing for the node's block.
    node.ip(&["link", "set", "brindle0", "up"])?;
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    node.exec(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])?;
    node.exec(&["sysctl", "-qw", "net.ipv4.conf.brindle0.rp_filter=0"])?;
    for block in [peer::BLOCK, peer::REMOTE_BLOCK] {
        route_via_brindle0(&node, block)?;
    }
    node.exec(&[
        "nft",
        &format!(
            "add table ip kp; \
             add chain ip kp pre {{ type nat hook prerouting priority -100; }}; \
             add rule ip kp pre ip daddr 10.96.0.10 tcp dport 80 dnat to {}:8081; \
             add rule ip kp pre ip daddr {} tcp dport 30080 dnat to {TAP_POD}:8080; \
             add chain ip kp post {{ type nat hook postrouting priority 100; }}; \
             add rule ip kp post ip saddr 10.66.6.0/24 oifname != brindle0 masquerade",
            peer::REMOTE_POD,
            peer::NODE,
        ),
    ])?;

    let backend = format!("{}:8081", peer::REMOTE_POD);
    for (pod, addr, what) in [(&tap, TAP_POD, "TAP"), (&veth, VETH_POD, "veth")] {
        let at = format!("{addr}:8080");
        connections(pod, &at, &node, &at, &format!("host -> {what} pod"))?;
        connections(
            remote,
            &backend,
            pod,
            "10.96.0.10:80",
            &format!("{what} pod -> ClusterIP -> remote pod"),
        )?;
    }
    let tap_at = format!("{TAP_POD}:8080");
    let node_port = format!("{}:30080", peer::NODE);
    connections(
        &tap,
        &tap_at,
        remote,
        &node_port,
        "peer -> NodePort -> TAP pod",
    )?;
    let peer_at = format!("{}:9000", peer::PEER);
    let seen = tcp_through(remote, &peer_at, &tap, &peer_at).context("TAP pod -> outside")?;
    assert_eq!(seen.ip().to_string(), peer::NODE, "natOutgoing");
    assert_eq!(drops(&mut c, "conntrack_invalid")?, 0);

    // The host on a port the pod's policy does not open: dropped.
    let denied = drops(&mut c, "policy_denied")?;
    assert!(
        !tcp_ok(&tap, &node, format!("{TAP_POD}:8081").parse()?)?,
        "host -> TAP pod:8081 is denied"
    );
    assert!(drops(&mut c, "policy_denied")? > denied);

    // Anti-spoofing towards the host port (issue 14, item 6): the TAP pod
    // sends from an address that is not its own to the node and beyond
    // it: counted `spoofed`, and the node's kernel never sees the source.
    node.exec(&[
        "nft",
        "add table ip forged; \
         add chain ip forged pre { type filter hook prerouting priority -300; }; \
         add rule ip forged pre ip saddr 10.66.6.99 counter",
    ])?;
    tap.ip(&["addr", "add", "10.66.6.99/32", "dev", "eth0"])?;
    let spoofed = drops(&mut c, "spoofed")?;
    for dst in [peer::NODE, peer::PEER] {
        let out = tap.exec(&["ping", "-c", "1", "-W", "1", "-I", "10.66.6.99", dst]);
        assert!(out.is_err(), "forged source to {dst} answered: {out:?}");
    }
    assert!(drops(&mut c, "spoofed")? >= spoofed + 2);
    let rules = node.exec(&["nft", "list", "table", "ip", "forged"])?;
    assert!(rules.contains("counter packets 0 bytes 0"), "{rules}");

    // Frames read on a worker that does not keep their flow went to the
    // one that does, unprocessed.
    let m = metrics(&node, METRICS)?;
    let redirected = metric_sum(&m, "worker_handoff_redirected_total{", "");
    assert!(redirected > 0, "nothing handed unprocessed\n{m}");
    eprintln!(
        "redirected {redirected}, handoff_out {}",
        metric_sum(&m, "worker_handoff_out_total{", "")
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}
