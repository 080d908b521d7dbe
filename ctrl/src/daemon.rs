//! The daemon: wires the datastore, IPAM, endpoint API, BGP speaker,
//! registry, routing and the vrouter executor together.
//!
//! Threads and tasks:
//! - the executor thread owns the [`Executor`] and takes batches of
//!   requests from a channel; every second without work it reconciles
//!   (Hello, and a Sync when the vrouter was away or restarted);
//! - the API thread accepts on `ctrl.sock`, one thread per connection;
//! - the control loop (the main thread) runs once a second: heartbeat in
//!   the registry, mesh peers = live nodes, announce/withdraw our blocks,
//!   refresh pools for routing, export metrics. It uses plain threads because
//!   every datastore call blocks;
//! - tokio tasks: the BGP speaker, learned routes → executor, metrics HTTP.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use brindle_api::framing::{RemoteError, RemoteErrorKind, Reply};
use brindle_api::vrouter::{
    NodeConfig, PortKind, PortSpec, Route, RouteTarget, VrouterRequest, VxlanConfig,
};
use brindle_ipam::Ipam;
use brindle_ipam::model::{IpamConfig, Pool};
use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore, EtcdStore, EtcdTls};
use ipnet::IpNet;
use serde_json::Value;
use tracing::{Instrument, info, info_span, warn};

use crate::api_server::{self, ApiServer, CtrlOps};
use crate::bgp::rib::{BestRoute, RouteChange};
use crate::bgp::speaker::{PeerConfig, Speaker, SpeakerConfig};
use crate::config::{Config, Validated};
use crate::ctrl_api::{CtrlRequest, NodeStatus, NodeView};
use crate::endpoints::{EndpointHandler, EndpointStore};
use crate::gateway;
use crate::metrics::{self, Metrics, StateLabel};
use crate::neighbors;
use crate::programming::Work;
use crate::programming::coalesce::MAX_ROUTES_PER_REQUEST;
use crate::programming::dataplane::SocketDataplane;
use crate::programming::executor::Executor;
use crate::registry::{NodeRecord, Registry, Role, WantedPeer, mesh_peers, now_ms, wanted_peers};
use crate::routing::{PoolRouting, Underlay, block_diff, request_for, route_for};

/// Where the IPAM data lives under the datastore root prefix (the
/// default root makes it `/brindle/ipam`, `brindle-ipam`'s default).
pub const IPAM_DIR: &str = "ipam";

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A start-up step failed.
    #[error("{step}: {message}")]
    Start {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        message: String,
    },
}

fn start_err(step: &'static str) -> impl FnOnce(String) -> DaemonError {
    move |message| DaemonError::Start { step, message }
}

/// The vrouter's node settings; `tunnel_peers` are the other live nodes
/// (encapsulated packets from anyone else are dropped); `underlay_gateway`
/// the router towards nodes outside the underlay subnet.
fn node_config(
    v: &Validated,
    tunnel_peers: Vec<Ipv4Addr>,
    underlay_gateway: Option<Ipv4Addr>,
) -> NodeConfig {
    NodeConfig {
        address_v4: Some(v.node_address),
        address_v6: None,
        underlay_subnet: v.underlay_subnet,
        underlay_gateway,
        vxlan: VxlanConfig::default(),
        tunnel_peers,
    }
}

/// State the control loop carries from one step to the next.
#[derive(Default)]
struct LoopState {
    /// Peers we added from the registry, with their port and client flag.
    peers: BTreeMap<IpAddr, (u16, bool)>,
    /// Our blocks programmed as blackholes.
    own_blackholes: BTreeSet<IpNet>,
    /// The tunnel peers last sent in `SetNode`.
    tunnel_peers: Vec<Ipv4Addr>,
    /// The underlay gateway last sent in `SetNode`.
    underlay_gateway: Option<Ipv4Addr>,
    /// `SetNode` must be sent again (peers or gateway changed).
    node_stale: bool,
    /// Service prefixes we announce.
    services: BTreeSet<IpNet>,
}

/// The learned best routes and what routing them depends on.
struct Learned {
    pools: Vec<PoolRouting>,
    routes: BTreeMap<IpNet, BestRoute>,
    underlay: Underlay,
}

