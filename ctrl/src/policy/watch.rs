//! What changed in the datastore since the last read, as compiler changes:
//! the policy resources (every node applies the same ones) and the
//! endpoints of the other nodes (their pods' addresses, for the sets of
//! selectors that match them). This node's endpoints reach the compiler
//! from the owner (`Event::Endpoint`), at once.
//!
//! Polled by the datastore thread on every tick and after a local apply:
//! each read lists the two prefixes; only records whose revision changed
//! are parsed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use brindle_api::endpoint::Endpoint;
use brindle_ipam::store::{Datastore, StoreError};
use brindle_policy::compile::{Change, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::ResourceKey;
use tracing::warn;

use super::store::{marker, parse_record, prefix};

/// A pod and the addresses of one of its endpoints.
type PodAddrs = (EndpointKey, Vec<IpAddr>);

/// The last read, to diff the next one against.
pub struct PolicyWatch {
    policy_prefix: String,
    marker: String,
    /// The marker's revision at the last full read.
    marker_revision: Option<u64>,
    endpoints_prefix: String,
    own_endpoints: String,
    /// Policy records by datastore key: revision and the resource key.
    resources: BTreeMap<String, (u64, ResourceKey)>,
    /// Other nodes' endpoint records by datastore key: revision and the pod
    /// with its addresses.
    endpoints: BTreeMap<String, (u64, Option<PodAddrs>)>,
    /// The addresses last reported per remote pod.
    pods: BTreeMap<EndpointKey, Vec<IpAddr>>,
}

impl PolicyWatch {
    /// A watch of `root` (`datastore.prefix`) for node `node`.
    pub fn new(root: &str, node: &str) -> Self {
        PolicyWatch {
            policy_prefix: prefix(root),
            marker: marker(root),
            marker_revision: None,
            endpoints_prefix: format!("{root}endpoints/"),
            own_endpoints: format!("{root}endpoints/{node}/"),
            resources: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            pods: BTreeMap::new(),
        }
    }

    /// Reads both prefixes and returns what changed since the last
    /// successful read (everything, the first time). A record that does
    /// not parse is logged and left out (as if absent).
    pub fn poll(&mut self, store: &dyn Datastore) -> Result<Vec<Change>, StoreError> {
        let marker = store.get(&self.marker)?.map(|e| e.revision);
        let changes = self.read(store)?;
        // Read before the records: a write after it bumps it again.
        self.marker_revision = marker;
        Ok(changes)
    }

    /// Reads the marker key only, and everything when it changed since the
    /// last full read (a policy change on any node). Other nodes' endpoints
    /// wait for the next [`PolicyWatch::poll`].
    pub fn check(&mut self, store: &dyn Datastore) -> Result<Vec<Change>, StoreError> {
        let marker = store.get(&self.marker)?.map(|e| e.revision);
        if marker == self.marker_revision {
            return Ok(Vec::new());
        }
        self.poll(store)
    }

    fn read(&mut self, store: &dyn Datastore) -> Result<Vec<Change>, StoreError> {
        let policy = store.list(&self.policy_prefix)?;
        let endpoints = store.list(&self.endpoints_prefix)?;
        let mut changes = Vec::new();

        let mut seen = BTreeSet::new();
        let mut applied = Vec::new();
        for e in policy {
            seen.insert(e.key.clone());
            if self
                .resources
                .get(&e.key)
                .is_some_and(|(rev, _)| *rev == e.revision)
            {
                continue;
            }
            match parse_record(&e.key, &e.value) {
                Ok(r) => {
                    let rk = r.key();
                    if let Some((_, old)) = self.resources.insert(e.key, (e.revision, rk.clone()))
                        && old != rk
                    {
                        changes.push(Change::Delete(old));
                    }
                    applied.push(r);
                }
                Err(err) => {
                    warn!(error = %err, "policy record left out");
                    if let Some((_, old)) = self.resources.remove(&e.key) {
                        changes.push(Change::Delete(old));
                    }
                }
            }
        }
        let gone: Vec<String> = self
            .resources
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some((_, rk)) = self.resources.remove(&k) {
                changes.push(Change::Delete(rk));
            }
        }
        // Deletions first: a resource renamed in place is deleted, then
        // applied.
        changes.extend(applied.into_iter().map(Change::Apply));

        let mut seen = BTreeSet::new();
        let mut dirty = false;
        for e in endpoints {
            if e.key.starts_with(&self.own_endpoints) {
                continue;
            }
            seen.insert(e.key.clone());
            if self
                .endpoints
                .get(&e.key)
                .is_some_and(|(rev, _)| *rev == e.revision)
            {
                continue;
            }
            let pod = match serde_json::from_slice::<Endpoint>(&e.value) {
                Ok(ep) if !ep.pod.namespace.is_empty() && !ep.pod.name.is_empty() => Some((
                    EndpointKey {
                        namespace: ep.pod.namespace,
                        name: ep.pod.name,
                    },
                    ep.ips.iter().map(|n| n.addr()).collect(),
                )),
                Ok(_) => None,
                Err(err) => {
                    warn!(key = %e.key, error = %err, "endpoint record left out");
                    None
                }
            };
            self.endpoints.insert(e.key, (e.revision, pod));
            dirty = true;
        }
        let before = self.endpoints.len();
        self.endpoints.retain(|k, _| seen.contains(k));
        dirty |= self.endpoints.len() != before;
        if dirty {
            changes.extend(self.pod_changes());
        }
        Ok(changes)
    }

    /// The remote pods whose addresses changed (a pod with several
    /// interfaces has the addresses of all).
    fn pod_changes(&mut self) -> Vec<Change> {
        let mut now: BTreeMap<EndpointKey, Vec<IpAddr>> = BTreeMap::new();
        for (k, addrs) in self.endpoints.values().filter_map(|(_, p)| p.as_ref()) {
            now.entry(k.clone()).or_default().extend(addrs);
        }
        for addrs in now.values_mut() {
            addrs.sort();
            addrs.dedup();
        }
        let mut out = Vec::new();
        for (k, addrs) in &now {
            if self.pods.get(k) != Some(addrs) {
                out.push(Change::Endpoint(
                    k.clone(),
                    Some(EndpointInfo {
                        addrs: addrs.clone(),
                        local: false,
                    }),
                ));
            }
        }
        for k in self.pods.keys().filter(|k| !now.contains_key(*k)) {
            out.push(Change::Endpoint(k.clone(), None));
        }
        self.pods = now;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use brindle_api::endpoint::PodRef;
    use brindle_ipam::store::MemoryStore;
    use brindle_policy::resource::parse_documents;

    use super::super::store::PolicyStore;
    use super::*;
    use crate::endpoints::EndpointStore;

    fn endpoint(container: &str, ns: &str, pod: &str, ip: &str) -> Endpoint {
        let mut ep = crate::programming::desired::tests::endpoint(container, "bri0", ip);
        ep.pod = PodRef {
            namespace: ns.into(),
            name: pod.into(),
            ..PodRef::default()
        };
        ep
    }

    fn describe(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Apply(r) => format!("apply {}", r.key()),
                Change::Delete(k) => format!("delete {k}"),
                Change::Endpoint(k, Some(i)) => {
                    format!(
                        "endpoint {}/{} {:?} local={}",
                        k.namespace, k.name, i.addrs, i.local
                    )
                }
                Change::Endpoint(k, None) => format!("endpoint {}/{} gone", k.namespace, k.name),
            })
            .collect()
    }

    #[test]
    fn each_change_is_reported_once_and_own_endpoints_are_left_to_the_owner() {
        let ds: Arc<dyn Datastore> = Arc::new(MemoryStore::new());
        let policies = PolicyStore::new(ds.clone(), "/brindle/");
        let mine = EndpointStore::new(ds.clone(), "/brindle/", "n1");
        let theirs = EndpointStore::new(ds.clone(), "/brindle/", "n2");
        let mut w = PolicyWatch::new("/brindle/", "n1");
        assert!(w.poll(&*ds).unwrap().is_empty());

        let docs = parse_documents(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: x}}\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: a}\n\
             spec: {podSelector: {}}\n",
        )
        .unwrap();
        policies.apply(&docs).unwrap();
        mine.put(&endpoint("c1", "a", "p1", "10.65.0.2/32"))
            .unwrap();
        theirs
            .put(&endpoint("c2", "a", "p2", "10.65.1.2/32"))
            .unwrap();
        theirs.put(&endpoint("c3", "", "", "10.65.1.3/32")).unwrap();
        assert_eq!(
            describe(&w.poll(&*ds).unwrap()),
            [
                "apply Namespace a",
                "apply NetworkPolicy a/deny",
                "endpoint a/p2 [10.65.1.2] local=false"
            ]
        );
        assert!(w.poll(&*ds).unwrap().is_empty(), "nothing new");

        // The marker check reads one key while nothing changed, and
        // everything once a policy changed.
        assert!(w.check(&*ds).unwrap().is_empty());
        let tier = parse_documents(
            "apiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: t}\nspec: {order: 1}\n",
        )
        .unwrap();
        policies.apply(&tier).unwrap();
        assert_eq!(describe(&w.check(&*ds).unwrap()), ["apply Tier t"]);
        assert!(w.check(&*ds).unwrap().is_empty());

        policies.delete(&[docs[1].key()], false).unwrap();
        theirs
            .delete(&endpoint("c2", "a", "p2", "10.65.1.2/32").key)
            .unwrap();
        assert_eq!(
            describe(&w.poll(&*ds).unwrap()),
            ["delete NetworkPolicy a/deny", "endpoint a/p2 gone"]
        );
        assert!(w.poll(&*ds).unwrap().is_empty());
    }
}
