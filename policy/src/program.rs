//! The compiled form the compiler sends and the classifier reads: per
//! endpoint an ingress and an egress [`Chain`] of tiers of rules, which
//! refer to shared IP sets by [`SetId`]. Everything is serde, so one
//! [`Update`] travels to the vrouter as it is.
//!
//! A chain reads top to bottom: in each tier, the first rule that matches
//! decides (Allow, Deny) or leaves the tier (Pass); Log rules note and go
//! on; a tier none of whose rules decided ends with its
//! [`TierChain::end`] (Deny, or Pass for a tier whose default action is
//! Pass). A chain without tiers (no policy selects the endpoint in that
//! direction) allows, and so does passing the last tier (Calico's
//! Kubernetes profiles allow).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ipset::SetContent;

/// An IP set, by number (dense, reused after removal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SetId(pub u32);

/// An endpoint: the pod's namespace and name (the `K8S_POD_NAMESPACE` and
/// `K8S_POD_NAME` the runtime passes at CNI ADD).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointKey {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
}

impl EndpointKey {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> EndpointKey {
        EndpointKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RuleAction {
    /// Allow; stop.
    Allow,
    /// Drop; stop.
    Deny,
    /// Leave the tier; go on with the next one.
    Pass,
    /// Note the packet (rate-limited log line), go on with the next rule.
    Log,
}

/// How a tier ends when no rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TierEnd {
    /// Drop (the end-of-tier drop; every tier but `defaultAction: Pass`).
    Deny,
    /// Go on with the next tier.
    Pass,
}

/// ICMP type and optional code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IcmpMatch {
    /// Type.
    pub icmp_type: u8,
    /// Code (any when absent).
    pub code: Option<u8>,
}

/// A port condition: the port is in one of `ranges`, or the peer address
/// serves the port under one of the names in the `named` sets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ports {
    /// Inclusive ranges.
    pub ranges: Vec<(u16, u16)>,
    /// Named-port sets (of the side's address).
    pub named: Vec<SetId>,
}

/// The conditions on one side (source or destination) of a packet. Every
/// present field must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Side {
    /// The address is in every one of these sets (nets; selected
    /// endpoints and network sets).
    pub in_sets: Vec<SetId>,
    /// The address is in none of these sets (notNets; notSelector).
    pub not_in_sets: Vec<SetId>,
    /// The port matches.
    pub ports: Option<Ports>,
    /// The port does not match.
    pub not_ports: Option<Ports>,
}

/// What a rule matches. Every present field must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Match {
    /// 4 or 6.
    pub ip_version: Option<u8>,
    /// The IP protocol is this.
    pub protocol: Option<u8>,
    /// The IP protocol is not this.
    pub not_protocol: Option<u8>,
    /// ICMP type/code is this.
    pub icmp: Option<IcmpMatch>,
    /// ICMP type/code is not this.
    pub not_icmp: Option<IcmpMatch>,
    /// Source conditions.
    pub src: Side,
    /// Destination conditions.
    pub dst: Side,
}

/// One compiled rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompiledRule {
    /// The action.
    pub action: RuleAction,
    /// The conditions.
    pub when: Match,
    /// Which policy (index into [`Program::policies`]).
    pub policy: u32,
    /// The rule's index in that policy's ingress or egress list.
    pub index: u32,
}

/// One tier's rules for one endpoint and direction: the rules of every
/// policy of the tier that selects the endpoint, policies in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierChain {
    /// The tier's name.
    pub tier: String,
    /// The rules.
    pub rules: Vec<CompiledRule>,
    /// What happens when none decided.
    pub end: TierEnd,
}

/// One direction's tiers, in tier order (only tiers with a policy that
/// applies to the endpoint in this direction).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Chain {
    /// The tiers.
    pub tiers: Vec<TierChain>,
}

/// A policy as rules name it (for counters and logs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PolicyName {
    /// The tier.
    pub tier: String,
    /// Calico's name for it: `knp.default.<name>` for Kubernetes
    /// policies, the name otherwise; with the namespace for namespaced
    /// kinds (`ns/knp.default.deny-all`).
    pub name: String,
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}", self.tier, self.name)
    }
}

/// An endpoint's compiled policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Program {
    /// Traffic to the endpoint.
    pub ingress: Chain,
    /// Traffic from the endpoint.
    pub egress: Chain,
    /// Policies the rules refer to.
    pub policies: Vec<PolicyName>,
}

impl Program {
    /// The chain of a direction.
    pub fn chain(&self, direction: Direction) -> &Chain {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// Every set the program refers to.
    pub fn sets(&self) -> impl Iterator<Item = SetId> + '_ {
        [&self.ingress, &self.egress]
            .into_iter()
            .flat_map(|c| &c.tiers)
            .flat_map(|t| &t.rules)
            .flat_map(|r| [&r.when.src, &r.when.dst])
            .flat_map(|s| {
                s.in_sets
                    .iter()
                    .chain(&s.not_in_sets)
                    .chain(s.ports.iter().flat_map(|p| &p.named))
                    .chain(s.not_ports.iter().flat_map(|p| &p.named))
                    .copied()
            })
    }

    /// The policy and rule index (in the policy's ingress or egress list)
    /// of the rule at `tier`/`rule` of a chain: what a verdict's
    /// `Decision::Rule` names, for per-rule counters and logs.
    pub fn rule_of(
        &self,
        direction: Direction,
        tier: u16,
        rule: u32,
    ) -> Option<(&PolicyName, u32)> {
        let r = self
            .chain(direction)
            .tiers
            .get(usize::from(tier))?
            .rules
            .get(rule as usize)?;
        Some((self.policies.get(r.policy as usize)?, r.index))
    }

    /// Number of rules, both directions.
    pub fn rule_count(&self) -> usize {
        [&self.ingress, &self.egress]
            .into_iter()
            .flat_map(|c| &c.tiers)
            .map(|t| t.rules.len())
            .sum()
    }
}

/// Which way a packet crosses the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Direction {
    /// To the endpoint.
    Ingress,
    /// From the endpoint.
    Egress,
}

/// A change of one set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetUpdate {
    /// Which set.
    pub id: SetId,
    /// Its new content; `None`: removed.
    pub content: Option<SetContent>,
}

/// A change of one endpoint's program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramUpdate {
    /// Which endpoint.
    pub endpoint: EndpointKey,
    /// Its new program; `None`: the endpoint has none any more (gone, or
    /// not local).
    pub program: Option<Program>,
}

/// What one compiler step changed, to apply in order: sets first (new
/// sets before programs refer to them), then programs, then removed sets.
/// `generation` grows by one per non-empty update.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// The policy generation after this update.
    pub generation: u64,
    /// Changed or new sets, and removed ones.
    pub sets: Vec<SetUpdate>,
    /// Changed programs.
    pub programs: Vec<ProgramUpdate>,
    /// Endpoints whose program is unchanged but a set it reads changed:
    /// their verdicts may differ, so their flows revalidate.
    pub touched: Vec<EndpointKey>,
}

impl Update {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.programs.is_empty() && self.touched.is_empty()
    }
}
