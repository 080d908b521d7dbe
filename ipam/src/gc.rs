//! Automatic garbage collection, as Calico's kube-controllers does it: the
//! node daemon runs [`Collector::collect`] periodically and every release it
//! makes comes back as a [`Release`] (the daemon logs each one and counts
//! it in a metric).
//!
//! What is released, and when:
//! - a **leaked handle** of this node: its endpoint is gone from the node
//!   and its pod does not exist (or no pod source is known), continuously
//!   for the grace period. The grace covers an ADD in flight (the address
//!   is allocated before the endpoint is recorded) and a pod source that
//!   lags behind;
//! - a **dead node**'s handles and blocks: a node that holds blocks or
//!   handles but has had no live lease for the grace period. Its handles
//!   are released, its empty blocks deleted and its affinity dropped from
//!   blocks that still hold borrowed addresses ([`Ipam::gc_nodes`]).
//!
//! Never released: an address whose pod still exists. A leaked-looking
//! handle whose pod is in the pod source is kept (and warned about once
//! per pass); a dead node with such a handle is left whole until the pod
//! is gone (a node that is only partitioned keeps its pods' addresses).
//!
//! [`Collector::plan`] is the decision as a pure function (handles, block
//! owners, liveness, time in, what to release out); [`Collector::collect`]
//! reads the datastore, plans, and releases.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use brindle_api::ipam::{HandleId, HandleView};
use ipnet::IpNet;

use crate::allocator::{Ipam, IpamError};
use crate::store::Datastore;

/// A pod: namespace and name.
pub type PodKey = (String, String);

/// What the daemon knows of the world at the time of a pass.
#[derive(Debug, Clone, Copy)]
pub struct Liveness<'a> {
    /// This node: its handles are checked against `endpoints`.
    pub node: &'a str,
    /// `(container_id, ifname)` of every endpoint this node has.
    pub endpoints: &'a BTreeSet<(String, String)>,
    /// Every pod that exists; `None` when no pod source is configured (no
    /// Kubernetes API): then only the endpoints decide for this node, and a
    /// dead node's handles are released with the node.
    pub pods: Option<&'a BTreeSet<PodKey>>,
    /// Nodes whose lease is live (this node among them).
    pub live_nodes: &'a BTreeSet<String>,
}

/// One thing the collector released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// A handle of this node whose endpoint and pod were gone.
    LeakedHandle {
        /// The handle.
        handle: HandleId,
        /// Its pod, when the allocation recorded one.
        pod: Option<PodKey>,
        /// The addresses it held.
        addresses: Vec<IpAddr>,
    },
    /// A handle of a dead node.
    DeadNodeHandle {
        /// The node.
        node: String,
        /// The handle.
        handle: HandleId,
    },
    /// An empty block of a dead node, deleted.
    DeadNodeBlock {
        /// The node (empty for a block that had no affinity).
        node: String,
        /// The block.
        block: IpNet,
    },
}

impl Release {
    /// The metric label of this kind of release.
    pub fn kind(&self) -> &'static str {
        match self {
            Release::LeakedHandle { .. } => "leaked_handle",
            Release::DeadNodeHandle { .. } => "dead_node_handle",
            Release::DeadNodeBlock { .. } => "dead_node_block",
        }
    }
}

/// What one pass decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leaked handles of this node to release now.
    pub leaked: Vec<HandleId>,
    /// Dead nodes to collect now.
    pub dead_nodes: BTreeSet<String>,
    /// Handles kept only because their pod still exists (endpoint gone, or
    /// on a dead node): worth a warning, never a release.
    pub kept_for_pod: Vec<HandleId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Suspect {
    Handle(HandleId),
    Node(String),
}

/// The collector: remembers since when each suspect has looked collectable,
/// so that only a state that held for the whole grace period is acted on.
#[derive(Debug)]
pub struct Collector {
    grace_ms: u64,
    since: BTreeMap<Suspect, u64>,
}

impl Collector {
    /// A collector that releases what stayed collectable for `grace`.
    pub fn new(grace: Duration) -> Self {
        Collector {
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            since: BTreeMap::new(),
        }
    }

    fn pod_exists(pods: Option<&BTreeSet<PodKey>>, h: &HandleView) -> bool {
        match (pods, &h.attrs.namespace, &h.attrs.pod) {
            (Some(pods), Some(ns), Some(pod)) => pods.contains(&(ns.clone(), pod.clone())),
            _ => false,
        }
    }

