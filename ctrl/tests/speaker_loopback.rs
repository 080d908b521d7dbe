//! Two of our speakers on loopback addresses (no root needed): sessions,
//! route exchange, withdrawal, max-prefix and shutdown through the public
//! API.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use brindle_ctrl::bgp::fsm::State;
use brindle_ctrl::bgp::rib::{RouteChange, Source};
use brindle_ctrl::bgp::speaker::*;
use ipnet::IpNet;
use tokio::sync::mpsc::UnboundedReceiver;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn speaker(addr: &str, asn: u32) -> (Speaker, UnboundedReceiver<RouteChange>) {
    let a: Ipv4Addr = addr.parse().unwrap();
    let mut cfg = SpeakerConfig::new(asn, a);
    cfg.listen = Some(SocketAddr::new(IpAddr::V4(a), 0));
    Speaker::start(cfg).await.unwrap()
}

fn peer_of(other: &Speaker, other_addr: &str, local: &str, asn: u32) -> PeerConfig {
    let mut p = PeerConfig::new(ip(other_addr), asn);
    p.port = other.listen_addr().unwrap().port();
    p.local_address = Some(ip(local));
    p.connect_retry = 1;
    p
}

/// Polls `check` until it holds; a bound only so that a broken build fails
/// instead of hanging.
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

async fn next_change(rx: &mut UnboundedReceiver<RouteChange>) -> RouteChange {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .expect("a route change")
        .expect("speaker running")
}

async fn state_of(s: &Speaker, peer: &str) -> State {
    s.peers()
        .await
        .unwrap()
        .iter()
        .find(|p| p.address == ip(peer))
        .unwrap()
        .state
}

#[tokio::test]
async fn ibgp_speakers_exchange_routes_and_withdraw_them() {
    let (a, _a_rx) = speaker("127.0.0.2", 64512).await;
    let (b, mut b_rx) = speaker("127.0.0.3", 64512).await;
    a.add_peer(peer_of(&b, "127.0.0.3", "127.0.0.2", 64512))
        .await
        .unwrap();
    b.add_peer(peer_of(&a, "127.0.0.2", "127.0.0.3", 64512))
        .await
        .unwrap();
    eventually("established", || async {
        state_of(&a, "127.0.0.3").await == State::Established
            && state_of(&b, "127.0.0.2").await == State::Established
    })
    .await;

    let block: IpNet = "10.244.1.0/26".parse().unwrap();
    a.announce(block, ip("127.0.0.2")).unwrap();
    match next_change(&mut b_rx).await {
        RouteChange::Added(r) => {
            assert_eq!(
                (r.prefix, r.next_hop, r.peer),
                (block, ip("127.0.0.2"), ip("127.0.0.2"))
            );
        }
        other => panic!("{other:?}"),
    }
    let routes = b.routes().await.unwrap();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].source, Source::Peer(ip("127.0.0.2")));
    let peers = a.peers().await.unwrap();
    assert_eq!((peers[0].prefixes_out, peers[0].prefixes_in), (1, 0));

    a.withdraw(block).unwrap();
    assert_eq!(
        next_change(&mut b_rx).await,
        RouteChange::Removed { prefix: block }
    );

    // Shutdown sends Cease; the other side drops the routes at once.
    a.announce(block, ip("127.0.0.2")).unwrap();
    assert!(matches!(
        next_change(&mut b_rx).await,
        RouteChange::Added(_)
    ));
    a.shutdown().await;
    assert_eq!(
        next_change(&mut b_rx).await,
        RouteChange::Removed { prefix: block }
    );
    let st = &b.peers().await.unwrap()[0];
    assert_ne!(st.state, State::Established);
    assert_eq!(st.last_error.as_deref(), Some("received NOTIFICATION 6/2"));
    b.shutdown().await;
}

