//! Three real `brindle-ctrl` daemons sharing one real etcd form a BGP full
//! mesh (or peer through a route reflector) from the node registry, and each programs (into its own fake
//! vrouter) IPIP routes to the other two nodes' blocks.
//!
//! The nodes are 127.0.0.1, .2 and .3 on the loopback interface rather than
//! three network namespaces: the whole 127/8 is local on Linux, so each
//! daemon binds and sources its BGP sessions from its own address, and all
//! of them reach the one etcd on 127.0.0.1 without a shared bridge. This
//! needs no root and tests the same thing (registry → mesh → routes → vrouter
//! programming, withdrawal when a node stops, a crashed node's lease running
//! out); the namespace-level data path is the vrouter's to test.

mod daemon_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use brindle_api::framing::Client;
use brindle_api::vrouter::{Encap, RouteTarget};
use brindle_ctrl::programming::desired::Desired;
use daemon_support::{Daemon, Etcd, FakeVrouter, free_port, wait_for};
use ipnet::IpNet;
use serde_json::Value;

struct Node {
    address: Ipv4Addr,
    vrouter: FakeVrouter,
    daemon: Daemon,
    block: IpNet,
}

impl Node {
    /// The routes the fake vrouter holds (requests replayed in order).
    fn routes(&self) -> BTreeMap<IpNet, RouteTarget> {
        let mut d = Desired::default();
        for r in self.vrouter.requests() {
            d.apply(&r);
        }
        d.routes
    }

    /// The tunnel peers in the last `SetNode`.
    fn tunnel_peers(&self) -> Vec<Ipv4Addr> {
        let mut d = Desired::default();
        for r in self.vrouter.requests() {
            d.apply(&r);
        }
        d.node.map(|n| n.tunnel_peers).unwrap_or_default()
    }
}

