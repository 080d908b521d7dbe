//! The one seam between [`super::Control`]'s decisions and the world: the
//! [`Effects`] trait, its real implementation over the running
//! [`Dataplane`] (sockets, worker commands, FIB writes, BPF maps), and a
//! [`Recording`] one that keeps every effect as a value, for unit tests.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::Arc;

use brindle_xsk::Role;
use ipnet::IpNet;

use crate::endpoint::Endpoint;
use crate::engine::{
    AttachDevice, Attached, Backend, Dataplane, EngineError, PortAttach, WorkerCmd, WorkerSnapshot,
};
use crate::fib::{FibChange, NextHop};
use crate::frame::PortId;
use crate::pipeline::PipelineConfig;
use crate::policy::PolicyView;
use crate::port::xdp::LinkInfo;

/// What a key of the pod-prefix steering map is: network and length.
pub type SteerKey = (Ipv4Addr, u8);

/// Everything the control state does to the dataplane.
pub trait Effects {
    /// The interface's MAC and MTU.
    fn link(&mut self, name: &str) -> Result<LinkInfo, EngineError>;
    /// Opens `name` and installs it in slot `id` of every worker, its
    /// queues spread from worker `first`; returns the owning workers and
    /// the socket kind.
    fn attach_port(
        &mut self,
        id: PortId,
        name: &str,
        role: Role,
        link: LinkInfo,
        first: usize,
        endpoint: &Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError>;
    /// Attaches one queue per worker of the TAP `ifname` in the namespace
    /// at `netns` (`None`: the vrouter's own) into slot `id`, queues spread
    /// from worker `first`; `endpoint` gets the device's MTU, and its MAC as
    /// the peer's unless set. Returns the owners and the socket kind.
    fn attach_tap(
        &mut self,
        id: PortId,
        name: &str,
        netns: Option<&str>,
        ifname: &str,
        first: usize,
        endpoint: Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError>;
    /// Attaches every port of `ports` ([`Effects::attach_port`] or
    /// [`Effects::attach_tap`] by device); one result per port, in order,
    /// a failed one not stopping the others. The dataplane opens them
    /// several at once; by default one after the other.
    fn attach_ports(&mut self, ports: Vec<PortAttach>) -> Vec<Attached> {
        ports
            .into_iter()
            .map(|p| match p.device {
                AttachDevice::Xdp { role, link } => {
                    self.attach_port(p.id, &p.name, role, link, p.first, &p.endpoint)
                }
                AttachDevice::Tap { netns, ifname } => self.attach_tap(
                    p.id,
                    &p.name,
                    netns.as_deref(),
                    &ifname,
                    p.first,
                    p.endpoint,
                ),
            })
            .collect()
    }
    /// Closes slot `id`.
    fn detach_port(&mut self, id: PortId) -> Result<(), EngineError>;
    /// Sets (`Some`) or forgets (`None`) a neighbour on every worker.
    fn set_neighbor(
        &mut self,
        port: PortId,
        addr: IpAddr,
        mac: Option<[u8; 6]>,
    ) -> Result<(), EngineError>;
    /// Replaces the node-wide settings on every worker.
    fn set_pipeline(&mut self, cfg: &PipelineConfig) -> Result<(), EngineError>;
    /// Accept tunnels only from these peers (`None`: from any; `serve`
    /// and `run` always send `Some`, empty = from nobody).
    fn set_tunnel_peers(&mut self, peers: Option<Vec<Ipv4Addr>>) -> Result<(), EngineError>;
    /// The FIB's next hop for exactly `prefix`.
    fn fib_get(&self, prefix: &IpNet) -> Option<NextHop>;
    /// Routes in the FIB.
    fn fib_len(&self) -> usize;
    /// Changes the FIB (one batch, as the workers see it).
    fn fib_apply(&mut self, changes: Vec<FibChange>) -> Result<(), EngineError>;
    /// The node address and VXLAN port of the steering programs.
    fn steer_node(&mut self, node: Option<Ipv4Addr>, vxlan_port: u16) -> Result<(), EngineError>;
    /// Adds a pod prefix to the steering map; `Ok(false)`: the map is full.
    fn steer_add(&mut self, key: SteerKey) -> Result<bool, EngineError>;
    /// Takes a pod prefix out of the steering map.
    fn steer_remove(&mut self, key: SteerKey) -> Result<(), EngineError>;
    /// Makes the kernel resolve an underlay next hop (its entry then
    /// reaches the vrouter as a neighbour: from ctrl's netlink watcher, or
    /// from `run`'s learner).
    fn resolve(&mut self, addr: Ipv4Addr);
    /// How many workers run.
    fn worker_count(&self) -> usize;
    /// The workers' cores.
    fn cores(&self) -> Vec<Option<usize>>;
    /// Each worker's counters (`None`: it does not answer).
    fn snapshots(&self) -> Vec<Option<WorkerSnapshot>>;
    /// Stops the workers; their last counters.
    fn shutdown(&mut self) -> Vec<WorkerSnapshot>;
    /// Hands every worker a new network policy view (taken at its next
    /// batch).
    fn publish_policy(&mut self, view: Arc<PolicyView>);
    /// The counters of every attached TAP port (none by default).
    fn tap_stats(&self) -> Vec<crate::port::tap::TapStatsRow> {
        Vec::new()
    }
}

// ===== impl Effects for Dataplane =====

impl Effects for Dataplane {
    fn link(&mut self, name: &str) -> Result<LinkInfo, EngineError> {
        LinkInfo::read(name).map_err(|error| EngineError::Link {
            name: name.to_owned(),
            error,
        })
    }

    fn attach_port(
        &mut self,
        id: PortId,
        name: &str,
        role: Role,
        link: LinkInfo,
        first: usize,
        endpoint: &Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError> {
        let (parts, backend) = self.open_port(name, role, endpoint.kind, link, first)?;
        let owners = self.install_port(id, name, link, parts, endpoint)?;
        Ok((owners, backend))
    }

    fn attach_tap(
        &mut self,
        id: PortId,
        name: &str,
        netns: Option<&str>,
        ifname: &str,
        first: usize,
        endpoint: Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError> {
        let (owners, _, backend) =
            Dataplane::attach_tap(self, id, name, netns, ifname, first, endpoint)?;
        Ok((owners, backend))
    }

    fn attach_ports(&mut self, ports: Vec<PortAttach>) -> Vec<Attached> {
        self.attach_many(&ports)
    }

    fn detach_port(&mut self, id: PortId) -> Result<(), EngineError> {
        self.remove_port(id)
    }

    fn set_neighbor(
        &mut self,
        port: PortId,
        addr: IpAddr,
        mac: Option<[u8; 6]>,
    ) -> Result<(), EngineError> {
        self.broadcast(|| WorkerCmd::Neighbor { port, addr, mac })
    }

    fn set_pipeline(&mut self, cfg: &PipelineConfig) -> Result<(), EngineError> {
        self.broadcast(|| WorkerCmd::Config(cfg.clone()))
    }

    fn set_tunnel_peers(&mut self, peers: Option<Vec<Ipv4Addr>>) -> Result<(), EngineError> {
        self.broadcast(|| WorkerCmd::TunnelPeers(peers.clone()))
    }

    fn fib_get(&self, prefix: &IpNet) -> Option<NextHop> {
        self.fib().get(prefix)
    }

    fn fib_len(&self) -> usize {
        self.fib().len()
    }

    fn fib_apply(&mut self, changes: Vec<FibChange>) -> Result<(), EngineError> {
        self.fib_mut().apply(changes).map_err(EngineError::Fib)
    }

    fn steer_node(&mut self, node: Option<Ipv4Addr>, vxlan_port: u16) -> Result<(), EngineError> {
        Dataplane::steer_node(self, node, vxlan_port)
    }

    fn steer_add(&mut self, (addr, len): SteerKey) -> Result<bool, EngineError> {
        let Some(s) = self.steering() else {
            return Ok(true);
        };
        match s.add_pod_prefix(addr, len) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::E2BIG)) => Ok(false),
            Err(e) => Err(EngineError::Steering(e)),
        }
    }

    fn steer_remove(&mut self, (addr, len): SteerKey) -> Result<(), EngineError> {
        match self.steering() {
            Some(s) => s
                .remove_pod_prefix(addr, len)
                .map(|_| ())
                .map_err(EngineError::Steering),
            None => Ok(()),
        }
    }

    fn resolve(&mut self, addr: Ipv4Addr) {
        // One empty datagram to the discard port: the kernel ARPs for the
        // next hop before it can send it.
        if let Ok(s) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
            let _ = s.send_to(&[], (addr, 9));
        }
    }

