//! Neighbour table for next hops on a port (underlay nodes and gateways on
//! the uplink): IP -> MAC, per port.
//!
//! The worker owns the table: it learns from ARP replies on the uplink, and
//! the control side adds static entries through the worker. A lookup that
//! misses does not drop silently: [`NeighTable::miss`] records an incomplete
//! entry, tells the caller whether to send an ARP request now (at most one per
//! address per [`RESOLVE_INTERVAL`]), and queues a bounded "resolve this"
//! event the control thread drains with [`NeighTable::drain_resolve`].
//!
//! The frame itself is not dropped silently: the pipeline rewrites it in
//! full (TTL, outer headers) and holds it in [`HeldFrames`], at most
//! [`UNRESOLVED_QUEUE_LEN`] per next hop and [`MAX_HELD_FRAMES`] per worker
//! (Linux's `unres_qlen`, made small). The frames stay in their arena chunks:
//! the queue keeps only descriptors, in a vector allocated once. When the
//! MAC is learned (an ARP reply on the uplink, or an entry the control side
//! sets), the held frames get it and leave; frames past the limits are
//! dropped as `neighbor_queue_full`, and a next hop that does not resolve
//! within [`UNRESOLVED_TIMEOUT`] has its frames dropped as
//! `neighbor_timeout`.
//!
//! Lookups happen once per forwarded packet, so the map uses a small
//! multiplicative hash instead of SipHash: the keys are addresses the control
//! plane programmed (remote nodes, gateways), not attacker-chosen.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::frame::{FrameDesc, PortId};

/// Shortest time between two ARP requests for the same address.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(1);

/// Most "resolve this" events kept until the control thread drains them;
/// later ones are counted in [`NeighTable::resolve_overflow`] instead.
pub const RESOLVE_QUEUE: usize = 64;

/// Most incomplete (unresolved) entries; beyond it a miss asks for nothing.
pub const MAX_INCOMPLETE: usize = 4096;

/// Most frames held for one unresolved next hop (Linux's `unres_qlen`
/// idea, small: enough for a TCP handshake or the first pings, never a
/// burst's worth of the arena).
pub const UNRESOLVED_QUEUE_LEN: usize = 4;

/// Most frames one worker holds for all unresolved next hops together, so
/// unresolvable next hops cannot park the arena.
pub const MAX_HELD_FRAMES: usize = 64;

/// How long frames wait for their next hop: three ARP requests at
/// [`RESOLVE_INTERVAL`], as Linux gives up after `mcast_solicit` (3) probes.
pub const UNRESOLVED_TIMEOUT: Duration = Duration::from_secs(3);

/// A multiplicative (Fibonacci) hasher for small fixed-size keys.
#[derive(Default)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // Fold the high bits (where the multiply mixes best) into the low
        // ones, which pick the bucket.
        self.0 ^ (self.0 >> 29)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[derive(Clone, Copy, Debug)]
enum State {
    Reachable([u8; 6]),
    Incomplete { last_request: Instant },
}

/// A request to resolve `addr` on `port`, for the control thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolveRequest {
    /// Port the neighbour is on.
    pub port: PortId,
    /// Address to resolve.
    pub addr: IpAddr,
}

/// What the caller should do after a miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissAction {
    /// Send an ARP request for the address now.
    SendRequest,
    /// A request went out recently (or the table is full): just drop.
    Wait,
}

/// The map key: the port in the high bits, so the low bits (which pick the
/// bucket) are the address's host part. IPv4 keys are one `u64`, hashed
/// with one multiply on the per-packet path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    V4(u64),
    V6(u16, u128),
}

#[inline]
fn key(port: PortId, addr: IpAddr) -> Key {
    match addr {
        IpAddr::V4(a) => Key::V4(u64::from(port) << 32 | u64::from(u32::from(a))),
        IpAddr::V6(a) => Key::V6(port, u128::from(a)),
    }
}

/// IP -> MAC per port, owned by one worker.
#[derive(Default)]
pub struct NeighTable {
    entries: FastMap<Key, State>,
    /// The last successful lookup: a burst usually goes to one or two
    /// next hops, so most lookups skip the hash map. Cleared on every
    /// change.
    last: Cell<Option<(Key, [u8; 6])>>,
    incomplete: usize,
    resolve: Vec<ResolveRequest>,
    resolve_overflow: u64,
    /// Bumped on every insert, so holders of frames know when to look again.
    generation: u64,
}

