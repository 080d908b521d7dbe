//! The compiler's IP sets: interned by definition (equal definitions share
//! one id), reference-counted by the programs that read them, with their
//! members kept current as endpoints, namespaces and network sets change;
//! [`SetTable::finish`] turns a step's changes into set updates.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::lower::{Scope, Selection, SetDef};
use super::{Ep, World};
use crate::ipset::{IpSet, PortSet, SetContent};
use crate::program::{EndpointKey, SetId, SetUpdate};

/// A member of a selection set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Member {
    Endpoint(EndpointKey),
    NetSet(String),
}

#[derive(Debug)]
struct Entry {
    def: SetDef,
    refs: usize,
    members: BTreeSet<Member>,
    content: SetContent,
    /// Members changed this step: content to recompute.
    dirty: bool,
    /// Created this step: to send whatever happens.
    new: bool,
}

/// Interned sets.
#[derive(Debug, Default)]
pub(crate) struct SetTable {
    by_def: HashMap<SetDef, SetId>,
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// Ids released this step that existed before it (to remove).
    released: Vec<SetId>,
}

fn selection_of(def: &SetDef) -> Option<&Selection> {
    match def {
        SetDef::Nets { .. } => None,
        SetDef::Select(s) => Some(s),
        SetDef::NamedPort { selection, .. } => Some(selection),
    }
}

/// Whether a selection holds an endpoint.
pub(crate) fn selects_endpoint(sel: &Selection, ep: &Ep, w: &World<'_>) -> bool {
    let in_scope = match &sel.scope {
        Scope::Any => true,
        Scope::Namespace(ns) => ep.key.namespace == *ns,
        Scope::NamespaceSelector(s) => {
            s.matches_namespace(Some(w.namespace_labels(&ep.key.namespace)))
        }
    };
    in_scope
        && sel.selector.matches(&ep.labels)
        && (sel.sa_names.is_empty() || sel.sa_names.binary_search(&ep.service_account).is_ok())
        && sel
            .sa_selector
            .as_ref()
            .is_none_or(|s| s.matches(w.sa_labels(&ep.key.namespace, &ep.service_account)))
}

/// Whether a selection holds a global network set.
fn selects_netset(sel: &Selection, labels: &BTreeMap<String, String>) -> bool {
    let in_scope = match &sel.scope {
        Scope::Any => true,
        Scope::Namespace(_) => false,
        Scope::NamespaceSelector(s) => s.matches_namespace(None),
    };
    in_scope && sel.sa_names.is_empty() && sel.sa_selector.is_none() && sel.selector.matches(labels)
}

fn content_of(def: &SetDef, members: &BTreeSet<Member>, w: &World<'_>) -> SetContent {
    match def {
        SetDef::Nets { nets, except } => SetContent::Ips(IpSet::from_nets_except(nets, except)),
        SetDef::Select(_) => {
            let mut nets = Vec::new();
            for m in members {
                match m {
                    Member::Endpoint(k) => {
                        if let Some(ep) = w.eps.get(k) {
                            nets.extend(ep.addrs.iter().map(|a| ipnet::IpNet::from(*a)));
                        }
                    }
                    Member::NetSet(n) => {
                        if let Some((_, ns)) = w.netsets.get(n) {
                            nets.extend(ns.iter().copied());
                        }
                    }
                }
            }
            SetContent::Ips(IpSet::from_nets(&nets))
        }
        SetDef::NamedPort { name, protocol, .. } => {
            let mut entries = Vec::new();
            for m in members {
                let Member::Endpoint(k) = m else { continue };
                let Some(ep) = w.eps.get(k) else { continue };
                for np in &ep.named_ports {
                    if np.name == *name && np.protocol == *protocol {
                        entries.extend(ep.addrs.iter().map(|a| (*a, np.protocol, np.port)));
                    }
                }
            }
            SetContent::Ports(PortSet::new(entries))
        }
    }
}

