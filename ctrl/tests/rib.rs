//! Best-path selection, route reflection, split horizon and the
//! Adj-RIB-In/Out bookkeeping.

use std::net::{IpAddr, Ipv4Addr};

use brindle_ctrl::bgp::packet::*;
use brindle_ctrl::bgp::rib::*;
use ipnet::{IpNet, Ipv4Net};

const LOCAL_AS: u32 = 64512;
const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn peer(addr: &str, remote_as: u32, rr_client: bool) -> PeerInfo {
    let a: Ipv4Addr = addr.parse().unwrap();
    PeerInfo {
        addr: IpAddr::V4(a),
        remote_as,
        router_id: a,
        rr_client,
        local_v4: Some(ME),
        local_v6: Some("fd00::1".parse().unwrap()),
        families: vec![(AFI_IPV4, SAFI_UNICAST), (AFI_IPV6, SAFI_UNICAST)],
    }
}

fn attrs(path: Vec<u32>, next_hop: &str) -> Attrs {
    Attrs {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::sequence(path)),
        next_hop: Some(next_hop.parse().unwrap()),
        ..Default::default()
    }
}

fn announce(prefixes: &[&str], a: Attrs) -> UpdateMsg {
    UpdateMsg {
        attrs: Some(a),
        nlri: prefixes
            .iter()
            .map(|p| p.parse::<Ipv4Net>().unwrap())
            .collect(),
        ..Default::default()
    }
}

fn withdraw(prefixes: &[&str]) -> UpdateMsg {
    UpdateMsg {
        withdrawn: prefixes
            .iter()
            .map(|p| p.parse::<Ipv4Net>().unwrap())
            .collect(),
        ..Default::default()
    }
}

fn rib_with(peers: &[PeerInfo]) -> Rib {
    let mut rib = Rib::new(LOCAL_AS, ME, None);
    for p in peers {
        rib.peer_up(p.clone());
    }
    rib
}

fn best_peer(rib: &Rib, prefix: &str) -> Option<Source> {
    rib.best(&net(prefix)).map(|p| p.source)
}

fn nlri_of(msgs: &[UpdateMsg]) -> Vec<IpNet> {
    msgs.iter()
        .flat_map(|m| {
            m.nlri
                .iter()
                .map(|n| IpNet::V4(*n))
                .chain(m.mp_reach.iter().flat_map(|r| r.nlri.clone()))
        })
        .collect()
}

#[test]
fn higher_local_pref_wins() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let b = peer("10.0.0.3", LOCAL_AS, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                local_pref: Some(100),
                ..attrs(vec![], "10.0.0.2")
            },
        ),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        b.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                local_pref: Some(200),
                ..attrs(vec![65000, 65001], "10.0.0.3")
            },
        ),
        None,
    )
    .unwrap();
    assert_eq!(best_peer(&rib, "10.1.0.0/16"), Some(Source::Peer(b.addr)));
}

#[test]
fn shorter_as_path_wins() {
    let a = peer("10.0.0.2", 65001, false);
    let b = peer("10.0.0.3", 65002, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65001, 65100], "10.0.0.2")),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        b.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65002], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert_eq!(best_peer(&rib, "10.1.0.0/16"), Some(Source::Peer(b.addr)));
}

#[test]
fn lower_origin_wins() {
    let a = peer("10.0.0.2", 65001, false);
    let b = peer("10.0.0.3", 65002, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                origin: Some(Origin::Incomplete),
                ..attrs(vec![65001], "10.0.0.2")
            },
        ),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        b.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                origin: Some(Origin::Egp),
                ..attrs(vec![65002], "10.0.0.3")
            },
        ),
        None,
    )
    .unwrap();
    assert_eq!(best_peer(&rib, "10.1.0.0/16"), Some(Source::Peer(b.addr)));
}

#[test]
fn lower_med_wins_between_paths_from_the_same_neighbour_as() {
    let a = peer("10.0.0.3", 65001, false);
    let b = peer("10.0.0.2", 65001, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                med: Some(5),
                ..attrs(vec![65001], "10.0.0.3")
            },
        ),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        b.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                med: Some(50),
                ..attrs(vec![65001], "10.0.0.2")
            },
        ),
        None,
    )
    .unwrap();
    assert_eq!(
        best_peer(&rib, "10.1.0.0/16"),
        Some(Source::Peer(a.addr)),
        "MED 5 beats the lower router ID"
    );
}

