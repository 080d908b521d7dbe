//! The classifier: an endpoint's [`Program`] and the IP sets, a packet's
//! 5-tuple (and ICMP type/code) → a [`Verdict`] naming what decided it.
//!
//! Rules are walked in order (a tier's rules are few: a selector or a set
//! of nets is one set membership test); each set membership is a binary
//! search over sorted ranges ([`crate::ipset`]). Nothing allocates per
//! packet.
//!
//! [`PolicyState`] is the dataplane's copy: programs per endpoint and the
//! sets, kept current by applying the compiler's [`Update`]s in order, with
//! the generation per endpoint the connection table revalidates against.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::ipset::SetContent;
use crate::program::{
    Chain, Direction, EndpointKey, Match, Ports, Program, RuleAction, SetId, Side, TierEnd, Update,
};

/// The most sets an update may number (ids are dense; this bounds the
/// table a malformed update could make the dataplane allocate).
pub const MAX_SET_ID: u32 = 1 << 20;

/// What the classifier looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number.
    pub protocol: u8,
    /// Source port (TCP, UDP, SCTP, UDPLite; else 0).
    pub src_port: u16,
    /// Destination port (likewise).
    pub dst_port: u16,
    /// ICMP/ICMPv6 type and code.
    pub icmp: Option<(u8, u8)>,
}

impl Packet {
    /// A TCP/UDP/SCTP packet.
    pub fn ported(src: IpAddr, dst: IpAddr, protocol: u8, src_port: u16, dst_port: u16) -> Packet {
        Packet {
            src,
            dst,
            protocol,
            src_port,
            dst_port,
            icmp: None,
        }
    }

    fn has_ports(&self) -> bool {
        matches!(self.protocol, 6 | 17 | 132 | 136)
    }
}

/// What decided a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// No policy applies to the endpoint in this direction: allowed.
    NoPolicy,
    /// A rule (Allow or Deny): tier index and rule index in the chain.
    Rule {
        /// Tier index in the chain.
        tier: u16,
        /// Rule index in the tier.
        rule: u32,
    },
    /// No rule of this tier decided and the tier ends with a drop.
    EndOfTier {
        /// Tier index in the chain.
        tier: u16,
    },
    /// Every tier passed: allowed (the namespace profile).
    PassedAll,
}

/// A classification result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// Allowed or dropped.
    pub allow: bool,
    /// What decided.
    pub decision: Decision,
    /// The first Log rule the packet matched on the way (tier, rule).
    pub logged: Option<(u16, u32)>,
}

impl Verdict {
    /// Allowed because no policy applies.
    pub const NO_POLICY: Verdict = Verdict {
        allow: true,
        decision: Decision::NoPolicy,
        logged: None,
    };
}

/// The IP sets, by id.
#[derive(Debug, Clone, Default)]
pub struct Sets {
    slots: Vec<Option<SetContent>>,
}

impl Sets {
    /// The set of an id.
    #[inline]
    pub fn get(&self, id: SetId) -> Option<&SetContent> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Sets (or removes) one set.
    pub fn set(&mut self, id: SetId, content: Option<SetContent>) -> Result<(), ApplyError> {
        if id.0 >= MAX_SET_ID {
            return Err(ApplyError::SetIdTooLarge(id.0));
        }
        let i = id.0 as usize;
        if self.slots.len() <= i {
            if content.is_none() {
                return Ok(());
            }
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = content;
        Ok(())
    }

    /// Number of sets present.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn has_addr(&self, id: SetId, addr: IpAddr) -> bool {
        match self.get(id) {
            Some(SetContent::Ips(s)) => s.contains(addr),
            _ => false,
        }
    }

    #[inline]
    fn has_port(&self, id: SetId, addr: IpAddr, protocol: u8, port: u16) -> bool {
        match self.get(id) {
            Some(SetContent::Ports(s)) => s.contains(addr, protocol, port),
            _ => false,
        }
    }
}

#[inline]
fn ports_match(p: &Ports, sets: &Sets, addr: IpAddr, protocol: u8, port: u16) -> bool {
    p.ranges.iter().any(|&(a, b)| a <= port && port <= b)
        || p.named
            .iter()
            .any(|&id| sets.has_port(id, addr, protocol, port))
}

