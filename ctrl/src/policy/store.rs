//! Policy resources as datastore records.

use std::sync::Arc;

use brindle_ipam::store::{Compare, Datastore, StoreError, Write};
use brindle_policy::resource::{Kind, Resource, ResourceKey};
use serde::{Deserialize, Serialize};

/// Every kind, in the order `get` lists them.
pub const KINDS: [Kind; 8] = [
    Kind::Namespace,
    Kind::Pod,
    Kind::ServiceAccount,
    Kind::Tier,
    Kind::KubernetesNetworkPolicy,
    Kind::NetworkPolicy,
    Kind::GlobalNetworkPolicy,
    Kind::GlobalNetworkSet,
];

/// The key segment of a kind (plural, lower case, as `kubectl get` names
/// it; Kubernetes' NetworkPolicy apart from Calico's).
pub fn kind_segment(kind: Kind) -> &'static str {
    match kind {
        Kind::Namespace => "namespaces",
        Kind::Pod => "pods",
        Kind::ServiceAccount => "serviceaccounts",
        Kind::KubernetesNetworkPolicy => "networkpolicies.networking.k8s.io",
        Kind::NetworkPolicy => "networkpolicies.projectcalico.org",
        Kind::GlobalNetworkPolicy => "globalnetworkpolicies",
        Kind::Tier => "tiers",
        Kind::GlobalNetworkSet => "globalnetworksets",
    }
}

/// The kinds a `brindlectl get` name stands for (`networkpolicies`: both
/// Kubernetes' and Calico's), or `None` when unknown.
pub fn kinds_named(name: &str) -> Option<Vec<Kind>> {
    let k = match name.to_ascii_lowercase().as_str() {
        "networkpolicies" | "networkpolicy" | "netpol" => {
            vec![Kind::KubernetesNetworkPolicy, Kind::NetworkPolicy]
        }
        "globalnetworkpolicies" | "globalnetworkpolicy" | "gnp" => vec![Kind::GlobalNetworkPolicy],
        "tiers" | "tier" => vec![Kind::Tier],
        "globalnetworksets" | "globalnetworkset" => vec![Kind::GlobalNetworkSet],
        "namespaces" | "namespace" | "ns" => vec![Kind::Namespace],
        "pods" | "pod" | "po" => vec![Kind::Pod],
        "serviceaccounts" | "serviceaccount" | "sa" => vec![Kind::ServiceAccount],
        "all" => KINDS.to_vec(),
        other => {
            return KINDS
                .iter()
                .copied()
                .find(|k| kind_segment(*k) == other)
                .map(|k| vec![k]);
        }
    };
    Some(k)
}

/// What applying one resource did (kubectl's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It did not exist.
    Created,
    /// It existed with another content.
    Configured,
    /// It existed with this content.
    Unchanged,
    /// Deleted.
    Deleted,
}

/// One line of an apply or delete report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// `Kind namespace/name` or `Kind name`.
    pub resource: String,
    /// What happened.
    pub outcome: Outcome,
}

/// Why an apply or delete did nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreFailure {
    /// The datastore failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Resources to delete that do not exist.
    #[error("not found: {}", .0.join(", "))]
    NotFound(Vec<String>),
    /// Others kept writing the same keys.
    #[error("conflicting writes to the same resources; try again")]
    Conflict,
}

/// Policy records under `<root>policy/`.
#[derive(Clone)]
pub struct PolicyStore {
    store: Arc<dyn Datastore>,
    prefix: String,
    marker: String,
}

/// Attempts of a transaction whose compares keep failing.
const ATTEMPTS: usize = 5;

impl PolicyStore {
    /// The records under `root` (`datastore.prefix`, `/brindle/`).
    pub fn new(store: Arc<dyn Datastore>, root: &str) -> Self {
        PolicyStore {
            store,
            prefix: prefix(root),
            marker: marker(root),
        }
    }

    fn key(&self, k: &ResourceKey) -> String {
        match &k.namespace {
            Some(ns) => format!("{}{}/{ns}/{}", self.prefix, kind_segment(k.kind), k.name),
            None => format!("{}{}/{}", self.prefix, kind_segment(k.kind), k.name),
        }
    }

    /// Stores every resource in one transaction (all or nothing; a later
    /// document wins over an earlier one with the same key).
    pub fn apply(&self, resources: &[Resource]) -> Result<Vec<Applied>, StoreFailure> {
        for _ in 0..ATTEMPTS {
            let mut compares = Vec::new();
            let mut writes = Vec::new();
            let mut report = Vec::new();
            for r in resources {
                let key = self.key(&r.key());
                let value = serde_json::to_vec(&r.to_value())
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let old = self.store.get(&key)?;
                let outcome = match &old {
                    None => Outcome::Created,
                    Some(e) if e.value == value => Outcome::Unchanged,
                    Some(_) => Outcome::Configured,
                };
                if !compares.iter().any(|c| compare_key(c) == key) {
                    compares.push(Compare::unchanged(&key, old.as_ref()));
                }
                // etcd refuses a transaction writing one key twice.
                writes.retain(|w| !matches!(w, Write::Put(k, _) if *k == key));
                if outcome != Outcome::Unchanged {
                    writes.push(Write::Put(key, value));
                }
                report.push(Applied {
                    resource: r.key().to_string(),
                    outcome,
                });
            }
            if writes.is_empty() {
                return Ok(report);
            }
            writes.push(Write::Put(self.marker.clone(), b"1".to_vec()));
            if self.store.txn(&compares, &writes)? {
                return Ok(report);
            }
        }
        Err(StoreFailure::Conflict)
    }

