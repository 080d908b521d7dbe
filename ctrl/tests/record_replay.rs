//! Record and replay (no root): a speaker records its inputs while it
//! learns routes from another speaker on loopback; the recording, fed
//! through the FSM and RIB by `Replay`, gives the same RIB and the same
//! best-route changes. (The same with GoBGP and the whole daemon is in
//! `daemon_interop.rs`.)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use brindle_ctrl::bgp::record::Replay;
use brindle_ctrl::bgp::rib::{RouteChange, RouteEntry};
use brindle_ctrl::bgp::speaker::*;
use ipnet::IpNet;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Routes in a stable order, for comparison.
fn sorted(routes: Vec<RouteEntry>) -> Vec<String> {
    let mut v: Vec<String> = routes
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    v.sort();
    v
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_recorded_session_replays_to_the_same_rib_and_route_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bgp.jsonl");
    let (a_addr, b_addr): (Ipv4Addr, Ipv4Addr) =
        ("127.0.0.6".parse().unwrap(), "127.0.0.7".parse().unwrap());
    let mut cfg = SpeakerConfig::new(64512, a_addr);
    cfg.listen = Some(SocketAddr::new(IpAddr::V4(a_addr), 0));
    cfg.record = Some(file.clone());
    let (a, mut a_rx) = Speaker::start(cfg).await.unwrap();
    let mut cfg = SpeakerConfig::new(65010, b_addr);
    cfg.listen = Some(SocketAddr::new(IpAddr::V4(b_addr), 0));
    let (b, _b_rx) = Speaker::start(cfg).await.unwrap();

    let mut to_b = PeerConfig::new(IpAddr::V4(b_addr), 65010);
    to_b.port = b.listen_addr().unwrap().port();
    to_b.local_address = Some(IpAddr::V4(a_addr));
    to_b.connect_retry = 1;
    to_b.password = Some("not-in-the-recording".into());
    let mut to_a = PeerConfig::new(IpAddr::V4(a_addr), 64512);
    to_a.port = a.listen_addr().unwrap().port();
    to_a.local_address = Some(IpAddr::V4(b_addr));
    to_a.connect_retry = 1;
    to_a.password = Some("not-in-the-recording".into());
    a.add_peer(to_b).await.unwrap();
    b.add_peer(to_a).await.unwrap();
    a.announce(net("10.244.7.0/26"), IpAddr::V4(a_addr))
        .unwrap();
    for p in ["203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/25"] {
        b.announce(net(p), IpAddr::V4(b_addr)).unwrap();
    }
    eventually("a learns b's three routes", || async {
        a.routes().await.unwrap().len() == 4
    })
    .await;
    b.withdraw(net("198.51.100.0/24")).unwrap();
    eventually("the withdrawal reaches a", || async {
        a.routes().await.unwrap().len() == 3
    })
    .await;
    let live = a.routes().await.unwrap();
    assert!(live.iter().any(|r| r.prefix == net("203.0.113.0/24")
        && r.next_hop == ip("127.0.0.7")
        && r.as_path == vec![65010]
        && r.best));

    // The recording so far replays to the same table.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("not-in-the-recording"));
    assert!(text.lines().next().unwrap().contains("\"event\":\"start\""));
    let mut replay = Replay::from_text(&text).unwrap();
    assert_eq!(sorted(replay.routes()), sorted(live));
    let mut changes = Vec::new();
    while let Ok(c) = a_rx.try_recv() {
        changes.push(c);
    }
    assert_eq!(replay.take_changes(), changes);
    assert!(
        matches!(changes.last(), Some(RouteChange::Removed { prefix }) if *prefix == net("198.51.100.0/24"))
    );

    // b goes away with a Cease: a drops its routes, and so does the replay.
    b.shutdown().await;
    eventually("a forgets b's routes", || async {
        a.routes().await.unwrap().len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = std::fs::read_to_string(&file).unwrap();
    let replay = Replay::from_text(&text).unwrap();
    assert_eq!(sorted(replay.routes()), sorted(a.routes().await.unwrap()));
    assert_eq!(replay.routes().len(), 1);
    a.shutdown().await;
}
