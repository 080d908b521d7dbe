//! Frames crossing workers.
//!
//! All workers' AF_XDP sockets share one UMEM (XDP_SHARED_UMEM, each socket
//! with its own fill and completion rings), and the UMEM's chunks are split
//! between the workers: worker `w` owns a contiguous range, which is the
//! free list of its arena and what it puts on its fill rings. A frame
//! received by worker A whose egress port belongs to worker B is handed
//! over by its descriptor through B's [`Mailbox`] (a bounded MPMC queue, no
//! copy); B puts it on the port's TX ring, and when the kernel completes it
//! B sends the chunk's address back to A's mailbox, so every chunk returns
//! to the free list of the worker that owns it ([`FrameHome::free`]).
//!
//! [`RemotePort`] stands in worker A's slot for a port owned by B: its
//! `tx_burst` is the hand-off. An idle worker blocked in poll(2) is woken
//! through its mailbox's datagram pair.

use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crossbeam::queue::ArrayQueue;

use crate::frame::{FrameArena, FrameDesc, Port, PortId, PortPoll};

/// Port slots whose learned peer MAC workers share (slots past this are
/// not shared; the CNI plugin's MAC still reaches every worker).
pub const SHARED_MAC_SLOTS: usize = 4096;

/// What other workers send one worker.
pub struct Mailbox {
    /// Frames to transmit on one of this worker's ports.
    tx: ArrayQueue<(PortId, FrameDesc)>,
    /// Frames another worker received on its queue of one of this
    /// worker's pod ports, for this worker's pipeline (the pod's flows
    /// live here).
    rx: ArrayQueue<(PortId, FrameDesc)>,
    /// Chunks of this worker's range that another worker finished with.
    returns: ArrayQueue<u64>,
    /// Set while the worker blocks in poll(2) (interrupt polling).
    sleeping: AtomicBool,
    wake_rx: UnixDatagram,
    wake_tx: UnixDatagram,
}

impl Mailbox {
    fn new(capacity: usize) -> std::io::Result<Mailbox> {
        let (wake_tx, wake_rx) = UnixDatagram::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Mailbox {
            tx: ArrayQueue::new(capacity.max(1)),
            rx: ArrayQueue::new(capacity.max(1)),
            returns: ArrayQueue::new(capacity.max(1)),
            sleeping: AtomicBool::new(false),
            wake_rx,
            wake_tx,
        })
    }

    fn wake(&self) {
        // SeqCst with the store in `set_sleeping`: either this load sees
        // the sleeper's flag, or the sleeper's mailbox check (after its
        // store) sees the frame pushed before this load.
        if self.sleeping.load(Ordering::SeqCst) {
            // A full socket buffer already means a pending wake-up.
            let _ = self.wake_tx.send(&[1]);
        }
    }
}

/// The chunk ranges of all workers and their mailboxes.
pub struct FrameHomes {
    frame_shift: u32,
    chunks_per_worker: u64,
    mailboxes: Vec<Mailbox>,
    /// Peer MACs learned by a port's owner (pipeline learning from the
    /// pod's frames), for the workers that route to it: 0 = none, else the
    /// MAC in the low 48 bits with bit 48 set.
    peer_macs: Vec<AtomicU64>,
}

impl FrameHomes {
    /// `workers` ranges over an arena of `frames` chunks of `frame_size`.
    pub fn new(workers: usize, frames: u32, frame_size: u32) -> std::io::Result<Arc<FrameHomes>> {
        let workers = workers.max(1);
        let mailboxes = (0..workers)
            .map(|_| Mailbox::new(frames as usize))
            .collect::<std::io::Result<_>>()?;
        Ok(Arc::new(FrameHomes {
            frame_shift: frame_size.max(1).trailing_zeros(),
            chunks_per_worker: (u64::from(frames) / workers as u64).max(1),
            mailboxes,
            peer_macs: (0..SHARED_MAC_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }))
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.mailboxes.len()
    }

    /// The worker whose range holds `addr` (the last one takes the
    /// remainder).
    #[inline]
    pub fn owner(&self, addr: u64) -> usize {
        (((addr >> self.frame_shift) / self.chunks_per_worker) as usize)
            .min(self.mailboxes.len() - 1)
    }

    /// Worker `worker`'s handle.
    pub fn home(self: &Arc<Self>, worker: usize) -> FrameHome {
        FrameHome {
            homes: self.clone(),
            me: worker.min(self.mailboxes.len() - 1),
        }
    }

    /// Port slot `id` as each worker gets it, in worker order: the part of
    /// the port that worker owns (`parts`: worker, part), or for a worker
    /// without one a [`RemotePort`] that hands frames to the first owner
    /// (`true` beside it marks the stand-in).
    pub fn place_port(
        self: &Arc<Self>,
        parts: Vec<(usize, Box<dyn Port>)>,
        name: &str,
        mac: [u8; 6],
        mtu: u32,
        id: PortId,
    ) -> Vec<(Box<dyn Port>, bool)> {
        let owner = parts.first().map_or(0, |(w, _)| *w);
        let mut by_worker: Vec<Option<Box<dyn Port>>> =
            (0..self.mailboxes.len()).map(|_| None).collect();
        for (w, part) in parts {
            if let Some(slot) = by_worker.get_mut(w) {
                *slot = Some(part);
            }
        }
        by_worker
            .into_iter()
            .enumerate()
            .map(|(w, part)| match part {
                Some(p) => (p, false),
                None => (
                    Box::new(RemotePort::new(name, mac, mtu, id, owner, self.home(w)))
                        as Box<dyn Port>,
                    true,
                ),
            })
            .collect()
    }

    /// Publishes (or clears) the peer MAC of port slot `id`.
    pub fn set_peer_mac(&self, id: PortId, mac: Option<[u8; 6]>) {
        if let Some(slot) = self.peer_macs.get(id as usize) {
            slot.store(mac.map_or(0, encode_mac), Ordering::Relaxed);
        }
    }

    /// The peer MAC of port slot `id`, if its owner knows it.
    pub fn peer_mac(&self, id: PortId) -> Option<[u8; 6]> {
        let v = self.peer_macs.get(id as usize)?.load(Ordering::Relaxed);
        (v != 0).then(|| {
            let b = v.to_be_bytes();
            [b[2], b[3], b[4], b[5], b[6], b[7]]
        })
    }
}

fn encode_mac(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&mac);
    u64::from_be_bytes(b) | (1 << 48)
}

