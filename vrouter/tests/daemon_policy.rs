//! Network policy through `brindle-vrouter serve` (issue 15): two
//! Calico-shaped pods on veths in a node namespace, the vrouter programmed
//! over its socket as ctrl does (ports with their workloads, routes, then
//! `ApplyPolicy` with what brindle-policy's compiler makes of Kubernetes
//! NetworkPolicies), and real TCP connections allowed and denied.
//!
//! The policy: pod B (app=b) takes TCP 8080 from pod A (app=a) only; pod A
//! takes nothing (deny-all ingress), yet the replies of A's connections
//! reach it (tracked flows). With two workers (the default on a 2-core
//! machine) the pods sit on different workers, so the hand-off path (the
//! owner checks the frames handed to its pod) is exercised too.
//!
//! The same scenario runs twice: veth pods (AF_XDP ports) and TAP pods
//! (the TAP port kind, whose kernels hand over TSO super-packets).
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_policy -- --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::vrouter::{
    Changed, Hello, PolicyEndpoint, PolicyRuleStats, PortDevice, PortKind, PortSpec, PortStatus,
    Route, RouteTarget, Stats, VrouterRequest,
};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::resource::parse_documents;
use common::{Netns, Vrouter, drops, in_netns, pod, tap_pod, tcp_ok, unique};

const WORLD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: demo, labels: {app: a}}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: demo, labels: {app: b}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-a, namespace: demo}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Ingress]
"#;

fn b_from_a(ports: &[u16]) -> String {
    let ports: Vec<String> = ports
        .iter()
        .map(|p| format!("{{protocol: TCP, port: {p}}}"))
        .collect();
    format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: b-from-a, namespace: demo}}
spec:
  podSelector: {{matchLabels: {{app: b}}}}
  ingress:
  - from: [{{podSelector: {{matchLabels: {{app: a}}}}}}]
    ports: [{}]
"#,
        ports.join(", ")
    )
}

fn pod_port(name: &str, addr: &str, mac: &str, workload: &str, tap: Option<&Netns>) -> PortSpec {
    PortSpec {
        name: name.to_owned(),
        kind: PortKind::Pod,
        addresses: vec![addr.parse().unwrap()],
        peer_mac: Some(mac.parse().unwrap()),
        endpoint: None,
        device: match tap {
            Some(ns) => PortDevice::Tap {
                netns: Some(ns.path()),
                ifname: "eth0".into(),
                queues: 1,
            },
            None => PortDevice::default(),
        },
        workload: Some(PolicyEndpoint::new("demo", workload)),
    }
}

fn local(prefix: &str, port: &str) -> Route {
    Route {
        prefix: prefix.parse().unwrap(),
        target: RouteTarget::Local {
            port: port.to_owned(),
        },
    }
}

