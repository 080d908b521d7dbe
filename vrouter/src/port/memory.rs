//! In-memory ports.
//!
//! [`MemoryPort`] is a pair of queues shared with a [`MemoryPortHandle`]: a
//! test injects frames through the handle, the worker receives them with
//! `rx_burst` (copied into arena chunks behind [`RX_HEADROOM`], as the kernel
//! lays out AF_XDP frames), and what the worker transmits is copied out for
//! the test to collect. The queues sit behind a mutex taken once per burst,
//! never per frame.
//!
//! [`ReplayPort`] is for benchmarks: it re-copies pre-built templates into
//! free chunks on every `rx_burst` and frees transmitted chunks at once, so
//! the port costs a 64-byte copy per frame and nothing else.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll, RX_HEADROOM};

#[derive(Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    /// How many more frames `tx_burst` accepts (`None`: unlimited), to
    /// simulate a full TX ring.
    tx_room: Option<usize>,
}

/// A port whose wire is a pair of in-memory queues.
pub struct MemoryPort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    queues: Arc<Mutex<Queues>>,
}

/// The test's side of a [`MemoryPort`].
#[derive(Clone)]
pub struct MemoryPortHandle {
    queues: Arc<Mutex<Queues>>,
}

fn lock(q: &Mutex<Queues>) -> MutexGuard<'_, Queues> {
    // A panicking test thread cannot leave the queues half-updated in a way
    // that matters, so a poisoned lock is still usable.
    q.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryPort {
    /// A port and the handle to feed and drain it.
    pub fn new(name: &str, mac: [u8; 6], mtu: u32) -> (MemoryPort, MemoryPortHandle) {
        let queues = Arc::new(Mutex::new(Queues::default()));
        (
            MemoryPort {
                name: name.to_owned(),
                mac,
                mtu,
                queues: queues.clone(),
            },
            MemoryPortHandle { queues },
        )
    }
}

impl MemoryPortHandle {
    /// Queues `frame` for the worker to receive.
    pub fn inject(&self, frame: &[u8]) {
        lock(&self.queues).rx.push_back(frame.to_vec());
    }

    /// Frames injected but not yet received.
    pub fn pending_rx(&self) -> usize {
        lock(&self.queues).rx.len()
    }

    /// Takes every frame transmitted so far, oldest first.
    pub fn take_transmitted(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut lock(&self.queues).tx)
    }

    /// Limits how many more frames the port accepts for transmission
    /// (`None`: no limit), to exercise the TX-ring-full path.
    pub fn set_tx_room(&self, room: Option<usize>) {
        lock(&self.queues).tx_room = room;
    }
}

impl Port for MemoryPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        let mut q = lock(&self.queues);
        let room = (arena.frame_size() - RX_HEADROOM) as usize;
        let mut n = 0;
        while n < descs.len() {
            let Some(frame) = q.rx.front() else { break };
            let Some(chunk) = arena.alloc() else { break };
            // A frame longer than a chunk is cut, as a NIC with this frame
            // size would; the pipeline then sees a truncated packet.
            let len = frame.len().min(room);
            let d = FrameDesc {
                addr: chunk + u64::from(RX_HEADROOM),
                len: len as u32,
            };
            arena.data_mut(d).copy_from_slice(&frame[..len]);
            q.rx.pop_front();
            descs[n] = d;
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let mut q = lock(&self.queues);
        let n = q.tx_room.map_or(descs.len(), |r| r.min(descs.len()));
        if let Some(r) = q.tx_room.as_mut() {
            *r -= n;
        }
        for d in &descs[..n] {
            q.tx.push(arena.data(*d).to_vec());
            arena.free(d.addr);
        }
        n
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }
}

/// A benchmark port: every `rx_burst` yields a full burst built from
/// templates (round robin), and transmitted frames are counted and freed.
pub struct ReplayPort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    templates: Vec<Vec<u8>>,
    next: usize,
    transmitted: u64,
}

impl ReplayPort {
    /// A port that replays `templates` forever.
    pub fn new(name: &str, mac: [u8; 6], mtu: u32, templates: Vec<Vec<u8>>) -> Self {
        ReplayPort {
            name: name.to_owned(),
            mac,
            mtu,
            templates,
            next: 0,
            transmitted: 0,
        }
    }

    /// Frames transmitted on this port so far.
    pub fn transmitted(&self) -> u64 {
        self.transmitted
    }
}

impl Port for ReplayPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        if self.templates.is_empty() {
            return 0;
        }
        let mut n = 0;
        while n < descs.len() {
            let Some(chunk) = arena.alloc() else { break };
            let t = &self.templates[self.next];
            self.next += 1;
            if self.next == self.templates.len() {
                self.next = 0;
            }
            let d = FrameDesc {
                addr: chunk + u64::from(RX_HEADROOM),
                len: t.len() as u32,
            };
            arena.data_mut(d).copy_from_slice(t);
            descs[n] = d;
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        for d in descs {
            arena.free(d.addr);
        }
        self.transmitted += descs.len() as u64;
        descs.len()
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_port_moves_frames_through_the_arena_and_back() {
        let mut arena = FrameArena::new_heap(4, 2048);
        let (mut port, h) = MemoryPort::new("p0", [2, 0, 0, 0, 0, 1], 1500);
        h.inject(&[1, 2, 3]);
        h.inject(&[4, 5]);
        let mut descs = [FrameDesc::default(); 8];
        assert_eq!(port.rx_burst(&mut arena, &mut descs), 2);
        assert_eq!(descs[0].headroom(2048), RX_HEADROOM);
        assert_eq!(arena.data(descs[1]), &[4, 5]);
        assert_eq!(arena.free_count(), 2);
        h.set_tx_room(Some(1));
        assert_eq!(port.tx_burst(&mut arena, &descs[..2]), 1);
        arena.free(descs[1].addr);
        assert_eq!(arena.free_count(), 4);
        assert_eq!(h.take_transmitted(), vec![vec![1, 2, 3]]);
        assert_eq!(h.pending_rx(), 0);
    }

    #[test]
    fn memory_port_stops_when_the_arena_is_empty() {
        let mut arena = FrameArena::new_heap(1, 2048);
        let (mut port, h) = MemoryPort::new("p0", [2, 0, 0, 0, 0, 1], 1500);
        h.inject(&[1]);
        h.inject(&[2]);
        let mut descs = [FrameDesc::default(); 8];
        assert_eq!(port.rx_burst(&mut arena, &mut descs), 1);
        assert_eq!(h.pending_rx(), 1, "the second frame waits for a chunk");
    }

    #[test]
    fn replay_port_fills_whole_bursts_from_templates() {
        let mut arena = FrameArena::new_heap(8, 2048);
        let mut port = ReplayPort::new("r", [2; 6], 1500, vec![vec![7; 64], vec![8; 60]]);
        let mut descs = [FrameDesc::default(); 4];
        assert_eq!(port.rx_burst(&mut arena, &mut descs), 4);
        assert_eq!(arena.data(descs[1]), &[8; 60][..]);
        assert_eq!(port.tx_burst(&mut arena, &descs), 4);
        assert_eq!(arena.free_count(), 8);
        assert_eq!(port.transmitted(), 4);
    }
}
