//! Two policed TAP pods of one node with two workers (issues 13, 15): both
//! directions of a flow between them meet one flow table, although each
//! pod's kernel picks any of its TAP's queues (one per worker) for a
//! flow's packets, whatever queue the vrouter wrote the other direction
//! on. The flow lives on the flow home of the lower port slot
//! (`Flows::pair_home`), the other worker hands such frames there.
//!
//! Server-first exchanges (the server writes a banner before the client
//! says anything, as SMTP or MySQL do) over several connections: each
//! completes with `conntrack_invalid` and `policy_denied` 0; a port the
//! policy does not open is denied. Without the pair's home the SYN/ACK
//! (and the banner) read on the other worker met no entry: every
//! connection but the first lost its SYN/ACK as `conntrack_invalid` (a 1 s
//! retransmission), and data a server sent after 3 s idle was denied.
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_tap_flows -- --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};
use brindle_api::vrouter::{
    Changed, PolicyEndpoint, PortDevice, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::resource::parse_documents;
use common::{Netns, drops, in_netns, serve, tap_pod, tcp_ok, unique};

const POLICY: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: demo, labels: {app: p}}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: demo, labels: {app: p}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: demo}
spec:
  podSelector: {matchLabels: {app: p}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ipBlock: {cidr: 10.66.6.0/24}}]
    ports: [{protocol: TCP, port: 8080}]
  egress:
  - to: [{ipBlock: {cidr: 10.66.6.0/24}}]
"#;

const PODS: [(&str, &str, &str); 2] = [
    ("a", "10.66.6.2", "02:b4:00:00:06:02"),
    ("b", "10.66.6.4", "02:b4:00:00:06:04"),
];

/// Connections from B to A's server.
const CONNECTIONS: usize = 8;

#[test]
#[ignore = "requires root and network namespaces"]
fn two_tap_pods_flows_meet_one_table_whichever_queue_their_kernels_pick() -> Result<()> {
    anyhow::ensure!(
        std::thread::available_parallelism()?.get() >= 2,
        "needs two CPUs (two workers)"
    );
    let node = Netns::new("tf")?;
    let pods = PODS
        .iter()
        .map(|(_, addr, mac)| tap_pod(addr, mac))
        .collect::<Result<Vec<_>>>()?;
    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", "", "--cores", "0-1"])?;
    let names: Vec<String> = PODS.iter().map(|_| unique("tq")).collect();
    let mut ports = Vec::new();
    let mut routes = Vec::new();
    let mut changes: Vec<Change> = parse_documents(POLICY)?
        .into_iter()
        .map(Change::Apply)
        .collect();
    for (((workload, addr, _), ns), name) in PODS.iter().zip(&pods).zip(&names) {
        ports.push(PortSpec {
            name: name.clone(),
            kind: PortKind::Pod,
            addresses: vec![addr.parse()?],
            peer_mac: None,
            endpoint: None,
            device: PortDevice::Tap {
                netns: Some(ns.path()),
                ifname: "eth0".into(),
                queues: 1,
            },
            workload: Some(PolicyEndpoint::new("demo", *workload)),
        });
        routes.push(Route {
            prefix: format!("{addr}/32").parse()?,
            target: RouteTarget::Local { port: name.clone() },
        });
        changes.push(Change::Endpoint(
            PolicyEndpoint::new("demo", *workload),
            Some(EndpointInfo {
                addrs: vec![addr.parse()?],
                local: true,
            }),
        ));
    }
    let _: Changed = c.call(&VrouterRequest::AddPorts { ports })?;
    let _: Changed = c.call(&VrouterRequest::AddRoutes { routes })?;
    let mut compiler = Compiler::new();
    let _: Changed = c.call(&VrouterRequest::ApplyPolicy {
        update: compiler.apply(changes),
    })?;

    let (a, b) = (&pods[0], &pods[1]);
    let at: SocketAddr = format!("{}:8080", PODS[0].1).parse()?;
    let listener = in_netns(a, move || Ok(TcpListener::bind(at)?))
        .join()
        .map_err(|_| anyhow::anyhow!("bind panicked"))??;
    for i in 0..CONNECTIONS {
        let mut client = in_netns(b, move || {
            Ok(TcpStream::connect_timeout(&at, Duration::from_secs(5))?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("connect panicked"))?
        .with_context(|| format!("B -> A:8080, connection {i}"))?;
        let (mut server, _) = listener.accept()?;
        for s in [&client, &server] {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
        }
        // The server speaks first.
        server.write_all(b"helo")?;
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).context("the banner")?;
        client.write_all(b"ehlo")?;
        server.read_exact(&mut buf).context("the answer")?;
        assert_eq!(&buf, b"ehlo");
    }
    assert_eq!(drops(&mut c, "conntrack_invalid")?, 0);
    assert_eq!(drops(&mut c, "policy_denied")?, 0);
    // The policy is in force: A's 8081 is not open.
    assert!(!tcp_ok(a, b, format!("{}:8081", PODS[0].1).parse()?)?);
    assert!(drops(&mut c, "policy_denied")? > 0);
    drop(c);
    vrouter.stop()?;
    Ok(())
}
