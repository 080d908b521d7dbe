//! The running dataplane: the workers on their threads over one shared UMEM
//! (or a heap arena for AF_PACKET), the FIB writer whose readers they hold,
//! the steering maps, and how ports are opened and placed on workers.
//! [`Dataplane::open`] is the one way both `run` and `serve` start it.
//!
//! The engine takes orders and does them; what to do is decided by
//! [`crate::control`], which owns the state.

pub mod attach;
pub mod tap;
pub mod worker_thread;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use brindle_xsk::{
    BindMode, BusyPoll, Role, Steering, SteeringConfig, Umem, UmemConfig, UmemHandle, XdpMode,
};
use serde::Deserialize;

use crate::endpoint::{Endpoint, PortKind};
use crate::fib::Fib;
use crate::frame::{Port, PortId};
use crate::pipeline::PipelineConfig;
use crate::policy::PolicyCell;
use crate::port::handoff::FrameHomes;
use crate::port::packet::PacketPort;
use crate::port::xdp::{FillSizing, LinkInfo, XdpPort, XdpPortConfig, uplink_fill_budget};
pub use attach::{AttachDevice, Attached, PortAttach};
pub use worker_thread::{
    Arenas, BATCH_BUCKETS, Polling, WorkerCmd, WorkerHandle, WorkerSnapshot, poll_loop, spawn_all,
};

/// Which socket kind ports use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// AF_XDP, falling back to AF_PACKET per port with a log line saying why.
    #[default]
    Auto,
    /// AF_XDP only; fail if a port cannot be opened.
    #[serde(alias = "af_xdp")]
    Xdp,
    /// AF_PACKET only.
    #[serde(alias = "af_packet")]
    Packet,
}

/// Preferred busy polling's socket settings (`Polling::BusyPoll`).
pub const BUSY_POLL: BusyPoll = BusyPoll {
    usecs: 20,
    budget: 64,
};

/// What the dataplane is started with.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// One worker per core, pinned; empty: one unpinned worker.
    pub cores: Vec<usize>,
    /// How idle workers wait.
    pub polling: Polling,
    /// Which socket kind ports use.
    pub io: IoMode,
    /// UMEM frames of 2048 B (or heap arena frames).
    pub umem_frames: u32,
    /// Descriptors per AF_XDP ring; `None`: the port's defaults.
    pub ring_size: Option<u32>,
    /// Zero-copy, copy or either.
    pub bind: BindMode,
    /// Native, generic or either.
    pub xdp_mode: XdpMode,
    /// Flows each worker's connection table holds (network policy).
    pub flows_per_worker: usize,
}

/// What the engine could not do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The UMEM or the steering maps could not be made (with `io = xdp`).
    #[error("UMEM of {frames} x 2048 B ({} KiB) and steering maps: {error}", u64::from(*frames) * 2)]
    Umem {
        /// Frames asked for.
        frames: u32,
        /// Why.
        error: brindle_xsk::Error,
    },
    /// A heap arena or the hand-off mailboxes could not be made.
    #[error("frame arenas: {0}")]
    Arena(std::io::Error),
    /// A worker thread could not be started.
    #[error("start the workers: {0}")]
    Spawn(std::io::Error),
    /// The interface's MAC/MTU could not be read (no such interface).
    #[error("port {name}: {error}")]
    Link {
        /// Interface.
        name: String,
        /// Why.
        error: std::io::Error,
    },
    /// An AF_XDP socket could not be opened (with `io = xdp`).
    #[error("AF_XDP port {name}: {error}")]
    Xdp {
        /// Interface.
        name: String,
        /// Why.
        error: brindle_xsk::Error,
    },
    /// An AF_PACKET socket could not be opened.
    #[error("AF_PACKET port {name}: {error}")]
    Packet {
        /// Interface.
        name: String,
        /// Why.
        error: brindle_xsk::Error,
    },
    /// A TAP port could not be attached (no such device in that
    /// namespace, not a persistent multi-queue TAP, no namespace there).
    #[error("TAP port {name}: {error}")]
    Tap {
        /// Port.
        name: String,
        /// Why.
        error: brindle_xsk::Error,
    },
    /// A worker no longer takes commands.
    #[error("worker {0} has stopped")]
    WorkerGone(usize),
    /// A FIB change was refused.
    #[error("FIB: {0}")]
    Fib(crate::fib::FibError),
    /// A steering map update failed.
    #[error("steering map: {0}")]
    Steering(brindle_xsk::Error),
}

/// The socket kind a port got.
pub type Backend = &'static str;

/// An opened port's parts, by worker.
pub type PortParts = Vec<(usize, Box<dyn Port>)>;

/// The running workers and what they share.
pub struct Dataplane {
    workers: Vec<WorkerHandle>,
    homes: Arc<FrameHomes>,
    fib: Fib,
    steering: Option<Steering>,
    umem: Option<UmemHandle>,
    xdp: XdpPortConfig,
    io: IoMode,
    policy: PolicyCell,
    /// Every TAP port's counters by port name (dead once its queues are
    /// released).
    tap_stats: std::sync::Mutex<Vec<(String, std::sync::Weak<crate::port::tap::TapPortStats>)>>,
}

