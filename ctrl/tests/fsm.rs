//! The RFC 4271 §8 state machine, one transition per test.

use std::net::Ipv4Addr;

use brindle_ctrl::bgp::fsm::*;
use brindle_ctrl::bgp::packet::*;

const LOCAL_ID: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);

fn config() -> FsmConfig {
    FsmConfig {
        local_as: 65001,
        remote_as: 65002,
        router_id: LOCAL_ID,
        hold_time: 90,
        keepalive: None,
        min_hold_time: 3,
        connect_retry: 5,
        passive: false,
        families: vec![(AFI_IPV4, SAFI_UNICAST), (AFI_IPV6, SAFI_UNICAST)],
        graceful_restart: Some(120),
    }
}

fn peer_open(asn: u32, hold: u16, id: [u8; 4]) -> OpenMsg {
    OpenMsg::new(
        asn,
        hold,
        Ipv4Addr::from(id),
        vec![
            Capability::MultiProtocol {
                afi: AFI_IPV4,
                safi: SAFI_UNICAST,
            },
            Capability::RouteRefresh,
            Capability::GracefulRestart(GracefulRestartCap {
                restarting: false,
                restart_time: 60,
                families: vec![(AFI_IPV4, SAFI_UNICAST, false)],
            }),
        ],
    )
}

/// A peer whose outgoing connection 1 is in OpenSent.
fn open_sent(cfg: FsmConfig) -> Fsm {
    let mut fsm = Fsm::new(cfg);
    fsm.process(Input::ManualStart);
    fsm.process(Input::TcpCrAcked(1));
    assert_eq!(fsm.state(), State::OpenSent);
    fsm
}

fn established(cfg: FsmConfig) -> Fsm {
    let mut fsm = open_sent(cfg);
    fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    fsm.process(Input::Message(1, Message::Keepalive));
    assert_eq!(fsm.state(), State::Established);
    fsm
}

fn sent_notification(out: &[Output]) -> Option<(ConnId, u8, u8, Vec<u8>)> {
    out.iter().find_map(|o| match o {
        Output::Send(id, Message::Notification(n)) => {
            Some((*id, n.code, n.subcode, n.data.to_vec()))
        }
        _ => None,
    })
}

fn open_error(open: OpenMsg) -> (u8, u8, Vec<u8>, State) {
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::Message(1, Message::Open(open)));
    assert!(out.contains(&Output::Close(1)), "{out:?}");
    let (_, code, sub, data) = sent_notification(&out).expect("a NOTIFICATION");
    (code, sub, data, fsm.state())
}

#[test]
fn manual_start_connects_and_arms_the_connect_retry_timer() {
    let mut fsm = Fsm::new(config());
    assert_eq!(fsm.state(), State::Idle);
    let out = fsm.process(Input::ManualStart);
    assert_eq!(
        out,
        vec![Output::Connect, Output::SetConnectRetryTimer(Some(5))]
    );
    assert_eq!(fsm.state(), State::Connect);
}

#[test]
fn passive_peer_waits_in_active_without_connecting() {
    let mut fsm = Fsm::new(FsmConfig {
        passive: true,
        ..config()
    });
    assert_eq!(fsm.process(Input::ManualStart), vec![]);
    assert_eq!(fsm.state(), State::Active);
    assert_eq!(fsm.process(Input::ConnectRetryTimerExpired), vec![]);
}

#[test]
fn idle_refuses_incoming_connections() {
    let mut fsm = Fsm::new(config());
    assert_eq!(
        fsm.process(Input::TcpConnectionConfirmed(7)),
        vec![Output::Close(7)]
    );
}

#[test]
fn failed_connect_waits_in_active_and_retries_when_the_timer_fires() {
    let mut fsm = Fsm::new(config());
    fsm.process(Input::ManualStart);
    fsm.process(Input::TcpConnectFailed);
    assert_eq!(fsm.state(), State::Active);
    let out = fsm.process(Input::ConnectRetryTimerExpired);
    assert_eq!(
        out,
        vec![Output::Connect, Output::SetConnectRetryTimer(Some(5))]
    );
    assert_eq!(fsm.state(), State::Connect);
}

#[test]
fn connected_tcp_sends_open_with_our_capabilities_and_a_large_hold_timer() {
    let mut fsm = Fsm::new(config());
    fsm.process(Input::ManualStart);
    let out = fsm.process(Input::TcpCrAcked(1));
    assert!(out.contains(&Output::SetConnectRetryTimer(None)));
    assert!(out.contains(&Output::SetHoldTimer(1, Some(LARGE_HOLD_TIME))));
    let open = out
        .iter()
        .find_map(|o| match o {
            Output::Send(1, Message::Open(o)) => Some(o.clone()),
            _ => None,
        })
        .expect("OPEN sent");
    assert_eq!(
        (open.my_as, open.hold_time, open.identifier),
        (65001, 90, LOCAL_ID)
    );
    assert!(open.capabilities.contains(&Capability::FourOctetAs(65001)));
    assert!(open.capabilities.contains(&Capability::MultiProtocol {
        afi: AFI_IPV6,
        safi: SAFI_UNICAST
    }));
    assert!(open.capabilities.contains(&Capability::RouteRefresh));
    assert_eq!(fsm.state(), State::OpenSent);
}