    fn worker_count(&self) -> usize {
        Dataplane::worker_count(self)
    }

    fn cores(&self) -> Vec<Option<usize>> {
        Dataplane::cores(self)
    }

    fn snapshots(&self) -> Vec<Option<WorkerSnapshot>> {
        Dataplane::snapshots(self)
    }

    fn tap_stats(&self) -> Vec<crate::port::tap::TapStatsRow> {
        Dataplane::tap_stats(self)
    }

    fn shutdown(&mut self) -> Vec<WorkerSnapshot> {
        Dataplane::shutdown(self)
    }

    fn publish_policy(&mut self, view: Arc<PolicyView>) {
        self.policy().publish(view);
    }
}

// ===== Recording =====

/// One effect, as a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A TAP was attached into a slot.
    AttachTap {
        /// Slot.
        id: PortId,
        /// Port name.
        name: String,
        /// Namespace path.
        netns: Option<String>,
        /// Device name there.
        ifname: String,
        /// First worker.
        first: usize,
        /// What the workers were told (MTU 0: the device's, filled by the
        /// dataplane).
        endpoint: Endpoint,
    },
    /// A port was opened into a slot.
    Attach {
        /// Slot.
        id: PortId,
        /// Interface.
        name: String,
        /// Steering role.
        role: Role,
        /// First worker.
        first: usize,
        /// What the workers were told about it.
        endpoint: Endpoint,
    },
    /// A slot was closed.
    Detach(PortId),
    /// A neighbour was set or forgotten.
    Neighbor(PortId, IpAddr, Option<[u8; 6]>),
    /// New node-wide settings: node address and VXLAN VNI.
    Pipeline {
        /// Node address.
        node_v4: Ipv4Addr,
        /// VXLAN VNI.
        vni: u32,
    },
    /// The tunnel peer allow-list.
    TunnelPeers(Option<Vec<Ipv4Addr>>),
    /// A FIB batch.
    Fib(Vec<FibChange>),
    /// The steering programs' node settings.
    SteerNode(Option<Ipv4Addr>, u16),
    /// A prefix into the steering map.
    SteerAdd(SteerKey),
    /// A prefix out of it.
    SteerRemove(SteerKey),
    /// A next hop poked for the kernel to resolve.
    Resolve(Ipv4Addr),
    /// A policy view published: its generation and the pod slots with a
    /// workload.
    Policy {
        /// The controller's generation.
        generation: u64,
        /// Slots with a workload, in order.
        workloads: Vec<PortId>,
    },
}

