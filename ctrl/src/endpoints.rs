//! Endpoints: persisted in the datastore under
//! `/brindle/endpoints/<node>/<network>/<container>/<ifname>`, and the
//! handler of the CNI plugin's endpoint requests.
//!
//! `add_endpoint` refuses with `try_again_later` when the vrouter did not
//! answer the executor's last call (as Calico fails ADD while calico-node is
//! not ready: a pod the dataplane does not know has no network, and the CNI
//! plugin rolls back and the runtime retries). Otherwise it answers once the
//! record is stored and its programming queued, without waiting for the
//! vrouter's answer: the record is the promise, and if the vrouter goes away
//! in between, the executor's resync programs it when it is back.
//! `delete_endpoint` never needs the vrouter: the record goes, and the resync
//! removes what is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use brindle_api::endpoint::{
    DaemonStatus, Deleted, Endpoint, EndpointKey, EndpointRequest, GcReport,
};
use brindle_api::framing::{PROTOCOL_VERSION, RemoteError, RemoteErrorKind, Reply};
use brindle_api::ipam::HandleId;
use brindle_api::vrouter::VrouterRequest;
use brindle_ipam::store::{Datastore, StoreError, Write};
use serde_json::Value;
use tracing::{info, info_span};

use crate::metrics::Metrics;
use crate::programming::desired::{endpoint_added, endpoint_removed};

