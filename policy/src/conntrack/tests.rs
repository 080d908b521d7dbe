use std::cell::Cell;
use std::net::IpAddr;

use super::tcp_flags::{ACK, FIN, RST, SYN};
use super::*;
use crate::classify::{Decision, Verdict};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn allow() -> Verdict {
    Verdict {
        allow: true,
        decision: Decision::Rule { tier: 0, rule: 1 },
        logged: None,
    }
}

fn deny() -> Verdict {
    Verdict {
        allow: false,
        decision: Decision::EndOfTier { tier: 0 },
        logged: None,
    }
}

fn tcp(src: &str, sp: u16, dst: &str, dp: u16, flags: u8) -> Seen {
    Seen::new(
        Tuple {
            src: ip(src),
            dst: ip(dst),
            protocol: 6,
            src_port: sp,
            dst_port: dp,
        },
        flags,
        None,
    )
}

fn udp(src: &str, sp: u16, dst: &str, dp: u16) -> Seen {
    Seen::new(
        Tuple {
            src: ip(src),
            dst: ip(dst),
            protocol: 17,
            src_port: sp,
            dst_port: dp,
        },
        0,
        None,
    )
}

const S: u64 = 1_000_000_000;

#[test]
fn a_tcp_connection_walks_linux_states_and_replies_pass_without_classification() {
    let mut t = ConnTable::new(16, Timeouts::default());
    let a = tcp("10.0.0.1", 40000, "10.0.0.2", 80, SYN);
    let b = tcp("10.0.0.2", 80, "10.0.0.1", 40000, 0);
    assert!(matches!(t.process(&a, 0, 1, |_| allow()), Outcome::New(_)));
    assert_eq!(t.tcp_state(&a.tuple), Some(TcpState::SynSent));
    let never = |_: &Packet| -> Verdict { panic!("a tracked flow is not classified") };
    let steps = [
        (
            Seen {
                tcp_flags: SYN | ACK,
                ..b
            },
            true,
            TcpState::SynRecv,
        ),
        (
            Seen {
                tcp_flags: ACK,
                ..a
            },
            false,
            TcpState::Established,
        ),
        (
            Seen {
                tcp_flags: FIN | ACK,
                ..a
            },
            false,
            TcpState::FinWait,
        ),
        (
            Seen {
                tcp_flags: ACK,
                ..b
            },
            true,
            TcpState::CloseWait,
        ),
        (
            Seen {
                tcp_flags: FIN | ACK,
                ..b
            },
            true,
            TcpState::LastAck,
        ),
        (
            Seen {
                tcp_flags: ACK,
                ..a
            },
            false,
            TcpState::TimeWait,
        ),
    ];
    for (i, (seen, reply, state)) in steps.iter().enumerate() {
        let out = t.process(seen, i as u64, 1, never);
        assert_eq!(out, Outcome::Tracked { reply: *reply }, "step {i}");
        assert_eq!(t.tcp_state(&a.tuple), Some(*state), "step {i}");
    }
    // TIME_WAIT lasts 120 s.
    assert_eq!(t.sweep(119 * S), 0);
    assert_eq!(t.sweep(121 * S), 1);
    assert_eq!(t.stats().expired, 1);
}

#[test]
fn stray_tcp_segments_start_nothing_and_an_ack_picks_up_an_established_flow() {
    let mut t = ConnTable::new(16, Timeouts::default());
    for flags in [FIN, RST, SYN | ACK, 0] {
        let s = tcp("10.0.0.1", 1, "10.0.0.2", 2, flags);
        assert_eq!(
            t.process(&s, 0, 1, |_| panic!("not classified")),
            Outcome::Invalid
        );
    }
    assert_eq!(t.stats().invalid, 4);
    let s = tcp("10.0.0.1", 1, "10.0.0.2", 2, ACK);
    assert!(t.process(&s, 0, 1, |_| allow()).passes());
    assert_eq!(t.tcp_state(&s.tuple), Some(TcpState::Established));
    // An established flow lasts five days.
    assert_eq!(t.sweep(432_000 * S - 1), 0);
    // A SYN/ACK from the originator is out of state.
    let bad = Seen {
        tcp_flags: SYN | ACK,
        ..s
    };
    assert_eq!(t.process(&bad, 1, 1, |_| allow()), Outcome::Invalid);
}

