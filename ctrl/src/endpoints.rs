//! Endpoints: persisted in the datastore under
//! `/brindle/endpoints/<node>/<network>/<container>/<ifname>`, and the
//! handler of the CNI plugin's endpoint requests.
//!
//! The handler stores the record and hands the change to the daemon's owner
//! loop ([`EndpointChange`]), which keeps the node's endpoints and programs
//! them. `add_endpoint` refuses with `try_again_later` when the vrouter did
//! not answer the executor's last call (as Calico fails ADD while
//! calico-node is not ready: a pod the dataplane does not know has no
//! network, and the CNI plugin rolls back and the runtime retries).
//! Otherwise it stores the record, hands the change over and waits (at
//! most [`PORT_WAIT`]) until the vrouter acknowledged the pod's port, so
//! the pod's first packets meet an attached port; past the bound it answers
//! anyway: the record is the promise, and if the vrouter goes away in
//! between, the executor's resync programs it when it is back. `delete_endpoint` never needs the vrouter:
//! the record goes, and the resync removes what is left.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brindle_api::endpoint::{
    DaemonStatus, Deleted, Endpoint, EndpointKey, EndpointRequest, GcReport,
};
use brindle_api::framing::{PROTOCOL_VERSION, RemoteError, RemoteErrorKind, Reply};
use brindle_api::ipam::HandleId;
use brindle_ipam::store::{Datastore, StoreError, Write};
use serde_json::Value;
use tracing::{info, info_span, warn};

use crate::health::HealthWatch;
use crate::programming::acks::PortAcks;
use crate::programming::desired::endpoint_added;

/// How long ADD waits for the vrouter to acknowledge the pod's port: well
/// under the CNI plugin's default daemon timeout (10 s), so a slow vrouter
/// costs the wait, not a failed ADD ([`brindle_api::endpoint::ADD_PORT_WAIT`]).
pub const PORT_WAIT: Duration = brindle_api::endpoint::ADD_PORT_WAIT;

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

/// A stored change of this node's endpoints, handed to the owner loop,
/// which keeps the endpoints and programs them.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointChange {
    /// Stored: a new record, or one that replaced `replaced` (a retried ADD).
    Added {
        /// The record now stored.
        endpoint: Box<Endpoint>,
        /// The record it replaced.
        replaced: Option<Box<Endpoint>>,
    },
    /// Deleted (DEL or GC).
    Removed(Box<Endpoint>),
}

/// Where [`EndpointHandler`] hands its changes (the daemon's event channel).
pub type ChangeSink = Box<dyn Fn(EndpointChange) + Send + Sync>;

