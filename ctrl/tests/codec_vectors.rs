//! Decode every BGP message of a recorded BIRD 2 <-> GoBGP session
//! (tests/vectors/README.md) and check the fields and the round trip.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use brindle_ctrl::bgp::packet::*;
use ipnet::{IpNet, Ipv4Net};

struct Vector {
    name: String,
    bytes: Vec<u8>,
}

fn vectors() -> Vec<Vector> {
    include_str!("vectors/session.hex")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next().unwrap().to_string();
            let _receiver = f.next().unwrap();
            let bytes = hex::decode(f.next().unwrap()).unwrap();
            Vector { name, bytes }
        })
        .collect()
}

fn get(name: &str) -> Vec<u8> {
    vectors()
        .into_iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no vector {name}"))
        .bytes
}

fn cxt() -> DecodeCxt {
    DecodeCxt::default()
}

fn decode_update(name: &str) -> UpdateMsg {
    match Message::decode(&get(name), &cxt()).unwrap() {
        Message::Update(u) => u,
        other => panic!("{name} is not an UPDATE: {other:?}"),
    }
}

#[test]
fn every_captured_message_decodes_and_round_trips() {
    let all = vectors();
    assert!(all.len() >= 20, "only {} vectors", all.len());
    for v in all {
        assert_eq!(
            get_message_len(&v.bytes).unwrap(),
            Some(v.bytes.len()),
            "{}",
            v.name
        );
        let msg = Message::decode(&v.bytes, &cxt()).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let kind = v.name.rsplit('-').nth(1).unwrap();
        let matches = matches!(
            (&msg, kind),
            (Message::Open(_), "open")
                | (Message::Update(_), "update")
                | (Message::Notification(_), "notification")
                | (Message::Keepalive, "keepalive")
                | (Message::RouteRefresh(_), "route_refresh")
        );
        assert!(matches, "{}: decoded as {msg:?}", v.name);
        let again = msg.encode(&EncodeCxt::default());
        assert_eq!(
            Message::decode(&again, &cxt()).unwrap(),
            msg,
            "{}: re-encoded {}",
            v.name,
            hex::encode(&again)
        );
        // Byte for byte, except where the RFCs leave a choice: how OPEN
        // capabilities are grouped into optional parameters and when an
        // attribute uses the extended length.
        if matches!(
            msg,
            Message::Keepalive | Message::Notification(_) | Message::RouteRefresh(_)
        ) {
            assert_eq!(hex::encode(&again), hex::encode(&v.bytes), "{}", v.name);
        }
    }
}

#[test]
fn bird_open_announces_multiprotocol_four_octet_as_and_graceful_restart() {
    let Message::Open(open) = Message::decode(&get("bird-open-1"), &cxt()).unwrap() else {
        panic!("not an OPEN");
    };
    assert_eq!(open.version, 4);
    assert_eq!(open.my_as, 65001);
    assert_eq!(open.real_as(), 65001);
    assert_eq!(open.hold_time, 90);
    assert_eq!(open.identifier, Ipv4Addr::new(10, 0, 0, 1));
    let caps = &open.capabilities;
    assert!(caps.contains(&Capability::MultiProtocol {
        afi: AFI_IPV4,
        safi: SAFI_UNICAST
    }));
    assert!(caps.contains(&Capability::MultiProtocol {
        afi: AFI_IPV6,
        safi: SAFI_UNICAST
    }));
    assert!(caps.contains(&Capability::RouteRefresh));
    assert!(caps.contains(&Capability::FourOctetAs(65001)));
    assert!(
        caps.iter()
            .any(|c| matches!(c, Capability::GracefulRestart(_)))
    );
    // BIRD also sends enhanced route refresh (70) and others we keep as is.
    assert!(
        caps.iter()
            .any(|c| matches!(c, Capability::Unknown { code: 70, .. }))
    );
}

#[test]
fn gobgp_open_carries_as_trans_and_the_real_four_octet_as() {
    let Message::Open(open) = Message::decode(&get("gobgp-open-2"), &cxt()).unwrap() else {
        panic!("not an OPEN");
    };
    assert_eq!(open.my_as, AS_TRANS);
    assert_eq!(open.real_as(), 4_200_000_002);
    assert_eq!(open.identifier, Ipv4Addr::new(10, 0, 0, 2));
    let gr = open
        .capabilities
        .iter()
        .find_map(|c| match c {
            Capability::GracefulRestart(g) => Some(g.clone()),
            _ => None,
        })
        .expect("GoBGP was configured with graceful restart");
    assert_eq!(gr.restart_time, 120);
}