impl NeighTable {
    /// An empty table.
    pub fn new() -> Self {
        NeighTable {
            resolve: Vec::with_capacity(RESOLVE_QUEUE),
            ..Default::default()
        }
    }

    /// The MAC of `addr` on `port`, if resolved.
    #[inline]
    pub fn lookup(&self, port: PortId, addr: IpAddr) -> Option<[u8; 6]> {
        let k = key(port, addr);
        if let Some((last, mac)) = self.last.get()
            && last == k
        {
            return Some(mac);
        }
        match self.entries.get(&k) {
            Some(State::Reachable(mac)) => {
                self.last.set(Some((k, *mac)));
                Some(*mac)
            }
            _ => None,
        }
    }

    /// Sets (static entry from the control side, or a learned ARP reply).
    pub fn insert(&mut self, port: PortId, addr: IpAddr, mac: [u8; 6]) {
        self.last.set(None);
        self.generation = self.generation.wrapping_add(1);
        if let Some(State::Incomplete { .. }) =
            self.entries.insert(key(port, addr), State::Reachable(mac))
        {
            self.incomplete -= 1;
        }
    }

    /// Updates `addr` only if the table already has an entry for it
    /// (RFC 826's merge rule for requests we see but did not ask for).
    /// Returns whether it did.
    pub fn refresh(&mut self, port: PortId, addr: IpAddr, mac: [u8; 6]) -> bool {
        if self.entries.contains_key(&key(port, addr)) {
            self.insert(port, addr, mac);
            true
        } else {
            false
        }
    }

    /// Removes the entry for `addr` on `port`.
    pub fn remove(&mut self, port: PortId, addr: IpAddr) {
        self.last.set(None);
        if let Some(State::Incomplete { .. }) = self.entries.remove(&key(port, addr)) {
            self.incomplete -= 1;
        }
    }

    /// Records a miss for `addr` on `port` at `now`; says whether to send an
    /// ARP request now.
    pub fn miss(&mut self, port: PortId, addr: IpAddr, now: Instant) -> MissAction {
        let k = key(port, addr);
        match self.entries.get_mut(&k) {
            Some(State::Incomplete { last_request }) => {
                if now.saturating_duration_since(*last_request) < RESOLVE_INTERVAL {
                    return MissAction::Wait;
                }
                *last_request = now;
            }
            Some(State::Reachable(_)) => return MissAction::Wait,
            None => {
                if self.incomplete >= MAX_INCOMPLETE {
                    return MissAction::Wait;
                }
                self.entries
                    .insert(k, State::Incomplete { last_request: now });
                self.incomplete += 1;
            }
        }
        if self.resolve.len() < RESOLVE_QUEUE {
            self.resolve.push(ResolveRequest { port, addr });
        } else {
            self.resolve_overflow += 1;
        }
        MissAction::SendRequest
    }

    /// Takes the pending "resolve this" events.
    pub fn drain_resolve(&mut self) -> std::vec::Drain<'_, ResolveRequest> {
        self.resolve.drain(..)
    }

    /// Events lost because the queue was full.
    pub fn resolve_overflow(&self) -> u64 {
        self.resolve_overflow
    }

    /// Number of resolved entries.
    pub fn reachable(&self) -> usize {
        self.entries.len() - self.incomplete
    }

    /// A number that changes whenever an entry is set: when it has not
    /// changed, no held frame can have become sendable.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// A frame waiting for its next hop's MAC: ready to send except for the
/// destination MAC (the first six bytes of `desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldFrame {
    /// Port it leaves by.
    pub port: PortId,
    /// The next hop whose MAC it waits for.
    pub next_hop: IpAddr,
    /// The frame, as it will be transmitted.
    pub desc: FrameDesc,
    /// When it was held.
    pub since: Instant,
    /// Whether it counts as forwarded when sent (false for ICMP errors this
    /// node built).
    pub forwarded: bool,
}

/// Why a frame could not be held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldError {
    /// The next hop already has [`UNRESOLVED_QUEUE_LEN`] frames waiting, or
    /// the worker [`MAX_HELD_FRAMES`].
    Full,
}

