//! Network policy on a TAP pod's flows with a peer behind the uplink,
//! with two workers (issue 15): both directions of a flow must meet one
//! flow table although the pod's queue and the uplink's RSS pick workers
//! on their own.
//!
//! A served node with a TAP pod (one queue per worker) and an uplink veth
//! with two queues (queue `q` on worker `q`, workers pinned to CPUs 0 and
//! 1); the peer is Calico's kernel VXLAN path with a "remote pod" address.
//! The peer's XPS is crossed: what its CPU 0 sends leaves on queue 1 and
//! what CPU 1 sends on queue 0. The peer's kernel answers a SYN on the CPU
//! that delivered it, which is the CPU of the worker that sent it, so every
//! SYN/ACK comes back to the OTHER worker's uplink queue. The pod has a
//! policy (ingress: TCP 8080 from the remote pods only; egress: to them),
//! so its flows are tracked and a reply that meets no entry is dropped
//! (`conntrack_invalid` for a SYN/ACK, the ingress program for an echo
//! reply). Without a worker that keeps the TAP pod's uplink flows
//! (`Worker::set_flow_home`) the pod's connections never complete.
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_policy_uplink -- --include-ignored`.

mod common;

use std::net::SocketAddr;

use anyhow::Result;
use brindle_api::vrouter::{Changed, PolicyEndpoint, PortSpec, Route, RouteTarget, VrouterRequest};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::resource::parse_documents;
use common::peer::{metric_sum as sum, metrics, vxlan_peer};
use common::{Netns, drops, serve, tap_pod, tap_port, tcp_ok, unique};

const POLICY: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: t, namespace: demo, labels: {app: t}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: t-remote, namespace: demo}
spec:
  podSelector: {matchLabels: {app: t}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ipBlock: {cidr: 10.66.9.0/24}}]
    ports: [{protocol: TCP, port: 8080}]
  egress:
  - to: [{ipBlock: {cidr: 10.66.9.0/24}}]
"#;

const METRICS: &str = "127.0.0.1:9095";

#[test]
#[ignore = "requires root and network namespaces"]
fn a_tap_pods_flows_with_the_uplink_meet_one_table_when_replies_reach_the_other_worker()
-> Result<()> {
    anyhow::ensure!(
        std::thread::available_parallelism()?.get() >= 2,
        "needs two CPUs (two workers)"
    );
    let node = Netns::new("tn")?;
    let underlay = vxlan_peer(&node)?;
    let (peer, u2) = (&underlay.peer, &underlay.peer_if);
    // Crossed XPS: CPU 0 transmits on queue 1 (worker 1's), CPU 1 on
    // queue 0 (worker 0's).
    for (q, mask) in [(0, "2"), (1, "1")] {
        peer.exec(&[
            "sh",
            "-c",
            &format!("echo {mask} > /sys/class/net/{u2}/queues/tx-{q}/xps_cpus"),
        ])?;
    }
    let pod = tap_pod("10.66.6.2", "02:b4:00:00:06:02")?;
    pod.ip(&["link", "set", "eth0", "mtu", "1450"])?;
    let pp = unique("tp");

    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS])?;
    underlay.serve(&node, &mut c)?;
    let tap = PortSpec {
        workload: Some(PolicyEndpoint::new("demo", "t")),
        ..tap_port(&pp, &pod, "10.66.6.2")
    };
    let _: Changed = c.call(&VrouterRequest::AddPorts { ports: vec![tap] })?;
    let _: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: vec![Route {
            prefix: "10.66.6.2/32".parse()?,
            target: RouteTarget::Local { port: pp.clone() },
        }],
    })?;

    let mut compiler = Compiler::new();
    let mut changes: Vec<Change> = parse_documents(POLICY)?
        .into_iter()
        .map(Change::Apply)
        .collect();
    changes.push(Change::Endpoint(
        PolicyEndpoint::new("demo", "t"),
        Some(EndpointInfo {
            addrs: vec!["10.66.6.2".parse()?],
            local: true,
        }),
    ));
    let applied: Changed = c.call(&VrouterRequest::ApplyPolicy {
        update: compiler.apply(changes),
    })?;
    assert_eq!(applied.changed, 1);

    // The pod's own connections: the SYN leaves from the worker of the
    // pod's queue (or the one it was handed to), the SYN/ACK comes back to
    // the other worker's uplink queue.
    let remote: SocketAddr = "10.66.9.1:8081".parse()?;
    for i in 0..4 {
        assert!(
            tcp_ok(peer, &pod, remote)?,
            "pod -> remote:8081, connection {i}"
        );
    }
    let out = pod.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.9.1"])?;
    assert!(out.contains("3 received"), "{out}");
    // Into the pod: 8080 allowed from the remote pods, 8081 denied.
    assert!(
        tcp_ok(&pod, peer, "10.66.6.2:8080".parse()?)?,
        "remote -> pod:8080"
    );
    assert!(
        !tcp_ok(&pod, peer, "10.66.6.2:8081".parse()?)?,
        "remote -> pod:8081 is denied"
    );
    assert_eq!(drops(&mut c, "conntrack_invalid")?, 0);
    assert!(drops(&mut c, "policy_denied")? >= 1);

    let m = metrics(&node, METRICS)?;
    // Replies crossed workers: what the uplink brought to the other worker
    // was handed to the one that keeps the pod's flows.
    let handed = sum(&m, "worker_handoff_out_total{", "");
    assert!(handed > 0, "no hand-off\n{m}");
    let keepers = m
        .lines()
        .filter(|l| l.starts_with("brindle_vrouter_worker_flows_new_total{"))
        .filter(|l| l.rsplit(' ').next().is_some_and(|v| v != "0"))
        .count();
    assert_eq!(keepers, 1, "the pod's flows live on one worker\n{m}");
    eprintln!(
        "handoff_out {handed} redirected {}",
        sum(&m, "worker_handoff_redirected_total{", "")
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}
