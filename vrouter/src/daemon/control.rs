//! The control thread's state: what the controller asked for (ports by
//! name, routes, neighbours, node settings), the FIB writer, the steering
//! maps, and the workers' handles. Every operation of
//! `brindle_api::vrouter` is applied here, idempotently: asking for what is
//! already in effect changes nothing and answers `changed: 0`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use brindle_api::framing::{PROTOCOL_VERSION, RemoteError, RemoteErrorKind};
use brindle_api::vrouter as api;
use brindle_xsk::{Role, Steering, UmemHandle};
use ipnet::IpNet;

use crate::daemon::engine::{WorkerCmd, WorkerHandle, WorkerSnapshot};
use crate::daemon::neighbors::{self, Learned};
use crate::daemon::spec::IoMode;
use crate::endpoint::Endpoint;
use crate::fib::{Encap, Fib, FibChange, NextHop};
use crate::frame::{Port, PortId};
use crate::pipeline::{PipelineConfig, vtep_mac};
use crate::port::handoff::FrameHomes;
use crate::port::packet::PacketPort;
use crate::port::xdp::{LinkInfo, XdpPort, XdpPortConfig};
use crate::wire::udp::UdpChecksum;

struct PortEntry {
    spec: api::PortSpec,
    id: PortId,
    backend: &'static str,
    /// Workers holding the port or a share of its queues; the first one
    /// receives what the others hand over for it.
    owners: Vec<usize>,
}

/// The daemon's programmable state.
pub struct Control {
    workers: Vec<WorkerHandle>,
    homes: Arc<FrameHomes>,
    fib: Fib,
    steering: Option<Steering>,
    umem: Option<UmemHandle>,
    xdp: XdpPortConfig,
    io: IoMode,
    boot_id: String,
    ports: BTreeMap<String, PortEntry>,
    free_slots: Vec<PortId>,
    next_slot: PortId,
    routes: BTreeMap<IpNet, api::RouteTarget>,
    neighbors: BTreeMap<(String, IpAddr), api::Mac>,
    node: Option<api::NodeConfig>,
    pipeline: PipelineConfig,
    steered: BTreeSet<(Ipv4Addr, u8)>,
    learned: Learned,
}

fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind: RemoteErrorKind::InvalidRequest,
        message: message.into(),
    }
}

fn internal(message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind: RemoteErrorKind::Internal,
        message: message.into(),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, RemoteError> {
    serde_json::to_value(v).map_err(|e| internal(e.to_string()))
}

/// A fresh identifier per start (the kernel's random UUID; the time as a
/// fallback), so a controller notices a restarted vrouter.
pub fn new_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{}-{}", std::process::id(), t.as_nanos())
        })
}

/// What the control thread starts with.
pub struct ControlParts {
    /// The running workers.
    pub workers: Vec<WorkerHandle>,
    /// Their chunk ranges and mailboxes.
    pub homes: Arc<FrameHomes>,
    /// The FIB writer whose reader the worker holds.
    pub fib: Fib,
    /// The steering maps (AF_XDP only).
    pub steering: Option<Steering>,
    /// The worker's UMEM (AF_XDP only).
    pub umem: Option<UmemHandle>,
    /// How AF_XDP ports are opened.
    pub xdp: XdpPortConfig,
    /// Which socket kind ports use.
    pub io: IoMode,
    /// The worker's initial settings.
    pub pipeline: PipelineConfig,
}

impl Control {
    /// The control state over a started worker.
    pub fn new(parts: ControlParts) -> Control {
        Control {
            workers: parts.workers,
            homes: parts.homes,
            fib: parts.fib,
            steering: parts.steering,
            umem: parts.umem,
            xdp: parts.xdp,
            io: parts.io,
            boot_id: new_boot_id(),
            ports: BTreeMap::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            routes: BTreeMap::new(),
            neighbors: BTreeMap::new(),
            node: None,
            pipeline: parts.pipeline,
            steered: BTreeSet::new(),
            learned: Learned::default(),
        }
    }

    /// The boot id given in `Hello`.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Stops the worker (ports close, programs detach). Later requests
    /// fail with "the worker has stopped".
    pub fn shutdown(&mut self) {
        for w in &mut self.workers {
            w.join();
        }
    }