fn read_pools(
    ipam: &Ipam<Arc<dyn Datastore>>,
) -> Result<Vec<PoolRouting>, brindle_ipam::IpamError> {
    Ok(ipam
        .pools()?
        .into_iter()
        .map(|p| PoolRouting {
            cidr: p.cidr,
            encapsulation: p.encapsulation,
        })
        .collect())
}

/// What the control loop publishes for `ctrl_node_status`.
#[derive(Default)]
struct Shared {
    announced: BTreeSet<IpNet>,
    services: BTreeSet<IpNet>,
    nodes: Vec<NodeRecord>,
}

struct Ctrl {
    rt: tokio::runtime::Handle,
    speaker: Arc<Mutex<Option<Speaker>>>,
    shared: Arc<Mutex<Shared>>,
    config: Config,
    validated: Validated,
    store_kind: &'static str,
    vrouter_reachable: Arc<AtomicBool>,
    endpoints: EndpointStore,
}

fn internal(message: String) -> Reply<Value> {
    Reply::Error(RemoteError {
        kind: RemoteErrorKind::Internal,
        message,
    })
}

fn to_reply<T: serde::Serialize>(v: T) -> Reply<Value> {
    match serde_json::to_value(v) {
        Ok(result) => Reply::Ok { result },
        Err(e) => internal(e.to_string()),
    }
}

impl CtrlOps for Ctrl {
    fn handle(&self, req: CtrlRequest) -> Reply<Value> {
        let guard = self.speaker.lock().unwrap_or_else(|p| p.into_inner());
        let Some(speaker) = guard.as_ref() else {
            return internal("shutting down".into());
        };
        match req {
            CtrlRequest::CtrlBgpPeers => match self.rt.block_on(speaker.peers()) {
                Ok(p) => to_reply(p),
                Err(e) => internal(e.to_string()),
            },
            CtrlRequest::CtrlBgpRoutes => match self.rt.block_on(speaker.routes()) {
                Ok(r) => to_reply(r),
                Err(e) => internal(e.to_string()),
            },
            CtrlRequest::CtrlNodeStatus => {
                drop(guard);
                let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let now = now_ms();
                to_reply(NodeStatus {
                    name: self.validated.node_name.clone(),
                    address: self.validated.node_address,
                    as_number: self.config.bgp.as_number,
                    datastore: self.store_kind.into(),
                    vrouter_reachable: self.vrouter_reachable.load(Ordering::Relaxed),
                    endpoints: self.endpoints.list(None).map(|l| l.len()).unwrap_or(0),
                    announced_blocks: shared.announced.iter().copied().collect(),
                    announced_services: shared.services.iter().copied().collect(),
                    nodes: shared
                        .nodes
                        .iter()
                        .map(|n| NodeView {
                            live: n.is_live(now),
                            record: n.clone(),
                        })
                        .collect(),
                })
            }
        }
    }
}

fn open_store(config: &Config) -> Result<Arc<dyn Datastore>, DaemonError> {
    match config.datastore.kind.as_str() {
        "etcd" => {
            let file = |f: &str| (!f.is_empty()).then(|| std::path::PathBuf::from(f));
            let tls = EtcdTls {
                ca_file: file(&config.datastore.etcd_ca_file),
                cert_file: file(&config.datastore.etcd_cert_file),
                key_file: file(&config.datastore.etcd_key_file),
            };
            EtcdStore::connect_with_tls(&config.datastore.endpoints, Duration::from_secs(5), &tls)
                .map(|s| Arc::new(s) as Arc<dyn Datastore>)
                .map_err(|e| start_err("connecting to etcd")(e.to_string()))
        }
        _ => EmbeddedStore::open(
            config.datastore.path.join("ipam.redb"),
            EmbeddedMode::Exclusive,
            Duration::from_secs(10),
        )
        .map(|s| Arc::new(s) as Arc<dyn Datastore>)
        .map_err(|e| start_err("opening the embedded datastore")(e.to_string())),
    }
}

