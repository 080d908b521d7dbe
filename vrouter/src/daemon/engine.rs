//! A worker on its own thread, pinned to a core, taking updates from the
//! control thread over a crossbeam channel between two polls, so a port,
//! a neighbour or the node's settings change without stopping it. The FIB
//! needs no message: the worker reads the control thread's FIB through its
//! `FibReader` (one snapshot per burst).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::counters::Counters;
use crate::daemon::spec::Polling;
use crate::endpoint::Endpoint;
use crate::frame::{Port, PortId};
use crate::pipeline::PipelineConfig;
use crate::worker::{PortStats, Worker};

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
    /// Loops that received frames.
    pub busy_polls: u64,
    /// Loops that received none.
    pub idle_polls: u64,
    /// Frames received per non-empty burst, as a histogram of
    /// `BATCH_BUCKETS` upper bounds.
    pub batch_sizes: [u64; BATCH_BUCKETS.len()],
    /// Sum of received-frame counts over busy loops (for the histogram sum).
    pub batch_sum: u64,
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
    thread: Option<JoinHandle<()>>,
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
                poll_loop(&mut worker, &rx, polling, &s, &l);
                // Graceful stop: ports release their frames, programs detach.
                for id in 0..worker.port_slots() {
                    worker.detach_port(id as PortId);
                }
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

    /// Stops the worker and waits for it (its ports are released and their
    /// programs detached before it returns). Idempotent.
    pub fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Stats {
    busy: u64,
    idle: u64,
    batches: [u64; BATCH_BUCKETS.len()],
    batch_sum: u64,
}

fn apply(worker: &mut Worker, cmd: WorkerCmd, stats: &Stats) {
    match cmd {
        WorkerCmd::SetPort { id, port, endpoint } => {
            if !worker.set_port(id, port, endpoint) {
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
            let ports = (0..worker.port_slots())
                .map(|i| worker.port_stats(i as PortId).unwrap_or_default())
                .collect();
            let _ = reply.send(WorkerSnapshot {
                counters: worker.counters(),
                ports,
                busy_polls: stats.busy,
                idle_polls: stats.idle,
                batch_sizes: stats.batches,
                batch_sum: stats.batch_sum,
            });
        }
    }
}

/// Polls until `stop`; applies commands between polls. Adaptive: spin while
/// frames arrive, then sleep between polls (10 µs doubling to 1 ms) after
/// a run of empty ones; the ports' `poll` wakes the kernel only when it asks
/// (need_wakeup), so an idle worker costs near-zero CPU. Interrupt: after
/// the same run of empty polls, block in poll(2) on the ports' sockets.
pub fn poll_loop(
    worker: &mut Worker,
    commands: &Receiver<WorkerCmd>,
    polling: Polling,
    stop: &AtomicBool,
    loops: &AtomicU64,
) {
    const SPIN_BEFORE_SLEEP: u32 = 1024;
    const MIN_SLEEP: Duration = Duration::from_micros(10);
    const MAX_SLEEP: Duration = Duration::from_millis(1);
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
                Err(TryRecvError::Disconnected) => return,
            }
        }
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
            idle_run = 0;
            sleep = MIN_SLEEP;
            continue;
        }
        stats.idle += 1;
        if polling == Polling::Busy {
            continue;
        }
        idle_run = idle_run.saturating_add(1);
        if idle_run <= SPIN_BEFORE_SLEEP {
            continue;
        }
        if polling == Polling::Interrupt {
            // Commands wait at most this long too.
            worker.wait_for_frames(100);
        } else {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(MAX_SLEEP);
        }
    }
}