/// Answers endpoint requests: store, then hand the change over.
pub struct EndpointHandler {
    /// The records.
    pub store: EndpointStore,
    /// Where stored changes go. The owner lives as long as the daemon; a
    /// closed channel means we are shutting down and the record is what
    /// matters, so the sink ignores it.
    pub changes: ChangeSink,
    /// The daemon's readiness (the vrouter's reachability gates ADD).
    pub health: HealthWatch,
    /// Where the executor publishes the ports the vrouter acknowledged, and
    /// how long ADD waits there for its port ([`PORT_WAIT`]); `None`: ADD
    /// answers once the record is stored.
    pub port_wait: Option<(Arc<PortAcks>, Duration)>,
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
    /// Waits (bounded) until the vrouter acknowledged the port of `reqs`
    /// (`endpoint_added`'s), so the pod's first packets meet an attached
    /// port. Past the bound the ADD still succeeds, logged: the record is
    /// the promise and the port comes with the executor's next answer.
    fn wait_for_port(&self, reqs: &[brindle_api::vrouter::VrouterRequest]) {
        let Some((acks, wait)) = &self.port_wait else {
            return;
        };
        let deadline = Instant::now() + *wait;
        for r in reqs {
            if let brindle_api::vrouter::VrouterRequest::AddPorts { ports } = r {
                for p in ports {
                    if !acks.wait(p, deadline) {
                        warn!(port = %p.name, waited = ?wait, "the vrouter has not acknowledged the port yet; answering ADD anyway");
                    }
                }
            }
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
                // The same check the owner's programming makes, so a record
                // that cannot be programmed is refused rather than stored.
                let reqs = endpoint_added(&endpoint)
                    .map_err(|m| error(RemoteErrorKind::InvalidRequest, m))?;
                if !self.health.borrow().vrouter_up() {
                    return Err(error(
                        RemoteErrorKind::TryAgainLater,
                        "the vrouter is not reachable: the pod would have no network",
                    ));
                }
                let replaced = self.store.put(&endpoint).map_err(unavailable)?;
                info!(port = %endpoint.host_ifname, ips = ?endpoint.ips, "endpoint added");
                let answer = ok(&*endpoint);
                (self.changes)(EndpointChange::Added {
                    endpoint,
                    replaced: replaced.map(Box::new),
                });
                self.wait_for_port(&reqs);
                answer
            }
            EndpointRequest::DeleteEndpoint { key } => {
                let _span = info_span!("endpoint", handle = %key.handle()).entered();
                let old = self.store.delete(&key).map_err(unavailable)?;
                let existed = old.is_some();
                if let Some(old) = old {
                    info!(port = %old.host_ifname, "endpoint deleted");
                    (self.changes)(EndpointChange::Removed(Box::new(old)));
                }
                ok(Deleted { existed })
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
                        info!(handle = %ep.key.handle(), "endpoint collected");
                        report.removed.push(ep.key.clone());
                        (self.changes)(EndpointChange::Removed(Box::new(ep)));
                    }
                }
                ok(report)
            }
            EndpointRequest::Status => {
                let store_ok = self.store.list(Some("\u{1}")).is_ok();
                let vrouter_ok = self.health.borrow().vrouter_up();
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
    use std::sync::mpsc;

    use brindle_ipam::store::MemoryStore;
    use tokio::sync::watch;

    use super::*;
    use crate::health::Health;
    use crate::programming::desired::tests::endpoint;

    /// A handler on a memory store, the vrouter reachable; the changes it
    /// hands over and the health it reads stay with the test.
    struct Fixture {
        h: EndpointHandler,
        rx: mpsc::Receiver<EndpointChange>,
        health: watch::Sender<Health>,
    }

    fn handler() -> Fixture {
        let (tx, rx) = mpsc::channel();
        let (health, health_rx) = watch::channel(Health {
            datastore_ok: true,
            vrouter_reachable: Some(true),
        });
        let h = EndpointHandler {
            store: EndpointStore::new(Arc::new(MemoryStore::new()), "/brindle/", "n1"),
            changes: Box::new(move |c| {
                let _ = tx.send(c);
            }),
            health: health_rx,
            port_wait: None,
        };
        Fixture { h, rx, health }
    }

    fn set_vrouter(f: &Fixture, up: bool) {
        f.health.send_modify(|h| h.vrouter_reachable = Some(up));
    }

    fn added(ep: &Endpoint, replaced: Option<&Endpoint>) -> EndpointChange {
        EndpointChange::Added {
            endpoint: Box::new(ep.clone()),
            replaced: replaced.map(|r| Box::new(r.clone())),
        }
    }

    fn removed(ep: &Endpoint) -> EndpointChange {
        EndpointChange::Removed(Box::new(ep.clone()))
    }

    fn result<T: serde::de::DeserializeOwned>(r: Reply<Value>) -> Result<T, RemoteError> {
        r.into_result().map(|v| serde_json::from_value(v).unwrap())
    }

    #[test]
    fn add_stores_and_hands_the_change_over_and_delete_undoes_it() {
        let Fixture { h, rx, .. } = handler();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let stored: Endpoint = result(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        }))
        .unwrap();
        assert_eq!(stored, ep);
        assert_eq!(rx.try_recv().unwrap(), added(&ep, None));
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
        assert_eq!(rx.try_recv().unwrap(), removed(&ep));
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
    fn add_answers_only_once_the_vrouter_acknowledged_the_pods_port() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let Fixture { mut h, rx, .. } = handler();
        let acks = Arc::new(PortAcks::default());
        h.port_wait = Some((acks.clone(), Duration::from_secs(60)));
        let acked = Arc::new(AtomicBool::new(false));
        // The executor's part: the port is acknowledged a while after the
        // change was handed over.
        let executor = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                let EndpointChange::Added { endpoint, .. } = rx.recv().unwrap() else {
                    panic!("not an add");
                };
                std::thread::sleep(Duration::from_millis(200));
                acked.store(true, Ordering::SeqCst);
                for r in endpoint_added(&endpoint).unwrap() {
                    if let brindle_api::vrouter::VrouterRequest::AddPorts { ports } = r {
                        acks.added(&ports);
                    }
                }
            })
        };
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let stored: Endpoint = result(h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        }))
        .unwrap();
        assert_eq!(stored, ep);
        assert!(
            acked.load(Ordering::SeqCst),
            "ADD answered before the vrouter acknowledged the port"
        );
        executor.join().unwrap();
    }

    #[test]
    fn a_retried_add_hands_over_the_record_it_replaced() {
        let Fixture { h, rx, .. } = handler();
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
        assert_eq!(rx.try_recv().unwrap(), added(&again, Some(&ep)));
    }

    #[test]
    fn a_malformed_endpoint_is_invalid_and_not_stored() {
        let Fixture { h, rx, .. } = handler();
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
        let Fixture { h, rx, .. } = handler();
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
        assert_eq!(rx.try_recv().unwrap(), removed(&b));
        let all: Vec<Endpoint> = result(h.handle(EndpointRequest::ListEndpoints {
            network: Some("k8s-pod-network".into()),
        }))
        .unwrap();
        assert_eq!(all, vec![a]);
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
        let Fixture { mut h, rx, .. } = handler();
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
        let f = handler();
        let (h, rx) = (&f.h, &f.rx);
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        h.handle(EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        });
        rx.try_recv().unwrap();
        set_vrouter(&f, false);
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
        assert_eq!(rx.try_recv().unwrap(), removed(&ep));
    }

    #[test]
    fn status_is_not_ready_while_the_vrouter_is_unreachable() {
        let f = handler();
        set_vrouter(&f, false);
        let s: DaemonStatus = result(f.h.handle(EndpointRequest::Status)).unwrap();
        assert!(!s.ready);
        assert_eq!(s.message, "vrouter unreachable");
        set_vrouter(&f, true);
        let s: DaemonStatus = result(f.h.handle(EndpointRequest::Status)).unwrap();
        assert!(s.ready);
    }
}