fn bootstrap_ipam(
    ipam: &Ipam<Arc<dyn Datastore>>,
    config: &Config,
    v: &Validated,
) -> Result<(), DaemonError> {
    let err = |e: brindle_ipam::IpamError| start_err("bootstrapping IPAM")(e.to_string());
    ipam.set_config_if_absent(&IpamConfig {
        strict_affinity: config.ipam.strict_affinity,
        max_blocks_per_host: 0,
    })
    .map_err(err)?;
    if ipam.pools().map_err(err)?.is_empty() {
        let name = match v.default_pool {
            IpNet::V4(_) => "default-ipv4",
            IpNet::V6(_) => "default-ipv6",
        };
        let mut pool = Pool::new(name, v.default_pool);
        pool.block_size = Some(config.ipam.block_size);
        pool.encapsulation =
            serde_json::from_value(Value::String(config.ipam.encapsulation.clone()))
                .map_err(|e| start_err("bootstrapping IPAM")(e.to_string()))?;
        pool.nat_outgoing = config.ipam.nat_outgoing;
        ipam.put_pool(&pool).map_err(err)?;
        info!(pool = %v.default_pool, "created the default pool");
    }
    Ok(())
}

/// Re-reads the configuration (file, variables, flags) on SIGHUP.
pub type Reload = Box<dyn Fn() -> Result<Config, crate::config::ConfigError> + Send>;

/// Runs the daemon until SIGINT or SIGTERM, without reloading on SIGHUP.
pub fn run(config: Config, v: Validated) -> Result<(), DaemonError> {
    run_with_reload(config, v, None)
}