#[test]
fn valid_open_is_answered_with_keepalive_and_moves_to_open_confirm() {
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    assert_eq!(
        out,
        vec![
            Output::Send(1, Message::Keepalive),
            Output::SetHoldTimer(1, Some(30)),
            Output::SetKeepaliveTimer(1, Some(10)),
        ]
    );
    assert_eq!(fsm.state(), State::OpenConfirm);
}

#[test]
fn holdtime_negotiation_uses_minimum() {
    let fsm = established(config());
    let (_, neg) = fsm.established().unwrap();
    assert_eq!((neg.hold_time, neg.keepalive), (30, 10));
    let fsm = established(FsmConfig {
        hold_time: 9,
        ..config()
    });
    assert_eq!(fsm.established().unwrap().1.hold_time, 9);
}

#[test]
fn configured_keepalive_is_used_but_never_more_than_a_third_of_hold_time() {
    let fsm = established(FsmConfig {
        keepalive: Some(3),
        ..config()
    });
    assert_eq!(fsm.established().unwrap().1.keepalive, 3);
    let fsm = established(FsmConfig {
        keepalive: Some(60),
        ..config()
    });
    assert_eq!(fsm.established().unwrap().1.keepalive, 10);
}

#[test]
fn zero_hold_time_disables_hold_and_keepalive_timers() {
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 0, [10, 0, 0, 9])),
    ));
    assert!(out.contains(&Output::SetHoldTimer(1, None)));
    assert!(out.contains(&Output::SetKeepaliveTimer(1, None)));
}

#[test]
fn keepalive_in_open_confirm_establishes_the_session_with_negotiated_capabilities() {
    let mut fsm = open_sent(config());
    fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    let out = fsm.process(Input::Message(1, Message::Keepalive));
    let neg = out
        .iter()
        .find_map(|o| match o {
            Output::Established(1, n) => Some(n.clone()),
            _ => None,
        })
        .expect("Established output");
    assert_eq!(neg.remote_as, 65002);
    assert_eq!(neg.remote_id, Ipv4Addr::new(10, 0, 0, 9));
    assert!(neg.four_octet_as && neg.route_refresh);
    assert_eq!(
        neg.families,
        vec![(AFI_IPV4, SAFI_UNICAST)],
        "only the common family"
    );
    assert_eq!(neg.peer_graceful_restart.unwrap().restart_time, 60);
    assert_eq!(fsm.state(), State::Established);
}

#[test]
fn open_with_bad_version_is_answered_with_unsupported_version_number() {
    let mut fsm = open_sent(config());
    let mut bytes = Message::Open(peer_open(65002, 30, [10, 0, 0, 9]))
        .encode(&EncodeCxt::default())
        .to_vec();
    bytes[19] = 3;
    let err = Message::decode(&bytes, &DecodeCxt::default()).unwrap_err();
    let out = fsm.process(Input::DecodeError(1, err));
    assert_eq!(sent_notification(&out), Some((1, 2, 1, vec![0, 4])));
    assert!(out.contains(&Output::Close(1)));
    assert_eq!(fsm.state(), State::Active, "restarts automatically");
}

#[test]
fn open_from_the_wrong_as_is_answered_with_bad_peer_as() {
    let (code, sub, _, _) = open_error(peer_open(65099, 30, [10, 0, 0, 9]));
    assert_eq!((code, sub), (2, 2));
}

#[test]
fn open_with_four_octet_as_checks_the_capability_not_as_trans() {
    let mut fsm = open_sent(FsmConfig {
        remote_as: 4_200_000_002,
        ..config()
    });
    let open = peer_open(4_200_000_002, 30, [10, 0, 0, 9]);
    assert_eq!(open.my_as, AS_TRANS);
    let out = fsm.process(Input::Message(1, Message::Open(open)));
    assert_eq!(sent_notification(&out), None);
    assert_eq!(fsm.state(), State::OpenConfirm);
}

#[test]
fn ibgp_open_with_our_own_identifier_is_bad_bgp_identifier() {
    let mut fsm = open_sent(FsmConfig {
        remote_as: 65001,
        ..config()
    });
    let out = fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65001, 30, LOCAL_ID.octets())),
    ));
    assert_eq!(sent_notification(&out).map(|n| (n.1, n.2)), Some((2, 3)));
}

