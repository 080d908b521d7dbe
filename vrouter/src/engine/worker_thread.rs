//! Workers on their own threads, each pinned to a core, taking updates from
//! the control thread over a crossbeam channel between two polls, so a
//! port, a neighbour or the node's settings change without stopping them.
//! The FIB needs no message: every worker reads the control thread's FIB
//! through its own `FibReader` (one snapshot per burst).
//!
//! Several workers share one UMEM, each owning a range of its chunks
//! ([`crate::port::handoff`]); every worker has a slot for every port,
//! holding the port itself (or its share of the port's queues) where the
//! worker owns it and a [`crate::port::handoff::RemotePort`] elsewhere.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde::Deserialize;

use crate::counters::Counters;
use crate::endpoint::Endpoint;
use crate::fib::Fib;
use crate::frame::FrameArena;
use crate::frame::{Port, PortId, RingStats};
use crate::pipeline::PipelineConfig;
use crate::policy::{Counts, FlowStats, RuleKey};
use crate::port::handoff::FrameHomes;
use crate::worker::{HandoffStats, PortStats, Worker};

/// How a worker waits when there is no traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// Spin on the rings without ever sleeping: lowest latency, one core at
    /// 100 % even when idle.
    Busy,
    /// Spin while frames arrive; after a run of empty polls, sleep between
    /// polls, growing to 1 ms, with need_wakeup so the kernel is woken only
    /// when it asks. An idle vrouter costs near-zero CPU.
    #[default]
    Adaptive,
    /// After a run of empty polls, block in poll(2) on the ports' sockets
    /// (up to 100 ms at a time) until frames arrive: the least CPU when
    /// idle, a wake-up's latency on the first frame of a burst.
    Interrupt,
    /// Preferred busy polling: the AF_XDP sockets get SO_PREFER_BUSY_POLL,
    /// SO_BUSY_POLL (20 µs) and SO_BUSY_POLL_BUDGET (64), every receive
    /// starts with a recvfrom that runs the queue's NAPI in the worker's
    /// context, and the interface gets napi_defer_hard_irqs=2 and
    /// gro_flush_timeout=200000 if it had neither (restored on close), so
    /// the kernel's softirq leaves the queue to the worker. Idle, the worker
    /// blocks in poll(2), which busy-polls too.
    #[serde(rename = "busy-poll", alias = "busy_poll")]
    #[value(name = "busy-poll")]
    BusyPoll,
}

/// An update for a worker.
pub enum WorkerCmd {
    /// Put a port in slot `id` (new or reused).
    SetPort {
        /// The slot.
        id: PortId,
        /// The opened port.
        port: Box<dyn Port>,
        /// Its endpoint.
        endpoint: Endpoint,
        /// The port belongs to another worker (`port` is its stand-in).
        remote: bool,
        /// The worker that keeps the pod's flows with the uplink and the
        /// host port ([`Worker::set_flow_home`]; `None`: not a pod port of
        /// several workers).
        flow_home: Option<usize>,
        /// The port has a part on every worker (a TAP pod).
        spread: bool,
    },
    /// Close the port in slot `id`.
    DetachPort {
        /// The slot.
        id: PortId,
    },
    /// Set (`Some`) or remove (`None`) a neighbour.
    Neighbor {
        /// The port it is on.
        port: PortId,
        /// Its address.
        addr: IpAddr,
        /// Its MAC, or `None` to forget it.
        mac: Option<[u8; 6]>,
    },
    /// Set the pod's MAC on a port (the CNI plugin knew it).
    PeerMac {
        /// The port.
        port: PortId,
        /// The MAC.
        mac: Option<[u8; 6]>,
    },
    /// Replace the node-wide settings.
    Config(PipelineConfig),
    /// Accept tunnels only from these peers (`None`: from any).
    TunnelPeers(Option<Vec<std::net::Ipv4Addr>>),
    /// Send a snapshot of the counters back.
    Snapshot(Sender<WorkerSnapshot>),
}