impl Dataplane {
    /// Makes the arenas (one UMEM split over the workers, or a heap arena
    /// and one worker for AF_PACKET), the steering maps and the FIB, and
    /// starts one worker per core with `pipeline`. Workers poll until
    /// `stop` is set or [`Dataplane::shutdown`].
    pub fn open(
        cfg: &EngineConfig,
        pipeline: &PipelineConfig,
        stop: &Arc<AtomicBool>,
    ) -> Result<Dataplane, EngineError> {
        let wanted = cfg.cores.len().max(1);
        let frames = cfg.umem_frames;
        let heap = |why: &str| -> Result<Arenas, EngineError> {
            if wanted > 1 {
                tracing::warn!(
                    cores = ?cfg.cores,
                    "{why}: one worker (AF_PACKET frames live in a heap arena that workers cannot share)"
                );
            }
            Arenas::heap(frames).map_err(EngineError::Arena)
        };
        let (arenas, steering) = match cfg.io {
            IoMode::Packet => (heap("io = packet")?, None),
            io => {
                let opened = Umem::new(UmemConfig {
                    frame_count: frames,
                    ..UmemConfig::default()
                })
                .and_then(|u| Ok((u, Steering::new(SteeringConfig::default())?)));
                match opened {
                    Ok((umem, steering)) => (
                        Arenas::shared_umem(umem, wanted).map_err(EngineError::Arena)?,
                        Some(steering),
                    ),
                    Err(error) if io == IoMode::Auto => {
                        tracing::warn!(%error, "AF_XDP unavailable: every port uses AF_PACKET (one copy per frame)");
                        (heap("AF_XDP unavailable")?, None)
                    }
                    Err(error) => return Err(EngineError::Umem { frames, error }),
                }
            }
        };
        let umem = arenas.umem.clone();
        let homes = arenas.homes.clone();
        let mut xdp = XdpPortConfig {
            umem_frames: arenas.arenas[0].frames(),
            frame_size: arenas.arenas[0].frame_size(),
            ..XdpPortConfig::default()
        };
        xdp.fill_budget = uplink_fill_budget(frames, wanted, xdp.socket.fill_size);
        if let Some(ring) = cfg.ring_size {
            xdp.socket.rx_size = ring;
            xdp.socket.tx_size = ring;
            xdp.socket.fill_size = ring;
            xdp.socket.comp_size = ring;
            xdp.fill_budget = xdp.fill_budget.min(ring);
        }
        xdp.socket.mode = cfg.bind;
        xdp.xdp_mode = cfg.xdp_mode;
        if cfg.polling == Polling::BusyPoll {
            xdp.socket.busy_poll = Some(BUSY_POLL);
        }
        let (fib, reader) = Fib::new();
        drop(reader);
        let mut workers = arenas.into_workers(pipeline, &fib);
        let policy = PolicyCell::new();
        for w in &mut workers {
            let flows = w.pipeline_mut().flows_mut();
            flows.set_reader(policy.reader());
            flows.set_capacity(cfg.flows_per_worker);
        }
        let workers =
            spawn_all(workers, &cfg.cores, cfg.polling, stop).map_err(EngineError::Spawn)?;
        Ok(Dataplane {
            workers,
            homes,
            fib,
            steering,
            umem,
            xdp,
            io: cfg.io,
            policy,
            tap_stats: Default::default(),
        })
    }

    /// Where the control thread publishes network policy for the workers.
    pub fn policy(&self) -> &PolicyCell {
        &self.policy
    }

    /// How many workers run.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// The workers' cores (`None`: not pinned).
    pub fn cores(&self) -> Vec<Option<usize>> {
        self.workers.iter().map(|w| w.core).collect()
    }

    /// The FIB writer.
    pub fn fib(&self) -> &Fib {
        &self.fib
    }

    /// The FIB writer, to change routes.
    pub fn fib_mut(&mut self) -> &mut Fib {
        &mut self.fib
    }

    /// The steering maps (AF_XDP only).
    pub fn steering(&self) -> Option<&Steering> {
        self.steering.as_ref()
    }

    /// Sets the node address and VXLAN port in the steering map.
    pub fn steer_node(&self, node: Option<Ipv4Addr>, vxlan_port: u16) -> Result<(), EngineError> {
        match &self.steering {
            Some(s) => s.set_node(node, vxlan_port).map_err(EngineError::Steering),
            None => Ok(()),
        }
    }

