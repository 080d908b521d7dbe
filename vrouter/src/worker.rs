//! A forwarding worker: one arena, its ports, one pipeline, one loop.
//!
//! [`Worker::poll_once`] is one iteration: for each port, `rx_burst` ->
//! pipeline -> `tx_burst` on every port that got frames -> free what a full
//! TX ring refused; then every port's `poll(now)` (completions, refill,
//! wake-ups). Pinning to a core, adaptive polling (back off when idle) and the
//! control channel that changes ports and neighbours belong to the daemon
//! issue; they wrap this loop without changing it.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::time::Instant;
//!
//! use brindle_vrouter::demo::frames::udp_frame;
//! use brindle_vrouter::endpoint::{Endpoint, GATEWAY_MAC};
//! use brindle_vrouter::fib::{Fib, NextHop};
//! use brindle_vrouter::frame::FrameArena;
//! use brindle_vrouter::pipeline::PipelineConfig;
//! use brindle_vrouter::port::MemoryPort;
//! use brindle_vrouter::worker::Worker;
//!
//! let (mut fib, reader) = Fib::new();
//! let node = "192.168.0.1".parse()?;
//! let mut worker = Worker::new(FrameArena::new_heap(64, 2048), PipelineConfig::new(node, 24), reader);
//! let (a_mac, b_mac) = ([0x0a, 0x58, 0, 0, 0, 2], [0x0a, 0x58, 0, 0, 0, 3]);
//! let (a, b): (Ipv4Addr, Ipv4Addr) = ("10.65.0.2".parse()?, "10.65.0.3".parse()?);
//! let (port_a, pod_a) = MemoryPort::new("pod-a", GATEWAY_MAC, 1500);
//! let (port_b, pod_b) = MemoryPort::new("pod-b", GATEWAY_MAC, 1500);
//! worker.add_port(Box::new(port_a), Endpoint::pod(vec![a.into()], Some(a_mac), 1500));
//! let b_id = worker.add_port(Box::new(port_b), Endpoint::pod(vec![b.into()], Some(b_mac), 1500));
//! fib.insert("10.65.0.3/32".parse()?, NextHop::Local { port: b_id });
//!
//! pod_a.inject(&udp_frame(a_mac, GATEWAY_MAC, a, b, 64, b"hello"));
//! worker.poll_once(Instant::now());
//!
//! let sent = pod_b.take_transmitted();
//! assert_eq!(sent.len(), 1);
//! assert_eq!(&sent[0][..6], &b_mac); // to pod B, from ee:ee:ee:ee:ee:ee
//! assert_eq!(sent[0][14 + 8], 63); // TTL decremented
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Instant;

use crate::counters::{Counters, DropReason};
use crate::endpoint::{Endpoint, PortTable};
use crate::fib::FibReader;
use crate::frame::{FrameArena, FrameDesc, Port, PortId};
use crate::pipeline::{BURST, Pipeline, PipelineConfig, TxBatches};

/// Packets and bytes one port received and transmitted (counted per burst,
/// not per frame).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames the port took for transmission.
    pub tx_packets: u64,
    /// Bytes the port took for transmission.
    pub tx_bytes: u64,
}

/// One poll-mode worker.
pub struct Worker {
    arena: FrameArena,
    ports: Vec<Box<dyn Port>>,
    port_stats: Vec<PortStats>,
    pipeline: Pipeline,
    rx: [FrameDesc; BURST],
    tx: TxBatches,
}

impl Worker {
    /// A worker with no ports yet.
    pub fn new(arena: FrameArena, cfg: PipelineConfig, fib: FibReader) -> Self {
        Worker {
            arena,
            ports: Vec::new(),
            port_stats: Vec::new(),
            pipeline: Pipeline::new(cfg, PortTable::default(), fib),
            rx: [FrameDesc::default(); BURST],
            tx: TxBatches::new(0),
        }
    }

    /// Adds `port`, described by `endpoint`; returns its id (the id FIB
    /// routes to it use).
    pub fn add_port(&mut self, port: Box<dyn Port>, endpoint: Endpoint) -> PortId {
        let id = self.pipeline.ports_mut().push(endpoint);
        debug_assert_eq!(id as usize, self.ports.len());
        self.ports.push(port);
        self.port_stats.push(PortStats::default());
        self.tx.add_port();
        id
    }

