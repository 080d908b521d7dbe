//! The daemon's I/O: child tasks and threads that turn the outside into
//! [`Event`]s, and the appliers of [`Effect`]s. None of them holds state the
//! owner decides on; each either produces one kind of event or applies one
//! kind of effect.
//!
//! Blocking work runs on threads of its own: the executor (the vrouter
//! socket is a blocking client), the datastore (the etcd backend blocks on
//! its own runtime), `ctrl.sock` (one thread per connection). Everything
//! else is a tokio task, aborted when its [`Child`] handle is dropped.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use brindle_api::framing::Reply;
use brindle_ipam::Ipam;
use brindle_ipam::gc::{Collector, Liveness, Release};
use brindle_ipam::store::Datastore;
use ipnet::IpNet;
use serde_json::Value;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, warn};

use super::effect::{BgpCommand, DatastoreRequest, Effect, GcPass};
use super::event::{DatastoreView, Event, Responder};
use super::owner::{internal, to_reply};
use crate::api_server::CtrlOps;
use crate::bgp::rib::RouteChange;
use crate::bgp::speaker::Speaker;
use crate::config::{Config, ConfigError};
use crate::ctrl_api::CtrlRequest;
use crate::health::Health;
use crate::hostpath::HostState;
use crate::metrics::{Metrics, ReasonLabel, StateLabel};
use crate::policy::PolicyWatch;
use crate::programming::Work;
use crate::programming::coalesce::MAX_ROUTES_PER_REQUEST;
use crate::programming::dataplane::Dataplane;
use crate::programming::executor::Executor;
use crate::registry::{NodeRecord, Registry, now_ms};
use crate::routing::PoolRouting;
use crate::{gateway, neighbors};

/// Where producers send events (one clone per producer).
pub type EventSender = UnboundedSender<Event>;

/// A tokio child task, aborted when dropped.
pub struct Child(JoinHandle<()>);

impl Child {
    /// Spawns `task` in the current span.
    pub fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Child {
        Child(tokio::spawn(task.in_current_span()))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// ===== producers =====

/// [`Event::Tick`] every `period`, the first at once.
pub async fn ticker(events: EventSender, period: Duration) {
    ticker_of(events, period, || Event::Tick).await
}

/// `event()` every `period`, the first at once.
pub async fn ticker_of(events: EventSender, period: Duration, event: fn() -> Event) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if events.send(event()).is_err() {
            return;
        }
    }
}

/// The speaker's best-route changes as [`Event::Route`].
pub async fn routes(mut changes: UnboundedReceiver<RouteChange>, events: EventSender) {
    while let Some(change) = changes.recv().await {
        if events.send(Event::Route(change)).is_err() {
            return;
        }
    }
}

/// Re-reads the configuration (file, variables, flags) on SIGHUP.
pub type Reload = Box<dyn Fn() -> Result<Config, ConfigError> + Send>;

