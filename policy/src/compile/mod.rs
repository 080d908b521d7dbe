//! The compiler: from the resources (policies of every kind, tiers,
//! namespaces, pods, service accounts, global network sets) and the
//! endpoints the node hosts, to per-endpoint [`Program`]s and shared IP
//! sets, incrementally.
//!
//! [`Compiler::apply`] takes a batch of [`Change`]s and returns the
//! [`Update`] that brings a [`crate::classify::PolicyState`] from the
//! previous generation to the new one: only the programs that changed,
//! only the sets whose content changed, and the endpoints whose verdicts a
//! set change may alter (`touched`). What a change recompiles:
//!
//! - a policy: the local endpoints it selected before or selects now;
//! - a tier: the local endpoints with a policy in it;
//! - a pod, an endpoint, a namespace's or a service account's labels: the
//!   endpoints concerned (which policies apply), and their membership in
//!   every selection set (contents recomputed only for sets they were or
//!   are in);
//! - a global network set: its membership in every selection set.
//!
//! Semantics (Calico's, with Kubernetes policies placed as Calico places
//! them): see the crate README.

mod lower;
mod sets;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use self::lower::{IrPolicy, IrPorts, IrRule, IrSide, SetDef};
use self::sets::SetTable;
use crate::program::{
    Chain, CompiledRule, EndpointKey, Match, PolicyName, Ports, Program, ProgramUpdate, Side,
    TierChain, TierEnd, Update,
};
use crate::resource::calico::DEFAULT_TIER_ORDER;
use crate::resource::k8s::NamedPort;
use crate::resource::{Kind, Resource, ResourceKey};
use crate::selector::Labels;

/// Label Calico gives every endpoint: its namespace.
pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
/// Label Calico gives every endpoint: `k8s`.
pub const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";
/// Label Calico gives every endpoint: its service account.
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";
/// Label the API server gives every namespace: its name.
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// Label Calico gives every namespace: its name.
pub const LABEL_CALICO_NAME: &str = "projectcalico.org/name";

/// What the dataplane side knows of an endpoint (from CNI ADD, or the
/// datastore's endpoints of other nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// Whether it is on this node (gets a program) or elsewhere (only in
    /// sets).
    pub local: bool,
}

/// One input change.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a control-plane input, moved once
pub enum Change {
    /// A resource created or replaced.
    Apply(Resource),
    /// A resource removed.
    Delete(ResourceKey),
    /// An endpoint added, changed (`Some`) or removed (`None`).
    Endpoint(EndpointKey, Option<EndpointInfo>),
}

/// An endpoint as the compiler sees it: the `Pod`'s labels, service
/// account and named ports, the endpoint's addresses (the pod's status
/// addresses when the runtime has not reported it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ep {
    pub key: EndpointKey,
    /// Own labels plus Calico's implicit ones.
    pub labels: BTreeMap<String, String>,
    pub service_account: String,
    pub named_ports: Vec<NamedPort>,
    pub addrs: Vec<IpAddr>,
    pub local: bool,
}

/// What selectors are evaluated against.
pub(crate) struct World<'a> {
    pub eps: &'a BTreeMap<EndpointKey, Ep>,
    pub namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
    pub sas: &'a BTreeMap<(String, String), BTreeMap<String, String>>,
    pub netsets: &'a BTreeMap<String, (BTreeMap<String, String>, Vec<IpNet>)>,
    empty: &'a BTreeMap<String, String>,
}

impl World<'_> {
    /// A namespace's labels (with the implicit name labels).
    pub(crate) fn namespace_labels(&self, ns: &str) -> &dyn Labels {
        self.namespaces.get(ns).unwrap_or(self.empty)
    }

    /// A service account's labels.
    pub(crate) fn sa_labels(&self, ns: &str, sa: &str) -> &dyn Labels {
        self.sas
            .get(&(ns.to_owned(), sa.to_owned()))
            .unwrap_or(self.empty)
    }
}

/// A tier as the compiler orders it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TierInfo {
    order: Option<f64>,
    end: TierEnd,
}