    /// Deletes every resource in one transaction; fails without deleting
    /// anything when one does not exist, unless `ignore_missing`.
    pub fn delete(
        &self,
        keys: &[ResourceKey],
        ignore_missing: bool,
    ) -> Result<Vec<Applied>, StoreFailure> {
        for _ in 0..ATTEMPTS {
            let mut compares = Vec::new();
            let mut writes = Vec::new();
            let mut report = Vec::new();
            let mut missing = Vec::new();
            for k in keys {
                let key = self.key(k);
                let old = self.store.get(&key)?;
                if old.is_none() {
                    missing.push(k.to_string());
                    continue;
                }
                if !compares.iter().any(|c| compare_key(c) == key) {
                    compares.push(Compare::unchanged(&key, old.as_ref()));
                    writes.push(Write::Delete(key));
                }
                report.push(Applied {
                    resource: k.to_string(),
                    outcome: Outcome::Deleted,
                });
            }
            if !missing.is_empty() && !ignore_missing {
                return Err(StoreFailure::NotFound(missing));
            }
            if writes.is_empty() {
                return Ok(report);
            }
            writes.push(Write::Put(self.marker.clone(), b"1".to_vec()));
            if self.store.txn(&compares, &writes)? {
                return Ok(report);
            }
        }
        Err(StoreFailure::Conflict)
    }

    /// Every stored resource of `kind` (in `namespace` when given), in key
    /// order. A record that no longer parses is an error naming its key.
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<Vec<Resource>, StoreError> {
        let mut prefix = format!("{}{}/", self.prefix, kind_segment(kind));
        if let (Some(ns), true) = (namespace, kind.namespaced()) {
            prefix.push_str(ns);
            prefix.push('/');
        }
        self.store
            .list(&prefix)?
            .into_iter()
            .map(|e| parse_record(&e.key, &e.value))
            .collect()
    }
}

/// `<root>policy/`.
pub fn prefix(root: &str) -> String {
    format!("{root}policy/")
}

/// `<root>policy-changed`: written in every transaction that changes a
/// record, so a node learns of a change by reading this one key (its
/// revision) rather than listing every record.
pub fn marker(root: &str) -> String {
    format!("{root}policy-changed")
}

/// A stored record as a resource.
pub fn parse_record(key: &str, value: &[u8]) -> Result<Resource, StoreError> {
    let v: serde_json::Value =
        serde_json::from_slice(value).map_err(|e| StoreError::Corrupt(format!("{key}: {e}")))?;
    let r = Resource::from_value(v).map_err(|e| StoreError::Corrupt(format!("{key}: {e}")))?;
    r.validate()
        .map_err(|e| StoreError::Corrupt(format!("{key}: {e}")))?;
    Ok(r)
}

fn compare_key(c: &Compare) -> &str {
    match c {
        Compare::Absent(k) | Compare::Revision(k, _) => k,
    }
}

#[cfg(test)]
mod tests {
    use brindle_ipam::store::MemoryStore;
    use brindle_policy::resource::parse_documents;

    use super::*;

    fn store() -> PolicyStore {
        PolicyStore::new(Arc::new(MemoryStore::new()), "/brindle/")
    }

    const DOCS: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
        metadata: {name: deny, namespace: a}\nspec: {podSelector: {}}\n---\n\
        apiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: security}\nspec: {order: 100}\n";

    #[test]
    fn apply_reports_created_unchanged_configured_and_lists_by_kind() {
        let s = store();
        let docs = parse_documents(DOCS).unwrap();
        let out = s.apply(&docs).unwrap();
        assert_eq!(
            out.iter().map(|a| a.outcome).collect::<Vec<_>>(),
            [Outcome::Created, Outcome::Created]
        );
        assert_eq!(out[0].resource, "NetworkPolicy a/deny");
        let out = s.apply(&docs).unwrap();
        assert!(out.iter().all(|a| a.outcome == Outcome::Unchanged));
        let changed = parse_documents(&DOCS.replace("order: 100", "order: 50")).unwrap();
        let out = s.apply(&changed).unwrap();
        assert_eq!(out[1].outcome, Outcome::Configured);
        assert_eq!(s.list(Kind::Tier, None).unwrap(), vec![changed[1].clone()]);
        assert_eq!(
            s.list(Kind::KubernetesNetworkPolicy, Some("a"))
                .unwrap()
                .len(),
            1
        );
        assert!(
            s.list(Kind::KubernetesNetworkPolicy, Some("b"))
                .unwrap()
                .is_empty()
        );
        assert!(s.list(Kind::NetworkPolicy, None).unwrap().is_empty());
    }

    #[test]
    fn a_delete_with_one_missing_resource_deletes_nothing() {
        let s = store();
        let docs = parse_documents(DOCS).unwrap();
        s.apply(&docs[..1]).unwrap();
        let keys: Vec<ResourceKey> = docs.iter().map(Resource::key).collect();
        let e = s.delete(&keys, false).unwrap_err();
        assert_eq!(e.to_string(), "not found: Tier security");
        assert_eq!(
            s.list(Kind::KubernetesNetworkPolicy, None).unwrap().len(),
            1
        );
        let out = s.delete(&keys, true).unwrap();
        assert_eq!(out.len(), 1);
        assert!(
            s.list(Kind::KubernetesNetworkPolicy, None)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn get_names_map_to_kinds() {
        assert_eq!(
            kinds_named("networkpolicies").unwrap(),
            [Kind::KubernetesNetworkPolicy, Kind::NetworkPolicy]
        );
        assert_eq!(kinds_named("GNP").unwrap(), [Kind::GlobalNetworkPolicy]);
        assert_eq!(
            kinds_named("networkpolicies.projectcalico.org").unwrap(),
            [Kind::NetworkPolicy]
        );
        assert!(kinds_named("services").is_none());
    }
}