    /// Applies one request; the JSON value is the op's result type.
    pub fn handle(&mut self, req: api::VrouterRequest) -> Result<serde_json::Value, RemoteError> {
        use api::VrouterRequest as R;
        match req {
            R::Hello { version } => {
                if version != PROTOCOL_VERSION {
                    return Err(invalid(format!(
                        "protocol version {version} not supported (this vrouter speaks {PROTOCOL_VERSION})"
                    )));
                }
                to_json(&api::Hello {
                    version: PROTOCOL_VERSION,
                    boot_id: self.boot_id.clone(),
                })
            }
            R::SetNode { node } => {
                let changed = self.set_node(node)?;
                to_json(&api::Changed { changed })
            }
            R::AddPorts { ports } => {
                let changed = self.add_ports(ports)?;
                to_json(&api::Changed { changed })
            }
            R::RemovePorts { names } => {
                let changed = self.remove_ports(&names)?;
                to_json(&api::Changed { changed })
            }
            R::AddRoutes { routes } => {
                let changed = self.add_routes(routes)?;
                to_json(&api::Changed { changed })
            }
            R::RemoveRoutes { prefixes } => {
                let changed = self.remove_routes(&prefixes)?;
                to_json(&api::Changed { changed })
            }
            R::SetNeighbors { neighbors } => {
                let changed = self.set_neighbors(neighbors)?;
                to_json(&api::Changed { changed })
            }
            R::Sync { state } => {
                let changed = self.sync(state)?;
                to_json(&api::Changed { changed })
            }
            R::GetStats => to_json(&self.stats()),
            R::DumpRoutes => {
                let routes: Vec<api::Route> = self
                    .routes
                    .iter()
                    .map(|(p, t)| api::Route {
                        prefix: *p,
                        target: t.clone(),
                    })
                    .collect();
                to_json(&routes)
            }
            R::DumpPorts => to_json(&self.dump_ports()),
            R::Health => to_json(&self.health()),
        }
    }

    fn send_to(&self, worker: usize, cmd: WorkerCmd) -> Result<(), RemoteError> {
        self.workers
            .get(worker)
            .ok_or_else(|| internal(format!("no worker {worker}")))?
            .tx
            .send(cmd)
            .map_err(|_| internal(format!("worker {worker} has stopped")))
    }

    /// Sends every worker its own copy of `cmd` (neighbours, settings and
    /// slots are per worker: each one routes to every port).
    fn broadcast(&self, cmd: impl Fn() -> WorkerCmd) -> Result<(), RemoteError> {
        for w in 0..self.workers.len() {
            self.send_to(w, cmd())?;
        }
        Ok(())
    }

    /// The worker a new pod port goes to: the one owning fewest ports
    /// (ties: the lowest index). Ports never move once placed, so pods
    /// that stay keep their worker while others come and go.
    fn least_loaded_worker(&self) -> usize {
        let mut load = vec![0usize; self.workers.len()];
        for e in self.ports.values() {
            if let Some(&w) = e.owners.first() {
                load[w] += 1;
            }
        }
        load.iter()
            .enumerate()
            .min_by_key(|&(i, l)| (*l, i))
            .map_or(0, |(i, _)| i)
    }

    fn set_node(&mut self, node: api::NodeConfig) -> Result<u64, RemoteError> {
        if self.node.as_ref() == Some(&node) {
            return Ok(0);
        }
        let mut cfg = self.pipeline.clone();
        cfg.node_v4 = node.address_v4.unwrap_or(Ipv4Addr::UNSPECIFIED);
        cfg.node_v6 = node.address_v6;
        if let Some(IpNet::V4(subnet)) = node.underlay_subnet {
            cfg.underlay_prefix_len = subnet.prefix_len();
        }
        cfg.underlay_gateway = node.underlay_gateway;
        cfg.vxlan_vni = node.vxlan.vni;
        cfg.vxlan_port = node.vxlan.port;
        cfg.vxlan_udp_checksum = if node.vxlan.udp_checksum {
            UdpChecksum::Compute
        } else {
            UdpChecksum::Zero
        };
        cfg.vtep_mac = vtep_mac(cfg.node_v4);
        if let Some(s) = &self.steering {
            s.set_node(node.address_v4, node.vxlan.port)
                .map_err(|e| internal(format!("steering map: {e}")))?;
        }
        let vni_changed = cfg.vxlan_vni != self.pipeline.vxlan_vni;
        self.broadcast(|| WorkerCmd::Config(cfg.clone()))?;
        self.broadcast(|| {
            WorkerCmd::TunnelPeers(
                (!node.tunnel_peers.is_empty()).then(|| node.tunnel_peers.clone()),
            )
        })?;
        self.pipeline = cfg;
        self.node = Some(node);
        if vni_changed {
            // VXLAN routes carry the VNI in their next hop.
            let vxlan: Vec<api::Route> = self
                .routes
                .iter()
                .filter(|(_, t)| {
                    matches!(
                        t,
                        api::RouteTarget::Encap {
                            encap: api::Encap::Vxlan,
                            ..
                        }
                    )
                })
                .map(|(p, t)| api::Route {
                    prefix: *p,
                    target: t.clone(),
                })
                .collect();
            let changes = vxlan
                .iter()
                .map(|r| {
                    Ok(FibChange::Upsert {
                        prefix: r.prefix,
                        next_hop: self.next_hop(&r.target)?,
                    })
                })
                .collect::<Result<Vec<_>, RemoteError>>()?;
            self.fib
                .apply(changes)
                .map_err(|e| internal(format!("FIB: {e}")))?;
        }
        Ok(1)
    }

