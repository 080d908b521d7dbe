//! The vrouter's programmable state and every decision about it:
//! [`Control::handle`] applies one `brindle_api::vrouter` request to the
//! state (ports by name, routes, neighbours, node settings, the steered
//! prefixes, the next hops in use) and says what must change through one
//! seam, [`Effects`]: the running [`crate::engine::Dataplane`] in the
//! daemon, [`effects::Recording`] in the unit tests (`tests.rs`).
//!
//! Every request is idempotent: asking for what is already in effect
//! changes nothing and answers `changed: 0`. `serve` hands it what arrives
//! on its socket, `run` what its flags say; both go through here.

pub mod effects;
mod hops;
mod policy;
mod steering;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use brindle_api::framing::{PROTOCOL_VERSION, RemoteError, RemoteErrorKind};
use brindle_api::vrouter as api;
use brindle_xsk::Role;
use ipnet::IpNet;

pub use self::effects::{Effect, Effects, Recording};
use self::hops::NextHops;
use self::steering::steering_delta;
use crate::endpoint::{Endpoint, GATEWAY_MAC, PortKind};
use crate::engine::{AttachDevice, Backend, EngineError, PortAttach, WorkerSnapshot};
use crate::fib::{Encap, FibChange, NextHop};
use crate::frame::PortId;
use crate::pipeline::{PipelineConfig, vtep_mac};
use crate::port::xdp::LinkInfo;
use crate::wire::udp::UdpChecksum;

struct PortEntry {
    spec: api::PortSpec,
    id: PortId,
    backend: Backend,
    /// Workers holding the port or a share of its queues; the first one
    /// receives what the others hand over for it.
    owners: Vec<usize>,
    /// What its steering program sends the vrouter.
    role: Role,
}

/// A port in the metrics: name, slot, backend, owning workers.
pub type PortRow = (String, PortId, Backend, Vec<usize>);

/// The control state over the running dataplane (the daemon's).
pub type Daemon = Control<crate::engine::Dataplane>;