    /// Opens `name` and splits it over the workers: an AF_XDP port's
    /// queues spread from worker `first`; an AF_PACKET port (asked for, or
    /// the fallback with `io = auto`) goes whole to `first`. A pod
    /// (`kind`) gets a pod's fill rings whatever its steering `role`.
    /// Returns the parts by worker and the socket kind.
    pub fn open_port(
        &self,
        name: &str,
        role: Role,
        kind: PortKind,
        link: LinkInfo,
        first: usize,
    ) -> Result<(PortParts, Backend), EngineError> {
        let first = first % self.workers.len().max(1);
        let packet = |why: Option<String>| {
            if let Some(why) = why {
                tracing::warn!(port = %name, reason = %why, "AF_XDP cannot be opened: falling back to AF_PACKET (one copy per frame)");
            }
            let mut p = PacketPort::open(name, link).map_err(|error| EngineError::Packet {
                name: name.to_owned(),
                error,
            })?;
            p.set_home(self.homes.home(first));
            let parts: PortParts = vec![(first, Box::new(p))];
            Ok((parts, "af_packet"))
        };
        match (&self.umem, &self.steering, self.io) {
            (_, _, IoMode::Packet) => packet(None),
            (Some(umem), Some(steering), io) => {
                let fill = if kind == PortKind::Pod {
                    FillSizing::Pod
                } else {
                    FillSizing::Uplink
                };
                match XdpPort::open(umem, steering, name, role, fill, link, &self.xdp) {
                    Ok(p) => {
                        let parts = p
                            .split(self.workers.len(), first)
                            .into_iter()
                            .map(|(w, mut part)| {
                                part.set_home(self.homes.home(w));
                                (w, Box::new(part) as Box<dyn Port>)
                            })
                            .collect();
                        Ok((parts, "af_xdp"))
                    }
                    Err(e) if io == IoMode::Auto => packet(Some(e.to_string())),
                    Err(error) => Err(EngineError::Xdp {
                        name: name.to_owned(),
                        error,
                    }),
                }
            }
            _ => packet(Some("no UMEM".into())),
        }
    }

    /// Puts an opened port in slot `id` of every worker: its parts where
    /// they belong, stand-ins elsewhere. Returns the owning workers.
    pub fn install_port(
        &self,
        id: PortId,
        name: &str,
        link: LinkInfo,
        parts: PortParts,
        endpoint: &Endpoint,
    ) -> Result<Vec<usize>, EngineError> {
        let owners: Vec<usize> = parts.iter().map(|(w, _)| *w).collect();
        // The worker of a pod port's first part keeps the pod's flows with
        // the uplink and the host port (a TAP pod has a part on every
        // worker; a veth pod's only part is its owner): every worker is
        // told with the port (one command: the port and its flow home are
        // in force together), so a frame of such a flow read elsewhere goes
        // there.
        let flow_home = (endpoint.kind == crate::endpoint::PortKind::Pod && self.workers.len() > 1)
            .then(|| owners.first().copied())
            .flatten();
        let placed = self.homes.place_port(parts, name, link.mac, link.mtu, id);
        for (w, (port, remote)) in placed.into_iter().enumerate() {
            self.send(
                w,
                WorkerCmd::SetPort {
                    id,
                    port,
                    endpoint: endpoint.clone(),
                    remote,
                    flow_home,
                    spread: flow_home.is_some() && owners.len() > 1,
                },
            )?;
        }
        Ok(owners)
    }

    /// Closes slot `id` on every worker.
    pub fn remove_port(&self, id: PortId) -> Result<(), EngineError> {
        self.broadcast(|| WorkerCmd::DetachPort { id })?;
        self.homes.set_peer_mac(id, None);
        Ok(())
    }

    /// Sends one worker a command, and wakes it if it blocks in poll(2)
    /// (an idle worker applies it at once, not after its 100 ms wait).
    pub fn send(&self, worker: usize, cmd: WorkerCmd) -> Result<(), EngineError> {
        self.workers
            .get(worker)
            .ok_or(EngineError::WorkerGone(worker))?
            .tx
            .send(cmd)
            .map_err(|_| EngineError::WorkerGone(worker))?;
        self.homes.home(worker).wake(worker);
        Ok(())
    }

    /// Sends every worker its own copy of `cmd` (neighbours, settings and
    /// slots are per worker: each one routes to every port).
    pub fn broadcast(&self, cmd: impl Fn() -> WorkerCmd) -> Result<(), EngineError> {
        for w in 0..self.workers.len() {
            self.send(w, cmd())?;
        }
        Ok(())
    }

    /// Each worker's counters (`None` for a worker that does not answer).
    pub fn snapshots(&self) -> Vec<Option<WorkerSnapshot>> {
        // Ask them all (waking the idle ones), then collect: one second at
        // most for a stuck worker, whatever the count.
        let pending: Vec<_> = (0..self.workers.len())
            .map(|w| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                self.send(w, WorkerCmd::Snapshot(tx)).ok().map(|()| rx)
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        pending
            .into_iter()
            .map(|rx| rx.and_then(|rx| rx.recv_deadline(deadline).ok()))
            .collect()
    }

    /// Stops the workers and waits for them (ports release their frames,
    /// programs detach); returns each one's last counters, in worker order.
    /// A second call returns defaults.
    pub fn shutdown(&mut self) -> Vec<WorkerSnapshot> {
        // All at once, and awake: an idle worker blocked in poll(2) stops
        // now rather than after its 100 ms wait.
        for (i, w) in self.workers.iter().enumerate() {
            w.request_stop();
            self.homes.home(i).wake(i);
        }
        self.workers
            .iter_mut()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    }
}