/// Frames held for unresolved next hops, owned by one worker. Descriptors
/// only, in a vector allocated once: holding, releasing and expiring never
/// allocate.
#[derive(Debug)]
pub struct HeldFrames {
    frames: Vec<HeldFrame>,
    /// The neighbour table generation at the last release scan.
    seen_generation: u64,
}

impl Default for HeldFrames {
    fn default() -> Self {
        Self::new()
    }
}

impl HeldFrames {
    /// An empty queue with room for [`MAX_HELD_FRAMES`].
    pub fn new() -> Self {
        HeldFrames {
            frames: Vec::with_capacity(MAX_HELD_FRAMES),
            seen_generation: 0,
        }
    }

    /// Frames held now.
    #[inline]
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether no frame is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Frames held for `next_hop` on `port`.
    pub fn held_for(&self, port: PortId, next_hop: IpAddr) -> usize {
        self.frames
            .iter()
            .filter(|f| f.port == port && f.next_hop == next_hop)
            .count()
    }

    /// Holds `frame`, unless its next hop or the worker is at its limit.
    pub fn hold(&mut self, frame: HeldFrame) -> Result<(), HoldError> {
        if self.frames.len() >= MAX_HELD_FRAMES
            || self.held_for(frame.port, frame.next_hop) >= UNRESOLVED_QUEUE_LEN
        {
            return Err(HoldError::Full);
        }
        self.frames.push(frame);
        Ok(())
    }

    /// Whether a release scan could find something: frames are held and the
    /// neighbour table changed since the last scan.
    #[inline]
    pub fn may_release(&self, neigh: &NeighTable) -> bool {
        !self.frames.is_empty() && neigh.generation() != self.seen_generation
    }

    /// Hands every frame whose next hop `neigh` now resolves to `send`, with
    /// the MAC, in the order they were held (per next hop), and forgets
    /// them.
    pub fn release(&mut self, neigh: &NeighTable, mut send: impl FnMut(HeldFrame, [u8; 6])) {
        self.seen_generation = neigh.generation();
        let mut i = 0;
        while i < self.frames.len() {
            let f = self.frames[i];
            match neigh.lookup(f.port, f.next_hop) {
                Some(mac) => {
                    // `remove`, not `swap_remove`: frames of one flow keep
                    // their order (the vector holds at most 64).
                    self.frames.remove(i);
                    send(f, mac);
                }
                None => i += 1,
            }
        }
    }

    /// Hands every frame held for [`UNRESOLVED_TIMEOUT`] or longer at `now`
    /// to `expired`, and forgets them.
    pub fn expire(&mut self, now: Instant, mut expired: impl FnMut(HeldFrame)) {
        let mut i = 0;
        while i < self.frames.len() {
            let f = self.frames[i];
            if now.saturating_duration_since(f.since) >= UNRESOLVED_TIMEOUT {
                self.frames.remove(i);
                expired(f);
            } else {
                i += 1;
            }
        }
    }

    /// Hands every held frame to `drop` (a port going away, shutdown).
    pub fn drain(&mut self, drop: impl FnMut(HeldFrame)) {
        self.frames.drain(..).for_each(drop);
    }

