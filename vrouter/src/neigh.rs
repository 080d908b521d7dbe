//! Neighbour table for next hops on a port (underlay nodes and gateways on
//! the uplink): IP -> MAC, per port.
//!
//! The worker owns the table: it learns from ARP replies on the uplink, and
//! the control side adds static entries through the worker. A lookup that
//! misses does not drop silently: [`NeighTable::miss`] records an incomplete
//! entry, tells the caller whether to send an ARP request now (at most one per
//! address per [`RESOLVE_INTERVAL`]), and queues a bounded "resolve this"
//! event the control thread drains with [`NeighTable::drain_resolve`]. The
//! frame itself is dropped and counted (`no_neighbour`); holding a few frames
//! until the reply comes is the daemon issue's job.
//!
//! Lookups happen once per forwarded packet, so the map uses a small
//! multiplicative hash instead of SipHash: the keys are addresses the control
//! plane programmed (remote nodes, gateways), not attacker-chosen.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::frame::PortId;

/// Shortest time between two ARP requests for the same address.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(1);

/// Most "resolve this" events kept until the control thread drains them;
/// later ones are counted in [`NeighTable::resolve_overflow`] instead.
pub const RESOLVE_QUEUE: usize = 64;

/// Most incomplete (unresolved) entries; beyond it a miss asks for nothing.
pub const MAX_INCOMPLETE: usize = 4096;

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