impl SetTable {
    /// The id of a definition, created (members computed) if new; one
    /// more reference.
    pub(crate) fn intern(&mut self, def: &SetDef, w: &World<'_>) -> SetId {
        if let Some(id) = self.by_def.get(def) {
            if let Some(Some(e)) = self.slots.get_mut(id.0 as usize) {
                e.refs += 1;
            }
            return *id;
        }
        let mut members = BTreeSet::new();
        if let Some(sel) = selection_of(def) {
            for (k, ep) in w.eps {
                if selects_endpoint(sel, ep, w) {
                    members.insert(Member::Endpoint(k.clone()));
                }
            }
            for (n, (labels, _)) in w.netsets {
                if selects_netset(sel, labels) {
                    members.insert(Member::NetSet(n.clone()));
                }
            }
        }
        let content = content_of(def, &members, w);
        let entry = Entry {
            def: def.clone(),
            refs: 1,
            members,
            content,
            dirty: false,
            new: true,
        };
        let id = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(entry);
                SetId(i)
            }
            None => {
                self.slots.push(Some(entry));
                SetId((self.slots.len() - 1) as u32)
            }
        };
        self.by_def.insert(def.clone(), id);
        id
    }

    /// One reference fewer; the set goes when none is left.
    pub(crate) fn release(&mut self, id: SetId) {
        let Some(slot) = self.slots.get_mut(id.0 as usize) else {
            return;
        };
        let Some(e) = slot else { return };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 {
            self.by_def.remove(&e.def);
            if !e.new {
                self.released.push(id);
            }
            *slot = None;
            self.free.push(id.0);
        }
    }

    /// Re-evaluates one endpoint (changed, new or gone) against every
    /// selection set.
    pub(crate) fn reeval_endpoint(&mut self, key: &EndpointKey, w: &World<'_>) {
        let ep = w.eps.get(key);
        let member = Member::Endpoint(key.clone());
        for e in self.slots.iter_mut().flatten() {
            let Some(sel) = selection_of(&e.def) else {
                continue;
            };
            let now = ep.is_some_and(|ep| selects_endpoint(sel, ep, w));
            let was = if now {
                !e.members.insert(member.clone())
            } else {
                e.members.remove(&member)
            };
            // A member's addresses or ports may have changed too.
            if now || was {
                e.dirty = true;
            }
        }
    }

    /// Re-evaluates one global network set against every selection set.
    pub(crate) fn reeval_netset(&mut self, name: &str, w: &World<'_>) {
        let labels = w.netsets.get(name).map(|(l, _)| l);
        let member = Member::NetSet(name.to_owned());
        for e in self.slots.iter_mut().flatten() {
            let Some(sel) = selection_of(&e.def) else {
                continue;
            };
            let now = labels.is_some_and(|l| selects_netset(sel, l));
            let was = if now {
                !e.members.insert(member.clone())
            } else {
                e.members.remove(&member)
            };
            if now || was {
                e.dirty = true;
            }
        }
    }

    /// Ends a step: the updates to send (new sets, changed contents,
    /// removed sets) and the ids of pre-existing sets whose content changed.
    pub(crate) fn finish(&mut self, w: &World<'_>) -> (Vec<SetUpdate>, BTreeSet<SetId>) {
        let mut updates = Vec::new();
        let mut changed = BTreeSet::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(e) = slot else { continue };
            let id = SetId(i as u32);
            if e.dirty {
                let c = content_of(&e.def, &e.members, w);
                if c != e.content {
                    e.content = c;
                    if !e.new {
                        changed.insert(id);
                        updates.push(SetUpdate {
                            id,
                            content: Some(e.content.clone()),
                        });
                    }
                }
                e.dirty = false;
            }
            if e.new {
                updates.push(SetUpdate {
                    id,
                    content: Some(e.content.clone()),
                });
                e.new = false;
            }
        }
        for id in self.released.drain(..) {
            // Reused by a new set this step: its content went out above.
            if self.slots.get(id.0 as usize).is_some_and(Option::is_none) {
                updates.push(SetUpdate { id, content: None });
            }
        }
        (updates, changed)
    }

    /// Number of live sets.
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// A set's content.
    pub(crate) fn content(&self, id: SetId) -> Option<&SetContent> {
        self.slots.get(id.0 as usize)?.as_ref().map(|e| &e.content)
    }
}