/// The compiler's state; see the module docs.
#[derive(Debug, Default)]
pub struct Compiler {
    generation: u64,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    sas: BTreeMap<(String, String), BTreeMap<String, String>>,
    pods: BTreeMap<EndpointKey, crate::resource::k8s::Pod>,
    infos: BTreeMap<EndpointKey, EndpointInfo>,
    eps: BTreeMap<EndpointKey, Ep>,
    netsets: BTreeMap<String, (BTreeMap<String, String>, Vec<IpNet>)>,
    policies: BTreeMap<ResourceKey, IrPolicy>,
    tiers: BTreeMap<String, TierInfo>,
    /// Local endpoints → the policies that apply to them.
    applicable: BTreeMap<EndpointKey, BTreeSet<ResourceKey>>,
    programs: BTreeMap<EndpointKey, Program>,
    sets: SetTable,
    empty: BTreeMap<String, String>,
}

fn order_key(o: Option<f64>) -> f64 {
    o.unwrap_or(f64::INFINITY)
}

fn by_order_then_name(a: (Option<f64>, &str), b: (Option<f64>, &str)) -> Ordering {
    order_key(a.0)
        .total_cmp(&order_key(b.0))
        .then_with(|| a.1.cmp(b.1))
}

fn applies(p: &IrPolicy, ep: &Ep, w: &World<'_>) -> bool {
    let a = &p.applies;
    a.namespace
        .as_ref()
        .is_none_or(|ns| *ns == ep.key.namespace)
        && a.selector.matches(&ep.labels)
        && a.namespace_selector
            .as_ref()
            .is_none_or(|s| s.matches(w.namespace_labels(&ep.key.namespace)))
        && a.sa_selector
            .as_ref()
            .is_none_or(|s| s.matches(w.sa_labels(&ep.key.namespace, &ep.service_account)))
}

impl Compiler {
    /// An empty compiler (generation 0).
    pub fn new() -> Compiler {
        Compiler::default()
    }

    /// The generation of the last non-empty update.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A local endpoint's current program.
    pub fn program(&self, key: &EndpointKey) -> Option<&Program> {
        self.programs.get(key)
    }

    /// Number of live IP sets.
    pub fn set_count(&self) -> usize {
        self.sets.len()
    }

    /// A set's content (for inspection and `brindlectl`).
    pub fn set_content(&self, id: crate::program::SetId) -> Option<&crate::ipset::SetContent> {
        self.sets.content(id)
    }

    /// Everything as one update from generation 0 (for a dataplane that
    /// (re)connects): every live set and every local program.
    pub fn snapshot(&self) -> Update {
        let mut ids: BTreeSet<crate::program::SetId> = BTreeSet::new();
        for p in self.programs.values() {
            ids.extend(p.sets());
        }
        Update {
            generation: self.generation.max(1),
            sets: ids
                .into_iter()
                .map(|id| crate::program::SetUpdate {
                    id,
                    content: self.sets.content(id).cloned(),
                })
                .collect(),
            programs: self
                .programs
                .iter()
                .map(|(k, p)| ProgramUpdate {
                    endpoint: k.clone(),
                    program: Some(p.clone()),
                })
                .collect(),
            touched: Vec::new(),
        }
    }