/// Endpoint records of one node.
#[derive(Clone)]
pub struct EndpointStore {
    store: Arc<dyn Datastore>,
    prefix: String,
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl EndpointStore {
    /// The records of node `node` under `root` (`datastore.prefix`,
    /// `/brindle/`).
    pub fn new(store: Arc<dyn Datastore>, root: &str, node: &str) -> Self {
        EndpointStore {
            store,
            prefix: format!("{root}endpoints/{node}/"),
        }
    }

    fn key(&self, k: &EndpointKey) -> String {
        format!("{}{}", self.prefix, k.handle())
    }

    /// Stores `ep`, returning the record it replaced.
    pub fn put(&self, ep: &Endpoint) -> Result<Option<Endpoint>, StoreError> {
        let old = self.get(&ep.key)?;
        let value = serde_json::to_vec(ep).map_err(corrupt)?;
        self.store
            .txn(&[], &[Write::Put(self.key(&ep.key), value)])?;
        Ok(old)
    }

    /// The record of `key`.
    pub fn get(&self, key: &EndpointKey) -> Result<Option<Endpoint>, StoreError> {
        match self.store.get(&self.key(key))? {
            Some(e) => Ok(Some(serde_json::from_slice(&e.value).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    /// Deletes the record of `key`, returning it.
    pub fn delete(&self, key: &EndpointKey) -> Result<Option<Endpoint>, StoreError> {
        let old = self.get(key)?;
        if old.is_some() {
            self.store.txn(&[], &[Write::Delete(self.key(key))])?;
        }
        Ok(old)
    }

    /// Every record (of `network` when given), in key order.
    pub fn list(&self, network: Option<&str>) -> Result<Vec<Endpoint>, StoreError> {
        let prefix = match network {
            Some(n) => format!("{}{n}/", self.prefix),
            None => self.prefix.clone(),
        };
        self.store
            .list(&prefix)?
            .into_iter()
            .map(|e| serde_json::from_slice(&e.value).map_err(corrupt))
            .collect()
    }
}

/// Answers endpoint requests: store, then queue programming.
pub struct EndpointHandler {
    /// The records.
    pub store: EndpointStore,
    /// Where programming goes (the executor thread).
    pub programming: mpsc::Sender<Vec<VrouterRequest>>,
    /// Set by the executor.
    pub vrouter_reachable: Arc<AtomicBool>,
    /// Endpoint gauge.
    pub metrics: Option<Arc<Metrics>>,
}

fn error(kind: RemoteErrorKind, message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind,
        message: message.into(),
    }
}

fn unavailable(e: StoreError) -> RemoteError {
    error(RemoteErrorKind::TryAgainLater, e.to_string())
}

fn ok<T: serde::Serialize>(v: T) -> Result<Value, RemoteError> {
    serde_json::to_value(v).map_err(|e| error(RemoteErrorKind::Internal, e.to_string()))
}

fn validate_key(k: &EndpointKey) -> Result<(), RemoteError> {
    HandleId {
        network: k.network.clone(),
        container_id: k.container_id.clone(),
        ifname: k.ifname.clone(),
    }
    .validate()
    .map_err(|m| error(RemoteErrorKind::InvalidRequest, m))
}

impl EndpointHandler {
    /// Programs every stored endpoint (at start, before the first resync).
    pub fn restore(&self) -> Result<usize, StoreError> {
        let all = self.store.list(None)?;
        for ep in &all {
            if let Ok(reqs) = endpoint_added(ep) {
                self.send(reqs);
            }
        }
        self.count(all.len());
        Ok(all.len())
    }

    fn send(&self, reqs: Vec<VrouterRequest>) {
        // The executor lives as long as the daemon; a closed channel means
        // we are shutting down and the record is what matters.
        let _ = self.programming.send(reqs);
    }

    fn count(&self, n: usize) {
        if let Some(m) = &self.metrics {
            m.endpoints.set(n as i64);
        }
    }

    /// Moves the endpoint gauge by `delta` (no list per request).
    fn adjust(&self, delta: i64) {
        if let Some(m) = &self.metrics {
            m.endpoints.inc_by(delta);
        }
    }

    /// Answers one request.
    pub fn handle(&self, req: EndpointRequest) -> Reply<Value> {
        self.handle_inner(req).into()
    }

    fn handle_inner(&self, req: EndpointRequest) -> Result<Value, RemoteError> {
        match req {
            EndpointRequest::AddEndpoint { endpoint } => {
                let _span = info_span!("endpoint", handle = %endpoint.key.handle()).entered();
                validate_key(&endpoint.key)?;
                let reqs = endpoint_added(&endpoint)
                    .map_err(|m| error(RemoteErrorKind::InvalidRequest, m))?;
                if !self.vrouter_reachable.load(Ordering::Relaxed) {
                    return Err(error(
                        RemoteErrorKind::TryAgainLater,
                        "the vrouter is not reachable: the pod would have no network",
                    ));
                }
                let old = self.store.put(&endpoint).map_err(unavailable)?;
                match old {
                    None => self.adjust(1),
                    Some(old)
                        if old.host_ifname != endpoint.host_ifname || old.ips != endpoint.ips =>
                    {
                        self.send(endpoint_removed(&old));
                    }
                    Some(_) => {}
                }
                self.send(reqs);
                info!(port = %endpoint.host_ifname, ips = ?endpoint.ips, "endpoint added");
                ok(&*endpoint)
            }
            EndpointRequest::DeleteEndpoint { key } => {
                let _span = info_span!("endpoint", handle = %key.handle()).entered();
                let old = self.store.delete(&key).map_err(unavailable)?;
                if let Some(old) = &old {
                    self.send(endpoint_removed(old));
                    self.adjust(-1);
                    info!(port = %old.host_ifname, "endpoint deleted");
                }
                ok(Deleted {
                    existed: old.is_some(),
                })
            }
            EndpointRequest::GetEndpoint { key } => match self.store.get(&key) {
                Ok(Some(ep)) => ok(ep),
                Ok(None) => Err(error(
                    RemoteErrorKind::NotFound,
                    format!("no endpoint {}", key.handle()),
                )),
                Err(e) => Err(unavailable(e)),
            },
            EndpointRequest::ListEndpoints { network } => {
                ok(self.store.list(network.as_deref()).map_err(unavailable)?)
            }
            EndpointRequest::GcEndpoints { network, valid } => {
                let mut report = GcReport::default();
                for ep in self.store.list(Some(&network)).map_err(unavailable)? {
                    if valid.contains(&ep.key) {
                        continue;
                    }
                    if self.store.delete(&ep.key).map_err(unavailable)?.is_some() {
                        self.send(endpoint_removed(&ep));
                        self.adjust(-1);
                        info!(handle = %ep.key.handle(), "endpoint collected");
                        report.removed.push(ep.key);
                    }
                }
                ok(report)
            }
            EndpointRequest::Status => {
                let store_ok = self.store.list(Some("\u{1}")).is_ok();
                let vrouter_ok = self.vrouter_reachable.load(Ordering::Relaxed);
                let message = match (store_ok, vrouter_ok) {
                    (true, true) => String::new(),
                    (false, _) => "datastore unreachable".into(),
                    (true, false) => "vrouter unreachable".into(),
                };
                ok(DaemonStatus {
                    ready: store_ok && vrouter_ok,
                    message,
                    protocol_version: PROTOCOL_VERSION,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use brindle_ipam::store::MemoryStore;

    use super::*;
    use crate::programming::desired::tests::endpoint;

    fn handler() -> (EndpointHandler, mpsc::Receiver<Vec<VrouterRequest>>) {
        let (tx, rx) = mpsc::channel();
        let h = EndpointHandler {
            store: EndpointStore::new(Arc::new(MemoryStore::new()), "/brindle/", "n1"),
            programming: tx,
            vrouter_reachable: Arc::new(AtomicBool::new(true)),
            metrics: None,
        };
        (h, rx)
    }

    fn result<T: serde::de::DeserializeOwned>(r: Reply<Value>) -> Result<T, RemoteError> {
        r.into_result().map(|v| serde_json::from_value(v).unwrap())
    }

    #[test]
    fn add_stores_and_queues_programming_and_delete_undoes_it() {
        let (h, rx) = handler();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let stored: Endpoint = result(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        }))
        .unwrap();
        assert_eq!(stored, ep);
        assert_eq!(rx.try_recv().unwrap(), endpoint_added(&ep).unwrap());
        let got: Endpoint = result(h.handle(EndpointRequest::GetEndpoint {
            key: ep.key.clone(),
        }))
        .unwrap();
        assert_eq!(got, ep);

        let d: Deleted = result(h.handle(EndpointRequest::DeleteEndpoint {
            key: ep.key.clone(),
        }))
        .unwrap();
        assert!(d.existed);
        assert_eq!(rx.try_recv().unwrap(), endpoint_removed(&ep));
        let d: Deleted = result(h.handle(EndpointRequest::DeleteEndpoint {
            key: ep.key.clone(),
        }))
        .unwrap();
        assert!(!d.existed);
        assert!(rx.try_recv().is_err());
        let e =
            result::<Endpoint>(h.handle(EndpointRequest::GetEndpoint { key: ep.key })).unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::NotFound);
    }

    #[test]
    fn a_retried_add_with_a_new_veth_unprograms_the_old_one_first() {
        let (h, rx) = handler();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        });
        rx.try_recv().unwrap();
        let mut again = ep.clone();
        again.host_ifname = "bri2".into();
        h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(again.clone()),
        });
        assert_eq!(rx.try_recv().unwrap(), endpoint_removed(&ep));
        assert_eq!(rx.try_recv().unwrap(), endpoint_added(&again).unwrap());
    }

    #[test]
    fn a_malformed_endpoint_is_invalid_and_not_stored() {
        let (h, rx) = handler();
        let mut ep = endpoint("c/1", "bri1", "10.244.0.5/32");
        let e = result::<Endpoint>(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        }))
        .unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::InvalidRequest);
        ep.key.container_id = "c1".into();
        ep.ips.clear();
        let e = result::<Endpoint>(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep),
        }))
        .unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::InvalidRequest);
        assert!(rx.try_recv().is_err());
        let all: Vec<Endpoint> =
            result(h.handle(EndpointRequest::ListEndpoints { network: None })).unwrap();
        assert!(all.is_empty());
    }

    #[test]
    fn gc_deletes_only_the_attachments_not_listed_as_valid() {
        let (h, rx) = handler();
        let a = endpoint("c1", "bri1", "10.244.0.5/32");
        let b = endpoint("c2", "bri2", "10.244.0.6/32");
        for ep in [&a, &b] {
            h.handle(EndpointRequest::AddEndpoint {
                endpoint: Box::new(ep.clone()),
            });
            rx.try_recv().unwrap();
        }
        let report: GcReport = result(h.handle(EndpointRequest::GcEndpoints {
            network: "k8s-pod-network".into(),
            valid: vec![a.key.clone()],
        }))
        .unwrap();
        assert_eq!(report.removed, vec![b.key.clone()]);
        assert_eq!(rx.try_recv().unwrap(), endpoint_removed(&b));
        let all: Vec<Endpoint> = result(h.handle(EndpointRequest::ListEndpoints {
            network: Some("k8s-pod-network".into()),
        }))
        .unwrap();
        assert_eq!(all, vec![a]);
    }

    #[test]
    fn the_endpoint_gauge_counts_records_not_requests() {
        let (mut h, _rx) = handler();
        let m = Arc::new(Metrics::new());
        h.metrics = Some(m.clone());
        let a = endpoint("c1", "bri1", "10.244.0.5/32");
        let b = endpoint("c2", "bri2", "10.244.0.6/32");
        for ep in [&a, &a, &b] {
            h.handle(EndpointRequest::AddEndpoint {
                endpoint: Box::new(ep.clone()),
            });
        }
        assert_eq!(m.endpoints.get(), 2);
        for _ in 0..2 {
            h.handle(EndpointRequest::DeleteEndpoint { key: a.key.clone() });
        }
        assert_eq!(m.endpoints.get(), 1);
        h.handle(EndpointRequest::GcEndpoints {
            network: "k8s-pod-network".into(),
            valid: vec![],
        });
        assert_eq!(m.endpoints.get(), 0);
    }

    /// A datastore that is down.
    struct DownStore;

    impl Datastore for DownStore {
        fn kind(&self) -> &'static str {
            "down"
        }
        fn get(&self, _: &str) -> Result<Option<brindle_ipam::store::Entry>, StoreError> {
            Err(StoreError::Unavailable("etcd: no leader".into()))
        }
        fn list(&self, _: &str) -> Result<Vec<brindle_ipam::store::Entry>, StoreError> {
            Err(StoreError::Unavailable("etcd: no leader".into()))
        }
        fn txn_revision(
            &self,
            _: &[brindle_ipam::store::Compare],
            _: &[Write],
        ) -> Result<Option<u64>, StoreError> {
            Err(StoreError::Unavailable("etcd: no leader".into()))
        }
    }

    #[test]
    fn a_datastore_outage_is_try_again_later_and_programs_nothing() {
        let (mut h, rx) = handler();
        h.store = EndpointStore::new(Arc::new(DownStore), "/brindle/", "n1");
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let e = result::<Endpoint>(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        }))
        .unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::TryAgainLater);
        assert!(e.message.contains("no leader"), "{e:?}");
        let e = result::<Deleted>(h.handle(EndpointRequest::DeleteEndpoint { key: ep.key }))
            .unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::TryAgainLater);
        assert!(rx.try_recv().is_err());
        let s: DaemonStatus = result(h.handle(EndpointRequest::Status)).unwrap();
        assert!(!s.ready);
        assert_eq!(s.message, "datastore unreachable");
    }

    #[test]
    fn add_is_refused_while_the_vrouter_is_unreachable_but_delete_is_not() {
        let (h, rx) = handler();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        });
        rx.try_recv().unwrap();
        h.vrouter_reachable.store(false, Ordering::Relaxed);
        let other = endpoint("c2", "bri2", "10.244.0.6/32");
        let e = result::<Endpoint>(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(other.clone()),
        }))
        .unwrap_err();
        assert_eq!(e.kind, RemoteErrorKind::TryAgainLater);
        assert!(h.store.get(&other.key).unwrap().is_none());
        assert!(rx.try_recv().is_err());
        let d: Deleted = result(h.handle(EndpointRequest::DeleteEndpoint {
            key: ep.key.clone(),
        }))
        .unwrap();
        assert!(d.existed);
        assert_eq!(rx.try_recv().unwrap(), endpoint_removed(&ep));
    }

    #[test]
    fn status_is_not_ready_while_the_vrouter_is_unreachable() {
        let (h, _rx) = handler();
        h.vrouter_reachable.store(false, Ordering::Relaxed);
        let s: DaemonStatus = result(h.handle(EndpointRequest::Status)).unwrap();
        assert!(!s.ready);
        assert_eq!(s.message, "vrouter unreachable");
        h.vrouter_reachable.store(true, Ordering::Relaxed);
        let s: DaemonStatus = result(h.handle(EndpointRequest::Status)).unwrap();
        assert!(s.ready);
    }
}