#[test]
fn ebgp_path_is_preferred_over_ibgp_path() {
    let i = peer("10.0.0.2", LOCAL_AS, false);
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(&[i.clone(), e.clone()]);
    rib.update_from_peer(
        i.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65001], "10.0.0.2")),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        e.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65001], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert_eq!(best_peer(&rib, "10.1.0.0/16"), Some(Source::Peer(e.addr)));
}

#[test]
fn lowest_router_id_breaks_the_tie() {
    let a = peer("10.0.0.9", LOCAL_AS, false);
    let b = peer("10.0.0.4", LOCAL_AS, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.9")),
        None,
    )
    .unwrap();
    rib.update_from_peer(
        b.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.4")),
        None,
    )
    .unwrap();
    assert_eq!(best_peer(&rib, "10.1.0.0/16"), Some(Source::Peer(b.addr)));
}

#[test]
fn route_changes_report_added_changed_and_removed_with_next_hop_and_peer() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let b = peer("10.0.0.3", LOCAL_AS, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        b.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert_eq!(
        rib.take_changes(),
        vec![RouteChange::Added(BestRoute {
            prefix: net("10.1.0.0/16"),
            next_hop: ip("10.0.0.3"),
            peer: b.addr,
            as_path: vec![]
        })]
    );
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    assert_eq!(
        rib.take_changes(),
        vec![RouteChange::Changed(BestRoute {
            prefix: net("10.1.0.0/16"),
            next_hop: ip("10.0.0.2"),
            peer: a.addr,
            as_path: vec![]
        })]
    );
    rib.update_from_peer(a.addr, &withdraw(&["10.1.0.0/16"]), None)
        .unwrap();
    assert!(matches!(&rib.take_changes()[..], [RouteChange::Changed(r)] if r.peer == b.addr));
    rib.peer_down(b.addr, false);
    assert_eq!(
        rib.take_changes(),
        vec![RouteChange::Removed {
            prefix: net("10.1.0.0/16")
        }]
    );
    assert!(rib.routes().is_empty());
}

#[test]
fn local_routes_never_become_route_changes() {
    let mut rib = rib_with(&[]);
    rib.announce_local(net("10.9.0.0/26"), ip("10.0.0.1"));
    assert!(rib.take_changes().is_empty());
    assert_eq!(rib.routes().len(), 1);
}

#[test]
fn local_route_goes_to_ibgp_peers_with_next_hop_self_and_local_pref() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    rib.announce_local(net("10.9.0.0/26"), ip("10.0.0.1"));
    let dirty = rib.take_dirty();
    let msgs = rib.updates_for(a.addr, &dirty);
    assert_eq!(msgs.len(), 1);
    let at = msgs[0].attrs.as_ref().unwrap();
    assert_eq!(at.next_hop, Some(ME));
    assert_eq!(at.local_pref, Some(100));
    assert_eq!(at.as_path, Some(AsPath::default()));
    assert_eq!(rib.prefixes_out(a.addr), 1);
    assert!(
        rib.updates_for(a.addr, &dirty).is_empty(),
        "Adj-RIB-Out sends differences only"
    );
}

#[test]
fn export_to_ebgp_prepends_our_as_sets_next_hop_self_and_strips_local_pref() {
    let i = peer("10.0.0.2", LOCAL_AS, false);
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(&[i.clone(), e.clone()]);
    rib.update_from_peer(
        i.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                local_pref: Some(300),
                med: Some(7),
                ..attrs(vec![], "10.0.0.2")
            },
        ),
        None,
    )
    .unwrap();
    let msgs = rib.updates_for(e.addr, &rib.all_prefixes());
    let at = msgs[0].attrs.as_ref().unwrap();
    assert_eq!(at.as_path, Some(AsPath::sequence(vec![LOCAL_AS])));
    assert_eq!(at.next_hop, Some(ME));
    assert_eq!(at.local_pref, None);
    assert_eq!(at.med, Some(7), "MED from inside our AS may go out");
}