/// SIGTERM/SIGINT as [`Event::Shutdown`]; SIGHUP as [`Event::Reload`] with
/// the configuration read again by `reload` (nothing without one).
pub async fn signals(events: EventSender, reload: Option<Reload>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        warn!("cannot install the signal handlers");
        return;
    };
    loop {
        let event = tokio::select! {
            _ = tokio::signal::ctrl_c() => Event::Shutdown,
            _ = term.recv() => Event::Shutdown,
            _ = hup.recv() => match &reload {
                Some(reload) => Event::Reload(
                    reload()
                        .and_then(|c| c.validate().map(|v| Box::new((c, v))))
                        .map_err(|e| e.to_string()),
                ),
                None => {
                    info!("SIGHUP: no configuration source to reload");
                    continue;
                }
            },
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// The uplink's kernel neighbours as [`Event::Neighbors`].
pub async fn follow_neighbors(uplink: String, events: EventSender) {
    let send = move |changes| events.send(Event::Neighbors(changes)).is_ok();
    if let Err(e) = neighbors::watch(uplink, send).await {
        warn!(error = %e, "not following the uplink's neighbours");
    }
}

/// The uplink's default gateway as [`Event::Gateway`].
pub async fn follow_gateway(uplink: String, events: EventSender) {
    let send = move |gateway| events.send(Event::Gateway(gateway)).is_ok();
    if let Err(e) = gateway::watch(uplink, send).await {
        warn!(error = %e, "not following the uplink's default gateway");
    }
}

/// The `ctrl_*` ops of `ctrl.sock` as [`Event::Query`]: the connection's
/// thread waits (bounded) for the owner's answer.
pub struct QueryBridge {
    /// The owner's events.
    pub events: EventSender,
    /// How long an answer may take.
    pub timeout: Duration,
}

impl CtrlOps for QueryBridge {
    fn handle(&self, req: CtrlRequest) -> Reply<Value> {
        let (responder, answer) = Responder::new();
        if self.events.send(Event::Query(req, responder)).is_err() {
            return internal("shutting down");
        }
        answer
            .recv_timeout(self.timeout)
            .unwrap_or_else(|_| internal("the daemon did not answer in time"))
    }
}

// ===== appliers =====

/// Applies effects: each kind to its own consumer, in the order decided.
pub struct Appliers {
    /// The executor thread.
    pub vrouter: mpsc::Sender<Work>,
    /// The speaker task.
    pub bgp: UnboundedSender<BgpCommand>,
    /// The datastore thread.
    pub datastore: mpsc::Sender<DatastoreRequest>,
    /// Readiness for `ctrl.sock` and `/readyz`.
    pub health: watch::Sender<Health>,
    /// The host path's thread (none without a host port).
    pub host: Option<mpsc::Sender<HostState>>,
}

impl Appliers {
    /// Hands `effects` over. Consecutive vrouter requests go as one
    /// `Work::Apply` (the executor merges route runs), so a batch of events
    /// costs one message to the executor. A consumer that is gone is
    /// shutting down; what it misses does not matter then.
    pub fn apply(&self, effects: impl IntoIterator<Item = Effect>) {
        let mut requests = Vec::new();
        for effect in effects {
            match effect {
                Effect::Vrouter(Work::Apply(reqs)) => requests.extend(reqs),
                Effect::Vrouter(work) => {
                    self.flush(&mut requests);
                    let _ = self.vrouter.send(work);
                }
                Effect::Bgp(cmd) => {
                    let _ = self.bgp.send(cmd);
                }
                Effect::Datastore(req) => {
                    let _ = self.datastore.send(req);
                }
                Effect::Answer(responder, reply) => responder.send(reply),
                Effect::Health(h) => {
                    self.health.send_replace(h);
                }
                Effect::Host(state) => {
                    if let Some(host) = &self.host {
                        let _ = host.send(state);
                    }
                }
            }
        }
        self.flush(&mut requests);
    }

    fn flush(&self, requests: &mut Vec<brindle_api::vrouter::VrouterRequest>) {
        if !requests.is_empty() {
            let _ = self.vrouter.send(Work::Apply(std::mem::take(requests)));
        }
    }
}

/// The executor thread: applies [`Work`] in order, merging what is queued
/// (bounded, so a full BGP table streaming in is programmed as it comes
/// rather than after the last route), and reports the vrouter's
/// reachability as [`Event::Vrouter`] on the first attempt and on every
/// change. Ends when every sender is gone.
pub fn spawn_executor<D: Dataplane + 'static>(
    mut executor: Executor<D>,
    events: EventSender,
) -> std::io::Result<mpsc::Sender<Work>> {
    let (tx, rx) = mpsc::channel::<Work>();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("vrouter-exec".into())
        .spawn(move || {
            let _span = span.enter();
            let mut reported = None;
            while let Ok(first) = rx.recv() {
                let mut pending = first;
                while pending.items() < MAX_ROUTES_PER_REQUEST
                    && let Ok(more) = rx.try_recv()
                {
                    match (&mut pending, more) {
                        (Work::Apply(a), Work::Apply(b)) => a.extend(b),
                        (Work::Neighbors(a), Work::Neighbors(b)) => a.extend(b),
                        (Work::Reconcile, Work::Reconcile) => {}
                        (_, other) => executor.work(std::mem::replace(&mut pending, other)),
                    }
                }
                executor.work(pending);
                let reachable = executor.reachable();
                if reported != Some(reachable) {
                    reported = Some(reachable);
                    if events.send(Event::Vrouter { reachable }).is_err() {
                        return;
                    }
                }
            }
        })?;
    Ok(tx)
}

/// What the datastore thread needs.
pub struct DatastoreWorker {
    /// The IPAM (pools, blocks).
    pub ipam: Arc<Ipam<Arc<dyn Datastore>>>,
    /// The node registry.
    pub registry: Registry,
    /// Our record; the blocks and heartbeat time are filled in on each
    /// refresh.
    pub record: NodeRecord,
    /// The automatic IPAM GC (remembers its suspects between passes).
    pub collector: Collector,
    /// Where the GC's releases are counted.
    pub metrics: Arc<Metrics>,
    /// The datastore, for the policy watch.
    pub store: Arc<dyn Datastore>,
    /// The policy records and other nodes' endpoints as last read.
    pub policy: PolicyWatch,
}

impl DatastoreWorker {
    /// One refresh: the blocks affine to us, our heartbeat (with those
    /// blocks), the pools and every node. Failures are logged and leave
    /// their part out of the view.
    pub fn refresh(&self) -> DatastoreView {
        let name = self.record.name.as_str();
        let pools = match self.ipam.pools() {
            Ok(list) => Some(
                list.into_iter()
                    .map(|p| PoolRouting {
                        cidr: p.cidr,
                        encapsulation: p.encapsulation,
                        nat_outgoing: p.nat_outgoing,
                    })
                    .collect(),
            ),
            Err(e) => {
                warn!(error = %e, "reading pools");
                None
            }
        };
        let (affine_blocks, foreign_blocks) = match self.ipam.blocks() {
            Ok(blocks) => {
                let (ours, foreign): (Vec<_>, Vec<_>) = blocks
                    .into_iter()
                    .partition(|b| b.affinity.as_deref() == Some(name));
                // IPAM usage of this node, for the dashboard.
                let sum = |f: fn(&brindle_api::ipam::BlockView) -> u64| {
                    i64::try_from(ours.iter().map(f).sum::<u64>()).unwrap_or(i64::MAX)
                };
                self.metrics.ipam_blocks.set(ours.len() as i64);
                self.metrics
                    .ipam_addresses_allocated
                    .set(sum(|b| b.allocated));
                self.metrics.ipam_addresses_usable.set(sum(|b| b.usable));
                let cidrs = |v: Vec<brindle_api::ipam::BlockView>| -> BTreeSet<IpNet> {
                    v.into_iter().map(|b| b.cidr).collect()
                };
                (Some(cidrs(ours)), Some(cidrs(foreign)))
            }
            Err(e) => {
                warn!(error = %e, "reading blocks");
                (None, None)
            }
        };
        let mut record = self.record.clone();
        if let Some(blocks) = &affine_blocks {
            record.blocks = blocks.iter().copied().collect();
        }
        record.heartbeat_ms = now_ms();
        let heartbeat_ok = match self.registry.heartbeat(&record) {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, "registry heartbeat");
                false
            }
        };
        let nodes = match self.registry.nodes() {
            Ok(nodes) => Some(nodes),
            Err(e) => {
                warn!(error = %e, "reading the registry");
                None
            }
        };
        DatastoreView {
            pools,
            affine_blocks,
            foreign_blocks,
            nodes,
            heartbeat_ok,
            now_ms: now_ms(),
        }
    }

    /// One pass of the automatic IPAM GC: what stayed collectable for the
    /// grace period is released, each release logged and counted
    /// (`brindle_ctrl_ipam_gc_released_total{reason}`). An address whose pod
    /// exists is never released ([`brindle_ipam::gc`]).
    pub fn gc(&mut self, pass: &GcPass) -> Vec<Release> {
        let live = Liveness {
            node: &self.record.name,
            endpoints: &pass.endpoints,
            pods: pass.pods.as_ref(),
            live_nodes: &pass.live_nodes,
        };
        let (plan, released) = match self.collector.collect(&*self.ipam, &live, pass.now_ms) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "ipam gc pass failed");
                return Vec::new();
            }
        };
        for handle in &plan.kept_for_pod {
            debug!(%handle, "ipam gc: endpoint gone but the pod exists: kept");
        }
        for r in &released {
            self.metrics
                .ipam_gc_released
                .get_or_create(&ReasonLabel {
                    reason: r.kind().to_owned(),
                })
                .inc();
            match r {
                Release::LeakedHandle {
                    handle,
                    pod,
                    addresses,
                } => info!(
                    %handle,
                    pod = ?pod,
                    addresses = ?addresses,
                    "ipam gc: released a leaked handle (endpoint and pod gone)"
                ),
                Release::DeadNodeHandle { node, handle } => {
                    info!(%node, %handle, "ipam gc: released a dead node's handle")
                }
                Release::DeadNodeBlock { node, block } => {
                    info!(%node, %block, "ipam gc: deleted a dead node's empty block")
                }
            }
        }
        released
    }

    /// The datastore thread: refreshes on request, once for all the
    /// requests queued meanwhile (a datastore slower than the tick does not
    /// build a backlog), and answers with [`Event::Datastore`]; runs the
    /// newest IPAM GC pass asked for.
    pub fn spawn(mut self, events: EventSender) -> std::io::Result<mpsc::Sender<DatastoreRequest>> {
        let (tx, rx) = mpsc::channel::<DatastoreRequest>();
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("datastore".into())
            .spawn(move || {
                let _span = span.enter();
                while let Ok(first) = rx.recv() {
                    let (mut refresh, mut gc, mut policy) = (false, None, false);
                    for request in std::iter::once(first).chain(rx.try_iter()) {
                        match request {
                            DatastoreRequest::Refresh => refresh = true,
                            DatastoreRequest::IpamGc(pass) => gc = Some(pass),
                            DatastoreRequest::ReadPolicy => policy = true,
                        }
                    }
                    if let Some(pass) = gc {
                        self.gc(&pass);
                    }
                    if refresh || policy {
                        // The tick reads everything (other nodes' endpoints
                        // too); a check reads one key unless it changed.
                        let read = if refresh {
                            self.policy.poll(&*self.store)
                        } else {
                            self.policy.check(&*self.store)
                        };
                        match read {
                            Ok(changes) if changes.is_empty() => {}
                            Ok(changes) => {
                                if events.send(Event::Policy(changes)).is_err() {
                                    return;
                                }
                            }
                            Err(e) => warn!(error = %e, "reading policy records"),
                        }
                    }
                    if refresh && events.send(Event::Datastore(self.refresh())).is_err() {
                        return;
                    }
                }
            })?;
        Ok(tx)
    }
}