/// One worker's view of the [`FrameHomes`].
#[derive(Clone)]
pub struct FrameHome {
    homes: Arc<FrameHomes>,
    me: usize,
}

impl FrameHome {
    /// A single worker owning the whole arena (no hand-off ever happens).
    pub fn single(frames: u32, frame_size: u32) -> std::io::Result<FrameHome> {
        Ok(FrameHomes::new(1, frames, frame_size)?.home(0))
    }

    /// This worker's index.
    pub fn worker(&self) -> usize {
        self.me
    }

    /// All the workers' homes.
    pub fn homes(&self) -> &Arc<FrameHomes> {
        &self.homes
    }

    /// Whether `addr` is in this worker's range.
    #[inline]
    pub fn owns(&self, addr: u64) -> bool {
        self.homes.owner(addr) == self.me
    }

    /// Leaves in `arena`'s free list only this worker's range (an arena
    /// starts with every chunk of the shared region free).
    pub fn claim_range(&self, arena: &mut FrameArena) {
        let mut mine = Vec::with_capacity(arena.frames() as usize);
        while let Some(a) = arena.alloc() {
            if self.owns(a) {
                mine.push(a);
            }
        }
        // Freed in reverse so the lowest addresses are handed out first.
        for a in mine.into_iter().rev() {
            arena.free(a);
        }
    }

    /// Gives the chunk of `addr` back: to `arena` if it is this worker's,
    /// else to its owner's mailbox.
    #[inline]
    pub fn free(&self, arena: &mut FrameArena, addr: u64) {
        let owner = self.homes.owner(addr);
        // Super-packet slots are never handed over: always this worker's.
        if owner == self.me || arena.is_super(addr) {
            arena.free(addr);
        } else {
            let base = arena.chunk_base(addr);
            // Capacity is the arena's chunk count and every chunk is in at
            // most one place, so this cannot be full; if it ever were, the
            // chunk is lost to its owner, which is logged rather than
            // panicked on.
            if self.homes.mailboxes[owner].returns.push(base).is_err() {
                tracing::error!(addr = base, owner, "return mailbox full: frame lost");
            }
        }
    }

    /// Takes back the chunks other workers returned; returns how many.
    pub fn take_returns(&self, arena: &mut FrameArena) -> usize {
        let mailbox = &self.homes.mailboxes[self.me];
        let mut n = 0;
        while let Some(a) = mailbox.returns.pop() {
            arena.free(a);
            n += 1;
        }
        n
    }

    /// Hands `desc` to worker `owner` for its port `port`; `false` if its
    /// mailbox is full.
    #[inline]
    pub fn hand_off(&self, owner: usize, port: PortId, desc: FrameDesc) -> bool {
        self.homes
            .mailboxes
            .get(owner)
            .is_some_and(|m| m.tx.push((port, desc)).is_ok())
    }

    /// Hands `desc`, received on this worker's queue of pod port
    /// `ingress`, to worker `owner` for its pipeline; `false` if its
    /// mailbox is full.
    #[inline]
    pub fn hand_received(&self, owner: usize, ingress: PortId, desc: FrameDesc) -> bool {
        self.homes
            .mailboxes
            .get(owner)
            .is_some_and(|m| m.rx.push((ingress, desc)).is_ok())
    }

    /// The next frame another worker received for this worker's pipeline.
    #[inline]
    pub fn next_received(&self) -> Option<(PortId, FrameDesc)> {
        self.homes.mailboxes[self.me].rx.pop()
    }

