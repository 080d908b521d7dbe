//! The owner: the daemon's state and every decision, Sans-IO. It takes one
//! [`Event`] at a time and pushes the [`Effect`]s it decides; it reads no
//! clock (times come in the events), opens no socket and makes no datastore
//! call. The loop around it (`super::run_loop`) feeds it and hands the
//! effects to their appliers, so its unit tests are events in, effects out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use brindle_api::endpoint::Endpoint;
use brindle_api::framing::{RemoteError, RemoteErrorKind, Reply};
use brindle_api::vrouter::{
    NodeConfig, PortDevice, PortKind, PortSpec, Route, RouteTarget, VrouterRequest, VxlanConfig,
};
use ipnet::IpNet;
use serde_json::Value;
use tracing::{debug, info, warn};

use super::effect::{BgpCommand, DatastoreRequest, Effect, GcPass};
use super::event::{DatastoreView, Event, Responder};
use super::policy::{PolicyOwner, kube_change, local_pod, local_pods, pod_of};
use crate::bgp::rib::{BestRoute, RouteChange};
use crate::bgp::speaker::PeerConfig;
use crate::config::{Config, Validated};
use crate::ctrl_api::{CtrlRequest, NodeStatus, NodeView};
use crate::endpoints::EndpointChange;
use crate::health::Health;
use crate::hostpath::{HostState, NatPools};
use crate::metrics::Metrics;
use crate::programming::Work;
use crate::programming::desired::{endpoint_added, endpoint_removed};
use crate::registry::{NodeRecord, WantedPeer, mesh_peers, wanted_peers};
use crate::routing::{
    PoolRouting, Underlay, block_diff, borrowed, node_routes, request_for, route_for,
};

/// The daemon's state.
pub struct Owner {
    /// The configuration the daemon started with (a reload changes only the
    /// service prefixes).
    config: Config,
    v: Validated,
    /// `embedded` or `etcd`, for `node status`.
    store_kind: &'static str,
    metrics: Arc<Metrics>,

    // ----- routing of learned prefixes -----
    /// The pools, as last read.
    pools: Vec<PoolRouting>,
    /// Learned best routes, re-routed when the pools change.
    learned: BTreeMap<IpNet, BestRoute>,
    underlay: Underlay,
    /// The other nodes' addresses as routed in the vrouter, as last sent
    /// ([`node_routes`]: with a host port only).
    node_routes: BTreeMap<IpNet, RouteTarget>,

    // ----- what we announce -----
    /// Our blocks: announced, and programmed as blackholes so addresses of
    /// a block without an endpoint are dropped here rather than sent back
    /// to the uplink.
    blocks: BTreeSet<IpNet>,
    /// Every block not affine to us, as last read: our pods' addresses in
    /// them are borrowed.
    foreign_blocks: BTreeSet<IpNet>,
    /// The host routes of our borrowed addresses, announced.
    borrowed: BTreeSet<IpNet>,
    /// Service prefixes wanted (configuration, reload) and announced.
    services: BTreeSet<IpNet>,
    services_announced: BTreeSet<IpNet>,

    // ----- the mesh -----
    /// Peers we asked the speaker for, with their port and client flag.
    peers: BTreeMap<IpAddr, (u16, bool)>,
    /// Every registered node with its liveness, as last read.
    nodes: Vec<NodeView>,
    /// The tunnel peers last sent in `SetNode`.
    tunnel_peers: Vec<Ipv4Addr>,
    /// The underlay gateway learned from the kernel.
    learned_gateway: Option<Ipv4Addr>,
    /// The underlay gateway last sent in `SetNode`.
    sent_gateway: Option<Ipv4Addr>,
    /// `SetNode` must be sent again.
    node_stale: bool,

    // ----- endpoints and readiness -----
    /// This node's endpoints by handle.
    endpoints: BTreeMap<String, Endpoint>,
    health: Health,
    stopping: bool,

    // ----- automatic IPAM GC -----
    /// When the next pass is due (ms since the Unix epoch, from the
    /// datastore views); 0: at the first good view.
    next_gc_ms: u64,