/// Starts etcd and three daemons (node 1 a route reflector and the mesh
/// off when `reflector`), claims a block on each, and waits until each
/// vrouter has IPIP routes to the other two blocks.
fn three_nodes(top: &Path, etcd: &Etcd, reflector: bool) -> Vec<Node> {
    let bgp_port = free_port();
    let mut nodes = Vec::new();
    for i in 1..=3u8 {
        let dir = top.join(format!("n{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let address = Ipv4Addr::new(127, 0, 0, i);
        let vrouter = FakeVrouter::start(&dir.join("vrouter.sock"), &format!("boot-{i}"));
        let env: Vec<(String, String)> = [
            ("BRINDLE_NODE_NAME", format!("node-{i}")),
            ("BRINDLE_NODE_ADDRESS", address.to_string()),
            (
                "BRINDLE_API_SOCKET",
                dir.join("ctrl.sock").display().to_string(),
            ),
            (
                "BRINDLE_VROUTER_SOCKET",
                dir.join("vrouter.sock").display().to_string(),
            ),
            ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
            ("BRINDLE_DATASTORE_TYPE", "etcd".into()),
            ("BRINDLE_DATASTORE_ENDPOINTS", etcd.url.clone()),
            ("BRINDLE_BGP_LISTEN_PORT", bgp_port.to_string()),
            ("BRINDLE_BGP_HOLD_TIME_SECS", "9".into()),
            ("BRINDLE_BGP_NODE_LEASE_SECS", "3".into()),
            ("BRINDLE_BGP_NODE_TO_NODE_MESH", (!reflector).to_string()),
            (
                "BRINDLE_BGP_ROUTE_REFLECTOR",
                (reflector && i == 1).to_string(),
            ),
            (
                "BRINDLE_METRICS_LISTEN",
                format!("{address}:{}", free_port()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let daemon = Daemon::start(&env, &dir.join("ctrl.sock"), &dir.join("log"));
        // One pod address claims a block for this node.
        let mut c = Client::connect(dir.join("ctrl.sock"), Duration::from_secs(20)).unwrap();
        let r: Value = c
            .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
                "handle":{"network":"k8s-pod-network","container_id":format!("c{i}"),"ifname":"eth0"},
                "node":format!("node-{i}"),"attrs":{},"ipv4":true,"ipv6":false}))
            .unwrap();
        let block: IpNet = r["addresses"][0]["block"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        nodes.push(Node {
            address,
            vrouter,
            daemon,
            block,
        });
    }
    assert_ne!(nodes[0].block, nodes[1].block);
    assert_ne!(nodes[1].block, nodes[2].block);

    for me in &nodes {
        let expected: Vec<(IpNet, RouteTarget)> = nodes
            .iter()
            .filter(|n| n.address != me.address)
            .map(|n| {
                (
                    n.block,
                    RouteTarget::Encap {
                        encap: Encap::Ipip,
                        remote: n.address,
                    },
                )
            })
            .collect();
        wait_for(
            "routes to the other two blocks",
            Duration::from_secs(60),
            || {
                let routes = me.routes();
                expected.iter().all(|(p, t)| routes.get(p) == Some(t))
            },
        )
        .unwrap_or_else(|e| {
            panic!(
                "{} {e}: has {:?}\n{}",
                me.address,
                me.routes(),
                me.daemon.log()
            )
        });
        // Tunnel packets are accepted from the other two nodes only.
        let others: Vec<Ipv4Addr> = nodes
            .iter()
            .map(|n| n.address)
            .filter(|a| *a != me.address)
            .collect();
        wait_for("the tunnel peers", Duration::from_secs(30), || {
            me.tunnel_peers() == others
        })
        .unwrap_or_else(|e| panic!("{e}: {:?}", me.tunnel_peers()));
        // Its own block is a blackhole (more specific /32s go to pods).
        assert_eq!(me.routes().get(&me.block), Some(&RouteTarget::Blackhole));
    }
    nodes
}

#[test]
#[ignore = "starts a real etcd and three daemons (needs etcd-server)"]
fn route_reflection_without_the_mesh_gives_the_same_routes() {
    let top = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(top.path());
    let nodes = three_nodes(top.path(), &etcd, true);
    // Nodes 2 and 3 have one session each, to the reflector, and still
    // learned each other's block with the other's address as next hop.
    for n in &nodes[1..] {
        let mut c = Client::connect(&n.daemon.socket, Duration::from_secs(10)).unwrap();
        let peers: Value = c
            .call(&brindle_ctrl::ctrl_api::CtrlRequest::CtrlBgpPeers)
            .unwrap();
        let addrs: Vec<&str> = peers
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["address"].as_str().unwrap())
            .collect();
        assert_eq!(addrs, ["127.0.0.1"], "{peers}");
    }
    drop(nodes);
    drop(etcd);
}

#[test]
#[ignore = "starts a real etcd and three daemons (needs etcd-server)"]
fn three_daemons_form_a_full_mesh_and_program_each_others_blocks() {
    let top = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(top.path());
    let mut nodes = three_nodes(top.path(), &etcd, false);

    // Node 3 stops: it sends Cease, so the others withdraw its block at
    // once (no graceful-restart hold for an administrative shutdown).
    let mut third = nodes.pop().unwrap();
    third.daemon.stop();
    for me in &nodes {
        wait_for(
            "the stopped node's block to go",
            Duration::from_secs(30),
            || !me.routes().contains_key(&third.block),
        )
        .unwrap_or_else(|e| panic!("{} {e}: has {:?}", me.address, me.routes()));
        let other = nodes.iter().find(|n| n.address != me.address).unwrap();
        assert!(me.routes().contains_key(&other.block));
    }
    drop(third);

    // Node 2 crashes (SIGKILL: no Cease). Its session fails, and since it
    // announced graceful restart node 1 would hold its routes for 120 s;
    // its registry lease (3 s) runs out first, the mesh drops it as a peer
    // and its block goes.
    let mut second = nodes.pop().unwrap();
    second.daemon.kill();
    let first = &nodes[0];
    wait_for(
        "the crashed node's block to go",
        Duration::from_secs(60),
        || !first.routes().contains_key(&second.block),
    )
    .unwrap_or_else(|e| panic!("{e}: has {:?}\n{}", first.routes(), first.daemon.log()));
    let mut c = Client::connect(&first.daemon.socket, Duration::from_secs(10)).unwrap();
    let status: Value = c
        .call(&brindle_ctrl::ctrl_api::CtrlRequest::CtrlNodeStatus)
        .unwrap();
    let live: Vec<(String, bool)> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_owned(),
                n["live"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(live.contains(&("node-1".into(), true)), "{live:?}");
    assert!(live.contains(&("node-2".into(), false)), "{live:?}");
    drop(second);
    drop(nodes);
    drop(etcd);
}