#[test]
fn open_with_hold_time_below_our_minimum_is_unacceptable_hold_time() {
    let mut fsm = open_sent(FsmConfig {
        min_hold_time: 10,
        ..config()
    });
    let out = fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 5, [10, 0, 0, 9])),
    ));
    assert_eq!(sent_notification(&out).map(|n| (n.1, n.2)), Some((2, 6)));
}

#[test]
fn open_without_a_common_address_family_is_unsupported_capability() {
    let mut open = peer_open(65002, 30, [10, 0, 0, 9]);
    open.capabilities[0] = Capability::MultiProtocol { afi: 25, safi: 65 }; // L2VPN EVPN only
    let (code, sub, data, _) = open_error(open);
    assert_eq!((code, sub), (2, 7));
    // Our wanted capabilities: MP IPv4 unicast and MP IPv6 unicast.
    assert_eq!(data, vec![1, 4, 0, 1, 0, 1, 1, 4, 0, 2, 0, 1]);
}

#[test]
fn open_with_unknown_capabilities_is_accepted() {
    let mut open = peer_open(65002, 30, [10, 0, 0, 9]);
    open.capabilities.push(Capability::Unknown {
        code: 73,
        value: bytes::Bytes::from_static(b"host"),
    });
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::Message(1, Message::Open(open)));
    assert_eq!(sent_notification(&out), None);
}

#[test]
fn hold_timer_expiry_sends_notification_and_reports_the_session_down() {
    let mut fsm = established(config());
    let out = fsm.process(Input::HoldTimerExpired(1));
    assert_eq!(sent_notification(&out), Some((1, 4, 0, vec![])));
    assert!(out.contains(&Output::Close(1)));
    assert!(out.contains(&Output::Down {
        reason: DownReason::HoldTimerExpired,
        graceful: true
    }));
    assert_eq!(fsm.state(), State::Active);
}

#[test]
fn hold_timer_expiry_in_open_sent_closes_without_down() {
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::HoldTimerExpired(1));
    assert_eq!(sent_notification(&out), Some((1, 4, 0, vec![])));
    assert!(!out.iter().any(|o| matches!(o, Output::Down { .. })));
}

#[test]
fn keepalive_timer_sends_a_keepalive_and_rearms() {
    let mut fsm = established(config());
    let out = fsm.process(Input::KeepaliveTimerExpired(1));
    assert_eq!(
        out,
        vec![
            Output::Send(1, Message::Keepalive),
            Output::SetKeepaliveTimer(1, Some(10))
        ]
    );
}

#[test]
fn keepalive_and_update_in_established_restart_the_hold_timer() {
    let mut fsm = established(config());
    assert_eq!(
        fsm.process(Input::Message(1, Message::Keepalive)),
        vec![Output::SetHoldTimer(1, Some(30))]
    );
    let u = UpdateMsg {
        withdrawn: vec!["10.1.0.0/16".parse().unwrap()],
        ..Default::default()
    };
    let out = fsm.process(Input::Message(1, Message::Update(u.clone())));
    assert_eq!(
        out,
        vec![Output::SetHoldTimer(1, Some(30)), Output::Update(u)]
    );
}

#[test]
fn update_before_established_is_an_fsm_error() {
    let mut fsm = open_sent(config());
    let out = fsm.process(Input::Message(1, Message::Update(UpdateMsg::default())));
    assert_eq!(sent_notification(&out), Some((1, 5, 1, vec![])));
    let mut fsm = open_sent(config());
    fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    let out = fsm.process(Input::Message(1, Message::Update(UpdateMsg::default())));
    assert_eq!(sent_notification(&out), Some((1, 5, 2, vec![])));
}

#[test]
fn open_in_established_is_an_fsm_error() {
    let mut fsm = established(config());
    let out = fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    assert_eq!(sent_notification(&out), Some((1, 5, 3, vec![])));
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Down {
            graceful: false,
            ..
        }
    )));
}

#[test]
fn notification_from_the_peer_closes_without_reply_and_ends_graceful_restart() {
    let mut fsm = established(config());
    let n = NotificationMsg::new(6, 2);
    let out = fsm.process(Input::Message(1, Message::Notification(n.clone())));
    assert_eq!(sent_notification(&out), None);
    assert!(out.contains(&Output::Close(1)));
    assert!(out.contains(&Output::Down {
        reason: DownReason::Received(n),
        graceful: false
    }));
}

#[test]
fn tcp_failure_of_a_graceful_restart_peer_keeps_its_routes() {
    let mut fsm = established(config());
    let out = fsm.process(Input::TcpConnectionFails(1));
    assert!(out.contains(&Output::Down {
        reason: DownReason::TcpFailed,
        graceful: true
    }));
    assert!(out.contains(&Output::SetConnectRetryTimer(Some(5))));
}

