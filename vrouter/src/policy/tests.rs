use std::net::IpAddr;

use super::parse::{seen_v4, seen_v6};

fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let len = (p.len() + l4.len()) as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p.extend_from_slice(l4);
    p
}

#[test]
fn a_tcp_segment_gives_ports_and_flags() {
    let mut tcp = [0u8; 20];
    tcp[..4].copy_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
    tcp[13] = 0x12;
    let s = seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 6, &tcp)).expect("parses");
    assert_eq!(s.tuple.src, IpAddr::from([10, 0, 0, 1]));
    assert_eq!((s.tuple.src_port, s.tuple.dst_port), (40000, 80));
    assert_eq!(s.tcp_flags, 0x12);
    // Truncated: not trackable.
    assert!(seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 6, &tcp[..10])).is_none());
}

#[test]
fn an_echo_uses_its_identifier_and_an_error_quotes_its_flow() {
    let echo = [8, 0, 0, 0, 0x12, 0x34, 0, 1];
    let s = seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 1, &echo)).expect("parses");
    assert_eq!((s.tuple.src_port, s.tuple.dst_port), (0x1234, 0x1234));
    assert_eq!(s.icmp, Some((8, 0)));
    let quoted = v4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        17,
        &[0x9c, 0x40, 0, 53, 0, 8, 0, 0],
    );
    let mut err = vec![3, 3, 0, 0, 0, 0, 0, 0];
    err.extend_from_slice(&quoted);
    let s = seen_v4(&v4([10, 0, 0, 2], [10, 0, 0, 1], 1, &err)).expect("parses");
    let q = s.quoted.expect("the quote is read");
    assert_eq!((q.protocol, q.src_port, q.dst_port), (17, 40000, 53));
}

#[test]
fn a_later_fragment_is_not_trackable_and_ipv6_reads_its_ports() {
    let mut p = v4([10, 0, 0, 1], [10, 0, 0, 2], 17, &[0; 8]);
    p[6..8].copy_from_slice(&[0x00, 0x10]);
    assert!(seen_v4(&p).is_none());
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
    v6.extend_from_slice(&[0xfd; 16]);
    v6.extend_from_slice(&[0xfe; 16]);
    v6.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    let s = seen_v6(&v6).expect("parses");
    assert_eq!(
        (s.tuple.protocol, s.tuple.src_port, s.tuple.dst_port),
        (17, 40000, 53)
    );
}

fn udp4(src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16) -> Vec<u8> {
    let mut l4 = sp.to_be_bytes().to_vec();
    l4.extend_from_slice(&dp.to_be_bytes());
    l4.extend_from_slice(&[0, 8, 0, 0]);
    v4(src, dst, 17, &l4)
}

#[test]
fn a_flow_from_the_host_port_is_marked_and_its_replies_say_so() {
    use super::{Flow, Flows};
    let mut f = Flows::new();
    // No policy and no host port: nothing is tracked.
    f.begin_batch(std::time::Instant::now(), false);
    let fwd = udp4([10, 65, 0, 2], 40000, [10, 65, 0, 3], 80);
    assert_eq!(
        f.check(&fwd, false, Some(0), Some(1), true),
        Ok(Flow::default())
    );
    assert_eq!(f.stats().flows, 0);
    // With a host port every pod flow is tracked; the kernel handed A -> B
    // back (after DNAT): from host.
    f.begin_batch(std::time::Instant::now(), true);
    let first = f
        .check(&fwd, false, Some(0), Some(1), true)
        .expect("passes");
    assert_eq!(
        first,
        Flow {
            reply: false,
            from_host: true
        }
    );
    let back = udp4([10, 65, 0, 3], 80, [10, 65, 0, 2], 40000);
    let reply = f
        .check(&back, false, Some(1), Some(0), false)
        .expect("passes");
    assert_eq!(
        reply,
        Flow {
            reply: true,
            from_host: true
        }
    );
    // A pod's own flow is not marked.
    let other = udp4([10, 65, 0, 2], 40001, [10, 65, 0, 3], 80);
    assert_eq!(
        f.check(&other, false, Some(0), Some(1), false),
        Ok(Flow::default())
    );
    // A destination pod of another worker is left to that worker.
    f.set_remote(1, true);
    let third = udp4([10, 65, 0, 9], 1, [10, 65, 0, 3], 80);
    assert_eq!(
        f.check(&third, false, None, Some(1), false),
        Ok(Flow::default())
    );
    assert_eq!(f.stats().flows, 2);
}