    /// The oldest frame's hold time, if any (when the next expiry is due).
    pub fn oldest(&self) -> Option<Instant> {
        self.frames.iter().map(|f| f.since).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    #[test]
    fn miss_asks_once_per_interval_and_queues_one_event_per_request() {
        let mut t = NeighTable::new();
        let a: IpAddr = "192.168.0.2".parse().unwrap();
        let t0 = Instant::now();
        assert_eq!(t.miss(1, a, t0), MissAction::SendRequest);
        assert_eq!(
            t.miss(1, a, t0 + Duration::from_millis(10)),
            MissAction::Wait
        );
        assert_eq!(t.miss(1, a, t0 + RESOLVE_INTERVAL), MissAction::SendRequest);
        let events: Vec<_> = t.drain_resolve().collect();
        assert_eq!(events, vec![ResolveRequest { port: 1, addr: a }; 2]);
        assert_eq!(t.lookup(1, a), None);
        t.insert(1, a, MAC);
        assert_eq!(t.lookup(1, a), Some(MAC));
        assert_eq!(t.lookup(0, a), None, "entries are per port");
        assert_eq!(t.miss(1, a, t0), MissAction::Wait);
        assert_eq!(t.reachable(), 1);
    }

    #[test]
    fn the_lookup_cache_follows_changes() {
        let mut t = NeighTable::new();
        let a: IpAddr = "192.168.0.2".parse().unwrap();
        t.insert(1, a, MAC);
        assert_eq!(t.lookup(1, a), Some(MAC));
        assert_eq!(t.lookup(1, a), Some(MAC), "from the cache");
        t.insert(1, a, [9; 6]);
        assert_eq!(t.lookup(1, a), Some([9; 6]));
        t.remove(1, a);
        assert_eq!(t.lookup(1, a), None);
        assert_eq!(t.lookup(2, a), None);
    }

    #[test]
    fn refresh_only_updates_known_entries() {
        let mut t = NeighTable::new();
        let a: IpAddr = "192.168.0.2".parse().unwrap();
        assert!(!t.refresh(1, a, MAC));
        assert_eq!(t.lookup(1, a), None);
        t.miss(1, a, Instant::now());
        assert!(t.refresh(1, a, MAC));
        assert_eq!(t.lookup(1, a), Some(MAC));
    }

    fn held(port: PortId, hop: IpAddr, addr: u64, since: Instant) -> HeldFrame {
        HeldFrame {
            port,
            next_hop: hop,
            desc: FrameDesc { addr, len: 60 },
            since,
            forwarded: true,
        }
    }

    #[test]
    fn held_frames_are_bounded_per_next_hop_and_released_in_order() {
        let mut t = NeighTable::new();
        let mut q = HeldFrames::new();
        let (a, b): (IpAddr, IpAddr) = (
            "192.168.0.2".parse().unwrap(),
            "192.168.0.3".parse().unwrap(),
        );
        let now = Instant::now();
        for i in 0..UNRESOLVED_QUEUE_LEN as u64 {
            assert_eq!(q.hold(held(1, a, i * 2048, now)), Ok(()));
        }
        assert_eq!(q.hold(held(1, a, 99 * 2048, now)), Err(HoldError::Full));
        assert_eq!(q.hold(held(1, b, 10 * 2048, now)), Ok(()));
        assert_eq!(q.hold(held(2, a, 11 * 2048, now)), Ok(()), "per port");
        assert!(!q.may_release(&t));
        t.insert(1, a, MAC);
        assert!(q.may_release(&t));
        let mut sent = Vec::new();
        q.release(&t, |f, mac| sent.push((f.desc.addr, mac)));
        assert_eq!(sent, (0..4).map(|i| (i * 2048, MAC)).collect::<Vec<_>>());
        assert_eq!(q.len(), 2);
        assert!(!q.may_release(&t), "nothing new since the scan");
    }

    #[test]
    fn held_frames_expire_after_the_timeout_and_the_worker_limit_holds() {
        let mut q = HeldFrames::new();
        let t0 = Instant::now();
        for i in 0..MAX_HELD_FRAMES as u32 {
            let hop = IpAddr::V4(i.into());
            assert_eq!(q.hold(held(1, hop, u64::from(i), t0)), Ok(()));
        }
        let extra = held(1, IpAddr::V4(9999.into()), 0, t0);
        assert_eq!(q.hold(extra), Err(HoldError::Full));
        let mut expired = 0;
        q.expire(t0 + UNRESOLVED_TIMEOUT - Duration::from_millis(1), |_| {
            expired += 1
        });
        assert_eq!((expired, q.len()), (0, MAX_HELD_FRAMES));
        assert_eq!(q.oldest(), Some(t0));
        q.expire(t0 + UNRESOLVED_TIMEOUT, |_| expired += 1);
        assert_eq!((expired, q.len()), (MAX_HELD_FRAMES, 0));
        assert!(q.is_empty());
    }

    #[test]
    fn the_resolve_queue_is_bounded() {
        let mut t = NeighTable::new();
        let now = Instant::now();
        for i in 0..(RESOLVE_QUEUE as u32 + 5) {
            t.miss(1, IpAddr::V4(i.into()), now);
        }
        assert_eq!(t.drain_resolve().count(), RESOLVE_QUEUE);
        assert_eq!(t.resolve_overflow(), 5);
    }
}