#[test]
fn denied_flows_are_not_tracked_and_are_classified_each_time() {
    let mut t = ConnTable::new(16, Timeouts::default());
    let calls = Cell::new(0);
    let s = udp("10.0.0.1", 5000, "10.0.0.2", 53);
    for _ in 0..3 {
        let out = t.process(&s, 0, 1, |_| {
            calls.set(calls.get() + 1);
            deny()
        });
        assert!(matches!(out, Outcome::Denied(_)));
    }
    assert_eq!(calls.get(), 3);
    assert!(t.is_empty());
    assert_eq!(t.stats().denied, 3);
}

#[test]
fn a_newer_generation_revalidates_in_the_original_direction_and_a_deny_ends_the_flow() {
    let mut t = ConnTable::new(16, Timeouts::default());
    let q = udp("10.0.0.1", 5000, "10.0.0.2", 53);
    let r = udp("10.0.0.2", 53, "10.0.0.1", 5000);
    assert!(matches!(t.process(&q, 0, 3, |_| allow()), Outcome::New(_)));
    // Same generation: no classification.
    assert_eq!(
        t.process(&r, 1, 3, |_| panic!("no")),
        Outcome::Tracked { reply: true }
    );
    // Generation 4: the reply triggers a reclassification of the query.
    let seen = Cell::new(None);
    let out = t.process(&r, 2, 4, |p| {
        seen.set(Some(*p));
        allow()
    });
    assert!(matches!(out, Outcome::Revalidated(_)));
    let p = seen.get().unwrap();
    assert_eq!((p.src, p.dst_port), (ip("10.0.0.1"), 53));
    // Generation 5 denies: dropped, entry gone, the next packet is new.
    assert!(matches!(
        t.process(&q, 3, 5, |_| deny()),
        Outcome::Denied(_)
    ));
    assert!(t.is_empty());
    assert_eq!(t.stats().revalidated, 1);
}

#[test]
fn udp_times_out_after_30_s_unreplied_and_120_s_once_replied() {
    let mut t = ConnTable::new(16, Timeouts::default());
    let q = udp("10.0.0.1", 5000, "10.0.0.2", 53);
    t.process(&q, 0, 1, |_| allow());
    assert_eq!(t.sweep(31 * S), 1);
    t.process(&q, 100 * S, 1, |_| allow());
    t.process(&udp("10.0.0.2", 53, "10.0.0.1", 5000), 101 * S, 1, |_| {
        allow()
    });
    assert_eq!(t.sweep(200 * S), 0);
    assert_eq!(t.sweep(222 * S), 1);
}

#[test]
fn icmp_echo_replies_and_errors_about_tracked_flows_pass_others_are_invalid() {
    let mut t = ConnTable::new(16, Timeouts::default());
    let req = Seen::new(
        Tuple::icmp_echo(ip("10.0.0.1"), ip("10.0.0.2"), 1, 7),
        0,
        Some((8, 0)),
    );
    let rep = Seen::new(
        Tuple::icmp_echo(ip("10.0.0.2"), ip("10.0.0.1"), 1, 7),
        0,
        Some((0, 0)),
    );
    let got = Cell::new(None);
    t.process(&req, 0, 1, |p| {
        got.set(Some(*p));
        allow()
    });
    assert_eq!(got.get().unwrap().icmp, Some((8, 0)));
    assert_eq!(
        t.process(&rep, 1, 1, |_| panic!("no")),
        Outcome::Tracked { reply: true }
    );
    // A UDP flow, then a port unreachable from its destination quoting it.
    let q = udp("10.0.0.1", 5000, "10.0.0.2", 9);
    t.process(&q, 0, 1, |_| allow());
    let err = Seen {
        tuple: Tuple {
            src: ip("10.0.0.2"),
            dst: ip("10.0.0.1"),
            protocol: 1,
            src_port: 0,
            dst_port: 0,
        },
        tcp_flags: 0,
        icmp: Some((3, 3)),
        quoted: Some(q.tuple),
    };
    assert_eq!(t.process(&err, 1, 1, |_| panic!("no")), Outcome::Related);
    let other = Seen {
        quoted: Some(udp("10.0.0.1", 5001, "10.0.0.2", 9).tuple),
        ..err
    };
    assert_eq!(t.process(&other, 1, 1, |_| allow()), Outcome::Invalid);
}