/// The side's port conditions (cheap: checked before any set).
#[inline]
fn side_ports(s: &Side, sets: &Sets, pkt: &Packet, addr: IpAddr, port: u16) -> bool {
    if let Some(p) = &s.ports
        && !(pkt.has_ports() && ports_match(p, sets, addr, pkt.protocol, port))
    {
        return false;
    }
    if let Some(p) = &s.not_ports
        && pkt.has_ports()
        && ports_match(p, sets, addr, pkt.protocol, port)
    {
        return false;
    }
    true
}

/// The side's address conditions.
#[inline]
fn side_addrs(s: &Side, sets: &Sets, addr: IpAddr) -> bool {
    s.in_sets.iter().all(|&id| sets.has_addr(id, addr))
        && !s.not_in_sets.iter().any(|&id| sets.has_addr(id, addr))
}

/// Whether a rule's conditions hold for a packet.
#[inline]
pub fn matches(m: &Match, sets: &Sets, pkt: &Packet) -> bool {
    if let Some(v) = m.ip_version {
        let is4 = pkt.src.is_ipv4();
        if (v == 4) != is4 {
            return false;
        }
    }
    if m.protocol.is_some_and(|p| p != pkt.protocol) {
        return false;
    }
    if m.not_protocol.is_some_and(|p| p == pkt.protocol) {
        return false;
    }
    let icmp_hit = |c: &crate::program::IcmpMatch| {
        pkt.icmp
            .is_some_and(|(t, code)| t == c.icmp_type && c.code.is_none_or(|cc| cc == code))
    };
    if let Some(c) = &m.icmp
        && !icmp_hit(c)
    {
        return false;
    }
    if let Some(c) = &m.not_icmp
        && icmp_hit(c)
    {
        return false;
    }
    side_ports(&m.dst, sets, pkt, pkt.dst, pkt.dst_port)
        && side_ports(&m.src, sets, pkt, pkt.src, pkt.src_port)
        && side_addrs(&m.src, sets, pkt.src)
        && side_addrs(&m.dst, sets, pkt.dst)
}

/// Classifies a packet against one direction's chain.
pub fn classify_chain(chain: &Chain, sets: &Sets, pkt: &Packet) -> Verdict {
    if chain.tiers.is_empty() {
        return Verdict::NO_POLICY;
    }
    let mut logged = None;
    'tiers: for (ti, tier) in chain.tiers.iter().enumerate() {
        let ti = ti as u16;
        for (ri, rule) in tier.rules.iter().enumerate() {
            if !matches(&rule.when, sets, pkt) {
                continue;
            }
            let at = (ti, ri as u32);
            match rule.action {
                RuleAction::Allow | RuleAction::Deny => {
                    return Verdict {
                        allow: rule.action == RuleAction::Allow,
                        decision: Decision::Rule {
                            tier: at.0,
                            rule: at.1,
                        },
                        logged,
                    };
                }
                RuleAction::Pass => continue 'tiers,
                RuleAction::Log => {
                    logged.get_or_insert(at);
                }
            }
        }
        if tier.end == TierEnd::Deny {
            return Verdict {
                allow: false,
                decision: Decision::EndOfTier { tier: ti },
                logged,
            };
        }
    }
    Verdict {
        allow: true,
        decision: Decision::PassedAll,
        logged,
    }
}

/// Classifies a packet crossing an endpoint in a direction.
pub fn classify(program: &Program, direction: Direction, sets: &Sets, pkt: &Packet) -> Verdict {
    classify_chain(program.chain(direction), sets, pkt)
}

/// Why an update was refused (nothing of it applied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The update's generation is not after the state's.
    #[error("update generation {got} is not after the current {current}")]
    StaleGeneration {
        /// The state's generation.
        current: u64,
        /// The update's.
        got: u64,
    },
    /// A set id beyond [`MAX_SET_ID`].
    #[error("set id {0} is too large")]
    SetIdTooLarge(u32),
    /// A program refers to a set the state does not have.
    #[error("program of {endpoint} refers to missing set {set}")]
    MissingSet {
        /// The endpoint.
        endpoint: EndpointKey,
        /// The set id.
        set: u32,
    },
}