#[test]
#[ignore = "requires root and network namespaces"]
fn serve_enforces_network_policy_on_real_tcp_connections_between_veth_pods() -> Result<()> {
    enforce(false)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn serve_enforces_network_policy_on_real_tcp_connections_between_tap_pods() -> Result<()> {
    enforce(true)
}

fn enforce(tap: bool) -> Result<()> {
    let node = Netns::new("vpol")?;
    let (ha, hb) = (unique("pa"), unique("pb"));
    let (mac_a, mac_b) = ("02:b4:00:00:00:02", "02:b4:00:00:00:03");
    let (pod_a, pod_b) = if tap {
        (tap_pod("10.65.4.2", mac_a)?, tap_pod("10.65.4.3", mac_b)?)
    } else {
        (
            pod(&node, &ha, "10.65.4.2", mac_a)?,
            pod(&node, &hb, "10.65.4.3", mac_b)?,
        )
    };
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let _vrouter = Vrouter::start(
        &node,
        &[
            "serve",
            "--socket",
            socket.to_str().context("path")?,
            "--metrics",
            "127.0.0.1:9094",
        ],
    )?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    let _: Hello = c.call(&VrouterRequest::Hello {
        version: PROTOCOL_VERSION,
    })?;
    let ports = vec![
        pod_port(&ha, "10.65.4.2", mac_a, "a", tap.then_some(&pod_a)),
        pod_port(&hb, "10.65.4.3", mac_b, "b", tap.then_some(&pod_b)),
    ];
    assert_eq!(
        c.call::<_, Changed>(&VrouterRequest::AddPorts { ports })?
            .changed,
        2
    );
    // With two workers each veth pod gets its own: frames between them
    // cross a hand-off and the owner checks them. (A TAP pod has a queue on
    // every worker and no hand-off: its kernel's tun flow steering keeps
    // both directions of a flow on the worker that wrote it.)
    let dumped: Vec<PortStatus> = c.call(&VrouterRequest::DumpPorts)?;
    let workers: std::collections::BTreeSet<u32> = dumped.iter().map(|p| p.worker).collect();
    let two_workers = workers.len() == 2 && !tap;
    let routes = vec![local("10.65.4.2/32", &ha), local("10.65.4.3/32", &hb)];
    c.call::<_, Changed>(&VrouterRequest::AddRoutes { routes })?;

    let b8080: SocketAddr = "10.65.4.3:8080".parse()?;
    let b8081: SocketAddr = "10.65.4.3:8081".parse()?;
    let a8080: SocketAddr = "10.65.4.2:8080".parse()?;
    // No policy yet: everything passes.
    assert!(tcp_ok(&pod_b, &pod_a, b8081)?, "A -> B:8081 without policy");

    let mut compiler = Compiler::new();
    let mut changes: Vec<Change> = parse_documents(&format!("{WORLD}---{}", b_from_a(&[8080])))?
        .into_iter()
        .map(Change::Apply)
        .collect();
    for (name, ip) in [("a", "10.65.4.2"), ("b", "10.65.4.3")] {
        changes.push(Change::Endpoint(
            PolicyEndpoint::new("demo", name),
            Some(EndpointInfo {
                addrs: vec![ip.parse()?],
                local: true,
            }),
        ));
    }
    let update = compiler.apply(changes);
    let applied: Changed = c.call(&VrouterRequest::ApplyPolicy {
        update: update.clone(),
    })?;
    assert_eq!(applied.changed, 1);
    // The same generation again is refused, saying why.
    let err = c
        .call::<_, Changed>(&VrouterRequest::ApplyPolicy { update })
        .unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");

    assert!(tcp_ok(&pod_b, &pod_a, b8080)?, "A -> B:8080 is allowed");
    assert!(!tcp_ok(&pod_b, &pod_a, b8081)?, "A -> B:8081 is denied");
    assert!(!tcp_ok(&pod_a, &pod_b, a8080)?, "B -> A is denied");
    let out = pod_a.exec(&["ping", "-c", "1", "-W", "1", "10.65.4.3"]);
    assert!(
        out.is_err() || out.as_ref().is_ok_and(|o| o.contains("0 received")),
        "{out:?}"
    );
    let denied = drops(&mut c, "policy_denied")?;
    assert!(denied >= 3, "policy_denied = {denied}");
    if two_workers {
        // Some of those were dropped by the owner of the pod's port, after
        // the hand-off (the routing worker let them through to it).
        let stats: Stats = c.call(&VrouterRequest::GetStats)?;
        assert!(
            stats.workers.iter().all(|w| w.drops["policy_denied"] > 0),
            "{stats:?}"
        );
    }

    // The same drops by policy and rule: A -> B:8081 and B -> A meet the
    // end of the default tier (B's and A's ingress), A -> B:8080 was
    // allowed once by b-from-a's rule 0.
    let rules: Vec<PolicyRuleStats> = c.call(&VrouterRequest::PolicyStats)?;
    let row = |rule: &str, action: &str, policy: &str| {
        rules
            .iter()
            .filter(|r| {
                r.rule == rule
                    && r.action == action
                    && r.direction == "ingress"
                    && r.policy.contains(policy)
            })
            .map(|r| r.packets)
            .sum::<u64>()
    };
    let end_of_tier = row("end-of-tier", "deny", "");
    assert!(
        end_of_tier >= 2 && end_of_tier <= denied,
        "end-of-tier denies {end_of_tier} of {denied} policy_denied: {rules:?}"
    );
    assert!(row("0", "allow", "b-from-a") >= 1, "{rules:?}");
    let metrics = in_netns(&node, || -> Result<String> {
        let mut s = TcpStream::connect("127.0.0.1:9094")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("metrics thread panicked"))??;
    let flows_new: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("brindle_vrouter_worker_flows_new_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    // One entry per worker that checked the connection (both with veth
    // pods on two workers, one for TAP pods).
    let want = if two_workers { 2 } else { 1 };
    assert!(flows_new >= want, "flows_new = {flows_new}\n{metrics}");
    assert!(
        metrics.contains("brindle_vrouter_policy_rule_packets_total{")
            && metrics.contains("rule=\"end-of-tier\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("reason=\"policy_denied\"")
            && metrics.contains("brindle_vrouter_worker_policy_generation{"),
        "{metrics}"
    );

    // Open 8081 too: the change reaches the workers and the new port passes.
    let update = compiler.apply(
        parse_documents(&b_from_a(&[8080, 8081]))?
            .into_iter()
            .map(Change::Apply),
    );
    let applied: Changed = c.call(&VrouterRequest::ApplyPolicy { update })?;
    assert_eq!(applied.changed, 1);
    assert!(tcp_ok(&pod_b, &pod_a, b8081)?, "A -> B:8081 once allowed");
    assert!(tcp_ok(&pod_b, &pod_a, b8080)?, "A -> B:8080 still allowed");
    Ok(())
}