/// The counters of a worker at one moment.
#[derive(Clone, Debug, Default)]
pub struct WorkerSnapshot {
    /// Pipeline counters.
    pub counters: Counters,
    /// Per port slot.
    pub ports: Vec<PortStats>,
    /// Per port slot: an AF_XDP port's fill target and kernel drops.
    pub rings: Vec<Option<RingStats>>,
    /// Loops that received frames.
    pub busy_polls: u64,
    /// Loops that received none.
    pub idle_polls: u64,
    /// Frames received per non-empty burst, as a histogram of
    /// `BATCH_BUCKETS` upper bounds.
    pub batch_sizes: [u64; BATCH_BUCKETS.len()],
    /// Sum of received-frame counts over busy loops (for the histogram sum).
    pub batch_sum: u64,
    /// Frames exchanged with other workers.
    pub handoff: HandoffStats,
    /// Which slots hold another worker's port (their TX is counted by the
    /// owner).
    pub remote: Vec<bool>,
    /// The worker thread's CPU time in user mode (getrusage RUSAGE_THREAD),
    /// µs: the pipeline and ring handling.
    pub cpu_user_us: u64,
    /// Its CPU time in the kernel, µs: sendto/recvfrom/poll, i.e. copy-mode
    /// TX and RX wake-ups.
    pub cpu_system_us: u64,
    /// The flow table (network policy).
    pub flows: FlowStats,
    /// Per-rule policy counters, by name.
    pub rules: Vec<(RuleKey, Counts)>,
}

/// The calling thread's user and system CPU time in µs.
fn thread_cpu_us() -> (u64, u64) {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let us = |t: nix::sys::time::TimeVal| {
                (t.tv_sec().max(0) as u64) * 1_000_000 + t.tv_usec().max(0) as u64
            };
            (us(u.user_time()), us(u.system_time()))
        }
        Err(_) => (0, 0),
    }
}

/// Upper bounds of the batch-size histogram buckets.
pub const BATCH_BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The control thread's side of a running worker.
pub struct WorkerHandle {
    /// Where updates go.
    pub tx: Sender<WorkerCmd>,
    /// Loops since start: liveness (it advances while the worker polls).
    pub loops: Arc<AtomicU64>,
    /// The core it is pinned to.
    pub core: Option<usize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<WorkerSnapshot>>,
}

impl WorkerHandle {
    /// Starts `worker` on a thread pinned to `core`.
    pub fn spawn(
        index: usize,
        mut worker: Worker,
        core: Option<usize>,
        polling: Polling,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<WorkerHandle> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let loops = Arc::new(AtomicU64::new(0));
        let (l, s) = (loops.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                if let Some(id) = core
                    && !core_affinity::set_for_current(core_affinity::CoreId { id })
                {
                    tracing::warn!(worker = index, core = id, "could not pin the worker");
                }
                let last = poll_loop(&mut worker, &rx, polling, &s, &l);
                // Graceful stop: held frames are dropped (and counted),
                // ports release their frames, programs detach.
                worker.drop_held();
                for id in 0..worker.port_slots() {
                    worker.detach_port(id as PortId);
                }
                last
            })?;
        Ok(WorkerHandle {
            tx,
            loops,
            core,
            stop,
            thread: Some(thread),
        })
    }

    /// Asks for the counters; `None` if the worker did not answer within a
    /// second (it is stuck or gone).
    pub fn snapshot(&self) -> Option<WorkerSnapshot> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.tx.send(WorkerCmd::Snapshot(tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(1)).ok()
    }

    /// Tells the worker to stop after its current poll (without waiting).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the worker and waits for it (its ports are released and their
    /// programs detached before it returns); returns its counters as they
    /// were when it stopped polling (`None` on a second call, or if the
    /// thread panicked).
    pub fn join(&mut self) -> Option<WorkerSnapshot> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

/// The arenas of `workers` workers and what they share.
pub struct Arenas {
    /// One per worker.
    pub arenas: Vec<FrameArena>,
    /// The UMEM's handle (AF_XDP), to bind sockets on it.
    pub umem: Option<brindle_xsk::UmemHandle>,
    /// The workers' chunk ranges and mailboxes.
    pub homes: Arc<FrameHomes>,
}

impl Arenas {
    /// Heap arenas for AF_PACKET only: one worker (frames cannot cross
    /// workers without a shared region).
    pub fn heap(frames: u32) -> std::io::Result<Arenas> {
        Ok(Arenas {
            arenas: vec![FrameArena::new_heap(frames, 2048)],
            umem: None,
            homes: FrameHomes::new(1, frames, 2048)?,
        })
    }