    /// Opens `spec`'s port and places it: an AF_XDP port's queues are
    /// spread over the workers (an uplink's from worker 0, a pod's from the
    /// least loaded worker); an AF_PACKET port goes whole to one worker.
    /// Returns the parts by worker, the endpoint, the backend and the link.
    #[allow(clippy::type_complexity)]
    fn open_port(
        &self,
        spec: &api::PortSpec,
    ) -> Result<
        (
            Vec<(usize, Box<dyn Port>)>,
            Endpoint,
            &'static str,
            LinkInfo,
        ),
        RemoteError,
    > {
        let link =
            LinkInfo::read(&spec.name).map_err(|e| invalid(format!("port {}: {e}", spec.name)))?;
        let role = match spec.kind {
            api::PortKind::Pod => Role::Pod,
            api::PortKind::Uplink => Role::Uplink,
        };
        let endpoint = match spec.kind {
            api::PortKind::Pod => {
                Endpoint::pod(spec.addresses.clone(), spec.peer_mac.map(|m| m.0), link.mtu)
            }
            api::PortKind::Uplink => Endpoint::uplink(link.mac, link.mtu),
        };
        let first = match spec.kind {
            api::PortKind::Uplink => 0,
            api::PortKind::Pod => self.least_loaded_worker(),
        };
        let packet = |why: Option<String>| {
            if let Some(why) = why {
                tracing::warn!(port = %spec.name, reason = %why, "AF_XDP cannot be opened: falling back to AF_PACKET (one copy per frame)");
            }
            let mut p = PacketPort::open(&spec.name, link)
                .map_err(|e| internal(format!("AF_PACKET port {}: {e}", spec.name)))?;
            p.set_home(self.homes.home(first));
            let parts: Vec<(usize, Box<dyn Port>)> = vec![(first, Box::new(p))];
            Ok((parts, endpoint.clone(), "af_packet", link))
        };
        match (&self.umem, &self.steering, self.io) {
            (_, _, IoMode::Packet) => packet(None),
            (Some(umem), Some(steering), io) => {
                match XdpPort::open(umem, steering, &spec.name, role, link, &self.xdp) {
                    Ok(p) => {
                        let parts = p
                            .split(self.workers.len(), first)
                            .into_iter()
                            .map(|(w, mut part)| {
                                part.set_home(self.homes.home(w));
                                (w, Box::new(part) as Box<dyn Port>)
                            })
                            .collect();
                        Ok((parts, endpoint.clone(), "af_xdp", link))
                    }
                    Err(e) if io == IoMode::Auto => packet(Some(e.to_string())),
                    Err(e) => Err(internal(format!("AF_XDP port {}: {e}", spec.name))),
                }
            }
            _ => packet(Some("no UMEM".into())),
        }
    }

    fn add_ports(&mut self, ports: Vec<api::PortSpec>) -> Result<u64, RemoteError> {
        let mut changed = 0;
        for spec in ports {
            if let Some(e) = self.ports.get(&spec.name) {
                if e.spec == spec {
                    continue;
                }
                // Changed addresses, MAC or kind: re-open (a socket is
                // cheap to make, and the slot's state starts clean).
                self.detach(&spec.name)?;
            }
            let (parts, endpoint, backend, link) = self.open_port(&spec)?;
            let id = match self.free_slots.pop() {
                Some(id) => id,
                None => {
                    let id = self.next_slot;
                    self.next_slot = id.checked_add(1).ok_or_else(|| RemoteError {
                        kind: RemoteErrorKind::Exhausted,
                        message: "no port slot left".into(),
                    })?;
                    id
                }
            };
            let owners: Vec<usize> = parts.iter().map(|(w, _)| *w).collect();
            let placed = self
                .homes
                .place_port(parts, &spec.name, link.mac, link.mtu, id);
            for (w, (port, remote)) in placed.into_iter().enumerate() {
                self.send_to(
                    w,
                    WorkerCmd::SetPort {
                        id,
                        port,
                        endpoint: endpoint.clone(),
                        remote,
                    },
                )?;
            }
            tracing::info!(port = %spec.name, id, backend, workers = ?owners, "port attached");
            self.ports.insert(
                spec.name.clone(),
                PortEntry {
                    spec,
                    id,
                    backend,
                    owners,
                },
            );
            changed += 1;
        }
        if changed > 0 {
            // Slots may have changed: tell the worker again what the kernel
            // knows.
            self.learned.clear();
        }
        self.refresh_fib_for_ports()?;
        Ok(changed)
    }