#[test]
fn gobgp_update_carries_origin_med_communities_and_next_hop() {
    let all = vectors();
    let u = all
        .iter()
        .filter(|v| v.name.starts_with("gobgp-update"))
        .filter_map(|v| match Message::decode(&v.bytes, &cxt()).unwrap() {
            Message::Update(u) if u.nlri.contains(&"203.0.113.0/24".parse().unwrap()) => Some(u),
            _ => None,
        })
        .next()
        .expect("GoBGP announced 203.0.113.0/24");
    let a = u.attrs.unwrap();
    assert_eq!(a.origin, Some(Origin::Igp));
    assert_eq!(a.med, Some(10));
    assert_eq!(a.next_hop, Some(Ipv4Addr::new(10, 0, 0, 2)));
    assert_eq!(a.as_path.unwrap(), AsPath::sequence(vec![4_200_000_002]));
    // 65002:1 and NO_EXPORT.
    assert_eq!(a.communities, vec![(65002 << 16) | 1, 0xffff_ff01]);
}

#[test]
fn gobgp_update_carries_aggregator_and_egp_origin() {
    let u = vectors()
        .iter()
        .filter(|v| v.name.starts_with("gobgp-update"))
        .filter_map(|v| match Message::decode(&v.bytes, &cxt()).unwrap() {
            Message::Update(u) if u.nlri.contains(&"203.0.113.128/25".parse().unwrap()) => Some(u),
            _ => None,
        })
        .next()
        .expect("GoBGP announced 203.0.113.128/25");
    let a = u.attrs.unwrap();
    assert_eq!(a.origin, Some(Origin::Egp));
    assert_eq!(a.aggregator, Some((65010, Ipv4Addr::new(10, 9, 9, 9))));
    assert_eq!(
        a.as_path.unwrap(),
        AsPath::sequence(vec![4_200_000_002, 65010, 65011])
    );
}

#[test]
fn bird_ipv6_update_uses_mp_reach_with_the_configured_next_hop() {
    let u = (1..=4)
        .map(|i| decode_update(&format!("bird-update-{i}")))
        .find(|u| u.mp_reach.is_some())
        .expect("BIRD announced IPv6");
    let r = u.mp_reach.unwrap();
    assert_eq!((r.afi, r.safi), (AFI_IPV6, SAFI_UNICAST));
    assert_eq!(
        r.next_hop,
        IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap())
    );
    assert_eq!(r.nlri, vec!["2001:db8:1::/48".parse::<IpNet>().unwrap()]);
}

#[test]
fn bird_ipv4_update_has_its_export_filter_community_and_med() {
    let u = (1..=4)
        .map(|i| decode_update(&format!("bird-update-{i}")))
        .find(|u| !u.nlri.is_empty())
        .expect("BIRD announced IPv4");
    let mut nlri = u.nlri.clone();
    nlri.sort();
    assert_eq!(
        nlri,
        vec![
            "192.0.2.0/24".parse::<Ipv4Net>().unwrap(),
            "198.51.100.0/25".parse().unwrap()
        ]
    );
    let a = u.attrs.unwrap();
    assert_eq!(a.med, Some(50));
    assert_eq!(a.communities, vec![(65001 << 16) | 100]);
    assert_eq!(a.as_path.unwrap(), AsPath::sequence(vec![65001]));
}

#[test]
fn end_of_rib_markers_are_recognised_for_both_families() {
    let eors: Vec<_> = vectors()
        .iter()
        .filter(|v| v.name.contains("update"))
        .filter_map(|v| match Message::decode(&v.bytes, &cxt()).unwrap() {
            Message::Update(u) => u.end_of_rib_family(),
            _ => None,
        })
        .collect();
    assert!(eors.contains(&(AFI_IPV4, SAFI_UNICAST)), "{eors:?}");
    assert!(eors.contains(&(AFI_IPV6, SAFI_UNICAST)), "{eors:?}");
}

#[test]
fn gobgp_withdrawal_names_the_deleted_prefix() {
    let withdrawn: Vec<Ipv4Net> = vectors()
        .iter()
        .filter(|v| v.name.starts_with("gobgp-update"))
        .filter_map(|v| match Message::decode(&v.bytes, &cxt()).unwrap() {
            Message::Update(u) => Some(u.withdrawn),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        withdrawn.contains(&"203.0.113.0/24".parse().unwrap()),
        "{withdrawn:?}"
    );
}

#[test]
fn bird_route_refresh_asks_for_ipv4_unicast() {
    let Message::RouteRefresh(rr) = Message::decode(&get("bird-route_refresh-1"), &cxt()).unwrap()
    else {
        panic!("not a ROUTE-REFRESH");
    };
    assert_eq!((rr.afi, rr.safi), (AFI_IPV4, SAFI_UNICAST));
}

#[test]
fn bird_notifications_are_cease_admin_shutdown_and_bad_peer_as() {
    let Message::Notification(n) = Message::decode(&get("bird-notification-1"), &cxt()).unwrap()
    else {
        panic!("not a NOTIFICATION");
    };
    assert_eq!(
        (n.code, n.subcode),
        (error_code::CEASE, cease::ADMIN_SHUTDOWN)
    );
    let Message::Notification(n) =
        Message::decode(&get("bird-as2-notification-1"), &cxt()).unwrap()
    else {
        panic!("not a NOTIFICATION");
    };
    assert_eq!((n.code, n.subcode), (error_code::OPEN_MESSAGE, 2));
    assert_eq!(&n.data[..], &4_200_000_002u32.to_be_bytes());
}
