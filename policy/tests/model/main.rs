//! The classifier against the independent model (`spec.rs`): random
//! worlds (namespaces, pods with labels and named ports, global network
//! sets, tiers, Kubernetes and Calico policies) and random packets; the
//! world goes through the resource parser, the compiler (in random
//! batches, so the incremental paths run) and a `PolicyState`, and every
//! packet's verdict must equal the model's.

mod spec;
mod truth;
mod worlds;

use std::net::IpAddr;

use brindle_policy::classify::{Packet, PolicyState};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::{Direction, EndpointKey};
use brindle_policy::resource::{Kind, ResourceKey, parse_documents};
use proptest::prelude::*;

/// Parses the rendered world (a failure is the test's).
fn resources(seed: u64, text: &str) -> Result<Vec<Change>, TestCaseError> {
    match parse_documents(text) {
        Ok(r) => Ok(r.into_iter().map(Change::Apply).collect()),
        Err(e) => Err(TestCaseError::fail(format!("seed {seed}: {e}\n{text}"))),
    }
}

/// Applies changes in a seed-chosen order and batching.
fn apply_shuffled(
    seed: u64,
    rng: &mut worlds::Rng,
    compiler: &mut Compiler,
    dp: &mut PolicyState,
    mut changes: Vec<Change>,
) -> Result<(), TestCaseError> {
    for i in (1..changes.len()).rev() {
        let j = rng.below(i + 1);
        changes.swap(i, j);
    }
    let mut rest = changes.as_slice();
    while !rest.is_empty() {
        let n = 1 + rng.below(rest.len());
        let update = compiler.apply(rest[..n].to_vec());
        if !update.is_empty() {
            dp.apply(&update)
                .map_err(|e| TestCaseError::fail(format!("seed {seed}: {e}")))?;
        }
        rest = &rest[n..];
    }
    Ok(())
}