/// Effects kept as values, over a FIB kept in a map, with interfaces that
/// exist when [`Recording::links`] has them; for the control state's unit
/// tests.
#[derive(Debug)]
pub struct Recording {
    /// What happened, in order.
    pub effects: Vec<Effect>,
    /// Interfaces that exist.
    pub links: BTreeMap<String, LinkInfo>,
    /// The FIB.
    pub fib: BTreeMap<IpNet, NextHop>,
    /// Workers.
    pub workers: usize,
    /// Steering map capacity.
    pub steer_capacity: usize,
    steered: usize,
}

impl Recording {
    /// `workers` workers, no interfaces, room for 1024 steered prefixes.
    pub fn new(workers: usize) -> Recording {
        Recording {
            effects: Vec::new(),
            links: BTreeMap::new(),
            fib: BTreeMap::new(),
            workers,
            steer_capacity: 1024,
            steered: 0,
        }
    }

    /// Adds an interface with this MAC and MTU 1500.
    pub fn with_link(mut self, name: &str, mac: [u8; 6]) -> Recording {
        self.links
            .insert(name.to_owned(), LinkInfo { mac, mtu: 1500 });
        self
    }

    /// The effects recorded since the last call.
    pub fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }
}

impl Effects for Recording {
    fn link(&mut self, name: &str) -> Result<LinkInfo, EngineError> {
        self.links
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::Link {
                name: name.to_owned(),
                error: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
    }

    fn attach_port(
        &mut self,
        id: PortId,
        name: &str,
        role: Role,
        _link: LinkInfo,
        first: usize,
        endpoint: &Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError> {
        self.effects.push(Effect::Attach {
            id,
            name: name.to_owned(),
            role,
            first,
            endpoint: endpoint.clone(),
        });
        Ok((vec![first % self.workers.max(1)], "recorded"))
    }

    fn attach_tap(
        &mut self,
        id: PortId,
        name: &str,
        netns: Option<&str>,
        ifname: &str,
        first: usize,
        endpoint: Endpoint,
    ) -> Result<(Vec<usize>, Backend), EngineError> {
        self.effects.push(Effect::AttachTap {
            id,
            name: name.to_owned(),
            netns: netns.map(str::to_owned),
            ifname: ifname.to_owned(),
            first,
            endpoint,
        });
        Ok((vec![first % self.workers.max(1)], "recorded"))
    }

    fn detach_port(&mut self, id: PortId) -> Result<(), EngineError> {
        self.effects.push(Effect::Detach(id));
        Ok(())
    }

    fn set_neighbor(
        &mut self,
        port: PortId,
        addr: IpAddr,
        mac: Option<[u8; 6]>,
    ) -> Result<(), EngineError> {
        self.effects.push(Effect::Neighbor(port, addr, mac));
        Ok(())
    }

    fn set_pipeline(&mut self, cfg: &PipelineConfig) -> Result<(), EngineError> {
        self.effects.push(Effect::Pipeline {
            node_v4: cfg.node_v4,
            vni: cfg.vxlan_vni,
        });
        Ok(())
    }

    fn set_tunnel_peers(&mut self, peers: Option<Vec<Ipv4Addr>>) -> Result<(), EngineError> {
        self.effects.push(Effect::TunnelPeers(peers));
        Ok(())
    }

    fn fib_get(&self, prefix: &IpNet) -> Option<NextHop> {
        self.fib.get(prefix).copied()
    }

    fn fib_len(&self) -> usize {
        self.fib.len()
    }

    fn fib_apply(&mut self, changes: Vec<FibChange>) -> Result<(), EngineError> {
        for c in &changes {
            match *c {
                FibChange::Upsert { prefix, next_hop } => {
                    self.fib.insert(prefix, next_hop);
                }
                FibChange::Remove { prefix } => {
                    self.fib.remove(&prefix);
                }
            }
        }
        self.effects.push(Effect::Fib(changes));
        Ok(())
    }

    fn steer_node(&mut self, node: Option<Ipv4Addr>, vxlan_port: u16) -> Result<(), EngineError> {
        self.effects.push(Effect::SteerNode(node, vxlan_port));
        Ok(())
    }

    fn steer_add(&mut self, key: SteerKey) -> Result<bool, EngineError> {
        if self.steered >= self.steer_capacity {
            return Ok(false);
        }
        self.steered += 1;
        self.effects.push(Effect::SteerAdd(key));
        Ok(true)
    }

    fn steer_remove(&mut self, key: SteerKey) -> Result<(), EngineError> {
        self.steered = self.steered.saturating_sub(1);
        self.effects.push(Effect::SteerRemove(key));
        Ok(())
    }

    fn resolve(&mut self, addr: Ipv4Addr) {
        self.effects.push(Effect::Resolve(addr));
    }

    fn worker_count(&self) -> usize {
        self.workers
    }

    fn cores(&self) -> Vec<Option<usize>> {
        vec![None; self.workers]
    }

    fn snapshots(&self) -> Vec<Option<WorkerSnapshot>> {
        vec![Some(WorkerSnapshot::default()); self.workers]
    }

    fn shutdown(&mut self) -> Vec<WorkerSnapshot> {
        vec![WorkerSnapshot::default(); self.workers]
    }

    fn publish_policy(&mut self, view: Arc<PolicyView>) {
        let workloads = (0..=PortId::MAX)
            .take_while(|&i| usize::from(i) < view.slots())
            .filter(|&i| view.workload(i).is_some())
            .collect();
        self.effects.push(Effect::Policy {
            generation: view.generation(),
            workloads,
        });
    }
}