    /// Closes a port; its routes and neighbours stay in the desired state
    /// but leave the FIB until the port comes back.
    fn detach(&mut self, name: &str) -> Result<(), RemoteError> {
        if let Some(e) = self.ports.remove(name) {
            self.broadcast(|| WorkerCmd::DetachPort { id: e.id })?;
            self.homes.set_peer_mac(e.id, None);
            self.free_slots.push(e.id);
            tracing::info!(port = name, id = e.id, "port detached");
        }
        Ok(())
    }

    fn remove_ports(&mut self, names: &[String]) -> Result<u64, RemoteError> {
        let mut changed = 0;
        for n in names {
            if self.ports.contains_key(n) {
                self.detach(n)?;
                changed += 1;
            }
        }
        self.refresh_fib_for_ports()?;
        Ok(changed)
    }

    /// Routes whose port is gone leave the FIB; those whose port is back
    /// return; neighbours are re-sent to the (possibly new) slot.
    fn refresh_fib_for_ports(&mut self) -> Result<(), RemoteError> {
        let mut changes = Vec::new();
        for (prefix, target) in &self.routes {
            // Only routes through a port depend on which ports exist; the
            // others were placed when added (and by `set_node` for the VNI).
            if !matches!(
                target,
                api::RouteTarget::Local { .. } | api::RouteTarget::Gateway { .. }
            ) {
                continue;
            }
            match self.next_hop(target) {
                Ok(nh) => {
                    if self.fib.get(prefix) != Some(nh) {
                        changes.push(FibChange::Upsert {
                            prefix: *prefix,
                            next_hop: nh,
                        });
                    }
                }
                Err(_) => {
                    if self.fib.get(prefix).is_some() {
                        changes.push(FibChange::Remove { prefix: *prefix });
                    }
                }
            }
        }
        if !changes.is_empty() {
            self.fib
                .apply(changes)
                .map_err(|e| internal(format!("FIB: {e}")))?;
        }
        for ((port, ip), mac) in &self.neighbors {
            if let Some(e) = self.ports.get(port) {
                self.broadcast(|| WorkerCmd::Neighbor {
                    port: e.id,
                    addr: *ip,
                    mac: Some(mac.0),
                })?;
            }
        }
        // The steered set follows the route map only (not the ports), so
        // there is nothing to redo for it here.
        Ok(())
    }

    fn port_id(&self, name: &str) -> Result<PortId, RemoteError> {
        self.ports
            .get(name)
            .map(|e| e.id)
            .ok_or_else(|| RemoteError {
                kind: RemoteErrorKind::NotFound,
                message: format!("no port named {name}"),
            })
    }

    fn next_hop(&self, t: &api::RouteTarget) -> Result<NextHop, RemoteError> {
        Ok(match t {
            api::RouteTarget::Local { port } => NextHop::Local {
                port: self.port_id(port)?,
            },
            api::RouteTarget::Encap { encap, remote } => NextHop::Encap {
                encap: match encap {
                    api::Encap::Ipip => Encap::Ipip,
                    api::Encap::Vxlan => Encap::Vxlan {
                        vni: self.pipeline.vxlan_vni,
                    },
                },
                remote: *remote,
            },
            api::RouteTarget::Gateway { via, port } => NextHop::Gateway {
                via: *via,
                port: self.port_id(port)?,
            },
            api::RouteTarget::Blackhole => NextHop::Blackhole,
            api::RouteTarget::Host => NextHop::Host,
        })
    }

    fn add_routes(&mut self, routes: Vec<api::Route>) -> Result<u64, RemoteError> {
        // Validate the whole batch before changing anything.
        let mut changes = Vec::new();
        for r in routes {
            let prefix = r.prefix.trunc();
            let nh = self.next_hop(&r.target)?;
            if self.routes.get(&prefix) != Some(&r.target) || self.fib.get(&prefix) != Some(nh) {
                changes.push((prefix, r.target, nh));
            }
        }
        if changes.is_empty() {
            return Ok(0);
        }
        self.fib
            .apply(changes.iter().map(|(p, _, nh)| FibChange::Upsert {
                prefix: *p,
                next_hop: *nh,
            }))
            .map_err(|e| internal(format!("FIB: {e}")))?;
        let changed = changes.len() as u64;
        let mut touched = Vec::with_capacity(changes.len());
        for (p, t, _) in changes {
            self.routes.insert(p, t);
            touched.push(p);
        }
        self.update_steering(&touched)?;
        Ok(changed)
    }

