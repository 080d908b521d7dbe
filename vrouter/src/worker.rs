//! A forwarding worker: one arena, its ports, one pipeline, one loop.
//!
//! [`Worker::poll_once`] is one iteration: for each port not parked (a TAP
//! queue found empty waits in the worker's epoll set, [`Parking`]), `rx_burst` ->
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

mod parking;

pub use parking::Parking;

use crate::counters::{Counters, DropReason};
use crate::endpoint::{Endpoint, PortTable};
use crate::fib::FibReader;
use crate::frame::{FrameArena, FrameDesc, Port, PortId};
use crate::pipeline::{Away, BURST, Handed, Pipeline, PipelineConfig, TxBatches};
use crate::port::handoff::FrameHome;

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

/// Frames that crossed between this worker and others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffStats {
    /// Frames this worker's pipeline sent to ports of other workers.
    pub out: u64,
    /// Frames other workers handed to this worker's ports.
    pub r#in: u64,
    /// Handed-in frames the port's TX ring refused (returned, dropped).
    pub drops: u64,
    /// Chunks of this worker's range returned by other workers.
    pub returned: u64,
    /// Frames this worker received of a flow another worker keeps (from a
    /// TAP pod's queue or the host port), handed to that worker
    /// unprocessed (in `out` too).
    pub redirected: u64,
}

/// One poll-mode worker.
pub struct Worker {
    arena: FrameArena,
    ports: Vec<Box<dyn Port>>,
    port_stats: Vec<PortStats>,
    /// Slots whose port belongs to another worker ([`crate::port::handoff::RemotePort`]).
    remote: Vec<bool>,
    pipeline: Pipeline,
    rx: [FrameDesc; BURST],
    tx: TxBatches,
    home: Option<FrameHome>,
    /// Frames handed in by other workers, per port slot (capacity BURST,
    /// reserved when the slot is made).
    handed: Vec<Vec<FrameDesc>>,
    handoff: HandoffStats,
    /// Ports not read until their descriptor says frames arrived.
    parking: Parking,
}

impl Worker {
    /// A worker with no ports yet.
    pub fn new(arena: FrameArena, cfg: PipelineConfig, fib: FibReader) -> Self {
        Worker {
            arena,
            ports: Vec::new(),
            port_stats: Vec::new(),
            remote: Vec::new(),
            pipeline: Pipeline::new(cfg, PortTable::default(), fib),
            rx: [FrameDesc::default(); BURST],
            tx: TxBatches::new(0),
            home: None,
            handed: Vec::new(),
            handoff: HandoffStats::default(),
            parking: Parking::default(),
        }
    }

    /// Makes this worker one of several sharing the arena's memory: only
    /// `home`'s range stays in the free list, chunks of other workers go
    /// back to them, and frames other workers hand over are transmitted.
    pub fn set_home(&mut self, home: FrameHome) {
        home.claim_range(&mut self.arena);
        self.home = Some(home);
    }

    /// This worker's place among the workers, if it shares its arena.
    pub fn home(&self) -> Option<&FrameHome> {
        self.home.as_ref()
    }

    /// Frames this worker has sent on (its pipeline's transmissions and the
    /// frames other workers handed it), ever: the poll loop spins on while
    /// this moves, not while frames only arrive to be consumed or dropped.
    pub fn frames_moved(&self) -> u64 {
        self.pipeline.counters().tx_packets + self.handoff.r#in
    }

    /// Frames exchanged with other workers.
    pub fn handoff_stats(&self) -> HandoffStats {
        self.handoff
    }

    /// Whether slot `id` stands for another worker's port.
    pub fn is_remote(&self, id: PortId) -> bool {
        self.remote.get(id as usize).copied().unwrap_or(false)
    }