#[test]
fn ibgp_learned_routes_are_not_sent_to_other_ibgp_peers() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let b = peer("10.0.0.3", LOCAL_AS, false);
    let mut rib = rib_with(&[a.clone(), b.clone()]);
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    assert!(rib.updates_for(b.addr, &rib.all_prefixes()).is_empty());
    assert!(
        rib.updates_for(a.addr, &rib.all_prefixes()).is_empty(),
        "never back to the sender"
    );
}

#[test]
fn reflector_sends_client_routes_to_every_ibgp_peer_with_originator_and_cluster_list() {
    let client = peer("10.0.0.2", LOCAL_AS, true);
    let other_client = peer("10.0.0.3", LOCAL_AS, true);
    let non_client = peer("10.0.0.4", LOCAL_AS, false);
    let mut rib = rib_with(&[client.clone(), other_client.clone(), non_client.clone()]);
    rib.update_from_peer(
        client.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    for to in [other_client.addr, non_client.addr] {
        let msgs = rib.updates_for(to, &rib.all_prefixes());
        assert_eq!(nlri_of(&msgs), vec![net("10.1.0.0/16")], "to {to}");
        let at = msgs[0].attrs.as_ref().unwrap();
        assert_eq!(at.originator_id, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(at.cluster_list, vec![ME]);
        assert_eq!(
            at.next_hop,
            Some(Ipv4Addr::new(10, 0, 0, 2)),
            "next hop unchanged"
        );
    }
    assert!(rib.updates_for(client.addr, &rib.all_prefixes()).is_empty());
}

#[test]
fn reflector_sends_non_client_routes_only_to_clients() {
    let client = peer("10.0.0.2", LOCAL_AS, true);
    let non_client = peer("10.0.0.4", LOCAL_AS, false);
    let other_non_client = peer("10.0.0.5", LOCAL_AS, false);
    let mut rib = rib_with(&[client.clone(), non_client.clone(), other_non_client.clone()]);
    rib.update_from_peer(
        non_client.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.4")),
        None,
    )
    .unwrap();
    assert_eq!(
        nlri_of(&rib.updates_for(client.addr, &rib.all_prefixes())),
        vec![net("10.1.0.0/16")]
    );
    assert!(
        rib.updates_for(other_non_client.addr, &rib.all_prefixes())
            .is_empty()
    );
}

#[test]
fn reflected_route_carrying_our_cluster_id_is_dropped() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = Rib::new(LOCAL_AS, ME, Some(Ipv4Addr::new(1, 1, 1, 1)));
    rib.peer_up(a.clone());
    let looped = Attrs {
        cluster_list: vec![Ipv4Addr::new(1, 1, 1, 1)],
        ..attrs(vec![], "10.0.0.2")
    };
    rib.update_from_peer(a.addr, &announce(&["10.1.0.0/16"], looped), None)
        .unwrap();
    assert!(rib.routes().is_empty());
}

#[test]
fn reflected_route_carrying_our_router_id_as_originator_is_dropped() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    let looped = Attrs {
        originator_id: Some(ME),
        ..attrs(vec![], "10.0.0.2")
    };
    rib.update_from_peer(a.addr, &announce(&["10.1.0.0/16"], looped), None)
        .unwrap();
    assert!(rib.routes().is_empty());
}

#[test]
fn ebgp_route_with_our_as_in_the_path_is_dropped() {
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(std::slice::from_ref(&e));
    rib.update_from_peer(
        e.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65001, LOCAL_AS], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert!(rib.routes().is_empty());
}

#[test]
fn no_export_routes_stay_inside_the_as() {
    let i = peer("10.0.0.2", LOCAL_AS, false);
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(&[i.clone(), e.clone()]);
    rib.update_from_peer(
        i.addr,
        &announce(
            &["10.1.0.0/16"],
            Attrs {
                communities: vec![NO_EXPORT],
                ..attrs(vec![], "10.0.0.2")
            },
        ),
        None,
    )
    .unwrap();
    assert!(rib.updates_for(e.addr, &rib.all_prefixes()).is_empty());
}