    fn remove_routes(&mut self, prefixes: &[IpNet]) -> Result<u64, RemoteError> {
        let mut removed = Vec::new();
        let mut touched = Vec::new();
        for p in prefixes {
            let p = p.trunc();
            if self.routes.remove(&p).is_some() {
                removed.push(FibChange::Remove { prefix: p });
                touched.push(p);
            }
        }
        if touched.is_empty() {
            return Ok(0);
        }
        let changed = removed.len() as u64;
        self.fib
            .apply(removed)
            .map_err(|e| internal(format!("FIB: {e}")))?;
        self.update_steering(&touched)?;
        Ok(changed)
    }

    /// Brings the pod-prefix steering map up to date for the `touched`
    /// prefixes (those a request added, replaced or removed): the work is
    /// per change, not per route held, so a full table arriving in batches
    /// stays linear.
    fn update_steering(&mut self, touched: &[IpNet]) -> Result<(), RemoteError> {
        let Some(s) = &self.steering else {
            return Ok(());
        };
        let delta = steering_delta(&self.steered, &self.routes, touched);
        for &(a, l) in &delta.remove {
            s.remove_pod_prefix(a, l)
                .map_err(|e| internal(format!("steering map: {e}")))?;
            self.steered.remove(&(a, l));
        }
        let mut left_out = 0u64;
        for &(a, l) in &delta.add {
            if left_out > 0 {
                // Full (the removals came first): no syscall per prefix.
                left_out += 1;
                continue;
            }
            match s.add_pod_prefix(a, l) {
                Ok(()) => {
                    self.steered.insert((a, l));
                }
                // The map is sized for a node's pods and pool blocks, not a
                // full BGP table: a prefix that does not fit stays on the
                // kernel path (its route is in the FIB all the same), and
                // the request succeeds, so the controller does not resync
                // in a loop over a table that can never fit.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::E2BIG)) => {
                    left_out += 1;
                }
                Err(e) => return Err(internal(format!("steering map: {e}"))),
            }
        }
        if left_out > 0 {
            tracing::warn!(
                left_out,
                steered = self.steered.len(),
                "steering map full: prefixes left to the kernel path"
            );
        }
        Ok(())
    }

    fn set_neighbors(&mut self, neighbors: Vec<api::Neighbor>) -> Result<u64, RemoteError> {
        for n in &neighbors {
            self.port_id(&n.port)?;
        }
        let mut changed = 0;
        for n in neighbors {
            let key = (n.port.clone(), n.ip);
            if self.neighbors.get(&key) == Some(&n.mac) {
                continue;
            }
            let port = self.port_id(&n.port)?;
            self.broadcast(|| WorkerCmd::Neighbor {
                port,
                addr: n.ip,
                mac: Some(n.mac.0),
            })?;
            self.neighbors.insert(key, n.mac);
            changed += 1;
        }
        Ok(changed)
    }

    fn sync(&mut self, state: api::DesiredState) -> Result<u64, RemoteError> {
        let mut changed = 0;
        if let Some(node) = state.node {
            changed += self.set_node(node)?;
        }
        let want_ports: BTreeSet<&str> = state.ports.iter().map(|p| p.name.as_str()).collect();
        let stale: Vec<String> = self
            .ports
            .keys()
            .filter(|n| !want_ports.contains(n.as_str()))
            .cloned()
            .collect();
        changed += self.remove_ports(&stale)?;
        changed += self.add_ports(state.ports)?;
        let want_routes: BTreeSet<IpNet> = state.routes.iter().map(|r| r.prefix.trunc()).collect();
        let stale: Vec<IpNet> = self
            .routes
            .keys()
            .filter(|p| !want_routes.contains(p))
            .copied()
            .collect();
        changed += self.remove_routes(&stale)?;
        changed += self.add_routes(state.routes)?;
        let want_neigh: BTreeSet<(String, IpAddr)> = state
            .neighbors
            .iter()
            .map(|n| (n.port.clone(), n.ip))
            .collect();
        let stale: Vec<(String, IpAddr)> = self
            .neighbors
            .keys()
            .filter(|k| !want_neigh.contains(*k))
            .cloned()
            .collect();
        for key in stale {
            if let Some(e) = self.ports.get(&key.0) {
                self.broadcast(|| WorkerCmd::Neighbor {
                    port: e.id,
                    addr: key.1,
                    mac: None,
                })?;
            }
            self.neighbors.remove(&key);
            changed += 1;
        }
        changed += self.set_neighbors(state.neighbors)?;
        Ok(changed)
    }

    /// Hands the worker the kernel's entries for the underlay next hops the
    /// routes need on uplink ports (tunnel remotes on the node's subnet, the
    /// underlay gateway for those beyond it, gateways), and makes the kernel
    /// resolve those it lacks. Neighbours set
    /// over the API are left alone. Called periodically by the daemon.
    pub fn learn_neighbors(&mut self) {
        let uplinks: BTreeMap<&str, PortId> = self
            .ports
            .iter()
            .filter(|(_, e)| e.spec.kind == api::PortKind::Uplink)
            .map(|(n, e)| (n.as_str(), e.id))
            .collect();
        let Some((&first_uplink, _)) = uplinks.iter().next() else {
            return;
        };
        // The distinct next hops first (a handful, against up to a million
        // routes walked under the control lock): no allocation and no map
        // lookup per route, only per distinct hop below.
        let mut hops: Vec<(&str, Ipv4Addr)> = Vec::new();
        for t in self.routes.values() {
            let hop = match t {
                api::RouteTarget::Encap { remote, .. } if self.pipeline.on_link(*remote) => {
                    Some((first_uplink, *remote))
                }
                api::RouteTarget::Encap { .. } => {
                    self.pipeline.underlay_gateway.map(|gw| (first_uplink, gw))
                }
                api::RouteTarget::Gateway {
                    via: IpAddr::V4(via),
                    port,
                } if uplinks.contains_key(port.as_str()) => Some((port.as_str(), *via)),
                _ => None,
            };
            if let Some(hop) = hop
                && !hops.contains(&hop)
            {
                hops.push(hop);
            }
        }
        let wanted: Vec<(String, Ipv4Addr)> = hops
            .into_iter()
            .map(|(dev, addr)| (dev.to_owned(), addr))
            .filter(|(dev, addr)| {
                !self
                    .neighbors
                    .contains_key(&(dev.clone(), IpAddr::V4(*addr)))
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let kernel = match neighbors::read_kernel_neighbors() {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the kernel's neighbour table");
                return;
            }
        };
        let (changed, missing) = self.learned.update(&wanted, &kernel);
        for (dev, addr, mac) in changed {
            if let Some(&port) = uplinks.get(dev.as_str()) {
                tracing::info!(port = %dev, %addr, "neighbour learned from the kernel");
                let _ = self.broadcast(|| WorkerCmd::Neighbor {
                    port,
                    addr: IpAddr::V4(addr),
                    mac: Some(mac),
                });
            }
        }
        for addr in missing {
            neighbors::poke(addr);
        }
    }

    /// Each worker's counters (`None` for a worker that does not answer).
    pub fn snapshots(&self) -> Vec<Option<WorkerSnapshot>> {
        self.workers.iter().map(|w| w.snapshot()).collect()
    }

    /// The workers' cores (`None`: not pinned).
    pub fn cores(&self) -> Vec<Option<usize>> {
        self.workers.iter().map(|w| w.core).collect()
    }

    /// Routes in the FIB.
    pub fn routes(&self) -> u64 {
        self.fib.len() as u64
    }

    /// Ports by name with their slot and backend, for metrics.
    pub fn port_names(&self) -> Vec<(String, PortId, &'static str)> {
        self.ports
            .iter()
            .map(|(n, e)| (n.clone(), e.id, e.backend))
            .collect()
    }

    fn stats(&self) -> api::Stats {
        let workers = self
            .snapshots()
            .into_iter()
            .enumerate()
            .map(|(i, snap)| {
                let snap = snap.unwrap_or_default();
                let c = snap.counters;
                let drops = crate::counters::DropReason::ALL
                    .iter()
                    .map(|r| (r.name().to_owned(), c.drops_for(*r)))
                    .collect();
                api::WorkerStats {
                    worker: i as u32,
                    core: self.workers[i].core.map(|c| c as u32),
                    rx_packets: c.rx_packets,
                    tx_packets: c.tx_packets,
                    drops,
                    busy_polls: snap.busy_polls,
                    idle_polls: snap.idle_polls,
                }
            })
            .collect();
        api::Stats {
            workers,
            routes: self.fib.len() as u64,
            ports: self.ports.len() as u64,
        }
    }

    fn dump_ports(&self) -> Vec<api::PortStatus> {
        let snaps = self.snapshots();
        self.ports
            .values()
            .map(|e| {
                // A port split over workers: its counters are the sum of
                // its parts (stand-ins count nothing).
                let mut counters = api::PortCounters::default();
                for &w in &e.owners {
                    let s = snaps
                        .get(w)
                        .and_then(|s| s.as_ref())
                        .and_then(|s| s.ports.get(e.id as usize).copied())
                        .unwrap_or_default();
                    counters.rx_packets += s.rx_packets;
                    counters.rx_bytes += s.rx_bytes;
                    counters.tx_packets += s.tx_packets;
                    counters.tx_bytes += s.tx_bytes;
                }
                api::PortStatus {
                    spec: e.spec.clone(),
                    backend: e.backend.to_owned(),
                    worker: e.owners.first().copied().unwrap_or(0) as u32,
                    counters,
                }
            })
            .collect()
    }

    /// Ports by name with their slot, backend and owning workers, for
    /// metrics.
    pub fn port_owners(&self) -> Vec<(String, PortId, &'static str, Vec<usize>)> {
        self.ports
            .iter()
            .map(|(n, e)| (n.clone(), e.id, e.backend, e.owners.clone()))
            .collect()
    }

    /// Liveness (the worker answers) and readiness (an uplink is attached
    /// and the node has an address).
    pub fn health(&self) -> api::Health {
        let mut problems = Vec::new();
        let snaps = self.snapshots();
        for (i, s) in snaps.iter().enumerate() {
            if s.is_none() {
                problems.push(format!("worker {i} does not answer"));
            }
        }
        let live = snaps.iter().all(Option::is_some);
        if !self
            .ports
            .values()
            .any(|e| e.spec.kind == api::PortKind::Uplink)
        {
            problems.push("no uplink port attached".to_owned());
        }
        if self.node.as_ref().and_then(|n| n.address_v4).is_none() {
            problems.push("node address not set".to_owned());
        }
        api::Health {
            live,
            ready: live && problems.is_empty(),
            problems,
        }
    }
}