    /// Puts `port` in slot `id` like [`Worker::set_port`], marking it as a
    /// stand-in for a port of another worker (`remote`): frames sent there
    /// count as handed off rather than as the port's TX.
    pub fn set_port_remote(
        &mut self,
        id: PortId,
        port: Box<dyn Port>,
        endpoint: Endpoint,
        remote: bool,
    ) -> bool {
        if !remote && let Some(h) = &self.home {
            h.homes().set_peer_mac(id, endpoint.peer_mac);
        }
        if !self.set_port(id, port, endpoint) {
            return false;
        }
        self.remote[id as usize] = remote;
        self.pipeline.flows_mut().set_remote(id, remote);
        if remote {
            // Super-packet slots are the worker's own: never handed over.
            self.pipeline.ports_mut().set_takes_super(id, false);
        }
        true
    }

    /// Says which worker keeps the flows between the pod in slot `id` and
    /// the uplink or the host port: `owner`, the worker of its first part
    /// (a veth pod's owner; for a TAP pod, with a queue on every worker,
    /// the worker of its first queue). On the other workers the pod's
    /// packets towards the uplink or the host port, and the host port's
    /// packets to or from the pod, are handed to it unprocessed, and what
    /// the uplink brings for the pod is handed to it to check and send; so
    /// both directions of such a flow meet one table whichever worker the
    /// uplink's RSS or the host port's queue gives them. `None`, or this
    /// worker: this worker keeps them.
    /// `spread`: the port has a part on every worker (a TAP pod), so its
    /// flows with the node's other pods need one worker too
    /// ([`crate::policy::Flows::pair_home`]).
    pub fn set_flow_home(&mut self, id: PortId, owner: Option<usize>, spread: bool) {
        let me = self.home.as_ref().map(FrameHome::worker);
        let away = owner.filter(|&o| me.is_some_and(|me| me != o));
        let flows = self.pipeline.flows_mut();
        flows.set_flow_home(id, away);
        flows.set_spread(id, spread);
    }

    /// Shares pod MACs learned from frames between workers: a port's owner
    /// publishes what its pipeline learned, the others take it. Cheap
    /// (a pass over the slots); the daemon calls it when idle and now and
    /// then when busy.
    pub fn sync_peer_macs(&mut self) {
        let Some(home) = &self.home else {
            return;
        };
        if home.homes().workers() < 2 {
            return;
        }
        let homes = home.homes().clone();
        for (i, &remote) in self.remote.iter().enumerate() {
            let id = i as PortId;
            let Some(ep) = self.pipeline.ports_mut().get_mut(id) else {
                continue;
            };
            // The owner's MAC wins and is followed when it changes (a pod
            // whose MAC changed after ADD).
            if remote {
                if let Some(mac) = homes.peer_mac(id)
                    && ep.peer_mac != Some(mac)
                {
                    ep.peer_mac = Some(mac);
                }
            } else if ep.peer_mac.is_some() && homes.peer_mac(id) != ep.peer_mac {
                homes.set_peer_mac(id, ep.peer_mac);
            }
        }
    }

    /// Adds `port`, described by `endpoint`; returns its id (the id FIB
    /// routes to it use).
    pub fn add_port(&mut self, port: Box<dyn Port>, endpoint: Endpoint) -> PortId {
        let whole = port.takes_super_packets();
        let id = self.pipeline.ports_mut().push(endpoint);
        self.pipeline.ports_mut().set_takes_super(id, whole);
        debug_assert_eq!(id as usize, self.ports.len());
        self.ports.push(port);
        self.parking.attach(id, &*self.ports[id as usize]);
        self.port_stats.push(PortStats::default());
        self.remote.push(false);
        self.handed.push(Vec::with_capacity(BURST));
        self.tx.add_port();
        id
    }

    /// Puts `port` and `endpoint` in slot `id` (a slot freed by
    /// [`Worker::detach_port`], the next new one, or one past it: the
    /// slots between get detached placeholders, as when a port of a batch
    /// failed to open and the next ones did); the old port is released into
    /// the arena. Always `true` (slots are `PortId`s: bounded).
    pub fn set_port(&mut self, id: PortId, port: Box<dyn Port>, endpoint: Endpoint) -> bool {
        let i = id as usize;
        while self.ports.len() < i {
            self.add_port(
                Box::new(crate::port::DetachedPort),
                Endpoint::pod(Vec::new(), None, 0),
            );
        }
        if i == self.ports.len() {
            self.add_port(port, endpoint);
            return true;
        }
        self.flush_handed(i);
        let whole = port.takes_super_packets();
        self.pipeline.ports_mut().set_takes_super(id, whole);
        self.parking.forget(id, &*self.ports[i]);
        let old = std::mem::replace(&mut self.ports[i], port);
        self.parking.attach(id, &*self.ports[i]);
        old.release(&mut self.arena);
        if let Some(ep) = self.pipeline.ports_mut().get_mut(id) {
            *ep = endpoint;
        }
        self.port_stats[i] = PortStats::default();
        self.remote[i] = false;
        self.pipeline.flows_mut().set_remote(id, false);
        self.pipeline.flows_mut().set_flow_home(id, None);
        self.pipeline.flows_mut().set_spread(id, false);
        true
    }