    fn world(&self) -> World<'_> {
        World {
            eps: &self.eps,
            namespaces: &self.namespaces,
            sas: &self.sas,
            netsets: &self.netsets,
            empty: &self.empty,
        }
    }

    fn endpoints_in(&self, ns: &str) -> Vec<EndpointKey> {
        self.pods
            .keys()
            .chain(self.infos.keys())
            .filter(|k| k.namespace == ns)
            .cloned()
            .collect()
    }

    /// Applies a batch of changes; returns what the dataplane must apply
    /// (empty, same generation, when nothing changed).
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>) -> Update {
        let mut ep_changed: BTreeSet<EndpointKey> = BTreeSet::new();
        let mut netset_changed: BTreeSet<String> = BTreeSet::new();
        let mut policy_changed: BTreeSet<ResourceKey> = BTreeSet::new();
        let mut tier_changed: BTreeSet<String> = BTreeSet::new();
        for change in changes {
            match change {
                Change::Apply(r) => self.apply_resource(
                    r,
                    &mut ep_changed,
                    &mut netset_changed,
                    &mut policy_changed,
                    &mut tier_changed,
                ),
                Change::Delete(key) => self.delete_resource(
                    key,
                    &mut ep_changed,
                    &mut netset_changed,
                    &mut policy_changed,
                    &mut tier_changed,
                ),
                Change::Endpoint(key, info) => {
                    match info {
                        Some(i) => self.infos.insert(key.clone(), i),
                        None => self.infos.remove(&key),
                    };
                    ep_changed.insert(key);
                }
            }
        }

        // Effective endpoints, then their membership in existing sets.
        for k in &ep_changed {
            match self.build_ep(k) {
                Some(ep) => self.eps.insert(k.clone(), ep),
                None => self.eps.remove(k),
            };
        }
        {
            let w = World {
                eps: &self.eps,
                namespaces: &self.namespaces,
                sas: &self.sas,
                netsets: &self.netsets,
                empty: &self.empty,
            };
            for k in &ep_changed {
                self.sets.reeval_endpoint(k, &w);
            }
            for n in &netset_changed {
                self.sets.reeval_netset(n, &w);
            }
        }

        // Which local endpoints to recompile.
        let mut recompile: BTreeSet<EndpointKey> = BTreeSet::new();
        for k in &ep_changed {
            let local = self.eps.get(k).filter(|e| e.local);
            match local {
                Some(ep) => {
                    let w = self.world();
                    let set: BTreeSet<ResourceKey> = self
                        .policies
                        .iter()
                        .filter(|(_, p)| applies(p, ep, &w))
                        .map(|(k, _)| k.clone())
                        .collect();
                    self.applicable.insert(k.clone(), set);
                }
                None => {
                    self.applicable.remove(k);
                }
            }
            recompile.insert(k.clone());
        }
        for pk in &policy_changed {
            let w = World {
                eps: &self.eps,
                namespaces: &self.namespaces,
                sas: &self.sas,
                netsets: &self.netsets,
                empty: &self.empty,
            };
            let policy = self.policies.get(pk);
            for (ek, set) in self.applicable.iter_mut() {
                let Some(ep) = w.eps.get(ek) else { continue };
                let now = policy.is_some_and(|p| applies(p, ep, &w));
                let before = if now {
                    !set.insert(pk.clone())
                } else {
                    set.remove(pk)
                };
                if now || before {
                    recompile.insert(ek.clone());
                }
            }
        }
        if !tier_changed.is_empty() {
            for (ek, set) in &self.applicable {
                if set.iter().any(|pk| {
                    self.policies
                        .get(pk)
                        .is_some_and(|p| tier_changed.contains(&p.name.tier))
                }) {
                    recompile.insert(ek.clone());
                }
            }
        }

        // Recompile.
        let mut programs = Vec::new();
        for k in &recompile {
            let new = if self.applicable.contains_key(k) {
                Some(self.compile_endpoint(k))
            } else {
                None
            };
            let old = match &new {
                Some(p) => self.programs.insert(k.clone(), p.clone()),
                None => self.programs.remove(k),
            };
            if let Some(old) = &old {
                for id in old.sets().collect::<Vec<_>>() {
                    self.sets.release(id);
                }
            }
            if old != new {
                programs.push(ProgramUpdate {
                    endpoint: k.clone(),
                    program: new,
                });
            }
        }

        let w = World {
            eps: &self.eps,
            namespaces: &self.namespaces,
            sas: &self.sas,
            netsets: &self.netsets,
            empty: &self.empty,
        };
        let (set_updates, changed) = self.sets.finish(&w);
        let mut touched = Vec::new();
        if !changed.is_empty() {
            // Every endpoint reading a changed set whose program is not
            // sent anyway (recompiled to the same program counts: its
            // flows must still revalidate).
            let sent: BTreeSet<&EndpointKey> = programs.iter().map(|p| &p.endpoint).collect();
            for (k, p) in &self.programs {
                if !sent.contains(k) && p.sets().any(|id| changed.contains(&id)) {
                    touched.push(k.clone());
                }
            }
        }
        let mut update = Update {
            generation: self.generation,
            sets: set_updates,
            programs,
            touched,
        };
        if !update.is_empty() {
            self.generation += 1;
            update.generation = self.generation;
        }
        update
    }

    fn build_ep(&self, key: &EndpointKey) -> Option<Ep> {
        let pod = self.pods.get(key);
        let info = self.infos.get(key);
        if pod.is_none() && info.is_none() {
            return None;
        }
        let service_account = pod
            .map(|p| p.service_account().to_owned())
            .unwrap_or_else(|| "default".to_owned());
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        labels.insert(LABEL_NAMESPACE.into(), key.namespace.clone());
        labels.insert(LABEL_ORCHESTRATOR.into(), "k8s".into());
        labels.insert(LABEL_SERVICE_ACCOUNT.into(), service_account.clone());
        if let Some(p) = pod {
            labels.extend(p.metadata.labels.clone());
        }
        let addrs = match (info, pod) {
            (Some(i), _) => i.addrs.clone(),
            (None, Some(p)) => p.addresses(),
            (None, None) => Vec::new(),
        };
        Some(Ep {
            key: key.clone(),
            labels,
            service_account,
            named_ports: pod.map(|p| p.named_ports()).unwrap_or_default(),
            addrs,
            local: info.is_some_and(|i| i.local),
        })
    }

    fn apply_resource(
        &mut self,
        r: Resource,
        ep_changed: &mut BTreeSet<EndpointKey>,
        netset_changed: &mut BTreeSet<String>,
        policy_changed: &mut BTreeSet<ResourceKey>,
        tier_changed: &mut BTreeSet<String>,
    ) {
        let key = r.key();
        match r {
            Resource::Namespace(n) => {
                let name = n.metadata.name.clone();
                let mut labels = n.metadata.labels.clone();
                labels.insert(LABEL_NAMESPACE_NAME.into(), name.clone());
                labels.insert(LABEL_CALICO_NAME.into(), name.clone());
                if self.namespaces.get(&name) != Some(&labels) {
                    self.namespaces.insert(name.clone(), labels);
                    ep_changed.extend(self.endpoints_in(&name));
                }
            }
            Resource::ServiceAccount(sa) => {
                let ns = sa.metadata.namespace().to_owned();
                let name = sa.metadata.name.clone();
                self.sas
                    .insert((ns.clone(), name.clone()), sa.metadata.labels.clone());
                let affected: Vec<EndpointKey> = self
                    .eps
                    .values()
                    .filter(|e| e.key.namespace == ns && e.service_account == name)
                    .map(|e| e.key.clone())
                    .collect();
                ep_changed.extend(affected);
            }
            Resource::Pod(p) => {
                let k = EndpointKey::new(p.metadata.namespace(), p.metadata.name.clone());
                self.pods.insert(k.clone(), p);
                ep_changed.insert(k);
            }
            Resource::KubernetesNetworkPolicy(p) => {
                self.policies.insert(key.clone(), lower::k8s_np(&p));
                policy_changed.insert(key);
            }
            Resource::NetworkPolicy(p) => {
                self.policies.insert(key.clone(), lower::calico_np(&p));
                policy_changed.insert(key);
            }
            Resource::GlobalNetworkPolicy(p) => {
                self.policies.insert(key.clone(), lower::calico_gnp(&p));
                policy_changed.insert(key);
            }
            Resource::Tier(t) => {
                let info = TierInfo {
                    order: t.order(),
                    end: if t.passes_by_default() {
                        TierEnd::Pass
                    } else {
                        TierEnd::Deny
                    },
                };
                self.tiers.insert(t.metadata.name.clone(), info);
                tier_changed.insert(t.metadata.name.clone());
            }
            Resource::GlobalNetworkSet(s) => {
                let nets = s.nets();
                self.netsets
                    .insert(s.metadata.name.clone(), (s.metadata.labels.clone(), nets));
                netset_changed.insert(s.metadata.name.clone());
            }
        }
    }

    fn delete_resource(
        &mut self,
        key: ResourceKey,
        ep_changed: &mut BTreeSet<EndpointKey>,
        netset_changed: &mut BTreeSet<String>,
        policy_changed: &mut BTreeSet<ResourceKey>,
        tier_changed: &mut BTreeSet<String>,
    ) {
        let ns = key.namespace.clone().unwrap_or_default();
        match key.kind {
            Kind::Namespace => {
                if self.namespaces.remove(&key.name).is_some() {
                    ep_changed.extend(self.endpoints_in(&key.name));
                }
            }
            Kind::ServiceAccount => {
                self.sas.remove(&(ns.clone(), key.name.clone()));
                let affected: Vec<EndpointKey> = self
                    .eps
                    .values()
                    .filter(|e| e.key.namespace == ns && e.service_account == key.name)
                    .map(|e| e.key.clone())
                    .collect();
                ep_changed.extend(affected);
            }
            Kind::Pod => {
                let k = EndpointKey::new(ns, key.name);
                self.pods.remove(&k);
                ep_changed.insert(k);
            }
            Kind::KubernetesNetworkPolicy | Kind::NetworkPolicy | Kind::GlobalNetworkPolicy => {
                if self.policies.remove(&key).is_some() {
                    policy_changed.insert(key);
                }
            }
            Kind::Tier => {
                if self.tiers.remove(&key.name).is_some() {
                    tier_changed.insert(key.name);
                }
            }
            Kind::GlobalNetworkSet => {
                if self.netsets.remove(&key.name).is_some() {
                    netset_changed.insert(key.name);
                }
            }
        }
    }

    fn tier_info(&self, name: &str) -> TierInfo {
        match self.tiers.get(name) {
            Some(t) => *t,
            None if name == crate::resource::calico::DEFAULT_TIER => TierInfo {
                order: Some(DEFAULT_TIER_ORDER),
                end: TierEnd::Deny,
            },
            // A policy in a tier that does not exist (yet): the tier is
            // ordered last and ends with a drop, so nothing opens up.
            None => TierInfo {
                order: None,
                end: TierEnd::Deny,
            },
        }
    }

    /// Compiles one local endpoint's program (its sets interned).
    fn compile_endpoint(&mut self, key: &EndpointKey) -> Program {
        let keys: Vec<ResourceKey> = self
            .applicable
            .get(key)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let mut pols: Vec<&IrPolicy> = keys.iter().filter_map(|k| self.policies.get(k)).collect();
        pols.sort_by(|a, b| {
            let (ta, tb) = (self.tier_info(&a.name.tier), self.tier_info(&b.name.tier));
            by_order_then_name((ta.order, &a.name.tier), (tb.order, &b.name.tier))
                .then_with(|| by_order_then_name((a.order, &a.name.name), (b.order, &b.name.name)))
        });
        let pols: Vec<IrPolicy> = pols.into_iter().cloned().collect();
        let mut program = Program::default();
        let mut policy_index: BTreeMap<PolicyName, u32> = BTreeMap::new();
        for (ingress, chain) in [(true, &mut program.ingress), (false, &mut program.egress)] {
            *chain = Chain::default();
            for p in &pols {
                let Some(rules) = (if ingress { &p.ingress } else { &p.egress }) else {
                    continue;
                };
                let pi = *policy_index.entry(p.name.clone()).or_insert_with(|| {
                    program.policies.push(p.name.clone());
                    (program.policies.len() - 1) as u32
                });
                if chain.tiers.last().is_none_or(|t| t.tier != p.name.tier) {
                    chain.tiers.push(TierChain {
                        tier: p.name.tier.clone(),
                        rules: Vec::new(),
                        end: self.tier_info(&p.name.tier).end,
                    });
                }
                let mut compiled = Vec::with_capacity(rules.len());
                for r in rules {
                    compiled.push(self.compile_rule(r, pi));
                }
                if let Some(t) = chain.tiers.last_mut() {
                    t.rules.extend(compiled);
                }
            }
        }
        program
    }

    fn compile_rule(&mut self, r: &IrRule, policy: u32) -> CompiledRule {
        let protocol = r.protocol;
        CompiledRule {
            action: r.action,
            when: Match {
                ip_version: r.ip_version,
                protocol,
                not_protocol: r.not_protocol,
                icmp: r.icmp,
                not_icmp: r.not_icmp,
                src: self.compile_side(&r.src, protocol),
                dst: self.compile_side(&r.dst, protocol),
            },
            policy,
            index: r.index,
        }
    }

    fn compile_side(&mut self, s: &IrSide, protocol: Option<u8>) -> Side {
        let w = World {
            eps: &self.eps,
            namespaces: &self.namespaces,
            sas: &self.sas,
            netsets: &self.netsets,
            empty: &self.empty,
        };
        let sets = &mut self.sets;
        let mut intern = |d: &SetDef| sets.intern(d, &w);
        let in_sets = s.in_sets.iter().map(&mut intern).collect();
        let not_in_sets = s.not_in_sets.iter().map(&mut intern).collect();
        let mut ports = |p: &Option<IrPorts>| {
            p.as_ref().map(|p| Ports {
                ranges: p.ranges.clone(),
                named: p
                    .named
                    .iter()
                    .map(|name| {
                        intern(&SetDef::NamedPort {
                            selection: s
                                .named_scope
                                .clone()
                                .unwrap_or_else(lower::Selection::everything),
                            name: name.clone(),
                            protocol: protocol.unwrap_or(6),
                        })
                    })
                    .collect(),
            })
        };
        let p = ports(&s.ports);
        let np = ports(&s.not_ports);
        Side {
            in_sets,
            not_in_sets,
            ports: p,
            not_ports: np,
        }
    }
}

#[cfg(test)]
mod tests;
