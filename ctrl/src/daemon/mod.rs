//! The daemon: one owner loop over one [`Event`] enum, the shape the BGP
//! speaker itself has.
//!
//! - [`owner::Owner`] holds the daemon's state (learned routes, pools, our
//!   blocks and service prefixes, mesh peers, tunnel peers, the underlay
//!   gateway, this node's endpoints, readiness) and decides everything,
//!   Sans-IO: `handle(Event, &mut Vec<Effect>)`.
//! - Every input is an [`Event`] sent by a child ([`tasks`]): the ticker,
//!   the speaker's route changes, the netlink watchers (neighbours,
//!   gateway), the datastore thread's views, the executor's reachability
//!   reports, `ctrl.sock` (endpoint changes, `ctrl_*` queries), signals
//!   (reload, shutdown), the Kubernetes API's watchers ([`kube_task`]).
//! - Every output is an [`Effect`] value handed to its applier: vrouter
//!   programming to the executor thread ([`crate::programming`], with its
//!   recording fake), BGP commands to the speaker task, datastore requests
//!   to the datastore thread, answers to their askers, readiness to the
//!   servers that report it.
//!
//! The loop ([`run_loop`]) takes one event, then what else is queued
//! (bounded), so a burst of route changes leaves as one batch of
//! programming. Periodic work (datastore refresh, vrouter reconcile, BGP
//! metrics) is driven by [`Event::Tick`]; nothing sleeps to synchronise.
//!
//! Adding a source: a variant of [`Event`], a producer in [`tasks`] given
//! a clone of the [`tasks::EventSender`] (started in [`run_with_reload`]),
//! and its case in `Owner::handle`. Adding an effect: a variant of
//! [`Effect`] (or of the command enum of an existing applier), its case in
//! [`tasks::Appliers::apply`], and the applier (a task or thread that owns
//! the I/O, answering with an event when the owner needs the result).

pub mod effect;
pub mod event;
pub mod kube_task;
pub mod owner;
pub mod policy;
pub mod tasks;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use brindle_ipam::Ipam;
use brindle_ipam::gc::Collector;
use brindle_ipam::model::{IpamConfig, Pool};
use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore, EtcdStore, EtcdTls};
use ipnet::IpNet;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, info, info_span, warn};

pub use self::effect::Effect;
pub use self::event::Event;
use self::owner::Owner;
pub use self::tasks::Reload;
use self::tasks::{Appliers, Child, DatastoreWorker, QueryBridge};
use crate::api_server::{self, ApiServer};
use crate::bgp::speaker::{PeerConfig, Speaker, SpeakerConfig};
use crate::config::{Config, Validated};
use crate::endpoints::{EndpointHandler, EndpointStore, PORT_WAIT};
use crate::health::Health;
use crate::hostpath::{self, netlink::NetlinkKernel};
use crate::metrics::{self, Metrics};
use crate::policy::ops::PolicyOps;
use crate::policy::{PolicyStore, PolicyWatch};
use crate::programming::acks::PortAcks;
use crate::programming::dataplane::SocketDataplane;
use crate::programming::executor::Executor;
use crate::registry::{NodeRecord, Registry, Role};
use crate::routing::PoolRouting;

/// Where the IPAM data lives under the datastore root prefix (the
/// default root makes it `/brindle/ipam`, `brindle-ipam`'s default).
pub const IPAM_DIR: &str = "ipam";

/// The period of [`Event::Tick`].
pub const TICK: Duration = Duration::from_secs(1);
/// How often the datastore thread checks the policy marker key (one small
/// read; the records are listed only when it changed): how soon a
/// `brindlectl apply` on another node reaches this one.
pub const POLICY_CHECK: Duration = Duration::from_millis(200);

/// How long the daemon waits for the vrouter's first answer before it
/// serves `ctrl.sock`, so that a daemon starting beside a running vrouter
/// does not refuse the first ADD.
const FIRST_ANSWER: Duration = Duration::from_secs(3);

/// Events the loop takes before applying their effects.
const MAX_BATCH: usize = 1024;

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