    // ----- the host path (issue 14) -----
    /// The kernel's host-path state may have changed since the last
    /// [`Owner::flush`].
    host_dirty: bool,
    /// The host-path state last handed to its applier.
    host_sent: Option<HostState>,

    // ----- the Kubernetes API -----
    /// The cluster as the Kubernetes source reported it (`None` without
    /// `[datastore.kubernetes]`).
    cluster: Option<brindle_kube::Cluster>,

    // ----- network policy -----
    /// The policy compiler and its inputs' bookkeeping.
    policy: PolicyOwner,
}

/// An internal error as a reply.
pub(super) fn internal(message: impl Into<String>) -> Reply<Value> {
    Reply::Error(RemoteError {
        kind: RemoteErrorKind::Internal,
        message: message.into(),
    })
}

/// A serialisable answer as a reply.
pub(super) fn to_reply<T: serde::Serialize>(v: T) -> Reply<Value> {
    match serde_json::to_value(v) {
        Ok(result) => Reply::Ok { result },
        Err(e) => internal(e.to_string()),
    }
}

fn apply(reqs: Vec<VrouterRequest>) -> Effect {
    Effect::Vrouter(Work::Apply(reqs))
}

impl Owner {
    /// The owner of a daemon that starts with `pools` (read before the
    /// speaker starts, so the first learned routes already see them).
    pub fn new(
        config: Config,
        v: Validated,
        store_kind: &'static str,
        metrics: Arc<Metrics>,
        pools: Vec<PoolRouting>,
    ) -> Self {
        let config_cluster = config
            .datastore
            .kubernetes
            .enabled
            .then(|| brindle_kube::Cluster::new(v.node_name.clone()));
        let policy = PolicyOwner::new(metrics.clone());
        let underlay = Underlay {
            uplink: v.uplink.clone(),
            subnet: v.underlay_subnet,
            host_port: !config.vrouter.host_port.is_empty(),
        };
        Owner {
            services: v.service_prefixes.clone(),
            sent_gateway: v.underlay_gateway,
            config,
            v,
            store_kind,
            metrics,
            pools,
            learned: BTreeMap::new(),
            underlay,
            node_routes: BTreeMap::new(),
            blocks: BTreeSet::new(),
            foreign_blocks: BTreeSet::new(),
            borrowed: BTreeSet::new(),
            services_announced: BTreeSet::new(),
            peers: BTreeMap::new(),
            nodes: Vec::new(),
            tunnel_peers: Vec::new(),
            learned_gateway: None,
            node_stale: false,
            endpoints: BTreeMap::new(),
            health: Health::default(),
            stopping: false,
            next_gc_ms: 0,
            host_dirty: true,
            host_sent: None,
            cluster: config_cluster,
            policy,
        }
    }

    /// The first programming: the node, the uplink (and the host port with
    /// its default routes), the endpoints stored before this start; the
    /// service prefixes; the kernel's host path.
    pub fn start(&mut self, endpoints: Vec<Endpoint>, out: &mut Vec<Effect>) {
        let mut ports = vec![PortSpec {
            name: self.v.uplink.clone(),
            kind: PortKind::Uplink,
            addresses: Vec::new(),
            peer_mac: None,
            endpoint: None,
            device: Default::default(),
            workload: None,
        }];
        let host_port = &self.config.vrouter.host_port;
        let mut host_routes = Vec::new();
        if !host_port.is_empty() {
            ports.push(PortSpec {
                name: host_port.clone(),
                kind: PortKind::Host,
                addresses: Vec::new(),
                peer_mac: None,
                endpoint: None,
                device: PortDevice::Tap {
                    netns: None,
                    ifname: host_port.clone(),
                    queues: self.config.vrouter.host_port_queues,
                },
                workload: None,
            });
            // What is not a pod (the node's and other nodes' addresses,
            // Services, the outside) goes to the node's kernel.
            host_routes = ["0.0.0.0/0", "::/0"]
                .into_iter()
                .filter_map(|p| p.parse().ok())
                .map(|prefix| Route {
                    prefix,
                    target: RouteTarget::Host,
                })
                .collect();
        }
        let mut reqs = vec![
            VrouterRequest::SetNode {
                node: self.node_config(),
            },
            VrouterRequest::AddPorts { ports },
        ];
        if !host_routes.is_empty() {
            reqs.push(VrouterRequest::AddRoutes {
                routes: host_routes,
            });
        }
        for ep in endpoints {
            match endpoint_added(&ep) {
                Ok(r) => reqs.extend(r),
                Err(e) => {
                    warn!(handle = %ep.key.handle(), error = %e, "stored endpoint not programmable")
                }
            }
            self.endpoints.insert(ep.key.handle(), ep);
        }
        info!(endpoints = self.endpoints.len(), "restored endpoints");
        self.count_endpoints();
        reqs.extend(self.policy.compile(local_pods(&self.endpoints)));
        out.push(apply(reqs));
        self.announce_services(out);
        self.flush(out);
    }