#[test]
fn a_flows_next_packet_in_the_same_batch_skips_the_lookup_but_not_across_batches_or_directions() {
    use super::Flows;
    let mut f = Flows::new();
    let now = std::time::Instant::now();
    f.begin_batch(now, true);
    let fwd = udp4([10, 65, 0, 2], 40000, [10, 65, 0, 3], 80);
    let back = udp4([10, 65, 0, 3], 80, [10, 65, 0, 2], 40000);
    for _ in 0..3 {
        assert!(f.check(&fwd, false, Some(0), Some(1), false).is_ok());
    }
    let s = f.stats();
    assert_eq!((s.table.new, s.table.tracked, s.batched), (1, 0, 2));
    // The other way is a lookup (it marks the flow replied).
    let r = f
        .check(&back, false, Some(1), Some(0), false)
        .expect("passes");
    assert!(r.reply);
    f.begin_batch(now, true);
    assert!(f.check(&back, false, Some(1), Some(0), false).is_ok());
    let s = f.stats();
    assert_eq!((s.table.tracked, s.batched), (2, 2));
}

#[test]
fn log_lines_are_limited_per_second_and_the_rest_counted() {
    use brindle_policy::classify::Packet;
    use brindle_policy::program::{Direction, EndpointKey, Program};
    let mut l = super::LogLimit::default();
    let key = EndpointKey::new("demo", "a");
    let pkt = Packet::ported([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 17, 1, 2);
    let program = Program::default();
    for _ in 0..12 {
        l.line(&key, &program, Direction::Ingress, 0, 0, true, &pkt);
    }
    assert_eq!((l.lines, l.suppressed), (10, 2));
    l.now_ns = 1_000_000_000;
    l.line(&key, &program, Direction::Ingress, 0, 0, true, &pkt);
    // The next second's first line reports (and resets) the suppressed.
    assert_eq!((l.lines, l.suppressed), (1, 0));
}

#[test]
fn denied_packets_and_allowed_flows_are_counted_per_policy_and_rule() {
    use super::{Counts, Flows, PolicyView};
    use brindle_policy::program::{
        Chain, CompiledRule, EndpointKey, Match, PolicyName, Ports, Program, ProgramUpdate,
        RuleAction, Side, TierChain, TierEnd, Update,
    };
    let key = EndpointKey::new("demo", "b");
    let allow_80 = CompiledRule {
        action: RuleAction::Allow,
        when: Match {
            protocol: Some(17),
            dst: Side {
                ports: Some(Ports {
                    ranges: vec![(80, 80)],
                    named: vec![],
                }),
                ..Side::default()
            },
            ..Match::default()
        },
        policy: 0,
        index: 0,
    };
    let program = Program {
        ingress: Chain {
            tiers: vec![TierChain {
                tier: "default".into(),
                rules: vec![allow_80],
                end: TierEnd::Deny,
            }],
        },
        egress: Chain::default(),
        policies: vec![PolicyName {
            tier: "default".into(),
            name: "demo/knp.default.web".into(),
        }],
    };
    let update = Update {
        generation: 1,
        programs: vec![ProgramUpdate {
            endpoint: key.clone(),
            program: Some(program),
        }],
        ..Update::default()
    };
    let view = PolicyView::new()
        .with_update(&update)
        .expect("applies")
        .with_workload(1, Some(key));
    let mut f = Flows::new();
    f.set_view(std::sync::Arc::new(view));
    f.begin_batch(std::time::Instant::now(), false);
    let to_80 = udp4([10, 65, 0, 2], 40000, [10, 65, 0, 3], 80);
    let to_81 = udp4([10, 65, 0, 2], 40000, [10, 65, 0, 3], 81);
    for _ in 0..3 {
        assert!(f.check(&to_80, false, Some(0), Some(1), false).is_ok());
        assert!(f.check(&to_81, false, Some(0), Some(1), false).is_err());
    }
    let counts: Vec<_> = f
        .rule_counts()
        .into_iter()
        .map(|(k, c)| (k.policy, k.rule, k.direction, k.action, c))
        .collect();
    let len = to_80.len() as u64;
    assert_eq!(
        counts,
        vec![
            (
                String::new(),
                "end-of-tier".to_owned(),
                "ingress",
                "deny",
                // Every denied packet.
                Counts {
                    packets: 3,
                    bytes: 3 * len
                }
            ),
            (
                "demo/knp.default.web".to_owned(),
                "0".to_owned(),
                "ingress",
                "allow",
                // The allowed flow once.
                Counts {
                    packets: 1,
                    bytes: len
                }
            ),
        ]
    );
    // A new view with the policy still in force keeps what was counted,
    // by name.
    let kept = f.view().with_update(&Update {
        generation: 2,
        ..Update::default()
    });
    f.set_view(std::sync::Arc::new(kept.expect("applies")));
    assert_eq!(f.rule_counts().len(), 2);
    // The policy deleted (no program names it or its tier): its rows go,
    // so counters do not grow with every policy ever enforced.
    let deleted = f.view().with_update(&Update {
        generation: 3,
        programs: vec![ProgramUpdate {
            endpoint: EndpointKey::new("demo", "b"),
            program: None,
        }],
        ..Update::default()
    });
    f.set_view(std::sync::Arc::new(deleted.expect("applies")));
    assert_eq!(f.rule_counts(), vec![]);
}

#[test]
fn rows_of_a_deleted_policy_go_and_those_of_the_policies_in_force_stay() {
    use super::{Counts, Flows, PolicyView, RuleKey};
    use brindle_policy::compile::{Change, Compiler, EndpointInfo};
    use brindle_policy::program::EndpointKey;
    use brindle_policy::resource::parse_documents;

    const WORLD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: demo, labels: {app: b}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: demo}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - ports: [{protocol: UDP, port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: dns, namespace: demo}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - ports: [{protocol: UDP, port: 53}]
"#;
    let key = EndpointKey::new("demo", "b");
    let mut compiler = Compiler::new();
    let mut changes: Vec<Change> = parse_documents(WORLD)
        .expect("parses")
        .into_iter()
        .map(Change::Apply)
        .collect();
    changes.push(Change::Endpoint(
        key.clone(),
        Some(EndpointInfo {
            addrs: vec!["10.65.0.3".parse().expect("an address")],
            local: true,
        }),
    ));
    let view = PolicyView::new()
        .with_update(&compiler.apply(changes))
        .expect("applies")
        .with_workload(1, Some(key));
    let mut f = Flows::new();
    f.set_view(std::sync::Arc::new(view));
    f.begin_batch(std::time::Instant::now(), false);
    for port in [80, 53] {
        let p = udp4([10, 65, 0, 2], 40000 + port, [10, 65, 0, 3], port);
        assert!(f.check(&p, false, Some(0), Some(1), false).is_ok());
    }
    let policies = |f: &Flows| -> Vec<(String, u64)> {
        f.rule_counts()
            .into_iter()
            .map(|(k, c): (RuleKey, Counts)| (k.policy, c.packets))
            .collect()
    };
    assert_eq!(
        policies(&f),
        vec![
            ("demo/knp.default.dns".to_owned(), 1),
            ("demo/knp.default.web".to_owned(), 1)
        ]
    );
    let dns = parse_documents(WORLD).expect("parses").pop().expect("dns");
    let update = compiler.apply([Change::Delete(dns.key())]);
    let next = f.view().with_update(&update).expect("applies");
    f.set_view(std::sync::Arc::new(next));
    assert_eq!(policies(&f), vec![("demo/knp.default.web".to_owned(), 1)]);
}