    /// Wakes worker `owner` if it sleeps in poll(2).
    pub fn wake(&self, owner: usize) {
        if let Some(m) = self.homes.mailboxes.get(owner) {
            m.wake();
        }
    }

    /// The next frame handed to this worker.
    #[inline]
    pub fn next_handed(&self) -> Option<(PortId, FrameDesc)> {
        self.homes.mailboxes[self.me].tx.pop()
    }

    /// Whether frames or returns wait in this worker's mailbox.
    pub fn has_mail(&self) -> bool {
        let m = &self.homes.mailboxes[self.me];
        !m.tx.is_empty() || !m.rx.is_empty() || !m.returns.is_empty()
    }

    /// Marks this worker as blocking in poll(2) (or not any more).
    pub fn set_sleeping(&self, sleeping: bool) {
        self.homes.mailboxes[self.me]
            .sleeping
            .store(sleeping, Ordering::SeqCst);
        if !sleeping {
            let mut buf = [0u8; 16];
            while self.homes.mailboxes[self.me].wake_rx.recv(&mut buf).is_ok() {}
        }
    }

    /// The descriptor that becomes readable when another worker wakes this
    /// one.
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.homes.mailboxes[self.me].wake_rx.as_fd()
    }
}

/// A port owned by another worker, in this worker's slot for it: what the
/// pipeline sends there is handed to the owner, which transmits it.
pub struct RemotePort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    id: PortId,
    owner: usize,
    home: FrameHome,
}

impl RemotePort {
    /// The stand-in for port `id` (named `name`, with `mac` and `mtu`) of
    /// worker `owner`, in the worker of `home`.
    pub fn new(
        name: &str,
        mac: [u8; 6],
        mtu: u32,
        id: PortId,
        owner: usize,
        home: FrameHome,
    ) -> RemotePort {
        RemotePort {
            name: name.to_owned(),
            mac,
            mtu,
            id,
            owner,
            home,
        }
    }

    /// The worker that owns the port.
    pub fn owner(&self) -> usize {
        self.owner
    }
}

impl Port for RemotePort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, _arena: &mut FrameArena, _descs: &mut [FrameDesc]) -> usize {
        0
    }

    fn tx_burst(&mut self, _arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let mut taken = 0;
        for d in descs {
            if !self.home.hand_off(self.owner, self.id, *d) {
                break;
            }
            taken += 1;
        }
        if taken > 0 {
            self.home.wake(self.owner);
        }
        taken
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_go_home_to_the_worker_that_owns_them() {
        let homes = FrameHomes::new(2, 8, 2048).unwrap();
        let (a, b) = (homes.home(0), homes.home(1));
        let mut arena_a = FrameArena::new_heap(8, 2048);
        let mut arena_b = FrameArena::new_heap(8, 2048);
        a.claim_range(&mut arena_a);
        b.claim_range(&mut arena_b);
        assert_eq!((arena_a.free_count(), arena_b.free_count()), (4, 4));
        let frame = arena_a.alloc().unwrap();
        assert!(a.owns(frame) && !b.owns(frame));
        // B transmitted A's frame; the completion goes back to A.
        assert!(b.hand_off(
            1,
            3,
            FrameDesc {
                addr: frame + 256,
                len: 60
            }
        ));
        assert_eq!(
            b.next_handed(),
            Some((
                3,
                FrameDesc {
                    addr: frame + 256,
                    len: 60
                }
            ))
        );
        b.free(&mut arena_b, frame + 256);
        assert_eq!(arena_b.free_count(), 4);
        assert_eq!(a.take_returns(&mut arena_a), 1);
        assert_eq!(arena_a.free_count(), 4);
    }

    #[test]
    fn peer_macs_are_shared_by_slot() {
        let homes = FrameHomes::new(2, 8, 2048).unwrap();
        assert_eq!(homes.peer_mac(5), None);
        homes.set_peer_mac(5, Some([0, 1, 2, 3, 4, 5]));
        assert_eq!(homes.peer_mac(5), Some([0, 1, 2, 3, 4, 5]));
        homes.set_peer_mac(5, None);
        assert_eq!(homes.peer_mac(5), None);
        homes.set_peer_mac(60_000, Some([1; 6]));
        assert_eq!(homes.peer_mac(60_000), None);
    }

    #[test]
    fn a_remote_port_hands_frames_to_its_owner() {
        let homes = FrameHomes::new(2, 8, 2048).unwrap();
        let mut port = RemotePort::new("pod", [2; 6], 1500, 7, 1, homes.home(0));
        let mut arena = FrameArena::new_heap(8, 2048);
        let d = FrameDesc { addr: 256, len: 42 };
        assert_eq!(port.tx_burst(&mut arena, &[d, d]), 2);
        let owner = homes.home(1);
        assert_eq!(owner.next_handed(), Some((7, d)));
        assert_eq!(owner.next_handed(), Some((7, d)));
        assert_eq!(owner.next_handed(), None);
    }
}