/// Runs the daemon until SIGINT or SIGTERM. On SIGHUP `reload` gives the
/// new configuration: the service prefixes take effect (announced,
/// withdrawn), other changes are logged as needing a restart.
pub fn run_with_reload(
    config: Config,
    v: Validated,
    reload: Option<Reload>,
) -> Result<(), DaemonError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| start_err("starting the runtime")(e.to_string()))?;
    let _span = info_span!("node", name = %v.node_name).entered();

    let store = open_store(&config)?;
    let store_kind = store.kind();
    let ipam = Arc::new(Ipam::new(
        store.clone(),
        &format!("{}{IPAM_DIR}", config.datastore.prefix),
    ));
    bootstrap_ipam(&ipam, &config, &v)?;
    let metrics = Arc::new(Metrics::new());
    let registry = Registry::new(store.clone(), &config.datastore.prefix);

    // The executor thread.
    let (program_tx, program_rx) = mpsc::channel::<Work>();
    // The endpoint handler speaks plain request batches; forwarded in order.
    let (endpoint_tx, endpoint_rx) = mpsc::channel::<Vec<VrouterRequest>>();
    {
        let tx = program_tx.clone();
        std::thread::Builder::new()
            .name("endpoint-prog".into())
            .spawn(move || {
                for batch in endpoint_rx {
                    if tx.send(Work::Apply(batch)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| start_err("starting the executor")(e.to_string()))?;
    }
    let mut executor = Executor::new(
        SocketDataplane::new(&config.vrouter.socket, Duration::from_secs(10)),
        Some(metrics.clone()),
    );
    let vrouter_reachable = executor.reachable_flag();
    let endpoint_store = EndpointStore::new(store.clone(), &config.datastore.prefix, &v.node_name);
    let endpoints = Arc::new(EndpointHandler {
        store: endpoint_store.clone(),
        programming: endpoint_tx,
        vrouter_reachable: vrouter_reachable.clone(),
        metrics: Some(metrics.clone()),
    });
    let _ = program_tx.send(Work::Apply(vec![
        VrouterRequest::SetNode {
            node: node_config(&v, Vec::new(), v.underlay_gateway),
        },
        VrouterRequest::AddPorts {
            ports: vec![PortSpec {
                name: v.uplink.clone(),
                kind: PortKind::Uplink,
                addresses: Vec::new(),
                peer_mac: None,
                endpoint: None,
            }],
        },
    ]));
    let restored = endpoints
        .restore()
        .map_err(|e| start_err("reading endpoints")(e.to_string()))?;
    info!(endpoints = restored, "restored endpoints");
    let exec_span = tracing::Span::current();
    let executor_thread = std::thread::Builder::new()
        .name("vrouter-exec".into())
        .spawn(move || {
            let _e = exec_span.enter();
            loop {
                match program_rx.recv_timeout(Duration::from_secs(1)) {
                    Ok(first) => {
                        // Merge what is queued: consecutive request batches
                        // go out together (the executor merges route runs),
                        // neighbour changes in order. Bounded, so a full BGP
                        // table streaming in is programmed as it comes
                        // rather than after the last route.
                        let mut pending = first;
                        while pending.items() < MAX_ROUTES_PER_REQUEST
                            && let Ok(more) = program_rx.try_recv()
                        {
                            match (&mut pending, more) {
                                (Work::Apply(a), Work::Apply(b)) => a.extend(b),
                                (Work::Neighbors(a), Work::Neighbors(b)) => a.extend(b),
                                (_, other) => {
                                    executor.work(std::mem::replace(&mut pending, other));
                                }
                            }
                        }
                        executor.work(pending);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => executor.reconcile(),
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        })
        .map_err(|e| start_err("starting the executor")(e.to_string()))?;

    // BGP.
    let mut speaker_config = SpeakerConfig::new(config.bgp.as_number, v.node_address);
    speaker_config.listen = Some(SocketAddr::new(
        IpAddr::V4(v.node_address),
        config.bgp.listen_port,
    ));
    speaker_config.cluster_id = v.cluster_id;
    if !config.bgp.record_file.is_empty() {
        info!(file = %config.bgp.record_file, "recording the BGP speaker's inputs");
        speaker_config.record = Some(config.bgp.record_file.clone().into());
    }
    let (speaker, mut changes) = rt
        .block_on(Speaker::start(speaker_config))
        .map_err(|e| start_err("starting BGP")(e.to_string()))?;
    for p in &config.bgp.peers {
        let mut pc = PeerConfig::new(p.address, p.as_number);
        pc.port = p.port.unwrap_or(179);
        pc.password = p.password.clone();
        pc.max_prefixes = p.max_prefixes;
        pc.rr_client = p.rr_client;
        pc.hold_time = config.bgp.hold_time_secs;
        rt.block_on(speaker.add_peer(pc))
            .map_err(|e| start_err("adding an explicit BGP peer")(e.to_string()))?;
    }
    let speaker = Arc::new(Mutex::new(Some(speaker)));
    let underlay = Underlay {
        uplink: v.uplink.clone(),
        subnet: v.underlay_subnet,
    };
    let learned = Arc::new(Mutex::new(Learned {
        pools: read_pools(&ipam).unwrap_or_default(),
        routes: BTreeMap::new(),
        underlay,
    }));
    {
        let learned = learned.clone();
        let tx = program_tx.clone();
        rt.spawn(
            async move {
                while let Some(change) = changes.recv().await {
                    tracing::debug!(?change, "learned route change");
                    let mut l = learned.lock().unwrap_or_else(|p| p.into_inner());
                    match &change {
                        RouteChange::Added(b) | RouteChange::Changed(b) => {
                            l.routes.insert(b.prefix, b.clone());
                        }
                        RouteChange::Removed { prefix } => {
                            l.routes.remove(prefix);
                        }
                    }
                    // Sent under the lock so a re-evaluation after a pool
                    // change cannot overtake it.
                    let _ = tx.send(Work::Apply(vec![request_for(
                        &change,
                        &l.pools,
                        &l.underlay,
                    )]));
                }
            }
            .instrument(tracing::Span::current()),
        );
    }

    // Metrics.
    let ready = Arc::new(AtomicBool::new(false));
    let metrics_listener = rt
        .block_on(metrics::bind(v.metrics_listen))
        .map_err(|e| start_err("binding the metrics listener")(e.to_string()))?;
    rt.spawn(metrics::serve(
        metrics_listener,
        metrics.clone(),
        ready.clone(),
    ));

    // The API socket.
    let shared = Arc::new(Mutex::new(Shared::default()));
    let ctrl = Arc::new(Ctrl {
        rt: rt.handle().clone(),
        speaker: speaker.clone(),
        shared: shared.clone(),
        config: config.clone(),
        validated: v.clone(),
        store_kind,
        vrouter_reachable: vrouter_reachable.clone(),
        endpoints: endpoint_store,
    });
    // Give the executor's first Hello a moment before the first ADD can
    // arrive, so a daemon that just started with a vrouter up does not
    // refuse it; a vrouter that is down only delays the start by this.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !vrouter_reachable.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let listener = api_server::bind(&config.api.socket)
        .map_err(|e| start_err("binding the API socket")(e.to_string()))?;
    let server = Arc::new(ApiServer {
        ipam: ipam.clone(),
        endpoints,
        ctrl,
    });
    std::thread::Builder::new()
        .name("ctrl-api".into())
        .spawn(move || api_server::serve(listener, server))
        .map_err(|e| start_err("starting the API")(e.to_string()))?;
    info!(socket = %config.api.socket.display(), bgp_port = config.bgp.listen_port, "brindle-ctrl running");

    // The uplink's neighbours from the kernel, as programming.
    {
        let tx = program_tx.clone();
        let uplink = v.uplink.clone();
        rt.spawn(
            async move {
                let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel();
                let watcher = tokio::spawn(
                    neighbors::watch(uplink, ntx).instrument(tracing::Span::current()),
                );
                while let Some(changes) = nrx.recv().await {
                    if tx.send(Work::Neighbors(changes)).is_err() {
                        break;
                    }
                }
                if let Ok(Err(e)) = watcher.await {
                    warn!(error = %e, "not following the uplink's neighbours");
                }
            }
            .instrument(tracing::Span::current()),
        );
    }

    // The underlay gateway, unless configured: the uplink's default
    // gateway, followed; the control loop sends it in `SetNode`.
    let learned_gateway: Arc<Mutex<Option<Ipv4Addr>>> = Arc::new(Mutex::new(None));
    if v.underlay_gateway.is_none() {
        let learned_gateway = learned_gateway.clone();
        let uplink = v.uplink.clone();
        rt.spawn(
            async move {
                let (gtx, mut grx) = tokio::sync::mpsc::unbounded_channel();
                let watcher =
                    tokio::spawn(gateway::watch(uplink, gtx).instrument(tracing::Span::current()));
                while let Some(gw) = grx.recv().await {
                    *learned_gateway.lock().unwrap_or_else(|p| p.into_inner()) = gw;
                }
                if let Ok(Err(e)) = watcher.await {
                    warn!(error = %e, "not following the uplink's default gateway");
                }
            }
            .instrument(tracing::Span::current()),
        );
    }

    // Reload on SIGHUP.
    let hup = Arc::new(AtomicBool::new(false));
    {
        let hup = hup.clone();
        rt.spawn(async move {
            let Ok(mut sig) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while sig.recv().await.is_some() {
                hup.store(true, Ordering::Relaxed);
            }
        });
    }
    let mut services = v.service_prefixes.clone();

    // Shutdown on a signal.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        rt.spawn(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            stop.store(true, Ordering::Relaxed);
        });
    }

    // The control loop.
    let mut state = LoopState {
        underlay_gateway: v.underlay_gateway,
        ..LoopState::default()
    };
    while !stop.load(Ordering::Relaxed) {
        if hup.swap(false, Ordering::Relaxed) {
            match &reload {
                Some(reload) => match reload().and_then(|c| c.validate().map(|nv| (c, nv))) {
                    Ok((c, nv)) => {
                        info!(services = ?nv.service_prefixes, "configuration reloaded");
                        services = nv.service_prefixes.clone();
                        let mut same = c.clone();
                        same.bgp
                            .service_cluster_ips
                            .clone_from(&config.bgp.service_cluster_ips);
                        same.bgp
                            .service_external_ips
                            .clone_from(&config.bgp.service_external_ips);
                        same.bgp
                            .service_loadbalancer_ips
                            .clone_from(&config.bgp.service_loadbalancer_ips);
                        if same != config {
                            warn!(
                                "configuration changes other than the service prefixes take effect at the next start"
                            );
                        }
                    }
                    Err(e) => warn!(error = %e, "reload failed: keeping the running configuration"),
                },
                None => info!("SIGHUP: no configuration source to reload"),
            }
        }
        control_step(
            &rt,
            &config,
            &v,
            &ipam,
            &registry,
            &speaker,
            &learned,
            &shared,
            &mut state,
            &program_tx,
            &services,
            &metrics,
            &ready,
            &vrouter_reachable,
            &learned_gateway,
        );
        for _ in 0..10 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    info!("shutting down: withdrawing our routes");
    let speaker = speaker.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(s) = speaker {
        rt.block_on(s.shutdown());
    }
    let _ = std::fs::remove_file(&config.api.socket);
    drop(program_tx);
    // The executor exits once every sender is gone; the API threads hold
    // one, so do not wait for it.
    drop(executor_thread);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The `SetNode` to send when the tunnel peers or the underlay gateway (the
/// configured one, else `learned`) differ from those last sent; `state`
/// then records them as sent.
fn node_update(
    v: &Validated,
    state: &mut LoopState,
    learned: Option<Ipv4Addr>,
) -> Option<VrouterRequest> {
    let underlay_gateway = v.underlay_gateway.or(learned);
    if underlay_gateway != state.underlay_gateway {
        info!(?underlay_gateway, "underlay gateway changed");
        state.underlay_gateway = underlay_gateway;
        state.node_stale = true;
    }
    std::mem::take(&mut state.node_stale).then(|| VrouterRequest::SetNode {
        node: node_config(v, state.tunnel_peers.clone(), state.underlay_gateway),
    })
}

#[allow(clippy::too_many_arguments)]
fn control_step(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    v: &Validated,
    ipam: &Ipam<Arc<dyn Datastore>>,
    registry: &Registry,
    speaker: &Mutex<Option<Speaker>>,
    learned: &Mutex<Learned>,
    shared: &Mutex<Shared>,
    state: &mut LoopState,
    program_tx: &mpsc::Sender<Work>,
    services: &BTreeSet<IpNet>,
    metrics: &Metrics,
    ready: &AtomicBool,
    vrouter_reachable: &AtomicBool,
    learned_gateway: &Mutex<Option<Ipv4Addr>>,
) {
    let guard = speaker.lock().unwrap_or_else(|p| p.into_inner());
    let Some(speaker) = guard.as_ref() else {
        return;
    };
    let mut store_ok = true;

    // Pools (for routing learned prefixes): when one changes (a new pool,
    // another encapsulation) every learned route is routed again.
    match read_pools(ipam) {
        Ok(list) => {
            let mut l = learned.lock().unwrap_or_else(|p| p.into_inner());
            if l.pools != list {
                l.pools = list;
                let routes: Vec<Route> = l
                    .routes
                    .values()
                    .map(|b| route_for(b, &l.pools, &l.underlay))
                    .collect();
                if !routes.is_empty() {
                    info!(
                        routes = routes.len(),
                        "pools changed: re-routing learned prefixes"
                    );
                    let _ =
                        program_tx.send(Work::Apply(vec![VrouterRequest::AddRoutes { routes }]));
                }
            }
        }
        Err(e) => {
            store_ok = false;
            warn!(error = %e, "reading pools");
        }
    }

    // Our blocks: announce with the node address as next hop, withdraw on
    // release; a blackhole route for each so addresses of the block without
    // an endpoint are dropped here rather than sent back to the uplink.
    let affine: Option<BTreeSet<IpNet>> = match ipam.blocks() {
        Ok(blocks) => Some(
            blocks
                .into_iter()
                .filter(|b| b.affinity.as_deref() == Some(v.node_name.as_str()))
                .map(|b| b.cidr)
                .collect(),
        ),
        Err(e) => {
            store_ok = false;
            warn!(error = %e, "reading blocks");
            None
        }
    };
    let mut shared_guard = shared.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(affine) = &affine {
        let (announce, withdraw) = block_diff(&shared_guard.announced, affine);
        for b in &announce {
            info!(block = %b, "announcing our block");
            if let Err(e) = speaker.announce(*b, IpAddr::V4(v.node_address)) {
                warn!(block = %b, error = %e, "announce failed");
            }
        }
        for b in &withdraw {
            info!(block = %b, "withdrawing a released block");
            if let Err(e) = speaker.withdraw(*b) {
                warn!(block = %b, error = %e, "withdraw failed");
            }
        }
        let (add_bh, del_bh) = block_diff(&state.own_blackholes, affine);
        if !add_bh.is_empty() {
            let _ = program_tx.send(Work::Apply(vec![VrouterRequest::AddRoutes {
                routes: add_bh
                    .iter()
                    .map(|b| Route {
                        prefix: *b,
                        target: RouteTarget::Blackhole,
                    })
                    .collect(),
            }]));
        }
        if !del_bh.is_empty() {
            let _ = program_tx.send(Work::Apply(vec![VrouterRequest::RemoveRoutes {
                prefixes: del_bh,
            }]));
        }
        state.own_blackholes.clone_from(affine);
        shared_guard.announced.clone_from(affine);
    }

    // Service prefixes (cluster, external, load-balancer IPs): announced
    // from every node with its address as next hop, like Calico's
    // BGPConfiguration; withdrawn when a reload drops them.
    let (announce, withdraw) = block_diff(&state.services, services);
    for p in &announce {
        info!(prefix = %p, "announcing a service prefix");
        if let Err(e) = speaker.announce(*p, IpAddr::V4(v.node_address)) {
            warn!(prefix = %p, error = %e, "announce failed");
        }
    }
    for p in &withdraw {
        info!(prefix = %p, "withdrawing a service prefix");
        if let Err(e) = speaker.withdraw(*p) {
            warn!(prefix = %p, error = %e, "withdraw failed");
        }
    }
    state.services.clone_from(services);
    shared_guard.services.clone_from(services);

    // Heartbeat and the mesh.
    let record = NodeRecord {
        name: v.node_name.clone(),
        address: v.node_address,
        as_number: config.bgp.as_number,
        bgp_port: config.bgp.listen_port,
        role: if config.bgp.route_reflector {
            Role::RouteReflector
        } else {
            Role::Node
        },
        blocks: shared_guard.announced.iter().copied().collect(),
        heartbeat_ms: now_ms(),
        lease_secs: config.bgp.node_lease_secs,
    };
    if let Err(e) = registry.heartbeat(&record) {
        store_ok = false;
        warn!(error = %e, "registry heartbeat");
    }
    match registry.nodes() {
        Ok(nodes) => {
            let now = now_ms();
            let wanted: BTreeMap<IpAddr, WantedPeer<'_>> = wanted_peers(
                &nodes,
                &v.node_name,
                config.bgp.node_to_node_mesh,
                config.bgp.route_reflector,
                now,
            )
            .into_iter()
            .map(|p| (IpAddr::V4(p.node.address), p))
            .collect();
            let gone: Vec<IpAddr> = state
                .peers
                .keys()
                .filter(|a| !wanted.contains_key(a))
                .copied()
                .collect();
            for addr in gone {
                info!(peer = %addr, "node gone, dead or no longer wanted: removing its BGP peer");
                if let Err(e) = rt.block_on(speaker.remove_peer(addr)) {
                    warn!(peer = %addr, error = %e, "remove peer");
                }
                state.peers.remove(&addr);
            }
            for (addr, want) in wanted {
                let key = (want.node.bgp_port, want.rr_client);
                if state.peers.get(&addr) == Some(&key) {
                    continue;
                }
                if state.peers.contains_key(&addr) {
                    let _ = rt.block_on(speaker.remove_peer(addr));
                }
                let mut pc = PeerConfig::new(addr, want.node.as_number);
                pc.port = want.node.bgp_port;
                pc.hold_time = config.bgp.hold_time_secs;
                pc.local_address = Some(IpAddr::V4(v.node_address));
                pc.rr_client = want.rr_client;
                info!(peer = %addr, node = %want.node.name, rr_client = want.rr_client, "adding peer from the registry");
                match rt.block_on(speaker.add_peer(pc)) {
                    Ok(()) => {
                        state.peers.insert(addr, key);
                    }
                    Err(e) => warn!(peer = %addr, error = %e, "add peer"),
                }
            }
            let now = now_ms();
            let tunnel_peers: Vec<Ipv4Addr> = mesh_peers(&nodes, &v.node_name, now)
                .iter()
                .map(|n| n.address)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if tunnel_peers != state.tunnel_peers {
                info!(?tunnel_peers, "tunnel peers changed");
                state.tunnel_peers = tunnel_peers;
                state.node_stale = true;
            }
            shared_guard.nodes = nodes;
        }
        Err(e) => {
            store_ok = false;
            warn!(error = %e, "reading the registry");
        }
    }
    drop(shared_guard);

    let learned = *learned_gateway.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(set_node) = node_update(v, state, learned) {
        let _ = program_tx.send(Work::Apply(vec![set_node]));
    }

    // Metrics.
    if let Ok(list) = rt.block_on(speaker.peers()) {
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
    ready.store(
        store_ok && vrouter_reachable.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
}

#[cfg(test)]
mod tests {
    use brindle_api::framing::PROTOCOL_VERSION;
    use brindle_api::vrouter::DesiredState;

    use super::*;
    use crate::programming::dataplane::RecordingDataplane;

    fn validated(configured_gateway: Option<Ipv4Addr>) -> Validated {
        Validated {
            node_name: "n1".into(),
            node_address: Ipv4Addr::new(10, 99, 0, 11),
            uplink: "eth0".into(),
            metrics_listen: "127.0.0.1:9091".parse().unwrap(),
            default_pool: "10.244.0.0/16".parse().unwrap(),
            underlay_subnet: Some("10.99.0.0/24".parse().unwrap()),
            underlay_gateway: configured_gateway,
            cluster_id: None,
            service_prefixes: BTreeSet::new(),
        }
    }

    const GW: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 254);

    fn node(peers: Vec<Ipv4Addr>, gateway: Option<Ipv4Addr>) -> NodeConfig {
        NodeConfig {
            address_v4: Some(Ipv4Addr::new(10, 99, 0, 11)),
            address_v6: None,
            underlay_subnet: Some("10.99.0.0/24".parse().unwrap()),
            underlay_gateway: gateway,
            vxlan: VxlanConfig::default(),
            tunnel_peers: peers,
        }
    }

    #[test]
    fn a_learned_gateway_reaches_the_vrouter_once_per_change_and_after_a_restart() {
        let v = validated(None);
        let fake = RecordingDataplane::new("b1");
        let mut ex = Executor::new(fake.clone(), None);
        ex.reconcile();
        fake.take();
        let mut state = LoopState::default();
        assert_eq!(node_update(&v, &mut state, None), None);

        let set = node_update(&v, &mut state, Some(GW)).expect("a SetNode");
        ex.submit(vec![set]);
        assert_eq!(
            fake.take(),
            vec![VrouterRequest::SetNode {
                node: node(vec![], Some(GW))
            }]
        );
        // The same gateway again: nothing to send.
        assert_eq!(node_update(&v, &mut state, Some(GW)), None);
        // New tunnel peers keep the gateway.
        state.tunnel_peers = vec![Ipv4Addr::new(10, 99, 1, 13)];
        state.node_stale = true;
        ex.submit(vec![node_update(&v, &mut state, Some(GW)).unwrap()]);
        assert_eq!(
            fake.take(),
            vec![VrouterRequest::SetNode {
                node: node(vec![Ipv4Addr::new(10, 99, 1, 13)], Some(GW))
            }]
        );
        // A restarted vrouter gets it back in the Sync.
        fake.restart("b2");
        ex.reconcile();
        assert_eq!(
            fake.take(),
            vec![
                VrouterRequest::Hello {
                    version: PROTOCOL_VERSION
                },
                VrouterRequest::Sync {
                    state: DesiredState {
                        node: Some(node(vec![Ipv4Addr::new(10, 99, 1, 13)], Some(GW))),
                        ports: vec![],
                        routes: vec![],
                        neighbors: vec![],
                    }
                }
            ]
        );
        // The default route gone: the vrouter forgets the gateway.
        assert_eq!(
            node_update(&v, &mut state, None),
            Some(VrouterRequest::SetNode {
                node: node(vec![Ipv4Addr::new(10, 99, 1, 13)], None)
            })
        );
    }

    #[test]
    fn a_configured_gateway_wins_over_the_learned_one() {
        let configured = Ipv4Addr::new(10, 99, 0, 1);
        let v = validated(Some(configured));
        let mut state = LoopState {
            underlay_gateway: v.underlay_gateway,
            ..LoopState::default()
        };
        assert_eq!(node_update(&v, &mut state, Some(GW)), None);
        assert_eq!(state.underlay_gateway, Some(configured));
    }
}