/// The speaker task: runs [`BgpCommand`]s in order against the speaker
/// (a removal before the re-addition of the same peer stays before it).
/// Returns after `Shutdown` (Cease sent) or when the owner is gone.
pub async fn speaker(
    speaker: Speaker,
    mut commands: UnboundedReceiver<BgpCommand>,
    metrics: Arc<Metrics>,
    events: EventSender,
) {
    while let Some(cmd) = commands.recv().await {
        match cmd {
            BgpCommand::Announce(prefix, next_hop) => {
                if let Err(e) = speaker.announce(prefix, next_hop) {
                    warn!(%prefix, error = %e, "announce failed");
                }
            }
            BgpCommand::Withdraw(prefix) => {
                if let Err(e) = speaker.withdraw(prefix) {
                    warn!(%prefix, error = %e, "withdraw failed");
                }
            }
            BgpCommand::AddPeer(pc) => {
                let peer: IpAddr = pc.address;
                if let Err(e) = speaker.add_peer(*pc).await {
                    warn!(%peer, error = %e, "add peer");
                    let _ = events.send(Event::PeerFailed(peer));
                }
            }
            BgpCommand::RemovePeer(peer) => {
                if let Err(e) = speaker.remove_peer(peer).await {
                    debug!(%peer, error = %e, "remove peer");
                }
            }
            BgpCommand::Peers(reply) => reply.send(match speaker.peers().await {
                Ok(p) => to_reply(p),
                Err(e) => internal(e.to_string()),
            }),
            BgpCommand::Routes(reply) => reply.send(match speaker.routes().await {
                Ok(r) => to_reply(r),
                Err(e) => internal(e.to_string()),
            }),
            BgpCommand::RefreshMetrics => {
                if let Ok(list) = speaker.peers().await {
                    metrics.bgp_peers.clear();
                    let (mut pin, mut pout, mut upd) = (0i64, 0i64, 0i64);
                    for p in &list {
                        metrics
                            .bgp_peers
                            .get_or_create(&StateLabel {
                                state: format!("{:?}", p.state),
                            })
                            .inc();
                        pin += p.prefixes_in as i64;
                        pout += p.prefixes_out as i64;
                        upd += p.updates_in as i64;
                    }
                    metrics.bgp_prefixes_in.set(pin);
                    metrics.bgp_prefixes_out.set(pout);
                    metrics.bgp_updates_in.set(upd);
                }
            }
            BgpCommand::Shutdown => {
                speaker.shutdown().await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use brindle_api::ipam::{Attributes, HandleId};
    use brindle_ipam::AllocateArgs;
    use brindle_ipam::model::Pool;
    use brindle_ipam::store::{EmbeddedMode, EmbeddedStore};

    use super::*;
    use crate::registry::Role;

    fn handle(c: &str) -> HandleId {
        HandleId {
            network: "brindle".into(),
            container_id: c.into(),
            ifname: "eth0".into(),
        }
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn the_gc_releases_a_leaked_handle_after_the_grace_and_never_one_whose_pod_exists() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Datastore> = Arc::new(
            EmbeddedStore::open(
                dir.path().join("ipam.redb"),
                EmbeddedMode::Exclusive,
                Duration::from_secs(5),
            )
            .unwrap(),
        );
        let ipam = Arc::new(Ipam::new(store.clone(), "/t/ipam"));
        let mut pool = Pool::new("p", "10.244.0.0/24".parse().unwrap());
        pool.block_size = Some(28);
        ipam.put_pool(&pool).unwrap();
        for (c, pod) in [
            ("c-live", "live"),
            ("c-leak", "leak"),
            ("c-pod", "podlives"),
        ] {
            let mut args = AllocateArgs::v4(handle(c), "n1");
            args.attrs = Attributes {
                namespace: Some("ns".into()),
                pod: Some(pod.into()),
                node: "n1".into(),
            };
            ipam.allocate(&args).unwrap();
        }
        let metrics = Arc::new(Metrics::new());
        let mut worker = DatastoreWorker {
            ipam: ipam.clone(),
            registry: Registry::new(store.clone(), "/t/"),
            store,
            policy: PolicyWatch::new("/t/", "n1"),
            record: NodeRecord {
                name: "n1".into(),
                address: "10.99.0.11".parse().unwrap(),
                as_number: 64512,
                bgp_port: 179,
                role: Role::Node,
                blocks: vec![],
                heartbeat_ms: 0,
                lease_secs: 30,
            },
            collector: Collector::new(Duration::from_secs(30)),
            metrics: metrics.clone(),
        };
        // The refresh exports this node's IPAM usage: one /28, three
        // addresses.
        let view = worker.refresh();
        assert_eq!(view.affine_blocks.map(|b| b.len()), Some(1));
        assert_eq!(metrics.ipam_blocks.get(), 1);
        assert_eq!(metrics.ipam_addresses_allocated.get(), 3);
        assert!(metrics.ipam_addresses_usable.get() >= 3);
        // c-live has its endpoint; c-leak and c-pod lost theirs, and only
        // c-pod's pod still exists.
        let mut pass = GcPass {
            endpoints: BTreeSet::from([pair("c-live", "eth0")]),
            pods: Some(BTreeSet::from([pair("ns", "live"), pair("ns", "podlives")])),
            live_nodes: BTreeSet::from(["n1".to_owned()]),
            now_ms: 1_000_000,
        };
        assert!(worker.gc(&pass).is_empty(), "within the grace");
        pass.now_ms += 30_000;
        let released = worker.gc(&pass);
        assert_eq!(released.len(), 1, "{released:?}");
        assert!(
            matches!(&released[0], Release::LeakedHandle { handle: h, .. } if *h == handle("c-leak")),
            "{released:?}"
        );
        let left: BTreeSet<String> = ipam
            .handles()
            .unwrap()
            .into_iter()
            .map(|h| h.handle.container_id)
            .collect();
        assert_eq!(
            left,
            BTreeSet::from(["c-live".to_owned(), "c-pod".to_owned()])
        );
        // Later passes keep the pod's address for as long as the pod exists.
        pass.now_ms += 600_000;
        assert!(worker.gc(&pass).is_empty());
        let text = metrics.encode();
        assert!(
            text.contains("brindle_ctrl_ipam_gc_released_total{reason=\"leaked_handle\"} 1"),
            "{text}"
        );
    }
}