    /// After a batch of events: the kernel's host-path state, when it
    /// changed (computed once per batch, not per learned route).
    pub fn flush(&mut self, out: &mut Vec<Effect>) {
        if !std::mem::take(&mut self.host_dirty) || self.config.vrouter.host_port.is_empty() {
            return;
        }
        let state = self.host_state();
        if self.host_sent.as_ref() != Some(&state) {
            self.host_sent = Some(state.clone());
            out.push(Effect::Host(state));
        }
    }

    /// The kernel's host path: every pod prefix (our blocks and borrowed
    /// addresses, learned prefixes inside a pool: remote blocks, other
    /// nodes' borrowed /32s) into the host port; natOutgoing from the pools.
    fn host_state(&self) -> HostState {
        let in_pool = |p: &IpNet| self.pools.iter().any(|pool| pool.cidr.contains(p));
        let routes = self
            .blocks
            .iter()
            .chain(&self.borrowed)
            .chain(self.learned.keys().filter(|p| in_pool(p)))
            .copied()
            .collect();
        HostState {
            port: self.config.vrouter.host_port.clone(),
            mtu: self.config.vrouter.host_port_mtu,
            routes,
            nat: NatPools {
                masquerade: self
                    .pools
                    .iter()
                    .filter(|p| p.nat_outgoing)
                    .map(|p| p.cidr)
                    .collect(),
                pools: self.pools.iter().map(|p| p.cidr).collect(),
            },
        }
    }

    /// True once a shutdown was asked for: the loop stops after applying
    /// the effects of this batch.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Reacts to one event.
    pub fn handle(&mut self, event: Event, out: &mut Vec<Effect>) {
        match event {
            Event::Tick => {
                out.push(Effect::Datastore(DatastoreRequest::Refresh));
                out.push(Effect::Vrouter(Work::Reconcile));
                out.push(Effect::Bgp(BgpCommand::RefreshMetrics));
            }
            Event::Route(change) => self.route(change, out),
            Event::Neighbors(changes) => out.push(Effect::Vrouter(Work::Neighbors(changes))),
            Event::Gateway(gateway) => {
                self.learned_gateway = gateway;
                self.update_node(out);
            }
            Event::Datastore(view) => self.datastore(view, out),
            Event::Endpoint(change) => self.endpoint(change, out),
            Event::Vrouter { reachable } => {
                let health = Health {
                    vrouter_reachable: Some(reachable),
                    ..self.health
                };
                self.set_health(health, out);
            }
            Event::PeerFailed(addr) => {
                // Asked again on the next datastore view.
                self.peers.remove(&addr);
            }
            Event::Query(request, reply) => self.query(request, reply, out),
            Event::Reload(result) => self.reload(result, out),
            Event::Policy(changes) => {
                if let Some(req) = self.policy.compile(changes) {
                    out.push(apply(vec![req]));
                }
            }
            Event::PolicyStored => out.push(Effect::Datastore(DatastoreRequest::ReadPolicy)),
            Event::Kube(e) => {
                debug!(event = ?e, "kubernetes");
                if let Some(change) = kube_change(&e)
                    && let Some(req) = self.policy.compile(vec![change])
                {
                    out.push(apply(vec![req]));
                }
                if let Some(cluster) = &mut self.cluster {
                    cluster.apply(&e);
                }
            }
            Event::Shutdown => {
                info!("shutting down: withdrawing our routes");
                self.stopping = true;
                out.push(Effect::Bgp(BgpCommand::Shutdown));
            }
        }
    }