#[tokio::test]
async fn ebgp_peer_over_its_prefix_limit_is_closed_with_cease_max_prefixes() {
    let (a, _a_rx) = speaker("127.0.0.4", 65001).await;
    let (b, _b_rx) = speaker("127.0.0.5", 65002).await;
    for i in 0..3u8 {
        a.announce(format!("10.{i}.0.0/16").parse().unwrap(), ip("127.0.0.4"))
            .unwrap();
    }
    let mut limited = peer_of(&a, "127.0.0.4", "127.0.0.5", 65001);
    limited.max_prefixes = Some(2);
    a.add_peer(peer_of(&b, "127.0.0.5", "127.0.0.4", 65002))
        .await
        .unwrap();
    b.add_peer(limited).await.unwrap();
    eventually("max-prefix teardown", || async {
        b.peers().await.unwrap()[0].last_error.as_deref() == Some("sent NOTIFICATION 6/1")
    })
    .await;
    assert_eq!(state_of(&b, "127.0.0.4").await, State::Idle);
    assert!(b.routes().await.unwrap().is_empty());
    eventually("peer told", || async {
        a.peers().await.unwrap()[0].last_error.as_deref() == Some("received NOTIFICATION 6/1")
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn ebgp_routes_carry_the_senders_as_and_session_address() {
    let (a, _a_rx) = speaker("127.0.0.6", 65001).await;
    let (b, mut b_rx) = speaker("127.0.0.7", 4_200_000_002).await;
    a.add_peer(peer_of(&b, "127.0.0.7", "127.0.0.6", 4_200_000_002))
        .await
        .unwrap();
    b.add_peer(peer_of(&a, "127.0.0.6", "127.0.0.7", 65001))
        .await
        .unwrap();
    // The next hop given to announce is for iBGP; eBGP peers get the
    // session address (next-hop-self).
    a.announce("10.7.0.0/24".parse().unwrap(), ip("192.0.2.1"))
        .unwrap();
    match next_change(&mut b_rx).await {
        RouteChange::Added(r) => {
            assert_eq!(r.next_hop, ip("127.0.0.6"));
            assert_eq!(r.as_path, vec![65001]);
        }
        other => panic!("{other:?}"),
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn invalid_peer_config_is_refused_before_anything_starts() {
    let (a, _rx) = speaker("127.0.0.8", 65001).await;
    let mut p = PeerConfig::new(ip("127.0.0.9"), 65002);
    p.hold_time = 2;
    assert!(matches!(
        a.add_peer(p).await,
        Err(SpeakerError::InvalidPeer { .. })
    ));
    let p = PeerConfig::new(ip("127.0.0.9"), 65002);
    a.add_peer(p.clone()).await.unwrap();
    assert!(matches!(
        a.add_peer(p).await,
        Err(SpeakerError::PeerExists(_))
    ));
    a.remove_peer(ip("127.0.0.9")).await.unwrap();
    assert!(matches!(
        a.remove_peer(ip("127.0.0.9")).await,
        Err(SpeakerError::NoSuchPeer(_))
    ));
    a.shutdown().await;
}

#[tokio::test]
async fn routes_of_a_peer_that_dies_are_held_for_its_restart_time_then_removed() {
    let a_addr: Ipv4Addr = "127.0.0.10".parse().unwrap();
    let mut cfg = SpeakerConfig::new(64512, a_addr);
    cfg.listen = Some(SocketAddr::new(IpAddr::V4(a_addr), 0));
    cfg.graceful_restart_time = Some(2);
    let (a, _a_rx) = Speaker::start(cfg).await.unwrap();
    let (b, mut b_rx) = speaker("127.0.0.11", 64512).await;
    a.add_peer(peer_of(&b, "127.0.0.11", "127.0.0.10", 64512))
        .await
        .unwrap();
    let mut to_a = peer_of(&a, "127.0.0.10", "127.0.0.11", 64512);
    // Only A may reconnect: B must not bring the session back up.
    to_a.passive = true;
    b.add_peer(to_a).await.unwrap();
    let block: IpNet = "10.244.9.0/26".parse().unwrap();
    a.announce(block, ip("127.0.0.10")).unwrap();
    assert!(matches!(
        next_change(&mut b_rx).await,
        RouteChange::Added(_)
    ));

    // A dies without a NOTIFICATION: B keeps forwarding on the stale route.
    drop(a);
    eventually("session down", || async {
        state_of(&b, "127.0.0.10").await != State::Established
    })
    .await;
    let routes = b.routes().await.unwrap();
    assert_eq!(routes.len(), 1);
    assert!(routes[0].stale, "{routes:?}");
    assert!(b_rx.try_recv().is_err(), "no change for the dataplane yet");
    // After A's restart time (2 s) the route goes.
    assert_eq!(
        next_change(&mut b_rx).await,
        RouteChange::Removed { prefix: block }
    );
    assert!(b.routes().await.unwrap().is_empty());
    b.shutdown().await;
}