/// The vrouter's programmable state over its effects.
pub struct Control<E: Effects> {
    effects: E,
    boot_id: String,
    ports: BTreeMap<String, PortEntry>,
    free_slots: Vec<PortId>,
    next_slot: PortId,
    routes: BTreeMap<IpNet, api::RouteTarget>,
    neighbors: BTreeMap<(String, IpAddr), api::Mac>,
    node: Option<api::NodeConfig>,
    pipeline: PipelineConfig,
    steered: BTreeSet<(Ipv4Addr, u8)>,
    hops: NextHops,
    policy: policy::PolicyControl,
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

/// An engine failure as the API's error: a missing interface is the
/// caller's mistake, the rest is ours.
fn engine(e: EngineError) -> RemoteError {
    match e {
        EngineError::Link { .. } => invalid(e.to_string()),
        e => internal(e.to_string()),
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

impl<E: Effects> Control<E> {
    /// The state of a dataplane whose workers run with `pipeline`.
    pub fn new(effects: E, pipeline: PipelineConfig) -> Control<E> {
        Control {
            effects,
            boot_id: new_boot_id(),
            ports: BTreeMap::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            routes: BTreeMap::new(),
            neighbors: BTreeMap::new(),
            node: None,
            pipeline,
            steered: BTreeSet::new(),
            hops: NextHops::default(),
            policy: Default::default(),
        }
    }

    /// The effects (the dataplane, or the recording).
    pub fn effects(&self) -> &E {
        &self.effects
    }

    /// The effects, mutably (tests take the recorded ones).
    pub fn effects_mut(&mut self) -> &mut E {
        &mut self.effects
    }

    /// The boot id given in `Hello`.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Stops the workers (ports close, programs detach) and returns their
    /// last counters. Later requests fail with "worker N has stopped".
    pub fn shutdown(&mut self) -> Vec<WorkerSnapshot> {
        self.effects.shutdown()
    }

    /// Applies one request; the JSON value is the op's result type. The
    /// workers get the policy view once per request if it changed (also
    /// when the request failed half-way: what it did change is in force).
    pub fn handle(&mut self, req: api::VrouterRequest) -> Result<serde_json::Value, RemoteError> {
        let answer = self.handle_one(req);
        self.publish_policy();
        answer
    }

    fn handle_one(&mut self, req: api::VrouterRequest) -> Result<serde_json::Value, RemoteError> {
        use api::VrouterRequest as R;
        let changed = match req {
            R::Hello { version } => {
                if version != PROTOCOL_VERSION {
                    return Err(invalid(format!(
                        "protocol version {version} not supported (this vrouter speaks {PROTOCOL_VERSION})"
                    )));
                }
                return to_json(&api::Hello {
                    version: PROTOCOL_VERSION,
                    boot_id: self.boot_id.clone(),
                });
            }
            R::GetStats => return to_json(&self.stats()),
            R::PolicyStats => return to_json(&self.policy_stats()),
            R::DumpRoutes => {
                let routes: Vec<api::Route> = self
                    .routes
                    .iter()
                    .map(|(p, t)| api::Route {
                        prefix: *p,
                        target: t.clone(),
                    })
                    .collect();
                return to_json(&routes);
            }
            R::DumpPorts => return to_json(&self.dump_ports()),
            R::Health => return to_json(&self.health()),
            R::SetNode { node } => self.set_node(node)?,
            R::AddPorts { ports } => self.add_ports(ports)?,
            R::RemovePorts { names } => self.remove_ports(&names)?,
            R::AddRoutes { routes } => self.add_routes(routes)?,
            R::RemoveRoutes { prefixes } => self.remove_routes(&prefixes)?,
            R::SetNeighbors { neighbors } => self.set_neighbors(neighbors)?,
            R::Sync { state } => self.sync(state)?,
            R::ApplyPolicy { update } => self.apply_policy(&update)?,
        };
        if changed > 0 {
            self.resolve_missing();
        }
        to_json(&api::Changed { changed })
    }

    /// Ports each worker owns (an uplink counts on worker 0).
    fn worker_load(&self) -> Vec<usize> {
        let mut load = vec![0usize; self.effects.worker_count().max(1)];
        for e in self.ports.values() {
            if let Some(&w) = e.owners.first()
                && let Some(l) = load.get_mut(w)
            {
                *l += 1;
            }
        }
        load
    }

    /// The worker a new port starts on: an uplink on worker 0, any other
    /// port on the one owning fewest ports (ties: the lowest index), given
    /// `load` (which counts it). Ports never move once placed, so pods that
    /// stay keep their worker while others come and go.
    fn first_worker(kind: api::PortKind, load: &mut [usize]) -> usize {
        let w = if kind == api::PortKind::Uplink {
            0
        } else {
            load.iter()
                .enumerate()
                .min_by_key(|&(i, l)| (*l, i))
                .map_or(0, |(i, _)| i)
        };
        if let Some(l) = load.get_mut(w) {
            *l += 1;
        }
        w
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
        self.effects
            .steer_node(node.address_v4, node.vxlan.port)
            .map_err(engine)?;
        let vni_changed = cfg.vxlan_vni != self.pipeline.vxlan_vni;
        self.effects.set_pipeline(&cfg).map_err(engine)?;
        // The list is the whole truth once ctrl speaks: an empty one (no
        // other live node yet, or every other node gone) accepts no tunnel
        // from anyone, it never means "from any" (issue 14, item 6).
        self.effects
            .set_tunnel_peers(Some(node.tunnel_peers.clone()))
            .map_err(engine)?;
        self.pipeline = cfg;
        self.node = Some(node);
        if vni_changed {
            // VXLAN routes carry the VNI in their next hop.
            let changes = self
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
                .map(|(p, t)| {
                    Ok(FibChange::Upsert {
                        prefix: *p,
                        next_hop: self.next_hop(t)?,
                    })
                })
                .collect::<Result<Vec<_>, RemoteError>>()?;
            if !changes.is_empty() {
                self.effects.fib_apply(changes).map_err(engine)?;
            }
        }
        Ok(1)
    }

    /// What the workers are told about a port, and its steering role. With
    /// a host port (`host_port`), a veth pod's program sends the vrouter
    /// every frame: the pod reaches the node, the Services and the outside
    /// through the vrouter and the host port (anti-spoofed, tracked), not by
    /// the kernel's end of its veth; without one, what is not for a pod
    /// prefix goes to the kernel there, as before.
    fn endpoint(spec: &api::PortSpec, mac: [u8; 6], mtu: u32, host_port: bool) -> (Endpoint, Role) {
        let peer = spec.peer_mac.map(|m| m.0);
        match spec.kind {
            api::PortKind::Pod => {
                let role = if host_port { Role::All } else { Role::Pod };
                (Endpoint::pod(spec.addresses.clone(), peer, mtu), role)
            }
            api::PortKind::Uplink | api::PortKind::Appliance => {
                let mut e = Endpoint::uplink(mac, mtu);
                e.peer_mac = peer;
                let role = if spec.kind == api::PortKind::Uplink {
                    Role::Uplink
                } else {
                    Role::All
                };
                (e, role)
            }
            // A TAP host port (`brindle0`): the interface is the kernel's
            // end, so its MAC is the peer's (filled in when the TAP is
            // opened, unless given) and the vrouter speaks as the pods'
            // gateway (the kernel resolves 169.254.1.1 to it).
            api::PortKind::Host if matches!(spec.device, api::PortDevice::Tap { .. }) => (
                Endpoint {
                    kind: PortKind::Host,
                    mac: GATEWAY_MAC,
                    mtu,
                    addrs: Vec::new(),
                    peer_mac: peer,
                },
                Role::Uplink,
            ),
            api::PortKind::Host => (
                Endpoint {
                    kind: PortKind::Host,
                    mac,
                    mtu,
                    addrs: Vec::new(),
                    peer_mac: peer,
                },
                Role::Uplink,
            ),
        }
    }

    /// Whether a host port is attached.
    fn has_host_port(&self) -> bool {
        self.ports
            .values()
            .any(|e| e.spec.kind == api::PortKind::Host)
    }

    /// Attaches `ports` (several at once: the dataplane opens a batch's
    /// ports in parallel, issue 17). A port that fails does not stop the
    /// others: every one that attached is in force, with its routes, and
    /// the first failure is the answer.
    fn add_ports(&mut self, mut ports: Vec<api::PortSpec>) -> Result<u64, RemoteError> {
        // The later spec of a name is the one in force, as one by one.
        let mut seen = BTreeSet::new();
        ports.reverse();
        ports.retain(|p| seen.insert(p.name.clone()));
        ports.reverse();
        // The host port first, on its own: the pods are then steered for it.
        let (hosts, others): (Vec<_>, Vec<_>) = ports
            .into_iter()
            .partition(|p| p.kind == api::PortKind::Host);
        let mut changed = 0;
        let mut failed = None;
        for group in [hosts, others] {
            changed += self.attach_group(group, &mut failed);
        }
        if changed > 0 {
            self.refresh_fib_for_ports()?;
            self.resteer_pods()?;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    /// Attaches the ports of `specs` that are not in force as they are
    /// (a changed one is re-opened: a socket is cheap to make, and the
    /// slot's state starts clean) in one [`Effects::attach_ports`]; keeps
    /// the first failure in `failed`. Returns how many attached.
    fn attach_group(&mut self, specs: Vec<api::PortSpec>, failed: &mut Option<RemoteError>) -> u64 {
        let mut load = self.worker_load();
        let mut batch = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(e) = self.ports.get(&spec.name) {
                if e.spec == spec {
                    continue;
                }
                if let Err(e) = self.detach(&spec.name) {
                    failed.get_or_insert(e);
                    continue;
                }
            }
            // A TAP's MTU and the kernel end's MAC come from the device
            // when it is attached; the vrouter's MAC on it is the gateway's.
            let link = match &spec.device {
                api::PortDevice::Xdp => match self.effects.link(&spec.name) {
                    Ok(l) => l,
                    Err(e) => {
                        failed.get_or_insert(engine(e));
                        continue;
                    }
                },
                api::PortDevice::Tap { .. } => LinkInfo {
                    mac: crate::endpoint::GATEWAY_MAC,
                    mtu: 0,
                },
            };
            let (mut endpoint, role) =
                Self::endpoint(&spec, link.mac, link.mtu, self.has_host_port());
            let first = Self::first_worker(spec.kind, &mut load);
            let id = match self.free_slots.pop() {
                Some(id) => id,
                None => match self.next_slot.checked_add(1) {
                    Some(next) => std::mem::replace(&mut self.next_slot, next),
                    None => {
                        failed.get_or_insert(RemoteError {
                            kind: RemoteErrorKind::Exhausted,
                            message: "no port slot left".into(),
                        });
                        break;
                    }
                },
            };
            let device = match &spec.device {
                api::PortDevice::Tap { netns, ifname, .. } => {
                    // The device's MAC is the peer's unless the spec names
                    // one: the dataplane reads it when it attaches.
                    endpoint.peer_mac = spec.peer_mac.map(|m| m.0);
                    AttachDevice::Tap {
                        netns: netns.clone(),
                        ifname: ifname.clone(),
                    }
                }
                api::PortDevice::Xdp => AttachDevice::Xdp { role, link },
            };
            let attach = PortAttach {
                id,
                name: spec.name.clone(),
                device,
                first,
                endpoint,
            };
            batch.push((spec, role, attach));
        }
        if batch.is_empty() {
            return 0;
        }
        let results = self
            .effects
            .attach_ports(batch.iter().map(|(_, _, a)| a.clone()).collect());
        let mut changed = 0;
        for ((spec, role, attach), result) in batch.into_iter().zip(results) {
            let id = attach.id;
            let (owners, backend) = match result {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(port = %spec.name, error = %e, "port not attached");
                    self.free_slots.push(id);
                    failed.get_or_insert(engine(e));
                    continue;
                }
            };
            tracing::info!(port = %spec.name, id, backend, workers = ?owners, "port attached");
            self.set_port_workload(id, Some(&spec));
            self.ports.insert(
                spec.name.clone(),
                PortEntry {
                    spec,
                    id,
                    backend,
                    owners,
                    role,
                },
            );
            changed += 1;
        }
        changed
    }

    /// Re-opens the veth pods whose steering role no longer matches
    /// whether a host port is attached (it came or went).
    fn resteer_pods(&mut self) -> Result<(), RemoteError> {
        let host = self.has_host_port();
        let stale: Vec<api::PortSpec> = self
            .ports
            .values()
            .filter(|e| e.spec.kind == api::PortKind::Pod && e.spec.device.is_xdp())
            .filter(|e| e.role != if host { Role::All } else { Role::Pod })
            .map(|e| e.spec.clone())
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        tracing::info!(pods = stale.len(), host_port = host, "pods re-steered");
        for spec in &stale {
            self.detach(&spec.name)?;
        }
        self.add_ports(stale).map(|_| ())
    }

    /// Closes a port; its routes and neighbours stay in the desired state
    /// but leave the FIB until the port comes back.
    fn detach(&mut self, name: &str) -> Result<(), RemoteError> {
        if let Some(e) = self.ports.remove(name) {
            self.set_port_workload(e.id, None);
            self.effects.detach_port(e.id).map_err(engine)?;
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
        if changed > 0 {
            self.refresh_fib_for_ports()?;
            self.resteer_pods()?;
        }
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
            let installed = self.effects.fib_get(prefix);
            match self.next_hop(target) {
                Ok(nh) if installed != Some(nh) => changes.push(FibChange::Upsert {
                    prefix: *prefix,
                    next_hop: nh,
                }),
                Err(_) if installed.is_some() => {
                    changes.push(FibChange::Remove { prefix: *prefix });
                }
                _ => {}
            }
        }
        if !changes.is_empty() {
            self.effects.fib_apply(changes).map_err(engine)?;
        }
        for ((port, ip), mac) in &self.neighbors {
            if let Some(e) = self.ports.get(port) {
                self.effects
                    .set_neighbor(e.id, *ip, Some(mac.0))
                    .map_err(engine)?;
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
            if self.routes.get(&prefix) != Some(&r.target)
                || self.effects.fib_get(&prefix) != Some(nh)
            {
                changes.push((prefix, r.target, nh));
            }
        }
        if changes.is_empty() {
            return Ok(0);
        }
        self.effects
            .fib_apply(
                changes
                    .iter()
                    .map(|(p, _, nh)| FibChange::Upsert {
                        prefix: *p,
                        next_hop: *nh,
                    })
                    .collect(),
            )
            .map_err(engine)?;
        let changed = changes.len() as u64;
        let mut touched = Vec::with_capacity(changes.len());
        for (p, t, _) in changes {
            self.hops.add(&t);
            if let Some(old) = self.routes.insert(p, t) {
                self.hops.remove(&old);
            }
            touched.push(p);
        }
        self.update_steering(&touched)?;
        Ok(changed)
    }

    /// Keeps `routes` whose port is not attached in the desired state,
    /// out of the FIB (an older route of their prefix leaves it): they go
    /// in when their port comes (`refresh_fib_for_ports`).
    fn keep_waiting_routes(&mut self, routes: Vec<api::Route>) -> Result<u64, RemoteError> {
        let mut touched = Vec::new();
        let mut out_of_fib = Vec::new();
        for r in routes {
            let prefix = r.prefix.trunc();
            if self.routes.get(&prefix) == Some(&r.target) {
                continue;
            }
            self.hops.add(&r.target);
            if let Some(old) = self.routes.insert(prefix, r.target) {
                self.hops.remove(&old);
            }
            if self.effects.fib_get(&prefix).is_some() {
                out_of_fib.push(FibChange::Remove { prefix });
            }
            touched.push(prefix);
        }
        if !out_of_fib.is_empty() {
            self.effects.fib_apply(out_of_fib).map_err(engine)?;
        }
        self.update_steering(&touched)?;
        Ok(touched.len() as u64)
    }

    fn remove_routes(&mut self, prefixes: &[IpNet]) -> Result<u64, RemoteError> {
        let mut removed = Vec::new();
        let mut touched = Vec::new();
        for p in prefixes {
            let p = p.trunc();
            if let Some(old) = self.routes.remove(&p) {
                self.hops.remove(&old);
                removed.push(FibChange::Remove { prefix: p });
                touched.push(p);
            }
        }
        if touched.is_empty() {
            return Ok(0);
        }
        let changed = removed.len() as u64;
        self.effects.fib_apply(removed).map_err(engine)?;
        self.update_steering(&touched)?;
        Ok(changed)
    }

    /// Brings the pod-prefix steering map up to date for the `touched`
    /// prefixes (those a request added, replaced or removed): the work is
    /// per change, not per route held, so a full table arriving in batches
    /// stays linear.
    fn update_steering(&mut self, touched: &[IpNet]) -> Result<(), RemoteError> {
        let delta = steering_delta(&self.steered, &self.routes, touched);
        for &key in &delta.remove {
            self.effects.steer_remove(key).map_err(engine)?;
            self.steered.remove(&key);
        }
        let mut left_out = 0u64;
        for &key in &delta.add {
            if left_out > 0 {
                // Full (the removals came first): no syscall per prefix.
                left_out += 1;
                continue;
            }
            // The map is sized for a node's pods and pool blocks, not a
            // full BGP table: a prefix that does not fit stays on the
            // kernel path (its route is in the FIB all the same), and the
            // request succeeds, so the controller does not resync in a loop
            // over a table that can never fit.
            if self.effects.steer_add(key).map_err(engine)? {
                self.steered.insert(key);
            } else {
                left_out += 1;
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
            self.effects
                .set_neighbor(port, n.ip, Some(n.mac.0))
                .map_err(engine)?;
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
        // A pod port that cannot be attached (its TAP or veth is gone: the
        // CNI plugin rolled back an ADD whose answer came too late) does
        // not fail the Sync: the controller would resync again and again,
        // answering every ADD "vrouter not reachable" meanwhile (issue 17,
        // seen with 110 parallel ADDs on a loaded node). The rest is
        // applied; its routes wait for it as a detached port's do.
        let ports = state.ports.len();
        match self.add_ports(state.ports) {
            Ok(n) => changed += n,
            Err(e) => {
                tracing::warn!(ports, error = %e.message, "sync: some ports could not be attached; their routes wait for them");
            }
        }
        let want_routes: BTreeSet<IpNet> = state.routes.iter().map(|r| r.prefix.trunc()).collect();
        let stale: Vec<IpNet> = self
            .routes
            .keys()
            .filter(|p| !want_routes.contains(p))
            .copied()
            .collect();
        changed += self.remove_routes(&stale)?;
        let (ready, waiting): (Vec<api::Route>, Vec<api::Route>) = state
            .routes
            .into_iter()
            .partition(|r| self.next_hop(&r.target).is_ok());
        changed += self.add_routes(ready)?;
        changed += self.keep_waiting_routes(waiting)?;
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
                self.effects
                    .set_neighbor(e.id, key.1, None)
                    .map_err(engine)?;
            }
            self.neighbors.remove(&key);
            changed += 1;
        }
        changed += self.set_neighbors(state.neighbors)?;
        if let Some(snapshot) = &state.policy {
            // Refused: logged and counted, the policy in force stays; the
            // ports, routes and neighbours above are applied regardless.
            changed += self.sync_policy(snapshot);
        }
        Ok(changed)
    }

    /// The underlay next hops the routes need on uplink ports (tunnel
    /// remotes on the node's subnet, the underlay gateway for those beyond
    /// it, gateways) that no neighbour entry covers yet, as (port,
    /// address). Costs the number of distinct next hops, not of routes.
    pub fn unresolved(&self) -> Vec<(String, Ipv4Addr)> {
        let is_uplink = |name: &str| {
            self.ports
                .get(name)
                .is_some_and(|e| e.spec.kind == api::PortKind::Uplink)
        };
        let first_uplink = self
            .ports
            .iter()
            .find(|(_, e)| e.spec.kind == api::PortKind::Uplink)
            .map(|(n, _)| n.as_str());
        self.hops
            .needed(first_uplink, is_uplink, &self.pipeline)
            .into_iter()
            .filter(|(port, addr)| {
                !self
                    .neighbors
                    .contains_key(&(port.clone(), IpAddr::V4(*addr)))
            })
            .collect()
    }

    /// Makes the kernel resolve every next hop in [`Control::unresolved`]
    /// (after each change, and on the daemon's tick while some remain).
    pub fn resolve_missing(&mut self) {
        for (_, addr) in self.unresolved() {
            self.effects.resolve(addr);
        }
    }

    /// Each worker's counters (`None` for a worker that does not answer).
    pub fn snapshots(&self) -> Vec<Option<WorkerSnapshot>> {
        self.effects.snapshots()
    }

    /// Routes in the FIB.
    pub fn routes(&self) -> u64 {
        self.effects.fib_len() as u64
    }

    /// The counters of every attached TAP port, for metrics.
    pub fn tap_stats(&self) -> Vec<crate::port::tap::TapStatsRow> {
        self.effects.tap_stats()
    }

    /// Ports by name with their slot, backend and owning workers, for
    /// metrics.
    pub fn port_owners(&self) -> Vec<PortRow> {
        self.ports
            .iter()
            .map(|(n, e)| (n.clone(), e.id, e.backend, e.owners.clone()))
            .collect()
    }

    fn stats(&self) -> api::Stats {
        let cores = self.effects.cores();
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
                    core: cores.get(i).copied().flatten().map(|c| c as u32),
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
            routes: self.routes(),
            ports: self.ports.len() as u64,
            policy_snapshots_refused: self.refused_policy_snapshots(),
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

    /// Liveness (the workers answer) and readiness (an uplink is attached
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