/// The steering map key of a route, when the route is steered. The steering
/// programs send to the vrouter what is routed to pods, tunnels and natively
/// routed remote blocks (gateway routes). Without the gateway routes a pod's
/// frame to a remote block would go to the node's kernel, which has no pod
/// routes and sends it to its default route. A default route stays out: it
/// would pull every frame of every pod in. IPv6 is not steered.
fn steering_key(prefix: &IpNet, target: &api::RouteTarget) -> Option<(Ipv4Addr, u8)> {
    let steered = match target {
        api::RouteTarget::Local { .. } | api::RouteTarget::Encap { .. } => true,
        api::RouteTarget::Gateway { .. } => prefix.prefix_len() > 0,
        api::RouteTarget::Blackhole | api::RouteTarget::Host => false,
    };
    match prefix.trunc() {
        IpNet::V4(n) if steered => Some((n.network(), n.prefix_len())),
        _ => None,
    }
}

/// Steering keys to take out of and put into the map.
#[derive(Debug, Default, PartialEq, Eq)]
struct SteeringDelta {
    remove: Vec<(Ipv4Addr, u8)>,
    add: Vec<(Ipv4Addr, u8)>,
}

/// What changes in the steered set when the routes of `touched` (already
/// updated in `routes`) changed: a prefix whose route is gone or no longer
/// of a steered kind leaves, one newly of a steered kind enters.
fn steering_delta(
    steered: &BTreeSet<(Ipv4Addr, u8)>,
    routes: &BTreeMap<IpNet, api::RouteTarget>,
    touched: &[IpNet],
) -> SteeringDelta {
    let mut delta = SteeringDelta::default();
    let mut seen = BTreeSet::new();
    for p in touched {
        let p = p.trunc();
        let IpNet::V4(n) = p else {
            continue;
        };
        let key = (n.network(), n.prefix_len());
        if !seen.insert(key) {
            continue;
        }
        let want = routes.get(&p).and_then(|t| steering_key(&p, t)).is_some();
        let have = steered.contains(&key);
        if want && !have {
            delta.add.push(key);
        } else if !want && have {
            delta.remove.push(key);
        }
    }
    delta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn key(s: &str) -> (Ipv4Addr, u8) {
        match net(s) {
            IpNet::V4(n) => (n.network(), n.prefix_len()),
            IpNet::V6(_) => unreachable!("test keys are IPv4"),
        }
    }

    fn local() -> api::RouteTarget {
        api::RouteTarget::Local {
            port: "bri1".into(),
        }
    }

    fn gateway() -> api::RouteTarget {
        api::RouteTarget::Gateway {
            via: "192.168.0.1".parse().unwrap(),
            port: "eth0".into(),
        }
    }

    /// Applies a route change the way `add_routes`/`remove_routes` do and
    /// folds the delta into `steered` as `update_steering` does.
    fn change(
        steered: &mut BTreeSet<(Ipv4Addr, u8)>,
        routes: &mut BTreeMap<IpNet, api::RouteTarget>,
        adds: &[(&str, api::RouteTarget)],
        removes: &[&str],
    ) -> SteeringDelta {
        let mut touched = Vec::new();
        for (p, t) in adds {
            routes.insert(net(p).trunc(), t.clone());
            touched.push(net(p));
        }
        for p in removes {
            routes.remove(&net(p).trunc());
            touched.push(net(p));
        }
        let delta = steering_delta(steered, routes, &touched);
        for k in &delta.remove {
            steered.remove(k);
        }
        for k in &delta.add {
            steered.insert(*k);
        }
        delta
    }

    /// The set a full rebuild over the route map gives: the incremental
    /// updates must always equal it.
    fn rebuilt(routes: &BTreeMap<IpNet, api::RouteTarget>) -> BTreeSet<(Ipv4Addr, u8)> {
        routes
            .iter()
            .filter_map(|(p, t)| steering_key(p, t))
            .collect()
    }

    #[test]
    fn steered_kinds_enter_and_the_others_stay_out() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        let delta = change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", local()),
                (
                    "10.244.1.0/26",
                    api::RouteTarget::Encap {
                        encap: api::Encap::Vxlan,
                        remote: "192.168.0.12".parse().unwrap(),
                    },
                ),
                ("10.245.0.0/24", gateway()),
                ("0.0.0.0/0", gateway()),
                ("10.9.0.0/16", api::RouteTarget::Blackhole),
                ("10.8.0.0/16", api::RouteTarget::Host),
                ("fd00::5/128", local()),
            ],
            &[],
        );
        assert_eq!(
            delta,
            SteeringDelta {
                remove: vec![],
                add: vec![
                    key("10.244.0.5/32"),
                    key("10.244.1.0/26"),
                    key("10.245.0.0/24")
                ],
            }
        );
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn a_replaced_route_moves_in_and_out_of_the_steered_set() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", local())],
            &[],
        );
        // Steered → not steered.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", api::RouteTarget::Blackhole)],
            &[],
        );
        assert_eq!(delta.remove, vec![key("10.244.0.0/24")]);
        assert!(delta.add.is_empty());
        assert!(steered.is_empty());
        // Not steered → steered, written with host bits.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.9/24", gateway())],
            &[],
        );
        assert_eq!(delta.add, vec![key("10.244.0.0/24")]);
        // Steered → steered of another kind: the map is not touched.
        let delta = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.0/24", local())],
            &[],
        );
        assert_eq!(delta, SteeringDelta::default());
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn removal_takes_out_only_what_was_steered_and_repeats_change_nothing() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", local()),
                ("10.244.0.6/32", local()),
                ("10.9.0.0/16", api::RouteTarget::Blackhole),
            ],
            &[],
        );
        let delta = change(
            &mut steered,
            &mut routes,
            &[],
            &["10.244.0.5/32", "10.9.0.0/16", "10.1.0.0/16"],
        );
        assert_eq!(delta.remove, vec![key("10.244.0.5/32")]);
        assert_eq!(steered, BTreeSet::from([key("10.244.0.6/32")]));
        // The same request again and an unchanged add: nothing to do.
        let again = change(&mut steered, &mut routes, &[], &["10.244.0.5/32"]);
        assert_eq!(again, SteeringDelta::default());
        let again = change(
            &mut steered,
            &mut routes,
            &[("10.244.0.6/32", local())],
            &[],
        );
        assert_eq!(again, SteeringDelta::default());
        assert_eq!(steered, rebuilt(&routes));
    }

    #[test]
    fn a_prefix_twice_in_one_request_is_one_map_change() {
        let (mut steered, mut routes) = (BTreeSet::new(), BTreeMap::new());
        let delta = change(
            &mut steered,
            &mut routes,
            &[
                ("10.244.0.5/32", api::RouteTarget::Blackhole),
                ("10.244.0.5/32", local()),
            ],
            &[],
        );
        assert_eq!(delta.add, vec![key("10.244.0.5/32")]);
        assert_eq!(steered, rebuilt(&routes));
    }
}
