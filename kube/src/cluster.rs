//! The cluster as the daemon keeps it: the pure state a [`KubeEvent`]
//! stream builds, with the questions the daemon asks of it (which pods and
//! nodes exist, for IPAM garbage collection; this node; the policy
//! resources).

use std::collections::{BTreeMap, BTreeSet};

use brindle_policy::resource::{Kind, Resource, ResourceKey};

use crate::event::{Feed, KubeEvent, NodeInfo};

/// A pod: namespace and name (`brindle_ipam::gc::PodKey`).
pub type PodKey = (String, String);

/// What the events said so far.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    node: String,
    nodes: BTreeMap<String, NodeInfo>,
    pods: BTreeSet<PodKey>,
    resources: BTreeMap<ResourceKey, Resource>,
    synced: BTreeSet<Feed>,
}

impl Cluster {
    /// An empty cluster seen from the node `node`.
    pub fn new(node: impl Into<String>) -> Self {
        Cluster {
            node: node.into(),
            ..Cluster::default()
        }
    }

    /// Takes one event.
    pub fn apply(&mut self, event: &KubeEvent) {
        match event {
            KubeEvent::Apply(r) => {
                if let Resource::Pod(p) = r {
                    self.pods
                        .insert((p.metadata.namespace().to_owned(), p.metadata.name.clone()));
                }
                self.resources.insert(r.key(), r.clone());
            }
            KubeEvent::Delete(key) => {
                if key.kind == Kind::Pod {
                    let ns = key.namespace.clone().unwrap_or_else(|| "default".into());
                    self.pods.remove(&(ns, key.name.clone()));
                }
                self.resources.remove(key);
            }
            KubeEvent::NodeApply(n) => {
                self.nodes.insert(n.name.clone(), n.clone());
            }
            KubeEvent::NodeDelete(name) => {
                self.nodes.remove(name);
            }
            KubeEvent::Synced(feed) => {
                self.synced.insert(*feed);
            }
        }
    }

    /// A full list of `feed` has been taken.
    pub fn synced(&self, feed: Feed) -> bool {
        self.synced.contains(&feed)
    }

    /// Every pod that exists, once the pods were listed (`None` before:
    /// then nothing may be released for want of its pod).
    pub fn pods(&self) -> Option<&BTreeSet<PodKey>> {
        self.synced(Feed::Pods).then_some(&self.pods)
    }

    /// Every node that exists, once the nodes were listed.
    pub fn nodes(&self) -> Option<&BTreeMap<String, NodeInfo>> {
        self.synced(Feed::Nodes).then_some(&self.nodes)
    }

    /// `Some(true)` when the nodes were listed and `name` is not among
    /// them: the node was deleted from the cluster, its blocks and
    /// addresses are to be released. `None` before the first list.
    pub fn node_deleted(&self, name: &str) -> Option<bool> {
        self.nodes().map(|n| !n.contains_key(name))
    }

    /// This node, as the API has it.
    pub fn this_node(&self) -> Option<&NodeInfo> {
        self.nodes.get(&self.node)
    }

    /// The policy resources (Namespaces, Pods, NetworkPolicies) in force.
    pub fn resources(&self) -> impl Iterator<Item = &Resource> {
        self.resources.values()
    }
}