/// An endpoint's program and the generation it last changed in (its own
/// rules or a set they read).
#[derive(Debug, Clone)]
pub struct EndpointPolicy {
    /// The program.
    pub program: Program,
    /// The generation of the last change that may alter its verdicts.
    pub generation: u64,
}

/// The dataplane's policy state: the sets and the local endpoints'
/// programs, as of [`PolicyState::generation`].
#[derive(Debug, Clone, Default)]
pub struct PolicyState {
    generation: u64,
    sets: Sets,
    endpoints: HashMap<EndpointKey, EndpointPolicy>,
}

impl PolicyState {
    /// The generation of the last update applied.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The sets.
    pub fn sets(&self) -> &Sets {
        &self.sets
    }

    /// An endpoint's program and generation.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<&EndpointPolicy> {
        self.endpoints.get(key)
    }

    /// Every endpoint with a program, in no order.
    pub fn programs(&self) -> impl Iterator<Item = (&EndpointKey, &EndpointPolicy)> {
        self.endpoints.iter()
    }

    /// Number of endpoints with a program.
    pub fn endpoints(&self) -> usize {
        self.endpoints.len()
    }

    /// Applies a compiler update: all of it or (on error) none of it.
    pub fn apply(&mut self, update: &Update) -> Result<(), ApplyError> {
        if update.generation <= self.generation {
            return Err(ApplyError::StaleGeneration {
                current: self.generation,
                got: update.generation,
            });
        }
        // Check everything before changing anything (no copy of the sets).
        let mut after: HashMap<SetId, bool> = HashMap::with_capacity(update.sets.len());
        for s in &update.sets {
            if s.id.0 >= MAX_SET_ID {
                return Err(ApplyError::SetIdTooLarge(s.id.0));
            }
            after.insert(s.id, s.content.is_some());
        }
        let exists = |id: SetId| {
            after
                .get(&id)
                .copied()
                .unwrap_or_else(|| self.sets.get(id).is_some())
        };
        for p in &update.programs {
            if let Some(program) = &p.program
                && let Some(missing) = program.sets().find(|id| !exists(*id))
            {
                return Err(ApplyError::MissingSet {
                    endpoint: p.endpoint.clone(),
                    set: missing.0,
                });
            }
        }
        // A removed set must not stay in use by a program the update keeps.
        let removed: Vec<SetId> = update
            .sets
            .iter()
            .filter(|s| s.content.is_none())
            .map(|s| s.id)
            .collect();
        if !removed.is_empty() {
            let replaced: std::collections::HashSet<&EndpointKey> =
                update.programs.iter().map(|p| &p.endpoint).collect();
            for (k, ep) in &self.endpoints {
                if !replaced.contains(k)
                    && let Some(id) = ep.program.sets().find(|id| removed.contains(id))
                {
                    return Err(ApplyError::MissingSet {
                        endpoint: k.clone(),
                        set: id.0,
                    });
                }
            }
        }
        for s in &update.sets {
            // In range: checked above.
            let _ = self.sets.set(s.id, s.content.clone());
        }
        let g = update.generation;
        for p in &update.programs {
            match &p.program {
                Some(program) => {
                    self.endpoints.insert(
                        p.endpoint.clone(),
                        EndpointPolicy {
                            program: program.clone(),
                            generation: g,
                        },
                    );
                }
                None => {
                    self.endpoints.remove(&p.endpoint);
                }
            }
        }
        for e in &update.touched {
            if let Some(ep) = self.endpoints.get_mut(e) {
                ep.generation = g;
            }
        }
        self.generation = g;
        Ok(())
    }

    /// Classifies a packet crossing a local endpoint; an endpoint without
    /// a program is not policed (allowed, [`Decision::NoPolicy`]).
    pub fn classify(&self, endpoint: &EndpointKey, direction: Direction, pkt: &Packet) -> Verdict {
        match self.endpoints.get(endpoint) {
            Some(ep) => classify(&ep.program, direction, &self.sets, pkt),
            None => Verdict::NO_POLICY,
        }
    }
}