fn speaker_config(config: &Config, v: &Validated) -> SpeakerConfig {
    let mut sc = SpeakerConfig::new(config.bgp.as_number, v.node_address);
    sc.listen = Some(SocketAddr::new(
        IpAddr::V4(v.node_address),
        config.bgp.listen_port,
    ));
    sc.cluster_id = v.cluster_id;
    if !config.bgp.record_file.is_empty() {
        info!(file = %config.bgp.record_file, "recording the BGP speaker's inputs");
        sc.record = Some(config.bgp.record_file.clone().into());
    }
    sc
}

/// Our registry record, without blocks and heartbeat time (the datastore
/// thread fills them in on each refresh).
fn node_record(config: &Config, v: &Validated) -> NodeRecord {
    NodeRecord {
        name: v.node_name.clone(),
        address: v.node_address,
        as_number: config.bgp.as_number,
        bgp_port: config.bgp.listen_port,
        role: if config.bgp.route_reflector {
            Role::RouteReflector
        } else {
            Role::Node
        },
        blocks: Vec::new(),
        heartbeat_ms: 0,
        lease_secs: config.bgp.node_lease_secs,
    }
}

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
    let _rt = rt.enter();

    // The datastore, as it is before anything runs.
    let store = open_store(&config)?;
    let ipam = Arc::new(Ipam::new(
        store.clone(),
        &format!("{}{IPAM_DIR}", config.datastore.prefix),
    ));
    bootstrap_ipam(&ipam, &config, &v)?;
    let endpoint_store = EndpointStore::new(store.clone(), &config.datastore.prefix, &v.node_name);
    let restored = endpoint_store
        .list(None)
        .map_err(|e| start_err("reading endpoints")(e.to_string()))?;
    let pools: Vec<PoolRouting> = ipam
        .pools()
        .map(|list| {
            list.into_iter()
                .map(|p| PoolRouting {
                    cidr: p.cidr,
                    encapsulation: p.encapsulation,
                    nat_outgoing: p.nat_outgoing,
                })
                .collect()
        })
        .unwrap_or_default();
    let metrics = Arc::new(Metrics::new());
    let (events, events_rx) = mpsc::unbounded_channel();
    let (health, health_rx) = watch::channel(Health::default());

    // The owner and its first programming.
    let mut owner = Owner::new(
        config.clone(),
        v.clone(),
        store.kind(),
        metrics.clone(),
        pools,
    );
    let mut first = Vec::new();
    owner.start(restored, &mut first);
    // The policy before the first Sync: a restarted daemon's resync
    // replaces the vrouter's policy state, and one made of the endpoints
    // alone would leave every pod open until the first read.
    let mut policy_watch = PolicyWatch::new(&config.datastore.prefix, &v.node_name);
    match policy_watch.poll(&*store) {
        Ok(changes) => owner.handle(Event::Policy(changes), &mut first),
        Err(e) => warn!(error = %e, "reading the policy at start (retried every tick)"),
    }

    // The appliers.
    let port_acks = Arc::new(PortAcks::default());
    let vrouter = tasks::spawn_executor(
        Executor::new(
            SocketDataplane::new(&config.vrouter.socket, Duration::from_secs(10)),
            Some(metrics.clone()),
        )
        .with_acks(port_acks.clone()),
        events.clone(),
    )
    .map_err(|e| start_err("starting the executor")(e.to_string()))?;
    let datastore = DatastoreWorker {
        ipam: ipam.clone(),
        registry: Registry::new(store.clone(), &config.datastore.prefix),
        record: node_record(&config, &v),
        collector: Collector::new(Duration::from_secs(config.ipam.gc_grace_secs)),
        metrics: metrics.clone(),
        store: store.clone(),
        policy: policy_watch,
    }
    .spawn(events.clone())
    .map_err(|e| start_err("starting the datastore thread")(e.to_string()))?;
    let (speaker, changes) = rt
        .block_on(Speaker::start(speaker_config(&config, &v)))
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
    let (bgp, bgp_rx) = mpsc::unbounded_channel();
    let speaker_task = rt
        .spawn(tasks::speaker(speaker, bgp_rx, metrics.clone(), events.clone()).in_current_span());
    let host = if config.vrouter.host_port.is_empty() {
        None
    } else {
        Some(
            hostpath::spawn(NetlinkKernel::open)
                .map_err(|e| start_err("starting the host path")(e.to_string()))?,
        )
    };
    let appliers = Appliers {
        vrouter,
        bgp,
        datastore,
        health,
        host,
    };
    appliers.apply(first);

    // The producers.
    let mut children = vec![
        Child::spawn(tasks::routes(changes, events.clone())),
        Child::spawn(tasks::ticker(events.clone(), TICK)),
        Child::spawn(tasks::ticker_of(events.clone(), POLICY_CHECK, || {
            Event::PolicyStored
        })),
        Child::spawn(tasks::signals(events.clone(), reload)),
        Child::spawn(tasks::follow_neighbors(v.uplink.clone(), events.clone())),
    ];
    if config.datastore.kubernetes.enabled {
        children.push(Child::spawn(kube_task::watch(
            config.datastore.kubernetes.clone(),
            metrics.clone(),
            events.clone(),
        )));
    }
    if v.underlay_gateway.is_none() {
        children.push(Child::spawn(tasks::follow_gateway(
            v.uplink.clone(),
            events.clone(),
        )));
    }
    let metrics_listener = rt
        .block_on(metrics::bind(v.metrics_listen))
        .map_err(|e| start_err("binding the metrics listener")(e.to_string()))?;
    let metrics_health = health_rx.clone();
    let api_metrics = metrics.clone();
    children.push(Child::spawn(async move {
        let _ = metrics::serve(metrics_listener, metrics, metrics_health).await;
    }));

    let owner_task = rt.spawn(run_loop(owner, events_rx, appliers).in_current_span());

    // ctrl.sock, once the vrouter answered (or did not in time).
    let mut first_answer = health_rx.clone();
    rt.block_on(async {
        let _ = tokio::time::timeout(
            FIRST_ANSWER,
            first_answer.wait_for(|h| h.vrouter_reachable.is_some()),
        )
        .await;
    });
    let api = match api_server::bind(&config.api.socket) {
        Ok(listener) => listener,
        Err(e) => {
            let _ = events.send(Event::Shutdown);
            let _ = rt.block_on(owner_task);
            return Err(start_err("binding the API socket")(e.to_string()));
        }
    };
    let changes = events.clone();
    let stored = events.clone();
    let server = Arc::new(ApiServer {
        policy: Arc::new(PolicyOps {
            store: PolicyStore::new(store.clone(), &config.datastore.prefix),
            changed: Box::new(move || {
                let _ = stored.send(Event::PolicyStored);
            }),
        }),
        ipam,
        endpoints: Arc::new(EndpointHandler {
            store: endpoint_store,
            changes: Box::new(move |c| {
                let _ = changes.send(Event::Endpoint(c));
            }),
            health: health_rx,
            port_wait: Some((port_acks, PORT_WAIT)),
        }),
        ctrl: Arc::new(QueryBridge {
            events: events.clone(),
            timeout: Duration::from_secs(10),
        }),
        metrics: api_metrics,
    });
    std::thread::Builder::new()
        .name("ctrl-api".into())
        .spawn(move || api_server::serve(api, server))
        .map_err(|e| start_err("starting the API")(e.to_string()))?;
    info!(socket = %config.api.socket.display(), bgp_port = config.bgp.listen_port, "brindle-ctrl running");
    drop(events);

    // Until a signal stops the owner; then the speaker's Cease, bounded.
    let _ = rt.block_on(owner_task);
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(5), speaker_task).await;
    });
    let _ = std::fs::remove_file(&config.api.socket);
    drop(children);
    // The executor and datastore threads end when their senders (in the
    // owner's appliers, gone with it) are; ctrl.sock's threads end with
    // the process.
    drop(_rt);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The owner loop: one event, then what is queued (up to [`MAX_BATCH`]),
/// then the effects of the batch. Ends after a shutdown event, or when
/// every producer is gone.
pub async fn run_loop(mut owner: Owner, mut events: UnboundedReceiver<Event>, appliers: Appliers) {
    let mut out = Vec::new();
    while let Some(event) = events.recv().await {
        owner.handle(event, &mut out);
        for _ in 1..MAX_BATCH {
            match events.try_recv() {
                Ok(event) => owner.handle(event, &mut out),
                Err(_) => break,
            }
        }
        owner.flush(&mut out);
        appliers.apply(out.drain(..));
        if owner.stopping() {
            return;
        }
    }
}