    // ===== routes =====

    fn route(&mut self, change: RouteChange, out: &mut Vec<Effect>) {
        debug!(?change, "learned route change");
        match &change {
            RouteChange::Added(b) | RouteChange::Changed(b) => {
                self.learned.insert(b.prefix, b.clone());
            }
            RouteChange::Removed { prefix } => {
                self.learned.remove(prefix);
            }
        }
        self.host_dirty = true;
        out.push(apply(vec![request_for(
            &change,
            &self.pools,
            &self.underlay,
        )]));
        self.update_node_routes(out);
    }

    /// Sends the changes of the other nodes' /32 routes ([`node_routes`]).
    fn update_node_routes(&mut self, out: &mut Vec<Effect>) {
        let want: BTreeMap<IpNet, RouteTarget> =
            node_routes(self.learned.values(), &self.pools, &self.underlay)
                .into_iter()
                .filter(|(p, _)| !self.learned.contains_key(p))
                .collect();
        if want == self.node_routes {
            return;
        }
        let gone: Vec<IpNet> = self
            .node_routes
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        let changed: Vec<Route> = want
            .iter()
            .filter(|(p, t)| self.node_routes.get(p) != Some(t))
            .map(|(p, t)| Route {
                prefix: *p,
                target: t.clone(),
            })
            .collect();
        let mut reqs = Vec::new();
        if !gone.is_empty() {
            reqs.push(VrouterRequest::RemoveRoutes { prefixes: gone });
        }
        if !changed.is_empty() {
            reqs.push(VrouterRequest::AddRoutes { routes: changed });
        }
        self.node_routes = want;
        out.push(apply(reqs));
    }

    /// A pool change (a new pool, another encapsulation) routes every
    /// learned prefix again.
    fn pools(&mut self, pools: Vec<PoolRouting>, out: &mut Vec<Effect>) {
        if pools == self.pools {
            return;
        }
        self.pools = pools;
        self.host_dirty = true;
        let routes: Vec<Route> = self
            .learned
            .values()
            .map(|b| route_for(b, &self.pools, &self.underlay))
            .collect();
        if !routes.is_empty() {
            info!(
                routes = routes.len(),
                "pools changed: re-routing learned prefixes"
            );
            out.push(apply(vec![VrouterRequest::AddRoutes { routes }]));
        }
        self.update_node_routes(out);
    }

    // ===== the datastore view: blocks, mesh, readiness =====

    fn datastore(&mut self, view: DatastoreView, out: &mut Vec<Effect>) {
        let ok = view.ok();
        if ok && let Some(nodes) = &view.nodes {
            self.gc_tick(nodes, view.now_ms, out);
        }
        if let Some(pools) = view.pools {
            self.pools(pools, out);
        }
        if let Some(affine) = view.affine_blocks {
            self.blocks(affine, out);
        }
        if let Some(foreign) = view.foreign_blocks {
            self.foreign_blocks = foreign;
            self.announce_borrowed(out);
        }
        if let Some(nodes) = view.nodes {
            self.mesh(nodes, view.now_ms, out);
        }
        self.update_node(out);
        let health = Health {
            datastore_ok: ok,
            ..self.health
        };
        self.set_health(health, out);
    }

    /// Announces new blocks with the node address as next hop, withdraws
    /// released ones, and keeps a blackhole route for each.
    fn blocks(&mut self, affine: BTreeSet<IpNet>, out: &mut Vec<Effect>) {
        let (announce, withdraw) = block_diff(&self.blocks, &affine);
        let next_hop = IpAddr::V4(self.v.node_address);
        for b in &announce {
            info!(block = %b, "announcing our block");
            out.push(Effect::Bgp(BgpCommand::Announce(*b, next_hop)));
        }
        for b in &withdraw {
            info!(block = %b, "withdrawing a released block");
            out.push(Effect::Bgp(BgpCommand::Withdraw(*b)));
        }
        if !announce.is_empty() {
            out.push(apply(vec![VrouterRequest::AddRoutes {
                routes: announce
                    .iter()
                    .map(|b| Route {
                        prefix: *b,
                        target: RouteTarget::Blackhole,
                    })
                    .collect(),
            }]));
        }
        if !withdraw.is_empty() {
            out.push(apply(vec![VrouterRequest::RemoveRoutes {
                prefixes: withdraw,
            }]));
        }
        if self.blocks != affine {
            self.host_dirty = true;
        }
        self.blocks = affine;
    }

