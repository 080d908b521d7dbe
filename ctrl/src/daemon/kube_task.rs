//! The Kubernetes API as a producer: `brindle_kube`'s watchers (Nodes,
//! Pods, Namespaces, NetworkPolicies) run in this child task and every net
//! change reaches the owner as [`Event::Kube`]. The owner keeps them in a
//! `brindle_kube::Cluster`: the pods and nodes that exist feed IPAM GC.

use std::sync::Arc;

use brindle_kube::{Counters, KubeConfig};
use tracing::{error, info};

use super::event::Event;
use super::tasks::EventSender;

/// Connects (kubeconfig or in-cluster service account) and watches until
/// the owner is gone. A client that cannot be built is logged once and
/// the task ends: the daemon then runs without a pod source, as without
/// `[datastore.kubernetes]` (GC decides by endpoints alone).
pub async fn watch(config: KubeConfig, counters: Arc<Counters>, events: EventSender) {
    let client = match config.client().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "kubernetes API unavailable: running without it");
            return;
        }
    };
    info!(
        kubeconfig = %config.kubeconfig,
        "watching the kubernetes API (nodes, pods, namespaces, networkpolicies)"
    );
    brindle_kube::run(client, counters, move |e| {
        events.send(Event::Kube(Box::new(e))).is_ok()
    })
    .await;
}