    /// The decision of one pass at `now_ms`: `handles` are every handle,
    /// `block_owners` the affinity of every block. Suspects that are no
    /// longer collectable are forgotten (their clock restarts if they come
    /// back).
    pub fn plan(
        &mut self,
        handles: &[HandleView],
        block_owners: &BTreeSet<String>,
        live: &Liveness<'_>,
        now_ms: u64,
    ) -> Plan {
        let mut plan = Plan::default();
        let mut suspects = BTreeSet::new();
        // Nodes holding something, without a live lease.
        let mut dead: BTreeSet<String> = block_owners
            .iter()
            .chain(handles.iter().map(|h| &h.attrs.node))
            .filter(|n| !n.is_empty() && n.as_str() != live.node && !live.live_nodes.contains(*n))
            .cloned()
            .collect();
        for h in handles {
            let node = h.attrs.node.as_str();
            let pod_exists = Self::pod_exists(live.pods, h);
            if node == live.node {
                let endpoint = (h.handle.container_id.clone(), h.handle.ifname.clone());
                if live.endpoints.contains(&endpoint) {
                    continue;
                }
                if pod_exists {
                    plan.kept_for_pod.push(h.handle.clone());
                    continue;
                }
                suspects.insert(Suspect::Handle(h.handle.clone()));
            } else if dead.contains(node) && pod_exists {
                // A node that only looks dead (partitioned) keeps its pods'
                // addresses: the whole node waits.
                plan.kept_for_pod.push(h.handle.clone());
                dead.remove(node);
            }
        }
        suspects.extend(dead.into_iter().map(Suspect::Node));
        self.since.retain(|s, _| suspects.contains(s));
        for s in suspects {
            let since = *self.since.entry(s.clone()).or_insert(now_ms);
            if now_ms.saturating_sub(since) < self.grace_ms {
                continue;
            }
            match s {
                Suspect::Handle(h) => plan.leaked.push(h),
                Suspect::Node(n) => {
                    plan.dead_nodes.insert(n);
                }
            }
        }
        plan
    }