#[test]
fn tcp_failure_of_a_peer_without_graceful_restart_drops_its_routes() {
    let mut fsm = open_sent(config());
    let mut open = peer_open(65002, 30, [10, 0, 0, 9]);
    open.capabilities
        .retain(|c| !matches!(c, Capability::GracefulRestart(_)));
    fsm.process(Input::Message(1, Message::Open(open)));
    fsm.process(Input::Message(1, Message::Keepalive));
    let out = fsm.process(Input::TcpConnectionFails(1));
    assert!(out.contains(&Output::Down {
        reason: DownReason::TcpFailed,
        graceful: false
    }));
}

#[test]
fn malformed_update_is_answered_with_the_notification_of_its_decode_error() {
    let mut fsm = established(config());
    let out = fsm.process(Input::DecodeError(
        1,
        UpdateError::InvalidNetworkField.into(),
    ));
    assert_eq!(sent_notification(&out), Some((1, 3, 10, vec![])));
}

#[test]
fn max_prefix_exceeded_sends_cease_1_and_stays_idle() {
    let mut fsm = established(config());
    let out = fsm.process(Input::MaxPrefixExceeded {
        afi: 1,
        safi: 1,
        limit: 100,
    });
    assert_eq!(
        sent_notification(&out),
        Some((1, 6, 1, vec![0, 1, 1, 0, 0, 0, 100]))
    );
    assert!(out.contains(&Output::Close(1)));
    assert_eq!(fsm.state(), State::Idle);
    assert_eq!(fsm.process(Input::ConnectRetryTimerExpired), vec![]);
    assert_eq!(
        fsm.process(Input::TcpConnectionConfirmed(2)),
        vec![Output::Close(2)]
    );
}

#[test]
fn manual_stop_sends_cease_administrative_shutdown() {
    let mut fsm = established(config());
    let out = fsm.process(Input::ManualStop);
    assert_eq!(sent_notification(&out), Some((1, 6, 2, vec![])));
    assert!(out.contains(&Output::Down {
        reason: DownReason::AdminStop,
        graceful: false
    }));
    assert_eq!(fsm.state(), State::Idle);
}

/// Both sides connect at once: our connection 1, the peer's connection 2.
fn collision(local_id: Ipv4Addr, remote_id: [u8; 4]) -> (Fsm, Vec<Output>) {
    let mut fsm = open_sent(FsmConfig {
        router_id: local_id,
        ..config()
    });
    let out = fsm.process(Input::TcpConnectionConfirmed(2));
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Send(2, Message::Open(_))))
    );
    fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, remote_id)),
    ));
    let out = fsm.process(Input::Message(
        2,
        Message::Open(peer_open(65002, 30, remote_id)),
    ));
    (fsm, out)
}

#[test]
fn collision_with_a_higher_remote_identifier_closes_our_connection() {
    let (mut fsm, out) = collision(Ipv4Addr::new(10, 0, 0, 1), [10, 0, 0, 9]);
    assert_eq!(sent_notification(&out), Some((1, 6, 7, vec![])));
    assert!(out.contains(&Output::Close(1)));
    assert!(!out.contains(&Output::Close(2)));
    let out = fsm.process(Input::Message(2, Message::Keepalive));
    assert!(out.iter().any(|o| matches!(o, Output::Established(2, _))));
}

#[test]
fn collision_with_a_lower_remote_identifier_closes_the_peers_connection() {
    let (mut fsm, out) = collision(Ipv4Addr::new(10, 0, 0, 200), [10, 0, 0, 9]);
    assert_eq!(sent_notification(&out), Some((2, 6, 7, vec![])));
    assert!(out.contains(&Output::Close(2)));
    assert!(!out.contains(&Output::Close(1)));
    let out = fsm.process(Input::Message(1, Message::Keepalive));
    assert!(out.iter().any(|o| matches!(o, Output::Established(1, _))));
}

#[test]
fn collision_with_an_established_session_refuses_the_new_connection() {
    let mut fsm = established(config());
    assert_eq!(
        fsm.process(Input::TcpConnectionConfirmed(2)),
        vec![Output::Close(2)]
    );
    assert_eq!(fsm.state(), State::Established);
}

#[test]
fn established_connection_wins_over_one_still_in_open_sent() {
    let mut fsm = open_sent(config());
    fsm.process(Input::TcpConnectionConfirmed(2));
    fsm.process(Input::Message(
        1,
        Message::Open(peer_open(65002, 30, [10, 0, 0, 9])),
    ));
    let out = fsm.process(Input::Message(1, Message::Keepalive));
    assert_eq!(sent_notification(&out), Some((2, 6, 7, vec![])));
    assert!(out.contains(&Output::Close(2)));
}