#[test]
fn a_full_table_refuses_new_flows_counted_until_entries_expire() {
    let mut t = ConnTable::new(2, Timeouts::default());
    for port in [1, 2] {
        let s = udp("10.0.0.1", port, "10.0.0.2", 53);
        assert!(t.process(&s, 0, 1, |_| allow()).passes());
    }
    let s = udp("10.0.0.1", 3, "10.0.0.2", 53);
    assert_eq!(t.process(&s, S / 2, 1, |_| allow()), Outcome::Full);
    assert!(!Outcome::Full.passes());
    assert_eq!(t.stats().full, 1);
    // Tracked flows still pass while full.
    let old = udp("10.0.0.2", 53, "10.0.0.1", 1);
    assert!(t.process(&old, S / 2, 1, |_| allow()).passes());
    // After 30 s the unreplied flow expired: room again.
    assert!(matches!(
        t.process(&s, 31 * S, 1, |_| allow()),
        Outcome::New(_)
    ));
    assert_eq!(t.len(), 2);
}

#[test]
fn an_entry_costs_73_bytes() {
    assert_eq!(ENTRY_BYTES, std::hint::black_box(73));
}

#[test]
fn a_flow_keeps_the_mark_of_its_first_packet_both_ways_and_for_related_errors() {
    let mut t = ConnTable::new(8, Timeouts::default());
    let s = udp("10.0.0.1", 5000, "10.0.0.2", 53);
    assert!(matches!(
        t.process_marked(&s, 0, 1, 1, |_| allow()),
        (Outcome::New(_), 1)
    ));
    // Later packets either way give it back, whatever they pass in.
    let back = udp("10.0.0.2", 53, "10.0.0.1", 5000);
    assert_eq!(
        t.process_marked(&back, 1, 1, 0, |_| panic!("tracked")),
        (Outcome::Tracked { reply: true }, 1)
    );
    assert_eq!(
        t.process_marked(&s, 2, 1, 0, |_| panic!("tracked")),
        (Outcome::Tracked { reply: false }, 1)
    );
    let err = Seen {
        tuple: Tuple {
            protocol: 1,
            src_port: 0,
            dst_port: 0,
            ..back.tuple
        },
        tcp_flags: 0,
        icmp: Some((3, 3)),
        quoted: Some(s.tuple),
    };
    assert_eq!(
        t.process_marked(&err, 3, 1, 0, |_| panic!("no")),
        (Outcome::Related, 1)
    );
    // A denied flow carries no mark; an unmarked one keeps 0.
    let d = udp("10.0.0.1", 5001, "10.0.0.2", 53);
    assert!(matches!(
        t.process_marked(&d, 4, 1, 1, |_| deny()),
        (Outcome::Denied(_), 0)
    ));
    assert!(matches!(t.process(&d, 4, 1, |_| allow()), Outcome::New(_)));
    assert_eq!(
        t.process_marked(&d, 5, 1, 1, |_| panic!("tracked")),
        (Outcome::Tracked { reply: false }, 0)
    );
}