    /// `workers` arenas over one UMEM of `umem`'s frames, split in ranges.
    pub fn shared_umem(umem: brindle_xsk::Umem, workers: usize) -> std::io::Result<Arenas> {
        let (frames, frame_size) = (umem.frame_count(), umem.frame_size());
        let (arenas, handle) = crate::port::xdp::umem_arenas(umem, workers.max(1));
        Ok(Arenas {
            arenas,
            umem: Some(handle),
            homes: FrameHomes::new(workers.max(1), frames, frame_size)?,
        })
    }

    /// One worker per arena, each with its range, [`SUPER_SLOTS_PER_WORKER`]
    /// super-packet slots, its own FIB reader and
    /// the same settings.
    pub fn into_workers(self, cfg: &PipelineConfig, fib: &Fib) -> Vec<Worker> {
        let homes = self.homes;
        self.arenas
            .into_iter()
            .enumerate()
            .map(|(i, mut arena)| {
                arena.add_super_slots(SUPER_SLOTS_PER_WORKER);
                let mut w = Worker::new(arena, cfg.clone(), fib.reader());
                w.set_home(homes.home(i));
                w
            })
            .collect()
    }
}

/// Super-packet slots of each worker (TAP ports' TSO packets carried
/// whole): about 66 KiB each, 2.1 MiB per worker, on the heap; each TAP
/// queue keeps one for its next read, the rest are in flight.
pub const SUPER_SLOTS_PER_WORKER: u32 = 32;