    /// Closes the port in slot `id` and gives its frames back; the slot
    /// keeps a detached placeholder (no frames in or out, anti-spoofing
    /// with no allowed address) until [`Worker::set_port`] reuses it.
    pub fn detach_port(&mut self, id: PortId) -> bool {
        if id as usize >= self.ports.len() {
            return false;
        }
        self.set_port_remote(
            id,
            Box::new(crate::port::DetachedPort),
            Endpoint::pod(Vec::new(), None, 0),
            false,
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
        for (i, p) in self.ports.iter().enumerate() {
            // Parked ports wait through the one epoll descriptor.
            if !self.parking.is_parked(i) {
                p.wait_fds(&mut borrowed);
            }
        }
        borrowed.extend(self.parking.wait_fd());
        if let Some(home) = &self.home {
            // Another worker handing a frame over, or the control thread
            // sending a command, wakes this one.
            home.set_sleeping(true);
            if home.has_mail() {
                home.set_sleeping(false);
                return;
            }
            borrowed.push(home.wake_fd());
        }
        let _sleeping = SleepGuard(self.home.as_ref());
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

    /// The ports parked now, and how many times the epoll set unparked
    /// one since the worker started.
    pub fn parking(&self) -> &Parking {
        &self.parking
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

    /// Drops (and counts) the frames still waiting for a next hop's MAC,
    /// returning their chunks to the arena: the worker is stopping.
    pub fn drop_held(&mut self) {
        self.pipeline.drop_held(&mut self.arena);
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

    /// One loop iteration at `now`; returns how many frames were received
    /// (from the ports and handed over by other workers).
    pub fn poll_once(&mut self, now: Instant) -> usize {
        let mut received = self.take_mail(now);
        self.parking.take_ready();
        for ingress in 0..self.ports.len() {
            if self.parking.is_parked(ingress) {
                continue;
            }
            let n = self.ports[ingress].rx_burst(&mut self.arena, &mut self.rx);
            if self.ports[ingress].rx_drained() {
                // Not read again before a frame arrives.
                self.parking.park(ingress as PortId);
            }
            let bad = self.ports[ingress].take_rx_dropped();
            if bad > 0 {
                self.port_stats[ingress].rx_packets += bad;
                let c = self.pipeline.counters_mut();
                c.rx_packets += bad;
                c.drops[crate::counters::DropReason::ParseError as usize] += bad;
            }
            if n == 0 {
                continue;
            }
            received += n;
            let stats = &mut self.port_stats[ingress];
            stats.rx_packets += n as u64;
            stats.rx_bytes += self.rx[..n].iter().map(|d| u64::from(d.len)).sum::<u64>();
            // A super-packet cut into segments fills TX batches by dozens:
            // the batches leave after each one (one flush per super-packet,
            // its segments batched), so they never overflow.
            let mut from = 0;
            while from < n {
                let end = self.rx[from..n]
                    .iter()
                    .position(|d| self.arena.is_super(d.addr))
                    .map_or(n, |i| from + i + 1);
                self.pipeline.process(
                    &mut self.arena,
                    ingress as PortId,
                    &self.rx[from..end],
                    &mut self.tx,
                    now,
                );
                self.flush();
                from = end;
            }
        }
        if self.pipeline.held_frames() > 0 {
            // Frames waiting for a next hop's MAC leave as soon as it is
            // known (an entry the control thread set arrives without a
            // frame) and are freed when they waited too long.
            self.pipeline.poll_held(&mut self.arena, &mut self.tx, now);
            self.flush();
        }
        for port in &mut self.ports {
            port.poll(&mut self.arena, now);
        }
        received
    }

    /// Takes back returned chunks and transmits the frames other workers
    /// handed over; returns how many were handed over.
    fn take_mail(&mut self, now: Instant) -> usize {
        let Some(home) = &self.home else {
            return 0;
        };
        self.handoff.returned += home.take_returns(&mut self.arena) as u64;
        let mut handed = 0;
        // Bounded per loop so a flood from other workers cannot starve
        // this worker's own receive queues.
        while handed < 4 * BURST {
            let Some(home) = &self.home else { break };
            let Some((id, desc)) = home.next_handed() else {
                break;
            };
            handed += 1;
            let i = id as usize;
            if i >= self.handed.len() || self.remote[i] {
                // The port left this worker meanwhile.
                home.free(&mut self.arena, desc.addr);
                self.handoff.drops += 1;
                continue;
            }
            // A pod's flows are checked by the worker that owns its port;
            // the reply of a flow from the host port goes back to it.
            let i = match self
                .pipeline
                .police_handed(self.arena.data_mut(desc), id, now)
            {
                Handed::Send => i,
                Handed::ToHost(h) if !self.remote.get(h as usize).copied().unwrap_or(true) => {
                    h as usize
                }
                Handed::ToHost(_) => {
                    // No host queue on this worker (the TAP has one per
                    // worker, so only while it is being opened).
                    home.free(&mut self.arena, desc.addr);
                    self.handoff.drops += 1;
                    continue;
                }
                Handed::Drop => {
                    home.free(&mut self.arena, desc.addr);
                    continue;
                }
            };
            self.handed[i].push(desc);
            if self.handed[i].len() == BURST {
                self.flush_handed(i);
            }
        }
        for i in 0..self.handed.len() {
            self.flush_handed(i);
        }
        // Frames another worker received from a pod whose flows this one
        // keeps: through this pipeline, as if received here. Copied into a
        // chunk of this worker (the pipeline frees into its own arena),
        // the other's chunk going home at once.
        let mut received = 0;
        while received < BURST {
            let Some(home) = &self.home else { break };
            let Some((ingress, desc)) = home.next_received() else {
                break;
            };
            received += 1;
            let copy = self.arena.copy_frame(desc);
            home.free(&mut self.arena, desc.addr);
            let i = ingress as usize;
            match copy {
                Some(c) if i < self.ports.len() && !self.remote[i] => {
                    let stats = &mut self.port_stats[i];
                    stats.rx_packets += 1;
                    stats.rx_bytes += u64::from(c.len);
                    self.pipeline
                        .process(&mut self.arena, ingress, &[c], &mut self.tx, now);
                }
                Some(c) => {
                    // The port left this worker meanwhile.
                    self.arena.free(c.addr);
                    self.handoff.drops += 1;
                }
                None => self.handoff.drops += 1,
            }
        }
        if received > 0 {
            self.flush();
        }
        self.handoff.r#in += (handed + received) as u64;
        handed + received
    }

    /// Transmits the frames handed in for slot `i`; refused ones go back
    /// to their owner and count as hand-off drops.
    fn flush_handed(&mut self, i: usize) {
        if self.handed[i].is_empty() {
            return;
        }
        let batch = &self.handed[i];
        let taken = self.ports[i].tx_burst(&mut self.arena, batch);
        let stats = &mut self.port_stats[i];
        stats.tx_packets += taken as u64;
        stats.tx_bytes += batch[..taken].iter().map(|d| u64::from(d.len)).sum::<u64>();
        if let Some(home) = &self.home {
            for d in &batch[taken..] {
                home.free(&mut self.arena, d.addr);
                self.handoff.drops += 1;
            }
        }
        self.handed[i].clear();
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
            if self.remote[id] {
                // The owner counts the port's TX when it transmits.
                self.handoff.out += taken as u64;
            } else {
                let stats = &mut self.port_stats[id];
                stats.tx_packets += taken as u64;
                stats.tx_bytes += bytes;
            }
            let (gro, merged) = port.take_tx_coalesced();
            let counters = self.pipeline.counters_mut();
            counters.tx_packets += taken as u64;
            counters.tx_bytes += bytes;
            counters.gro_super += gro;
            counters.gro_segments += merged;
            for d in &batch[taken..] {
                self.arena.free(d.addr);
                counters.drop(DropReason::TxRingFull);
            }
            batch.clear();
        }
        if !self.tx.away_mut().is_empty() {
            self.flush_away();
        }
    }

    /// Hands the frames the pipeline gave other workers ([`Away`]) to
    /// their mailboxes, waking each owner once. Counted as the pipeline's
    /// TX to another worker's port is: a frame handed to be sent as
    /// `tx_packets` (the owner counts its port's TX), one handed to be
    /// received not at all (the owner counts it received); a full mailbox
    /// (or no other worker) drops it as `tx_ring_full`.
    #[cold]
    fn flush_away(&mut self) {
        let mut woken = 0u64;
        for away in self.tx.away_mut().drain(..) {
            let (owner, desc, receive) = match away {
                Away::Send { owner, desc, .. } => (owner, desc, false),
                Away::Receive { owner, desc, .. } => (owner, desc, true),
            };
            let sent = self.home.as_ref().is_some_and(|h| match away {
                Away::Send { owner, port, desc } => h.hand_off(owner, port, desc),
                Away::Receive {
                    owner,
                    ingress,
                    desc,
                } => h.hand_received(owner, ingress, desc),
            });
            let counters = self.pipeline.counters_mut();
            if !sent {
                self.arena.free(desc.addr);
                if receive {
                    counters.rx_packets += 1;
                    counters.rx_bytes += u64::from(desc.len);
                }
                counters.drop(DropReason::TxRingFull);
                continue;
            }
            self.handoff.out += 1;
            if receive {
                self.handoff.redirected += 1;
            } else {
                counters.tx_packets += 1;
                counters.tx_bytes += u64::from(desc.len);
            }
            if owner >= 64 || woken & (1 << owner) == 0 {
                woken |= 1u64.checked_shl(owner as u32).unwrap_or(0);
                if let Some(h) = &self.home {
                    h.wake(owner);
                }
            }
        }
    }
}

/// Clears the sleeping mark when a wait ends.
struct SleepGuard<'a>(Option<&'a FrameHome>);

impl Drop for SleepGuard<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.set_sleeping(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_past_the_next_new_one_is_taken_and_the_gap_is_detached() {
        // A batch's port in slot 1 failed to open, the one in slot 2 did:
        // slot 2 must be installed (was: refused, the port silently
        // missing on the worker while the control state listed it).
        let (_fib, reader) = crate::fib::Fib::new();
        let mut w = Worker::new(
            FrameArena::new_heap(64, 2048),
            PipelineConfig::new(std::net::Ipv4Addr::new(10, 0, 0, 1), 24),
            reader,
        );
        let port = |name: &str| {
            Box::new(crate::port::memory::MemoryPort::new(name, [2, 0, 0, 0, 0, 1], 1500).0)
                as Box<dyn Port>
        };
        let ep = |a: &str| Endpoint::pod(vec![a.parse().unwrap()], None, 1500);
        assert!(w.set_port(0, port("p0"), ep("10.65.0.2")));
        assert!(w.set_port(2, port("p2"), ep("10.65.0.4")));
        assert_eq!(w.port_slots(), 3);
        assert_eq!(w.port(2).map(|p| p.name().to_owned()), Some("p2".into()));
        assert_eq!(
            w.pipeline().ports().get(2).map(|e| e.addrs.clone()),
            Some(vec!["10.65.0.4".parse().unwrap()])
        );
        assert!(
            w.pipeline()
                .ports()
                .get(1)
                .is_some_and(|e| e.addrs.is_empty())
        );
        // The gap is a free slot like any detached one.
        assert!(w.set_port(1, port("p1"), ep("10.65.0.3")));
        assert_eq!(w.port(1).map(|p| p.name().to_owned()), Some("p1".into()));
    }

    #[test]
    fn a_worker_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Worker>();
    }
}
