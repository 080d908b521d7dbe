//! The real daemon with an explicit eBGP peer from its config file (a
//! top-of-rack router, played by our own speaker in the test): the peer
//! learns the node's block with the node as next hop, and the routes the
//! peer announces reach the vrouter as IPIP (inside the pool) and native
//! (outside every pool) routes.

mod daemon_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use brindle_api::framing::Client;
use brindle_api::vrouter::{Encap, RouteTarget};
use brindle_ctrl::bgp::rib::Source;
use brindle_ctrl::bgp::speaker::{PeerConfig, Speaker, SpeakerConfig};
use brindle_ctrl::programming::desired::Desired;
use daemon_support::{Daemon, FakeVrouter, free_port, wait_for};
use ipnet::IpNet;
use serde_json::Value;

#[test]
fn an_explicit_ebgp_peer_exchanges_routes_with_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let node: Ipv4Addr = "127.0.0.6".parse().unwrap();
    let tor: Ipv4Addr = "127.0.0.7".parse().unwrap();
    let (node_port, tor_port) = (free_port(), free_port());
    let config = format!(
        "node_name = \"node-x\"\nnode_address = \"{node}\"\n\
         [bgp]\nlisten_port = {node_port}\n\
         [[bgp.peers]]\naddress = \"{tor}\"\nas_number = 65001\nport = {tor_port}\n"
    );
    std::fs::write(dir.path().join("node.toml"), config).unwrap();
    let vrouter = FakeVrouter::start(&dir.path().join("vrouter.sock"), "boot-1");
    let env: Vec<(String, String)> = [
        (
            "BRINDLE_API_SOCKET",
            dir.path().join("ctrl.sock").display().to_string(),
        ),
        (
            "BRINDLE_VROUTER_SOCKET",
            dir.path().join("vrouter.sock").display().to_string(),
        ),
        (
            "BRINDLE_DATASTORE_PATH",
            dir.path().join("data").display().to_string(),
        ),
        ("BRINDLE_METRICS_LISTEN", format!("{node}:{}", free_port())),
        ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
        (
            "BRINDLE_CONFIG",
            dir.path().join("node.toml").display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let daemon = Daemon::start(&env, &dir.path().join("ctrl.sock"), &dir.path().join("log"));
    let mut c = Client::connect(dir.path().join("ctrl.sock"), Duration::from_secs(10)).unwrap();
    let r: Value = c
        .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
            "handle":{"network":"k8s-pod-network","container_id":"c1","ifname":"eth0"},
            "node":"node-x","attrs":{},"ipv4":true,"ipv6":false}))
        .unwrap();
    let block: IpNet = r["addresses"][0]["block"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cfg = SpeakerConfig::new(65001, tor);
    cfg.listen = Some(SocketAddr::new(IpAddr::V4(tor), tor_port));
    let (speaker, _changes) = rt.block_on(Speaker::start(cfg)).unwrap();
    let mut peer = PeerConfig::new(IpAddr::V4(node), 64512);
    peer.port = node_port;
    peer.local_address = Some(IpAddr::V4(tor));
    rt.block_on(speaker.add_peer(peer)).unwrap();
    let in_pool: IpNet = "10.244.250.0/26".parse().unwrap();
    let outside: IpNet = "203.0.113.0/24".parse().unwrap();
    speaker.announce(in_pool, IpAddr::V4(tor)).unwrap();
    speaker.announce(outside, IpAddr::V4(tor)).unwrap();

    // The router learns our block with the node as next hop.
    wait_for(
        "the router to learn the node's block",
        Duration::from_secs(60),
        || {
            rt.block_on(speaker.routes()).unwrap().iter().any(|r| {
                r.prefix == block
                    && r.next_hop == IpAddr::V4(node)
                    && r.source == Source::Peer(IpAddr::V4(node))
                    && r.as_path == [64512]
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));

    // The node programs the router's routes.
    let routes = || {
        let mut d = Desired::default();
        for r in vrouter.requests() {
            d.apply(&r);
        }
        d.routes
    };
    wait_for(
        "the router's routes in the vrouter",
        Duration::from_secs(60),
        || {
            let r = routes();
            r.get(&in_pool)
                == Some(&RouteTarget::Encap {
                    encap: Encap::Ipip,
                    remote: tor,
                })
                && r.get(&outside)
                    == Some(&RouteTarget::Gateway {
                        via: IpAddr::V4(tor),
                        port: "eth0".into(),
                    })
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", routes(), daemon.log()));

    // The router withdraws one: the vrouter loses it.
    speaker.withdraw(outside).unwrap();
    wait_for(
        "the withdrawal in the vrouter",
        Duration::from_secs(30),
        || !routes().contains_key(&outside),
    )
    .unwrap();
    assert!(routes().contains_key(&in_pool));
    rt.block_on(speaker.shutdown());
}