    /// Announces the host routes of our pods' borrowed addresses (in a
    /// block of another node or of none) with the node address as next hop
    /// and withdraws those whose pod went, as Calico's BIRD exports a
    /// workload route outside its node's blocks. The vrouter already routes
    /// them to the pod's port; the kernel's host path gets them too.
    fn announce_borrowed(&mut self, out: &mut Vec<Effect>) {
        let wanted = borrowed(
            self.endpoints.values().flat_map(|ep| &ep.ips),
            &self.foreign_blocks,
        );
        let (announce, withdraw) = block_diff(&self.borrowed, &wanted);
        let next_hop = IpAddr::V4(self.v.node_address);
        for p in announce {
            info!(address = %p, "announcing a borrowed address");
            out.push(Effect::Bgp(BgpCommand::Announce(p, next_hop)));
            self.host_dirty = true;
        }
        for p in withdraw {
            info!(address = %p, "withdrawing a borrowed address");
            out.push(Effect::Bgp(BgpCommand::Withdraw(p)));
            self.host_dirty = true;
        }
        self.metrics.borrowed_addresses.set(wanted.len() as i64);
        self.borrowed = wanted;
    }

    /// The automatic IPAM GC, every `ipam.gc_interval_secs` of datastore
    /// time, only on a view where every read worked (a node whose record
    /// could not be read must not look dead). The collector in the
    /// datastore thread decides what stayed collectable for the grace
    /// period; this only says what is alive now.
    fn gc_tick(&mut self, nodes: &[NodeRecord], now_ms: u64, out: &mut Vec<Effect>) {
        let interval_ms = self.config.ipam.gc_interval_secs.saturating_mul(1000);
        if interval_ms == 0 || now_ms < self.next_gc_ms {
            return;
        }
        self.next_gc_ms = now_ms.saturating_add(interval_ms);
        let endpoints = self
            .endpoints
            .values()
            .map(|ep| (ep.key.container_id.clone(), ep.key.ifname.clone()))
            .collect();
        // A node the Kubernetes API deleted is not live, whatever its
        // lease says.
        let deleted = |name: &str| {
            self.cluster
                .as_ref()
                .and_then(|c| c.node_deleted(name))
                .unwrap_or(false)
        };
        let live_nodes = nodes
            .iter()
            .filter(|n| n.is_live(now_ms) && !deleted(&n.name))
            .map(|n| n.name.clone())
            .chain(std::iter::once(self.v.node_name.clone()))
            .collect();
        out.push(Effect::Datastore(DatastoreRequest::IpamGc(GcPass {
            endpoints,
            // The pods that exist, once the Kubernetes API listed them;
            // `None` (no source, or not listed yet): the endpoints decide.
            pods: self.cluster.as_ref().and_then(|c| c.pods().cloned()),
            live_nodes,
            now_ms,
        })));
    }