#[test]
fn treat_as_withdraw_update_removes_the_announced_prefix() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    let mut bad = announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2"));
    bad.treat_as_withdraw = Some(UpdateError::MalformedAsPath);
    rib.update_from_peer(a.addr, &bad, None).unwrap();
    assert!(rib.routes().is_empty());
    assert_eq!(rib.prefixes_in(a.addr), 0);
}

#[test]
fn more_prefixes_than_the_limit_is_reported() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    let r = rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16", "10.2.0.0/16"], attrs(vec![], "10.0.0.2")),
        Some(2),
    );
    assert_eq!(r, Ok(()));
    let r = rib.update_from_peer(
        a.addr,
        &announce(&["10.3.0.0/16"], attrs(vec![], "10.0.0.2")),
        Some(2),
    );
    assert_eq!(
        r,
        Err(MaxPrefixExceeded {
            afi: 1,
            safi: 1,
            limit: 2
        })
    );
}

#[test]
fn graceful_restart_keeps_stale_routes_until_end_of_rib() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16", "10.2.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    rib.take_changes();
    rib.peer_down(a.addr, true);
    assert!(
        rib.take_changes().is_empty(),
        "the dataplane keeps forwarding"
    );
    assert!(rib.routes().iter().all(|r| r.stale));
    rib.peer_up(a.clone());
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    rib.end_of_rib(a.addr, (AFI_IPV4, SAFI_UNICAST));
    let routes = rib.routes();
    assert_eq!(routes.len(), 1);
    assert_eq!(
        (routes[0].prefix, routes[0].stale),
        (net("10.1.0.0/16"), false)
    );
    assert_eq!(
        rib.take_changes(),
        vec![RouteChange::Removed {
            prefix: net("10.2.0.0/16")
        }]
    );
}

#[test]
fn restart_timer_expiry_removes_all_stale_routes() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    rib.update_from_peer(
        a.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![], "10.0.0.2")),
        None,
    )
    .unwrap();
    rib.peer_down(a.addr, true);
    rib.remove_stale(a.addr, None);
    assert!(rib.routes().is_empty());
}

#[test]
fn ipv6_routes_go_out_in_mp_reach_with_our_ipv6_next_hop() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let mut rib = rib_with(std::slice::from_ref(&a));
    rib.announce_local(net("fd10::/122"), ip("fd00::1"));
    let msgs = rib.updates_for(a.addr, &rib.all_prefixes());
    let r = msgs[0].mp_reach.as_ref().unwrap();
    assert_eq!((r.afi, r.next_hop), (AFI_IPV6, ip("fd00::1")));
    assert_eq!(r.nlri, vec![net("fd10::/122")]);
    rib.withdraw_local(net("fd10::/122"));
    let dirty = rib.take_dirty();
    let msgs = rib.updates_for(a.addr, &dirty);
    assert_eq!(
        msgs[0].mp_unreach.as_ref().unwrap().withdrawn,
        vec![net("fd10::/122")]
    );
}

#[test]
fn prefixes_with_the_same_attributes_share_one_update() {
    let a = peer("10.0.0.2", LOCAL_AS, false);
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(&[a.clone(), e.clone()]);
    let many: Vec<String> = (0..1000)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    rib.update_from_peer(a.addr, &announce(&refs, attrs(vec![], "10.0.0.2")), None)
        .unwrap();
    let msgs = rib.updates_for(e.addr, &rib.all_prefixes());
    assert_eq!(msgs.len(), 2, "1000 prefixes in UPDATEs of at most 600");
    assert_eq!(nlri_of(&msgs).len(), 1000);
    for m in &msgs {
        assert!(
            Message::Update(m.clone())
                .encode(&EncodeCxt::default())
                .len()
                <= MAX_MESSAGE_LEN
        );
    }
}

#[test]
fn ebgp_route_whose_path_does_not_start_with_the_peers_as_is_dropped() {
    let e = peer("10.0.0.3", 65001, false);
    let mut rib = rib_with(std::slice::from_ref(&e));
    rib.update_from_peer(
        e.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65099], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert!(rib.routes().is_empty());
    rib.update_from_peer(
        e.addr,
        &announce(&["10.1.0.0/16"], attrs(vec![65001, 65099], "10.0.0.3")),
        None,
    )
    .unwrap();
    assert_eq!(rib.routes().len(), 1);
}