/// Starts `workers`, worker `i` pinned to `cores[i]` (unpinned when there
/// is no such core).
pub fn spawn_all(
    workers: Vec<Worker>,
    cores: &[usize],
    polling: Polling,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<Vec<WorkerHandle>> {
    workers
        .into_iter()
        .enumerate()
        .map(|(i, w)| WorkerHandle::spawn(i, w, cores.get(i).copied(), polling, stop.clone()))
        .collect()
}

struct Stats {
    busy: u64,
    idle: u64,
    batches: [u64; BATCH_BUCKETS.len()],
    batch_sum: u64,
}

fn apply(worker: &mut Worker, cmd: WorkerCmd, stats: &Stats) {
    match cmd {
        WorkerCmd::SetPort {
            id,
            port,
            endpoint,
            remote,
            flow_home,
            spread,
        } => {
            if worker.set_port_remote(id, port, endpoint, remote) {
                worker.set_flow_home(id, flow_home, spread);
            } else {
                tracing::error!(port = id, "port slot out of range");
            }
        }
        WorkerCmd::DetachPort { id } => {
            worker.detach_port(id);
        }
        WorkerCmd::Neighbor { port, addr, mac } => {
            let neigh = worker.pipeline_mut().neigh_mut();
            match mac {
                Some(mac) => neigh.insert(port, addr, mac),
                None => neigh.remove(port, addr),
            }
        }
        WorkerCmd::PeerMac { port, mac } => {
            if let Some(ep) = worker.pipeline_mut().ports_mut().get_mut(port) {
                ep.peer_mac = mac;
            }
        }
        WorkerCmd::Config(cfg) => worker.pipeline_mut().set_config(cfg),
        WorkerCmd::TunnelPeers(peers) => worker.pipeline_mut().set_tunnel_peers(peers),
        WorkerCmd::Snapshot(reply) => {
            // An idle worker takes the policy in force too: its rule
            // counters are named against it (rows of deleted policies go).
            worker.pipeline_mut().flows_mut().refresh_view();
            let _ = reply.send(snapshot(worker, stats));
        }
    }
}

fn snapshot(worker: &Worker, stats: &Stats) -> WorkerSnapshot {
    let ports = (0..worker.port_slots())
        .map(|i| worker.port_stats(i as PortId).unwrap_or_default())
        .collect();
    let rings = (0..worker.port_slots())
        .map(|i| worker.port(i as PortId).and_then(|p| p.ring_stats()))
        .collect();
    // Snapshots are taken on the worker's own thread (between polls).
    let (cpu_user_us, cpu_system_us) = thread_cpu_us();
    WorkerSnapshot {
        cpu_user_us,
        cpu_system_us,
        counters: worker.counters(),
        ports,
        rings,
        busy_polls: stats.busy,
        idle_polls: stats.idle,
        batch_sizes: stats.batches,
        batch_sum: stats.batch_sum,
        handoff: worker.handoff_stats(),
        remote: (0..worker.port_slots())
            .map(|i| worker.is_remote(i as PortId))
            .collect(),
        flows: worker.pipeline().flows().stats(),
        rules: worker.pipeline().flows().rule_counts(),
    }
}

/// Polls until `stop`; applies commands between polls. Adaptive: spin while
/// frames move (are sent on: frames that are only consumed or dropped do not
/// count), then sleep between polls (10 µs doubling to 1 ms) after
/// a run of empty ones; the ports' `poll` wakes the kernel only when it asks
/// (need_wakeup); after 64 such sleeps (about 60 ms idle) it blocks in
/// poll(2) as interrupt polling does, up to 100 ms at a time, so an idle
/// worker costs one wake-up per 100 ms whatever its port count. Interrupt and
/// busy-poll: after the same run of empty polls, block in poll(2) on the
/// ports' sockets and the worker's mailbox (another worker handing a frame
/// over wakes it). Returns the counters as they were when it stopped.
pub fn poll_loop(
    worker: &mut Worker,
    commands: &Receiver<WorkerCmd>,
    polling: Polling,
    stop: &AtomicBool,
    loops: &AtomicU64,
) -> WorkerSnapshot {
    const SPIN_BEFORE_SLEEP: u32 = 1024;
    const MIN_SLEEP: Duration = Duration::from_micros(10);
    const MAX_SLEEP: Duration = Duration::from_millis(1);
    const SLEEPS_BEFORE_BLOCKING: u32 = 64;
    let mut stats = Stats {
        busy: 0,
        idle: 0,
        batches: [0; BATCH_BUCKETS.len()],
        batch_sum: 0,
    };
    let mut idle_run = 0u32;
    let mut sleep = MIN_SLEEP;
    while !stop.load(Ordering::Relaxed) {
        loop {
            match commands.try_recv() {
                Ok(cmd) => apply(worker, cmd, &stats),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return snapshot(worker, &stats),
            }
        }
        let moved = worker.frames_moved();
        let n = worker.poll_once(Instant::now());
        loops.fetch_add(1, Ordering::Relaxed);
        if n > 0 {
            stats.busy += 1;
            stats.batch_sum += n as u64;
            let bucket = BATCH_BUCKETS
                .iter()
                .position(|&b| n as u64 <= b)
                .unwrap_or(BATCH_BUCKETS.len() - 1);
            stats.batches[bucket] += 1;
            if stats.busy.is_multiple_of(1024) {
                worker.sync_peer_macs();
            }
            if worker.frames_moved() != moved {
                idle_run = 0;
                sleep = MIN_SLEEP;
                continue;
            }
            // Only consumed or dropped frames (a pod's router
            // solicitations and MLD reports, a stranger's tunnel packet):
            // no flow whose next packet the spin would catch, so the loop
            // goes on idling as if nothing came. An idle node's 110 pods
            // send such frames on their own, each one used to buy ~1,000
            // polls and 64 sleeps.
        } else {
            stats.idle += 1;
            if stats.idle.is_multiple_of(256) {
                worker.sync_peer_macs();
            }
        }
        if polling == Polling::Busy {
            continue;
        }
        idle_run = idle_run.saturating_add(1);
        if idle_run <= SPIN_BEFORE_SLEEP {
            continue;
        }
        if !commands.is_empty() {
            // Apply them before blocking (a command sent now also wakes
            // the worker through its mailbox).
            continue;
        }
        if matches!(polling, Polling::Interrupt | Polling::BusyPoll) {
            // Commands wait at most this long too.
            worker.wait_for_frames(100);
        } else {
            if idle_run > SPIN_BEFORE_SLEEP + SLEEPS_BEFORE_BLOCKING {
                // Idle for tens of ms: block on the ports' sockets and the
                // mailbox instead of waking 1000 times a second to walk
                // every port (what an idle node with many pods paid).
                let t = Instant::now();
                worker.wait_for_frames(100);
                if t.elapsed() < MAX_SLEEP {
                    // No descriptor to wait on (in-memory ports).
                    std::thread::sleep(MAX_SLEEP);
                }
                continue;
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(MAX_SLEEP);
        }
    }
    snapshot(worker, &stats)
}