    /// Makes the speaker's registry peers exactly [`wanted_peers`] and the
    /// vrouter's tunnel peers the live nodes.
    fn mesh(&mut self, nodes: Vec<NodeRecord>, now_ms: u64, out: &mut Vec<Effect>) {
        let bgp = &self.config.bgp;
        let wanted: BTreeMap<IpAddr, WantedPeer<'_>> = wanted_peers(
            &nodes,
            &self.v.node_name,
            bgp.node_to_node_mesh,
            bgp.route_reflector,
            now_ms,
        )
        .into_iter()
        .map(|p| (IpAddr::V4(p.node.address), p))
        .collect();
        let gone: Vec<IpAddr> = self
            .peers
            .keys()
            .filter(|a| !wanted.contains_key(a))
            .copied()
            .collect();
        for addr in gone {
            info!(peer = %addr, "node gone, dead or no longer wanted: removing its BGP peer");
            out.push(Effect::Bgp(BgpCommand::RemovePeer(addr)));
            self.peers.remove(&addr);
        }
        for (addr, want) in wanted {
            let key = (want.node.bgp_port, want.rr_client);
            if self.peers.get(&addr) == Some(&key) {
                continue;
            }
            if self.peers.contains_key(&addr) {
                out.push(Effect::Bgp(BgpCommand::RemovePeer(addr)));
            }
            let mut pc = PeerConfig::new(addr, want.node.as_number);
            pc.port = want.node.bgp_port;
            pc.hold_time = bgp.hold_time_secs;
            pc.local_address = Some(IpAddr::V4(self.v.node_address));
            pc.rr_client = want.rr_client;
            info!(peer = %addr, node = %want.node.name, rr_client = want.rr_client, "adding peer from the registry");
            out.push(Effect::Bgp(BgpCommand::AddPeer(Box::new(pc))));
            self.peers.insert(addr, key);
        }
        let tunnel_peers: Vec<Ipv4Addr> = mesh_peers(&nodes, &self.v.node_name, now_ms)
            .iter()
            .map(|n| n.address)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if tunnel_peers != self.tunnel_peers {
            info!(?tunnel_peers, "tunnel peers changed");
            self.tunnel_peers = tunnel_peers;
            self.node_stale = true;
        }
        self.nodes = nodes
            .into_iter()
            .map(|n| NodeView {
                live: n.is_live(now_ms),
                record: n,
            })
            .collect();
    }

    // ===== the vrouter's node settings =====

    /// The vrouter's node settings: `tunnel_peers` are the other live nodes
    /// (encapsulated packets from anyone else are dropped),
    /// `underlay_gateway` the router towards nodes outside the underlay
    /// subnet.
    fn node_config(&self) -> NodeConfig {
        NodeConfig {
            address_v4: Some(self.v.node_address),
            address_v6: None,
            underlay_subnet: self.v.underlay_subnet,
            underlay_gateway: self.sent_gateway,
            vxlan: VxlanConfig::default(),
            tunnel_peers: self.tunnel_peers.clone(),
        }
    }

    /// Sends `SetNode` when the tunnel peers or the underlay gateway (the
    /// configured one, else the learned one) differ from those last sent.
    fn update_node(&mut self, out: &mut Vec<Effect>) {
        let gateway = self.v.underlay_gateway.or(self.learned_gateway);
        if gateway != self.sent_gateway {
            info!(underlay_gateway = ?gateway, "underlay gateway changed");
            self.sent_gateway = gateway;
            self.node_stale = true;
        }
        if std::mem::take(&mut self.node_stale) {
            out.push(apply(vec![VrouterRequest::SetNode {
                node: self.node_config(),
            }]));
        }
    }

    // ===== endpoints =====

    fn endpoint(&mut self, change: EndpointChange, out: &mut Vec<Effect>) {
        match change {
            EndpointChange::Added { endpoint, replaced } => {
                let mut reqs = Vec::new();
                // A retried ADD with another host interface, interface kind
                // or addresses: the old programming goes first.
                if let Some(old) = &replaced
                    && (old.host_ifname != endpoint.host_ifname
                        || old.interface != endpoint.interface
                        || old.ips != endpoint.ips)
                {
                    reqs.extend(endpoint_removed(old));
                }
                match endpoint_added(&endpoint) {
                    Ok(r) => reqs.extend(r),
                    Err(e) => {
                        warn!(handle = %endpoint.key.handle(), error = %e, "endpoint not programmable")
                    }
                }
                let pods: BTreeSet<_> = [pod_of(&endpoint)]
                    .into_iter()
                    .chain(replaced.as_deref().map(pod_of))
                    .flatten()
                    .collect();
                self.endpoints.insert(endpoint.key.handle(), *endpoint);
                self.policy_for(pods, &mut reqs);
                out.push(apply(reqs));
            }
            EndpointChange::Removed(endpoint) => {
                self.endpoints.remove(&endpoint.key.handle());
                let mut reqs = endpoint_removed(&endpoint);
                self.policy_for(pod_of(&endpoint).into_iter().collect(), &mut reqs);
                out.push(apply(reqs));
            }
        }
        self.count_endpoints();
        self.announce_borrowed(out);
    }

    /// The policy update for these pods' local endpoints, after `reqs`.
    fn policy_for(
        &mut self,
        pods: BTreeSet<brindle_policy::program::EndpointKey>,
        reqs: &mut Vec<VrouterRequest>,
    ) {
        let changes = pods
            .iter()
            .map(|p| local_pod(p, self.endpoints.values()))
            .collect();
        reqs.extend(self.policy.compile(changes));
    }

    fn count_endpoints(&self) {
        self.metrics.endpoints.set(self.endpoints.len() as i64);
    }

    // ===== queries, reload, readiness =====

    fn query(&mut self, request: CtrlRequest, reply: Responder, out: &mut Vec<Effect>) {
        if self.stopping {
            out.push(Effect::Answer(reply, internal("shutting down")));
            return;
        }
        match request {
            CtrlRequest::CtrlBgpPeers => out.push(Effect::Bgp(BgpCommand::Peers(reply))),
            CtrlRequest::CtrlBgpRoutes => out.push(Effect::Bgp(BgpCommand::Routes(reply))),
            CtrlRequest::CtrlNodeStatus => {
                let status = NodeStatus {
                    name: self.v.node_name.clone(),
                    address: self.v.node_address,
                    as_number: self.config.bgp.as_number,
                    datastore: self.store_kind.into(),
                    vrouter_reachable: self.health.vrouter_up(),
                    endpoints: self.endpoints.len(),
                    announced_blocks: self.blocks.iter().copied().collect(),
                    announced_borrowed: self.borrowed.iter().copied().collect(),
                    announced_services: self.services_announced.iter().copied().collect(),
                    nodes: self.nodes.clone(),
                };
                out.push(Effect::Answer(reply, to_reply(status)));
            }
        }
    }

    /// The service prefixes take effect (announced, withdrawn); other
    /// changes are logged as needing a restart.
    fn reload(&mut self, result: Result<Box<(Config, Validated)>, String>, out: &mut Vec<Effect>) {
        let (new, nv) = match result {
            Ok(both) => *both,
            Err(e) => {
                warn!(error = %e, "reload failed: keeping the running configuration");
                return;
            }
        };
        info!(services = ?nv.service_prefixes, "configuration reloaded");
        self.services = nv.service_prefixes;
        let mut same = new;
        let bgp = &self.config.bgp;
        same.bgp
            .service_cluster_ips
            .clone_from(&bgp.service_cluster_ips);
        same.bgp
            .service_external_ips
            .clone_from(&bgp.service_external_ips);
        same.bgp
            .service_loadbalancer_ips
            .clone_from(&bgp.service_loadbalancer_ips);
        if same != self.config {
            warn!(
                "configuration changes other than the service prefixes take effect at the next start"
            );
        }
        self.announce_services(out);
    }

    /// Service prefixes (cluster, external, load-balancer IPs): announced
    /// from every node with its address as next hop, like Calico's
    /// BGPConfiguration; withdrawn when a reload drops them.
    fn announce_services(&mut self, out: &mut Vec<Effect>) {
        let (announce, withdraw) = block_diff(&self.services_announced, &self.services);
        for p in announce {
            info!(prefix = %p, "announcing a service prefix");
            out.push(Effect::Bgp(BgpCommand::Announce(
                p,
                IpAddr::V4(self.v.node_address),
            )));
        }
        for p in withdraw {
            info!(prefix = %p, "withdrawing a service prefix");
            out.push(Effect::Bgp(BgpCommand::Withdraw(p)));
        }
        self.services_announced.clone_from(&self.services);
    }

    fn set_health(&mut self, health: Health, out: &mut Vec<Effect>) {
        if health != self.health {
            self.health = health;
            out.push(Effect::Health(health));
        }
    }
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
