//! The control thread's state: what the controller asked for (ports by
//! name, routes, neighbours, node settings), the FIB writer, the steering
//! maps, and the worker's handle. Every operation of
//! `brindle_api::vrouter` is applied here, idempotently: asking for what is
//! already in effect changes nothing and answers `changed: 0`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

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
use crate::port::packet::PacketPort;
use crate::port::xdp::{LinkInfo, XdpPort, XdpPortConfig};
use crate::wire::udp::UdpChecksum;

struct PortEntry {
    spec: api::PortSpec,
    id: PortId,
    backend: &'static str,
}

/// The daemon's programmable state.
pub struct Control {
    worker: WorkerHandle,
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
    /// The running worker.
    pub worker: WorkerHandle,
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
            worker: parts.worker,
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
        self.worker.join();
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

    fn send(&self, cmd: WorkerCmd) -> Result<(), RemoteError> {
        self.worker
            .tx
            .send(cmd)
            .map_err(|_| internal("the worker has stopped"))
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
        self.send(WorkerCmd::Config(cfg.clone()))?;
        self.send(WorkerCmd::TunnelPeers(
            (!node.tunnel_peers.is_empty()).then(|| node.tunnel_peers.clone()),
        ))?;
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

    fn open_port(
        &self,
        spec: &api::PortSpec,
    ) -> Result<(Box<dyn Port>, Endpoint, &'static str), RemoteError> {
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
        let packet =
            |why: Option<String>| -> Result<(Box<dyn Port>, Endpoint, &'static str), RemoteError> {
                if let Some(why) = why {
                    tracing::warn!(port = %spec.name, reason = %why, "AF_XDP cannot be opened: falling back to AF_PACKET (one copy per frame)");
                }
                let p = PacketPort::open(&spec.name, link)
                    .map_err(|e| internal(format!("AF_PACKET port {}: {e}", spec.name)))?;
                Ok((Box::new(p), endpoint.clone(), "af_packet"))
            };
        match (&self.umem, &self.steering, self.io) {
            (_, _, IoMode::Packet) => packet(None),
            (Some(umem), Some(steering), io) => {
                match XdpPort::open(umem, steering, &spec.name, role, link, &self.xdp) {
                    Ok(p) => Ok((Box::new(p), endpoint.clone(), "af_xdp")),
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
            let (port, endpoint, backend) = self.open_port(&spec)?;
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
            self.send(WorkerCmd::SetPort { id, port, endpoint })?;
            tracing::info!(port = %spec.name, id, backend, "port attached");
            self.ports
                .insert(spec.name.clone(), PortEntry { spec, id, backend });
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
            self.send(WorkerCmd::DetachPort { id: e.id })?;
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
        self.fib
            .apply(changes)
            .map_err(|e| internal(format!("FIB: {e}")))?;
        for ((port, ip), mac) in &self.neighbors {
            if let Some(e) = self.ports.get(port) {
                self.send(WorkerCmd::Neighbor {
                    port: e.id,
                    addr: *ip,
                    mac: Some(mac.0),
                })?;
            }
        }
        self.refresh_steering()
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
        for r in &routes {
            let prefix = r.prefix.trunc();
            let nh = self.next_hop(&r.target)?;
            if self.routes.get(&prefix) != Some(&r.target) || self.fib.get(&prefix) != Some(nh) {
                changes.push((prefix, r.target.clone(), nh));
            }
        }
        self.fib
            .apply(changes.iter().map(|(p, _, nh)| FibChange::Upsert {
                prefix: *p,
                next_hop: *nh,
            }))
            .map_err(|e| internal(format!("FIB: {e}")))?;
        let changed = changes.len() as u64;
        for (p, t, _) in changes {
            self.routes.insert(p, t);
        }
        self.refresh_steering()?;
        Ok(changed)
    }

    fn remove_routes(&mut self, prefixes: &[IpNet]) -> Result<u64, RemoteError> {
        let mut removed = Vec::new();
        for p in prefixes {
            let p = p.trunc();
            if self.routes.remove(&p).is_some() {
                removed.push(FibChange::Remove { prefix: p });
            }
        }
        let changed = removed.len() as u64;
        self.fib
            .apply(removed)
            .map_err(|e| internal(format!("FIB: {e}")))?;
        self.refresh_steering()?;
        Ok(changed)
    }

    /// The steering programs send to the vrouter what is routed to pods and
    /// tunnels: keep the pod-prefix map equal to those IPv4 prefixes.
    fn refresh_steering(&mut self) -> Result<(), RemoteError> {
        let Some(s) = &self.steering else {
            return Ok(());
        };
        let want: BTreeSet<(Ipv4Addr, u8)> = self
            .routes
            .iter()
            .filter(|(_, t)| {
                matches!(
                    t,
                    api::RouteTarget::Local { .. } | api::RouteTarget::Encap { .. }
                )
            })
            .filter_map(|(p, _)| match p {
                IpNet::V4(n) => Some((n.network(), n.prefix_len())),
                IpNet::V6(_) => None,
            })
            .collect();
        for &(a, l) in self.steered.difference(&want) {
            s.remove_pod_prefix(a, l)
                .map_err(|e| internal(format!("steering map: {e}")))?;
        }
        for &(a, l) in want.difference(&self.steered) {
            s.add_pod_prefix(a, l)
                .map_err(|e| internal(format!("steering map: {e}")))?;
        }
        self.steered = want;
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
            self.send(WorkerCmd::Neighbor {
                port: self.port_id(&n.port)?,
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
                self.send(WorkerCmd::Neighbor {
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
    /// routes need on uplink ports (tunnel remotes on the node's subnet,
    /// gateways), and makes the kernel resolve those it lacks. Neighbours set
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
        let mut wanted: Vec<(String, Ipv4Addr)> = Vec::new();
        for t in self.routes.values() {
            let hop = match t {
                api::RouteTarget::Encap { remote, .. } if self.pipeline.on_link(*remote) => {
                    Some((first_uplink, *remote))
                }
                api::RouteTarget::Gateway {
                    via: IpAddr::V4(via),
                    port,
                } if uplinks.contains_key(port.as_str()) => Some((port.as_str(), *via)),
                _ => None,
            };
            if let Some((dev, addr)) = hop
                && !self
                    .neighbors
                    .contains_key(&(dev.to_owned(), IpAddr::V4(addr)))
                && !wanted.iter().any(|(d, a)| d == dev && *a == addr)
            {
                wanted.push((dev.to_owned(), addr));
            }
        }
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
                let _ = self.send(WorkerCmd::Neighbor {
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

    /// The worker's counters, if it answers.
    pub fn snapshot(&self) -> Option<WorkerSnapshot> {
        self.worker.snapshot()
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
        let snap = self.snapshot().unwrap_or_default();
        let c = snap.counters;
        let drops = crate::counters::DropReason::ALL
            .iter()
            .map(|r| (r.name().to_owned(), c.drops_for(*r)))
            .collect();
        api::Stats {
            workers: vec![api::WorkerStats {
                worker: 0,
                core: self.worker.core.map(|c| c as u32),
                rx_packets: c.rx_packets,
                tx_packets: c.tx_packets,
                drops,
                busy_polls: snap.busy_polls,
                idle_polls: snap.idle_polls,
            }],
            routes: self.fib.len() as u64,
            ports: self.ports.len() as u64,
        }
    }

    fn dump_ports(&self) -> Vec<api::PortStatus> {
        let snap = self.snapshot().unwrap_or_default();
        self.ports
            .values()
            .map(|e| {
                let s = snap.ports.get(e.id as usize).copied().unwrap_or_default();
                api::PortStatus {
                    spec: e.spec.clone(),
                    backend: e.backend.to_owned(),
                    worker: 0,
                    counters: api::PortCounters {
                        rx_packets: s.rx_packets,
                        rx_bytes: s.rx_bytes,
                        tx_packets: s.tx_packets,
                        tx_bytes: s.tx_bytes,
                    },
                }
            })
            .collect()
    }

    /// Liveness (the worker answers) and readiness (an uplink is attached
    /// and the node has an address).
    pub fn health(&self) -> api::Health {
        let mut problems = Vec::new();
        let live = self.snapshot().is_some();
        if !live {
            problems.push("worker 0 does not answer".to_owned());
        }
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
