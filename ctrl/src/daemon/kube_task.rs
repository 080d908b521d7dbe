//! The Kubernetes API as a producer: `brindle_kube`'s watchers (Nodes,
//! Pods, Namespaces, NetworkPolicies) run in this child task and every net
//! change reaches the owner as [`Event::Kube`]. The owner keeps them in a
//! `brindle_kube::Cluster`: the pods and nodes that exist feed IPAM GC.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use brindle_kube::{Counters, KubeConfig};
use tracing::{error, info};

use super::event::Event;
use super::tasks::EventSender;
use crate::metrics::Metrics;

/// How often the source's counters reach the metrics.
const METRICS_PERIOD: Duration = Duration::from_secs(5);

/// Connects (kubeconfig or in-cluster service account) and watches until
/// the owner is gone. A client that cannot be built is logged once and
/// the task ends: the daemon then runs without a pod source, as without
/// `[datastore.kubernetes]` (GC decides by endpoints alone).
pub async fn watch(config: KubeConfig, metrics: Arc<Metrics>, events: EventSender) {
    let counters = Arc::new(Counters::default());
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
    let source = brindle_kube::run(client, counters.clone(), move |e| {
        events.send(Event::Kube(Box::new(e))).is_ok()
    });
    tokio::select! {
        () = source => {}
        () = export(&counters, &metrics) => {}
    }
}

/// Copies the source's counters into the metrics, forever.
async fn export(counters: &Counters, metrics: &Metrics) {
    let mut interval = tokio::time::interval(METRICS_PERIOD);
    let (mut errors, mut dropped) = (0, 0);
    loop {
        interval.tick().await;
        let e = counters.watch_errors.load(Ordering::Relaxed);
        let d = counters.dropped.load(Ordering::Relaxed);
        metrics.kube_watch_errors.inc_by(e.saturating_sub(errors));
        metrics
            .kube_objects_dropped
            .inc_by(d.saturating_sub(dropped));
        (errors, dropped) = (e, d);
    }
}