/// Every packet's verdict against the model's; (allowed, denied) counts.
fn verify(
    seed: u64,
    world: &spec::World,
    dp: &PolicyState,
    text: &str,
) -> Result<(usize, usize), TestCaseError> {
    let endpoint_of = |ip: std::net::Ipv4Addr| {
        world
            .pods
            .iter()
            .find(|p| p.ip == ip)
            .map(|p| EndpointKey::new(&p.namespace, &p.name))
    };
    let mut counts = (0, 0);
    for t in worlds::traffic(seed, world, 32) {
        let icmp = t.protocol == 1;
        let pkt = Packet {
            src: IpAddr::V4(t.src),
            dst: IpAddr::V4(t.dst),
            protocol: t.protocol,
            src_port: if icmp { 0 } else { 40000 },
            dst_port: if icmp { 0 } else { t.dst_port },
            icmp: icmp.then_some((t.icmp_type, 0)),
        };
        let out = endpoint_of(t.src).is_none_or(|k| dp.classify(&k, Direction::Egress, &pkt).allow);
        let inn =
            endpoint_of(t.dst).is_none_or(|k| dp.classify(&k, Direction::Ingress, &pkt).allow);
        let got = out && inn;
        let want = world.allowed(&t);
        replies_follow(seed, &t, &pkt, want, dp, &endpoint_of)?;
        if want {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
        if got != want {
            return Err(TestCaseError::fail(format!(
                "seed {seed}: {t:?}: classifier says {got} (egress {out}, ingress {inn}), model says {want}\n{text}"
            )));
        }
    }
    Ok(counts)
}

/// The stateful half of the spec, through the connection table with the
/// classifier deciding new flows: a flow the model allows is tracked and
/// its reply passes on the entry whatever the reverse direction's policy
/// says (the classifier is not asked again: it would deny), an ICMP error
/// about an allowed UDP flow is related; a flow the model denies leaves
/// no entry, so its "reply" is a new flow of its own.
fn replies_follow(
    seed: u64,
    t: &spec::Traffic,
    pkt: &Packet,
    want: bool,
    dp: &PolicyState,
    endpoint_of: &dyn Fn(std::net::Ipv4Addr) -> Option<EndpointKey>,
) -> Result<(), TestCaseError> {
    use brindle_policy::classify::Verdict;
    use brindle_policy::conntrack::{ConnTable, Outcome, Seen, Timeouts, Tuple, tcp_flags};
    if t.src == t.dst {
        // To itself: the "reply" is the same packet again.
        return Ok(());
    }
    let (src, dst) = (IpAddr::V4(t.src), IpAddr::V4(t.dst));
    let (tuple, flags, icmp, reply_flags, reply_icmp) = match (t.protocol, t.icmp_type) {
        (6, _) => (
            Tuple {
                src,
                dst,
                protocol: 6,
                src_port: 40000,
                dst_port: t.dst_port,
            },
            tcp_flags::SYN,
            None,
            tcp_flags::SYN | tcp_flags::ACK,
            None,
        ),
        (17, _) => (
            Tuple {
                src,
                dst,
                protocol: 17,
                src_port: 40000,
                dst_port: t.dst_port,
            },
            0,
            None,
            0,
            None,
        ),
        (1, 8) => (
            Tuple::icmp_echo(src, dst, 1, 7),
            0,
            Some((8, 0)),
            0,
            Some((0, 0)),
        ),
        _ => return Ok(()),
    };
    let classify = |p: &Packet| {
        let side = |ip: IpAddr, dir| match ip {
            IpAddr::V4(a) => endpoint_of(a).map(|k| dp.classify(&k, dir, p)),
            IpAddr::V6(_) => None,
        };
        let egress = side(p.src, Direction::Egress);
        if let Some(v) = egress
            && !v.allow
        {
            return v;
        }
        side(p.dst, Direction::Ingress)
            .or(egress)
            .unwrap_or(Verdict::NO_POLICY)
    };
    let mut table = ConnTable::new(4, Timeouts::default());
    let first = table.process(&Seen::new(tuple, flags, icmp), 1, 1, |p| {
        assert_eq!(p, pkt, "the table classifies the packet itself");
        classify(p)
    });
    if first.passes() != want {
        return Err(TestCaseError::fail(format!(
            "seed {seed}: {t:?}: the table says {first:?}, the model {want}"
        )));
    }
    let back = Tuple {
        src: dst,
        dst: src,
        protocol: tuple.protocol,
        src_port: tuple.dst_port,
        dst_port: tuple.src_port,
    };
    let deny = |_: &Packet| Verdict {
        allow: false,
        ..Verdict::NO_POLICY
    };
    let reply = table.process(&Seen::new(back, reply_flags, reply_icmp), 2, 1, deny);
    // Denied (a new flow the classifier refuses) or invalid (a SYN/ACK
    // opening nothing): never passed.
    let right = if want {
        reply == Outcome::Tracked { reply: true }
    } else {
        !reply.passes()
    };
    if !right {
        return Err(TestCaseError::fail(format!(
            "seed {seed}: {t:?} (model: {want}): its reply got {reply:?}"
        )));
    }
    if want && t.protocol == 17 {
        let error = Seen {
            tuple: Tuple {
                src: dst,
                dst: src,
                protocol: 1,
                src_port: 0,
                dst_port: 0,
            },
            tcp_flags: 0,
            icmp: Some((3, 3)),
            quoted: Some(tuple),
        };
        let related = table.process(&error, 3, 1, deny);
        if related != Outcome::Related {
            return Err(TestCaseError::fail(format!(
                "seed {seed}: {t:?}: an ICMP error about it got {related:?}"
            )));
        }
    }
    Ok(())
}

/// Checks one world, then the same world after deleting some policies,
/// network sets and tiers and relabelling some pods (the incremental
/// paths: sets released and their ids reused, memberships re-evaluated);
/// returns the first world's (allowed, denied) packet counts.
fn check(seed: u64) -> Result<(usize, usize), TestCaseError> {
    let world = worlds::world(seed);
    let text = serde_json::to_string_pretty(&worlds::render(&world)).expect("json");
    let mut changes = resources(seed, &text)?;
    for p in &world.pods {
        changes.push(Change::Endpoint(
            EndpointKey::new(&p.namespace, &p.name),
            Some(EndpointInfo {
                addrs: vec![IpAddr::V4(p.ip)],
                local: true,
            }),
        ));
    }
    let mut rng = worlds::Rng::new(seed ^ 0xba7c4);
    let mut compiler = Compiler::new();
    let mut dp = PolicyState::default();
    apply_shuffled(seed, &mut rng, &mut compiler, &mut dp, changes)?;
    let counts = verify(seed, &world, &dp, &text)?;

    let mut after = world.clone();
    let mut deletes = Vec::new();
    let key = |kind, namespace: Option<&String>, name: &String| ResourceKey {
        kind,
        namespace: namespace.cloned(),
        name: name.clone(),
    };
    after.k8s.retain(|p| {
        let keep = rng.chance(50);
        if !keep {
            deletes.push(key(
                Kind::KubernetesNetworkPolicy,
                Some(&p.namespace),
                &p.name,
            ));
        }
        keep
    });
    after.calico.retain(|p| {
        let keep = rng.chance(50);
        if !keep {
            let kind = match p.namespace {
                Some(_) => Kind::NetworkPolicy,
                None => Kind::GlobalNetworkPolicy,
            };
            deletes.push(key(kind, p.namespace.as_ref(), &p.name));
        }
        keep
    });
    after.netsets.retain(|s| {
        let keep = rng.chance(50);
        if !keep {
            deletes.push(key(Kind::GlobalNetworkSet, None, &s.name));
        }
        keep
    });
    for p in &mut after.pods {
        if rng.chance(30) {
            p.labels = worlds::labels(&mut rng);
        }
    }
    let text = serde_json::to_string_pretty(&worlds::render(&after)).expect("json");
    let mut changes = resources(seed, &text)?;
    changes.extend(deletes.into_iter().map(Change::Delete));
    apply_shuffled(seed, &mut rng, &mut compiler, &mut dp, changes)?;
    verify(seed, &after, &dp, &text)?;
    // The incremental state equals a fresh compilation's.
    let mut fresh = PolicyState::default();
    fresh
        .apply(&compiler.snapshot())
        .map_err(|e| TestCaseError::fail(format!("seed {seed}: snapshot: {e}")))?;
    verify(seed, &after, &fresh, &text)?;
    Ok(counts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_classifier_agrees_with_the_model(seed in any::<u64>()) {
        check(seed)?;
    }
}

/// Seeds that once disagreed, kept as regressions: a Kubernetes peer
/// with a `NotIn` namespace selector matched a global network set.
#[test]
fn known_seeds() {
    const SEEDS: &[u64] = &[5_288_455_763_167_833_252];
    for seed in SEEDS {
        check(*seed).unwrap();
    }
}

/// The worlds are not vacuous: both verdicts are common.
#[test]
fn the_worlds_allow_and_deny_alike() {
    let (mut allowed, mut denied) = (0, 0);
    for seed in 0..200 {
        let (a, d) = check(seed).unwrap();
        allowed += a;
        denied += d;
    }
    println!("allowed {allowed}, denied {denied}");
    assert!(
        allowed > 1000 && denied > 1000,
        "allowed {allowed}, denied {denied}"
    );
}