    /// One pass over the datastore: plan, then release. Every release is
    /// returned; a released suspect is forgotten.
    pub fn collect<S: Datastore>(
        &mut self,
        ipam: &Ipam<S>,
        live: &Liveness<'_>,
        now_ms: u64,
    ) -> Result<(Plan, Vec<Release>), IpamError> {
        let handles = ipam.handles()?;
        let blocks = ipam.blocks()?;
        let owners: BTreeSet<String> = blocks.iter().filter_map(|b| b.affinity.clone()).collect();
        let plan = self.plan(&handles, &owners, live, now_ms);
        let mut released = Vec::new();
        let by_id: BTreeMap<&HandleId, &HandleView> =
            handles.iter().map(|h| (&h.handle, h)).collect();
        for handle in &plan.leaked {
            let addresses = ipam.release_handle(handle)?;
            self.since.remove(&Suspect::Handle(handle.clone()));
            let pod = by_id
                .get(handle)
                .and_then(|h| Some((h.attrs.namespace.clone()?, h.attrs.pod.clone()?)));
            released.push(Release::LeakedHandle {
                handle: handle.clone(),
                pod,
                addresses,
            });
        }
        if !plan.dead_nodes.is_empty() {
            // gc_nodes releases everything of the nodes NOT listed: list
            // every other node that holds something.
            let keep: Vec<String> = owners
                .iter()
                .chain(handles.iter().map(|h| &h.attrs.node))
                .chain(live.live_nodes.iter())
                .chain(std::iter::once(&live.node.to_owned()))
                .filter(|n| !plan.dead_nodes.contains(*n))
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let block_owner: BTreeMap<IpNet, String> = blocks
                .iter()
                .map(|b| (b.cidr, b.affinity.clone().unwrap_or_default()))
                .collect();
            let report = ipam.gc_nodes(&keep)?;
            for handle in report.handles {
                let node = by_id
                    .get(&handle)
                    .map(|h| h.attrs.node.clone())
                    .unwrap_or_default();
                released.push(Release::DeadNodeHandle { node, handle });
            }
            for block in report.blocks {
                let node = block_owner.get(&block).cloned().unwrap_or_default();
                released.push(Release::DeadNodeBlock { node, block });
            }
            for node in &plan.dead_nodes {
                self.since.remove(&Suspect::Node(node.clone()));
            }
        }
        Ok((plan, released))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brindle_api::ipam::Attributes;

    fn view(c: &str, node: &str, pod: Option<(&str, &str)>) -> HandleView {
        HandleView {
            handle: HandleId {
                network: "net".into(),
                container_id: c.into(),
                ifname: "eth0".into(),
            },
            attrs: Attributes {
                namespace: pod.map(|p| p.0.into()),
                pod: pod.map(|p| p.1.into()),
                node: node.into(),
            },
            addresses: Vec::new(),
        }
    }

    fn set<const N: usize>(items: [(&str, &str); N]) -> BTreeSet<(String, String)> {
        items
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn names<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_handle_without_endpoint_or_pod_is_released_only_after_the_grace() {
        let mut c = Collector::new(Duration::from_secs(60));
        let handles = [view("c1", "n1", Some(("ns", "p1")))];
        let (endpoints, pods, live) = (set([]), set([]), names(["n1"]));
        let l = Liveness {
            node: "n1",
            endpoints: &endpoints,
            pods: Some(&pods),
            live_nodes: &live,
        };
        assert!(c.plan(&handles, &names([]), &l, 1_000).leaked.is_empty());
        assert!(c.plan(&handles, &names([]), &l, 60_999).leaked.is_empty());
        assert_eq!(
            c.plan(&handles, &names([]), &l, 61_000).leaked,
            [handles[0].handle.clone()]
        );
    }

    #[test]
    fn an_endpoint_seen_again_restarts_the_clock() {
        let mut c = Collector::new(Duration::from_secs(60));
        let handles = [view("c1", "n1", None)];
        let (none, with, live) = (set([]), set([("c1", "eth0")]), names(["n1"]));
        let gone = Liveness {
            node: "n1",
            endpoints: &none,
            pods: None,
            live_nodes: &live,
        };
        let back = Liveness {
            endpoints: &with,
            ..gone
        };
        c.plan(&handles, &names([]), &gone, 0);
        c.plan(&handles, &names([]), &back, 30_000);
        assert!(
            c.plan(&handles, &names([]), &gone, 61_000)
                .leaked
                .is_empty()
        );
        assert_eq!(c.plan(&handles, &names([]), &gone, 121_000).leaked.len(), 1);
    }

    #[test]
    fn an_address_whose_pod_exists_is_never_released() {
        let mut c = Collector::new(Duration::ZERO);
        let handles = [
            view("c1", "n1", Some(("ns", "alive"))),
            view("c2", "dead", Some(("ns", "alive-elsewhere"))),
        ];
        let (endpoints, pods) = (set([]), set([("ns", "alive"), ("ns", "alive-elsewhere")]));
        let live = names(["n1"]);
        let l = Liveness {
            node: "n1",
            endpoints: &endpoints,
            pods: Some(&pods),
            live_nodes: &live,
        };
        for t in [0, 1_000_000, 10_000_000] {
            let plan = c.plan(&handles, &names(["dead"]), &l, t);
            assert!(plan.leaked.is_empty(), "{plan:?}");
            assert!(plan.dead_nodes.is_empty(), "{plan:?}");
            assert_eq!(plan.kept_for_pod.len(), 2);
        }
    }

    #[test]
    fn a_node_without_a_live_lease_is_collected_after_the_grace_and_others_are_not() {
        let mut c = Collector::new(Duration::from_secs(10));
        let handles = [view("c1", "dead", None), view("c2", "n2", None)];
        let (endpoints, live) = (set([]), names(["n1", "n2"]));
        let l = Liveness {
            node: "n1",
            endpoints: &endpoints,
            pods: None,
            live_nodes: &live,
        };
        let owners = names(["dead", "n2", "gone-too"]);
        assert!(c.plan(&handles, &owners, &l, 0).dead_nodes.is_empty());
        let plan = c.plan(&handles, &owners, &l, 10_000);
        assert_eq!(plan.dead_nodes, names(["dead", "gone-too"]));
        // Another live node's handle is never this node's business.
        assert!(plan.leaked.is_empty());
    }
}