    /// Puts `port` and `endpoint` in slot `id` (a slot freed by
    /// [`Worker::detach_port`], or the next new one); the old port is
    /// released into the arena. Returns `false`, changing nothing, if `id`
    /// is past the next new slot.
    pub fn set_port(&mut self, id: PortId, port: Box<dyn Port>, endpoint: Endpoint) -> bool {
        let i = id as usize;
        if i == self.ports.len() {
            self.add_port(port, endpoint);
            return true;
        }
        if i > self.ports.len() {
            return false;
        }
        let old = std::mem::replace(&mut self.ports[i], port);
        old.release(&mut self.arena);
        if let Some(ep) = self.pipeline.ports_mut().get_mut(id) {
            *ep = endpoint;
        }
        self.port_stats[i] = PortStats::default();
        true
    }

    /// Closes the port in slot `id` and gives its frames back; the slot
    /// keeps a detached placeholder (no frames in or out, anti-spoofing
    /// with no allowed address) until [`Worker::set_port`] reuses it.
    pub fn detach_port(&mut self, id: PortId) -> bool {
        if id as usize >= self.ports.len() {
            return false;
        }
        self.set_port(
            id,
            Box::new(crate::port::DetachedPort),
            Endpoint::pod(Vec::new(), None, 0),
        )
    }

    /// Per-port packet and byte counts.
    pub fn port_stats(&self, id: PortId) -> Option<PortStats> {
        self.port_stats.get(id as usize).copied()
    }

    /// Blocks until a port with a wait descriptor has frames to receive,
    /// or `timeout_ms` passes (interrupt polling). Returns at once when no
    /// port has one. The descriptor list is built per wait: only idle
    /// workers wait.
    pub fn wait_for_frames(&self, timeout_ms: u16) {
        use nix::poll::{PollFd, PollFlags, poll};
        let mut borrowed = Vec::new();
        for p in &self.ports {
            p.wait_fds(&mut borrowed);
        }
        let mut fds: Vec<PollFd<'_>> = borrowed
            .into_iter()
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        if fds.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(u64::from(timeout_ms)));
            return;
        }
        // EINTR and the like just end the wait early.
        let _ = poll(&mut fds, timeout_ms);
    }

    /// Number of port slots (attached and detached).
    pub fn port_slots(&self) -> usize {
        self.ports.len()
    }

    /// The arena (for its free count, or the UMEM to bind sockets to).
    pub fn arena(&self) -> &FrameArena {
        &self.arena
    }

    /// The pipeline (port table, neighbours, counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline, writable.
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        *self.pipeline.counters()
    }

    /// The port `id`.
    pub fn port(&self, id: PortId) -> Option<&dyn Port> {
        self.ports.get(id as usize).map(|p| &**p)
    }

    /// One loop iteration at `now`; returns how many frames were received.
    pub fn poll_once(&mut self, now: Instant) -> usize {
        let mut received = 0;
        for ingress in 0..self.ports.len() {
            let n = self.ports[ingress].rx_burst(&mut self.arena, &mut self.rx);
            if n == 0 {
                continue;
            }
            received += n;
            let stats = &mut self.port_stats[ingress];
            stats.rx_packets += n as u64;
            stats.rx_bytes += self.rx[..n].iter().map(|d| u64::from(d.len)).sum::<u64>();
            self.pipeline.process(
                &mut self.arena,
                ingress as PortId,
                &self.rx[..n],
                &mut self.tx,
                now,
            );
            self.flush();
        }
        for port in &mut self.ports {
            port.poll(&mut self.arena, now);
        }
        received
    }

    /// Transmits every non-empty TX batch; frees and counts what the ports
    /// refuse.
    fn flush(&mut self) {
        for (id, port) in self.ports.iter_mut().enumerate() {
            let Some(batch) = self.tx.batch_mut(id as PortId) else {
                continue;
            };
            if batch.is_empty() {
                continue;
            }
            let taken = port.tx_burst(&mut self.arena, batch);
            let bytes = batch[..taken].iter().map(|d| u64::from(d.len)).sum::<u64>();
            let stats = &mut self.port_stats[id];
            stats.tx_packets += taken as u64;
            stats.tx_bytes += bytes;
            let counters = self.pipeline.counters_mut();
            counters.tx_packets += taken as u64;
            counters.tx_bytes += bytes;
            for d in &batch[taken..] {
                self.arena.free(d.addr);
                counters.drop(DropReason::TxRingFull);
            }
            batch.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Worker>();
    }
}
