//! The owner's policy part: the compiler (`brindle_policy::compile`) fed
//! from three sources, and its updates as vrouter requests.
//!
//! - resources from the datastore (`Event::Policy`, the datastore thread's
//!   watch: `brindlectl apply` on any node) and from the Kubernetes API
//!   (`KubeEvent::Apply/Delete`, 1:1 onto `Change::Apply/Delete`);
//! - this node's endpoints (CNI ADD/DEL: `K8S_POD_NAMESPACE`/`K8S_POD_NAME`
//!   and the addresses, local), other nodes' from the datastore watch.
//!
//! Each batch is one compiler step; a non-empty update is one
//! `ApplyPolicy`, queued after the endpoint's port so a program never
//! names a port the vrouter has not seen. The executor merges what it sent
//! into its desired state, so a (re)connecting vrouter gets the snapshot in
//! its `Sync`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use brindle_api::endpoint::Endpoint;
use brindle_api::vrouter::VrouterRequest;
use brindle_kube::KubeEvent;
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::{Kind, ResourceKey};
use tracing::{debug, info};

use crate::metrics::Metrics;

/// The compiler and what the metrics need of its state.
pub struct PolicyOwner {
    compiler: Compiler,
    /// Policies of every kind the compiler holds.
    policies: BTreeSet<ResourceKey>,
    /// Local endpoints with a program.
    programs: BTreeSet<EndpointKey>,
    metrics: Arc<Metrics>,
}

fn is_policy(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::KubernetesNetworkPolicy | Kind::NetworkPolicy | Kind::GlobalNetworkPolicy
    )
}

/// The pod an endpoint belongs to, when the runtime named one.
pub fn pod_of(ep: &Endpoint) -> Option<EndpointKey> {
    (!ep.pod.namespace.is_empty() && !ep.pod.name.is_empty()).then(|| EndpointKey {
        namespace: ep.pod.namespace.clone(),
        name: ep.pod.name.clone(),
    })
}

/// The change that gives `pod` the addresses of every local endpoint it
/// has in `endpoints` (`None` when it has none left).
pub fn local_pod<'a>(
    pod: &EndpointKey,
    endpoints: impl IntoIterator<Item = &'a Endpoint>,
) -> Change {
    let mut addrs: Vec<IpAddr> = endpoints
        .into_iter()
        .filter(|e| pod_of(e).as_ref() == Some(pod))
        .flat_map(|e| e.ips.iter().map(|n| n.addr()))
        .collect();
    addrs.sort();
    addrs.dedup();
    let info = (!addrs.is_empty()).then_some(EndpointInfo { addrs, local: true });
    Change::Endpoint(pod.clone(), info)
}

/// The compiler change of a Kubernetes event, if it is one.
pub fn kube_change(e: &KubeEvent) -> Option<Change> {
    match e {
        KubeEvent::Apply(r) => Some(Change::Apply(r.clone())),
        KubeEvent::Delete(k) => Some(Change::Delete(k.clone())),
        _ => None,
    }
}

impl PolicyOwner {
    /// An empty compiler.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        PolicyOwner {
            compiler: Compiler::new(),
            policies: BTreeSet::new(),
            programs: BTreeSet::new(),
            metrics,
        }
    }

    /// Compiles one batch; the request for the vrouter when something
    /// changed. (The compile time is measured for the metrics only: no
    /// decision reads the clock.)
    pub fn compile(&mut self, changes: Vec<Change>) -> Option<VrouterRequest> {
        if changes.is_empty() {
            return None;
        }
        for c in &changes {
            match c {
                Change::Apply(r) if is_policy(r.kind()) => {
                    self.policies.insert(r.key());
                }
                Change::Delete(k) => {
                    self.policies.remove(k);
                }
                _ => {}
            }
        }
        let n = changes.len();
        let start = Instant::now();
        let update = self.compiler.apply(changes);
        let took = start.elapsed();
        self.metrics
            .policy_compile_seconds
            .observe(took.as_secs_f64());
        for p in &update.programs {
            if p.program.is_some() {
                self.programs.insert(p.endpoint.clone());
            } else {
                self.programs.remove(&p.endpoint);
            }
        }
        self.metrics.policies.set(self.policies.len() as i64);
        self.metrics.policy_programs.set(self.programs.len() as i64);
        if update.is_empty() {
            debug!(changes = n, "policy: nothing to send");
            return None;
        }
        self.metrics
            .policy_generation
            .set(i64::try_from(update.generation).unwrap_or(i64::MAX));
        info!(
            changes = n,
            generation = update.generation,
            programs = update.programs.len(),
            sets = update.sets.len(),
            touched = update.touched.len(),
            micros = took.as_micros() as u64,
            "policy compiled"
        );
        Some(VrouterRequest::ApplyPolicy { update })
    }

    /// The compiler (for queries and tests).
    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    /// Policies held.
    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }
}

/// Every local pod's change, for the endpoints restored at start.
pub fn local_pods(endpoints: &BTreeMap<String, Endpoint>) -> Vec<Change> {
    let pods: BTreeSet<EndpointKey> = endpoints.values().filter_map(pod_of).collect();
    pods.iter()
        .map(|p| local_pod(p, endpoints.values()))
        .collect()
}
