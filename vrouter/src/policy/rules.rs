//! Per-rule counters (issue 15): which rule decided, in packets and bytes,
//! per policy, rule, direction and action, as Calico counts per rule.
//!
//! What is counted: every packet a rule **denies** (a denied flow is not
//! tracked, so each of its packets is classified and counted), and each
//! **allowed** flow once, with its first packet, when it is classified
//! (a new flow, or a tracked one revalidated under a newer policy): an
//! established flow's later packets pass on the flow table and cost no
//! counter. Each side classified counts: the source pod's egress and the
//! destination pod's ingress. Besides numbered rules, a verdict may come
//! from a tier's end (`end-of-tier`, the default deny of a tier that
//! selected the pod), from no policy selecting the pod in that direction
//! (`no-policy`, allowed) or from passing every tier (`profile`, allowed).
//! A pod without any program (no policy selects it either way) counts
//! nothing.
//!
//! The hot path counts by position ([`Hit`]: port slot, direction, the
//! verdict's tier and rule index) in a small per-worker map; positions are
//! turned into names against the view they were counted under, when the
//! worker takes a new view and when the control thread asks
//! ([`RuleCounters::snapshot`]), which sums the workers.
//!
//! A policy's rows go with it: when a worker takes a view in which no
//! endpoint's program names a policy any more (deleted, or selecting no
//! local pod), its rows are dropped, and a tier's `end-of-tier` rows when
//! no program has that tier; `no-policy` and `profile` rows stay (a
//! handful). So a long-running vrouter keeps rows for what is in force,
//! not for every policy it ever enforced, as Felix's per-rule counters go
//! with the policy's chains.

use std::collections::{BTreeMap, HashMap, HashSet};

use brindle_policy::classify::Decision;
use brindle_policy::program::Direction;

use super::PolicyView;
use crate::frame::PortId;

/// A counted verdict, by position in the view in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Hit {
    pub(super) port: PortId,
    pub(super) direction: Direction,
    pub(super) decision: Decision,
    pub(super) allow: bool,
}

/// A rule by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleKey {
    /// The tier (empty for `no-policy` and `profile`).
    pub tier: String,
    /// The policy (`ns/knp.default.name` for a Kubernetes policy; empty
    /// for a tier's end, `no-policy` and `profile`).
    pub policy: String,
    /// The rule's index in the policy's ingress or egress list, or
    /// `end-of-tier`, `no-policy`, `profile`.
    pub rule: String,
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// `allow` or `deny`.
    pub action: &'static str,
}

/// Packets and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Packets.
    pub packets: u64,
    /// Bytes (IP header to the end).
    pub bytes: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.packets += other.packets;
        self.bytes += other.bytes;
    }
}

/// One worker's per-rule counters.
#[derive(Debug, Default)]
pub(super) struct RuleCounters {
    /// Counted under the view in force, by position.
    pending: HashMap<Hit, Counts>,
    /// Counted under earlier views, by name.
    named: BTreeMap<RuleKey, Counts>,
}

impl RuleCounters {
    #[inline]
    pub(super) fn count(&mut self, hit: Hit, bytes: usize) {
        self.pending.entry(hit).or_default().add(Counts {
            packets: 1,
            bytes: bytes as u64,
        });
    }

    /// Names the positions counted under `left` (the view being left),
    /// then drops the rows of policies and tiers `next` (the view taken)
    /// no longer has.
    pub(super) fn fold(&mut self, left: &PolicyView, next: &PolicyView) {
        for (hit, c) in self.pending.drain() {
            self.named.entry(left.rule_key(&hit)).or_default().add(c);
        }
        if self.named.is_empty() {
            return;
        }
        let mut policies: HashSet<(&str, &str)> = HashSet::new();
        let mut tiers: HashSet<&str> = HashSet::new();
        for (_, ep) in next.state.programs() {
            let p = &ep.program;
            policies.extend(
                p.policies
                    .iter()
                    .map(|n| (n.tier.as_str(), n.name.as_str())),
            );
            for chain in [&p.ingress, &p.egress] {
                tiers.extend(chain.tiers.iter().map(|t| t.tier.as_str()));
            }
        }
        self.named.retain(|k, _| {
            if !k.policy.is_empty() {
                policies.contains(&(k.tier.as_str(), k.policy.as_str()))
            } else if k.rule == "end-of-tier" {
                tiers.contains(k.tier.as_str())
            } else {
                true
            }
        });
    }

    /// Everything counted, by name (positions named against `view`, the
    /// one in force).
    pub(super) fn snapshot(&self, view: &PolicyView) -> Vec<(RuleKey, Counts)> {
        let mut all = self.named.clone();
        for (hit, c) in &self.pending {
            all.entry(view.rule_key(hit)).or_default().add(*c);
        }
        all.into_iter().collect()
    }
}

/// Sums the workers' counters (`rows` of each), by name.
pub fn sum_rules<'a>(
    workers: impl IntoIterator<Item = &'a [(RuleKey, Counts)]>,
) -> Vec<(RuleKey, Counts)> {
    let mut all: BTreeMap<RuleKey, Counts> = BTreeMap::new();
    for rows in workers {
        for (k, c) in rows {
            all.entry(k.clone()).or_default().add(*c);
        }
    }
    all.into_iter().collect()
}

impl PolicyView {
    /// The name of a position counted under this view.
    pub(super) fn rule_key(&self, hit: &Hit) -> RuleKey {
        let program = self
            .ports
            .get(usize::from(hit.port))
            .and_then(|p| p.key.as_ref())
            .and_then(|k| self.state.endpoint(k))
            .map(|e| &e.program);
        let (tier, policy, rule) = match (hit.decision, program) {
            (Decision::Rule { tier, rule }, Some(p)) => {
                match p.rule_of(hit.direction, tier, rule) {
                    Some((name, index)) => {
                        (name.tier.clone(), name.name.clone(), index.to_string())
                    }
                    None => (String::new(), String::new(), "unknown".into()),
                }
            }
            (Decision::EndOfTier { tier }, Some(p)) => (
                p.chain(hit.direction)
                    .tiers
                    .get(usize::from(tier))
                    .map(|t| t.tier.clone())
                    .unwrap_or_default(),
                String::new(),
                "end-of-tier".into(),
            ),
            (Decision::NoPolicy, _) => (String::new(), String::new(), "no-policy".into()),
            (Decision::PassedAll, _) => (String::new(), String::new(), "profile".into()),
            (_, None) => (String::new(), String::new(), "unknown".into()),
        };
        RuleKey {
            tier,
            policy,
            rule,
            direction: match hit.direction {
                Direction::Ingress => "ingress",
                Direction::Egress => "egress",
            },
            action: if hit.allow { "allow" } else { "deny" },
        }
    }
}
