//! The forwarding information base: longest-prefix match for IPv4 and IPv6.
//!
//! The control thread owns the [`Fib`] and changes it; every worker holds a
//! [`FibReader`] and looks up destinations without taking a lock, while the
//! control thread keeps changing routes (no stop-the-world).
//!
//! # Structures
//!
//! - IPv4: DIR-24-8 (one memory access for routes up to /24, two beyond),
//!   cut into 4096 copy-on-write chunks of one /12 each; chunks holding one
//!   value everywhere are shared, so a small FIB costs tens of KiB, not the
//!   64 MiB of a flat `tbl24`. See `v4.rs` for why and for the entry format.
//! - IPv6: a stride-6 multibit trie whose nodes are compressed with 64-bit
//!   maps and popcount (poptrie-style), updated by path copying. See `v6.rs`.
//! - Both store a 24-bit next-hop index; the [`NextHop`] values live in a
//!   copy-on-write table of the same snapshot.
//!
//! # Concurrency
//!
//! Everything a lookup reads is an immutable [`Snapshot`](FibSnapshot)
//! behind one `arc_swap::ArcSwap`. The writer builds the next snapshot beside
//! the published one, sharing every part it did not change (IPv4 chunks, IPv6
//! nodes, the next-hop table), then publishes it with one atomic pointer
//! swap. A lookup loads the pointer once (a few atomic operations on
//! a thread-local slot, no lock, no allocation once the thread has looked up
//! once), so it sees entirely the old or entirely the new FIB: never a torn
//! or half-built one. [`FibReader::snapshot`] and the batch lookups load the
//! pointer once for a whole batch of frames.
//!
//! Old snapshots are freed by the writer, never by a worker: the writer keeps
//! each replaced snapshot until it holds the last reference (arc-swap hands
//! readers that still use it a real reference when it is replaced), and drops
//! it at a later update or [`Fib::reclaim`].
//!
//! Updates cost a copy of the touched parts: a single route change copies two
//! 512-byte pointer arrays of the IPv4 root and one 16 KiB chunk (or an IPv6
//! path), a few microseconds. [`Fib::apply`] folds a whole batch into one snapshot, which
//! is how the control plane should load a full table.

#![forbid(unsafe_code)]

mod next_hop;
mod v4;
mod v6;

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::next_hop::NextHopIndex;
use crate::v4::{V4Table, V4Writer};

/// Index of a port in a worker's port table (the same type as
/// `brindle_vrouter::frame::PortId`).
pub type PortId = u16;

/// Which encapsulation a remote node's block is reached with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encap {
    /// IPv4-in-IPv4 (IP protocol 4).
    Ipip,
    /// VXLAN (RFC 7348) with this VNI, to the configured UDP port.
    Vxlan {
        /// VXLAN network identifier (24 bits).
        vni: u32,
    },
}

/// Where a matching packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NextHop {
    /// A pod on this node, behind a local port.
    Local {
        /// The pod's port.
        port: PortId,
    },
    /// A remote node's block: encapsulate and send to the node's address.
    Encap {
        /// The encapsulation.
        encap: Encap,
        /// The remote node's underlay address (outer destination).
        remote: Ipv4Addr,
    },
    /// Route natively via a gateway on a port (usually the uplink).
    Gateway {
        /// The gateway's address, resolved through the neighbour table.
        via: IpAddr,
        /// The port the gateway is on.
        port: PortId,
    },
    /// Drop.
    Blackhole,
    /// Hand to the node's kernel.
    Host,
}

/// Why the FIB refused a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FibError {
    /// More than 2^24 distinct next hops would be in use at once.
    TooManyNextHops,
}

impl fmt::Display for FibError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FibError::TooManyNextHops => write!(
                f,
                "more than {} distinct next hops",
                next_hop::MAX_NEXT_HOPS
            ),
        }
    }
}

impl std::error::Error for FibError {}

/// One change of a batch given to [`Fib::apply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FibChange {
    /// Add or replace the route for `prefix` (host bits are ignored).
    Upsert {
        /// The destination prefix.
        prefix: IpNet,
        /// Where it goes.
        next_hop: NextHop,
    },
    /// Remove the route for exactly `prefix`, if any.
    Remove {
        /// The destination prefix.
        prefix: IpNet,
    },
}

/// Bytes used by the published lookup structures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibMemory {
    /// The IPv4 root and its distinct chunks (with their tbl8 groups).
    pub v4_bytes: usize,
    /// The IPv6 trie nodes.
    pub v6_bytes: usize,
    /// The published next-hop table.
    pub next_hop_bytes: usize,
    /// Distinct next hops in use.
    pub next_hops: usize,
}

impl FibMemory {
    /// Sum of the lookup structures.
    pub fn total_bytes(&self) -> usize {
        self.v4_bytes + self.v6_bytes + self.next_hop_bytes
    }
}

// ===== impl Snapshot =====

/// One immutable version of the whole FIB.
struct Snapshot {
    v4: Arc<V4Table>,
    v6: Option<Arc<v6::Node>>,
    next_hops: Arc<Vec<NextHop>>,
}

impl Snapshot {
    #[inline(always)]
    fn lookup_v4(&self, dst: u32) -> Option<NextHop> {
        self.next_hop_of_v4_entry(self.v4.lookup(dst))
    }

    #[inline(always)]
    fn next_hop_of_v4_entry(&self, entry: u32) -> Option<NextHop> {
        if v4::is_route(entry) {
            self.next_hops
                .get((entry & v4::INDEX_MASK) as usize)
                .copied()
        } else {
            None
        }
    }

    #[inline]
    fn lookup_v6(&self, dst: u128) -> Option<NextHop> {
        let index = v6::lookup(self.v6.as_deref()?, dst)?;
        self.next_hops.get(index as usize).copied()
    }

    #[inline]
    fn lookup_v4_batch(&self, dsts: &[Ipv4Addr], out: &mut [Option<NextHop>]) {
        const BLOCK: usize = 64;
        let mut entries = [0u32; BLOCK];
        for (dsts, out) in dsts.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
            // First pass: table loads only, independent of each other, so
            // the CPU keeps many cache misses in flight at once
            // (memory-level parallelism).
            for (entry, dst) in entries.iter_mut().zip(dsts) {
                *entry = self.v4.lookup(u32::from(*dst));
            }
            // Second pass: the next-hop table is small and stays in cache.
            for (slot, entry) in out.iter_mut().zip(&entries[..dsts.len()]) {
                *slot = self.next_hop_of_v4_entry(*entry);
            }
        }
    }

    fn lookup_v6_batch(&self, dsts: &[Ipv6Addr], out: &mut [Option<NextHop>]) {
        const BLOCK: usize = 32;
        let Some(root) = self.v6.as_deref() else {
            for slot in out.iter_mut().take(dsts.len()) {
                *slot = None;
            }
            return;
        };
        let mut addrs = [0u128; BLOCK];
        let mut indices = [None; BLOCK];
        for (dsts, out) in dsts.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
            for (addr, dst) in addrs.iter_mut().zip(dsts) {
                *addr = u128::from(*dst);
            }
            let n = dsts.len().min(out.len());
            v6::lookup_batch(root, &addrs[..n], &mut indices[..n]);
            for (slot, index) in out.iter_mut().zip(&indices[..n]) {
                *slot = index.and_then(|i| self.next_hops.get(i as usize).copied());
            }
        }
    }
}

// ===== impl Fib =====

/// The writer side of the FIB, owned by the control thread.
pub struct Fib {
    /// Per prefix length 0..=32: network -> next-hop index.
    v4_routes: Vec<HashMap<u32, u32>>,
    /// Per prefix length 0..=128: network -> next-hop index.
    v6_routes: Vec<HashMap<u128, u32>>,
    route_count: usize,
    next_hops: NextHopIndex,
    v4_writer: V4Writer,
    /// The snapshot last published.
    current: Arc<Snapshot>,
    published: Arc<ArcSwap<Snapshot>>,
    /// Replaced snapshots that readers may still hold; freed here.
    retired: Vec<Arc<Snapshot>>,
}

/// The next snapshot while a batch is applied.
struct Working {
    v4: Arc<V4Table>,
    v6: Option<Arc<v6::Node>>,
    next_hops: Arc<Vec<NextHop>>,
}

impl Fib {
    /// An empty FIB and a reader of it.
    pub fn new() -> (Fib, FibReader) {
        let (v4_writer, v4_table) = V4Writer::new();
        let current = Arc::new(Snapshot {
            v4: Arc::new(v4_table),
            v6: None,
            next_hops: Arc::new(Vec::new()),
        });
        let published = Arc::new(ArcSwap::new(current.clone()));
        let fib = Fib {
            v4_routes: vec![HashMap::new(); 33],
            v6_routes: vec![HashMap::new(); 129],
            route_count: 0,
            next_hops: NextHopIndex::default(),
            v4_writer,
            current,
            published: published.clone(),
            retired: Vec::new(),
        };
        (fib, FibReader { published })
    }

    /// Another reader of this FIB.
    pub fn reader(&self) -> FibReader {
        FibReader {
            published: self.published.clone(),
        }
    }

    /// Adds or replaces the route for `prefix` (host bits are ignored);
    /// returns the next hop it replaced.
    ///
    /// # Panics
    ///
    /// If more than 2^24 distinct next hops would be in use; use
    /// [`Fib::try_insert`] to get an error instead.
    pub fn insert(&mut self, prefix: IpNet, next_hop: NextHop) -> Option<NextHop> {
        match self.try_insert(prefix, next_hop) {
            Ok(old) => old,
            Err(e) => panic!("FIB insert of {prefix}: {e}"),
        }
    }

    /// Adds or replaces the route for `prefix` (host bits are ignored);
    /// returns the next hop it replaced.
    pub fn try_insert(
        &mut self,
        prefix: IpNet,
        next_hop: NextHop,
    ) -> Result<Option<NextHop>, FibError> {
        let mut working = self.working();
        let old = self.upsert(&mut working, prefix, next_hop);
        self.publish(working);
        old
    }

    /// Removes the route for exactly `prefix` (host bits are ignored);
    /// returns its next hop.
    pub fn remove(&mut self, prefix: &IpNet) -> Option<NextHop> {
        let mut working = self.working();
        let old = self.delete(&mut working, prefix);
        if old.is_some() {
            self.publish(working);
        }
        old
    }

    /// Applies a batch of changes and publishes them as one snapshot: readers
    /// see all of them or none. Much faster than one call per route for
    /// large batches (each touched chunk is copied once).
    ///
    /// On error, the changes before the failing one are applied and
    /// published, the rest are not.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = FibChange>) -> Result<(), FibError> {
        let mut working = self.working();
        let mut result = Ok(());
        for change in changes {
            match change {
                FibChange::Upsert { prefix, next_hop } => {
                    if let Err(e) = self.upsert(&mut working, prefix, next_hop) {
                        result = Err(e);
                        break;
                    }
                }
                FibChange::Remove { prefix } => {
                    self.delete(&mut working, &prefix);
                }
            }
        }
        self.publish(working);
        result
    }

    /// The next hop of the route for exactly `prefix` (host bits ignored).
    pub fn get(&self, prefix: &IpNet) -> Option<NextHop> {
        let index = match prefix.trunc() {
            IpNet::V4(n) => {
                self.v4_routes[usize::from(n.prefix_len())].get(&u32::from(n.network()))
            }
            IpNet::V6(n) => {
                self.v6_routes[usize::from(n.prefix_len())].get(&u128::from(n.network()))
            }
        };
        index.map(|&i| self.next_hops.get(i))
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.route_count
    }

    /// Whether the FIB has no routes.
    pub fn is_empty(&self) -> bool {
        self.route_count == 0
    }

    /// Every route, in no particular order.
    pub fn routes(&self) -> impl Iterator<Item = (IpNet, NextHop)> + '_ {
        let v4 = self
            .v4_routes
            .iter()
            .enumerate()
            .flat_map(move |(len, routes)| {
                routes.iter().filter_map(move |(&network, &index)| {
                    let net = Ipv4Net::new(Ipv4Addr::from(network), len as u8).ok()?;
                    Some((IpNet::V4(net), self.next_hops.get(index)))
                })
            });
        let v6 = self
            .v6_routes
            .iter()
            .enumerate()
            .flat_map(move |(len, routes)| {
                routes.iter().filter_map(move |(&network, &index)| {
                    let net = Ipv6Net::new(Ipv6Addr::from(network), len as u8).ok()?;
                    Some((IpNet::V6(net), self.next_hops.get(index)))
                })
            });
        v4.chain(v6)
    }

    /// Bytes used by the published lookup structures (not counting the
    /// writer's own route maps).
    pub fn memory(&self) -> FibMemory {
        let snapshot = &self.current;
        FibMemory {
            v4_bytes: snapshot.v4.bytes(),
            v6_bytes: snapshot.v6.as_deref().map_or(0, v6::bytes),
            next_hop_bytes: snapshot.next_hops.capacity() * std::mem::size_of::<NextHop>(),
            next_hops: self.next_hops.in_use(),
        }
    }

    /// Frees replaced snapshots that no reader holds any more. Updates do
    /// this themselves; call it when the FIB has been idle for a while.
    pub fn reclaim(&mut self) {
        self.retired
            .retain(|snapshot| Arc::strong_count(snapshot) > 1);
        self.v4_writer.trim();
    }

    fn working(&self) -> Working {
        Working {
            v4: self.current.v4.clone(),
            v6: self.current.v6.clone(),
            next_hops: self.current.next_hops.clone(),
        }
    }

    fn publish(&mut self, working: Working) {
        let next = Arc::new(Snapshot {
            v4: working.v4,
            v6: working.v6,
            next_hops: working.next_hops,
        });
        let replaced = self.published.swap(next.clone());
        self.current = next;
        self.retired.push(replaced);
        self.reclaim();
    }

    fn upsert(
        &mut self,
        working: &mut Working,
        prefix: IpNet,
        next_hop: NextHop,
    ) -> Result<Option<NextHop>, FibError> {
        let index = self.next_hops.acquire(next_hop, &mut working.next_hops)?;
        let replaced = match prefix.trunc() {
            IpNet::V4(n) => {
                let (network, len) = (u32::from(n.network()), n.prefix_len());
                let replaced = self.v4_routes[usize::from(len)].insert(network, index);
                if replaced != Some(index) {
                    let table = Arc::make_mut(&mut working.v4);
                    let entry = v4::route_entry(len, index);
                    self.v4_writer.insert(table, network, len, entry);
                }
                replaced
            }
            IpNet::V6(n) => {
                let (network, len) = (u128::from(n.network()), n.prefix_len());
                let replaced = self.v6_routes[usize::from(len)].insert(network, index);
                if replaced != Some(index) {
                    working.v6 = v6::update(working.v6.as_ref(), network, len, &self.v6_routes);
                }
                replaced
            }
        };
        Ok(match replaced {
            Some(old) => {
                let old_hop = self.next_hops.get(old);
                self.next_hops.release(old);
                Some(old_hop)
            }
            None => {
                self.route_count += 1;
                None
            }
        })
    }

    fn delete(&mut self, working: &mut Working, prefix: &IpNet) -> Option<NextHop> {
        let index = match prefix.trunc() {
            IpNet::V4(n) => {
                let (network, len) = (u32::from(n.network()), n.prefix_len());
                let index = self.v4_routes[usize::from(len)].remove(&network)?;
                let fallback = self.covering_v4(network, len);
                let table = Arc::make_mut(&mut working.v4);
                self.v4_writer.remove(table, network, len, fallback);
                index
            }
            IpNet::V6(n) => {
                let (network, len) = (u128::from(n.network()), n.prefix_len());
                let index = self.v6_routes[usize::from(len)].remove(&network)?;
                working.v6 = v6::update(working.v6.as_ref(), network, len, &self.v6_routes);
                index
            }
        };
        let old_hop = self.next_hops.get(index);
        self.next_hops.release(index);
        self.route_count -= 1;
        Some(old_hop)
    }

    /// The entry of the longest IPv4 route strictly shorter than `len` that
    /// holds `network`, or 0 (no route).
    fn covering_v4(&self, network: u32, len: u8) -> u32 {
        (0..len)
            .rev()
            .find_map(|l| {
                self.v4_routes[usize::from(l)]
                    .get(&v4::mask(network, l))
                    .map(|&index| v4::route_entry(l, index))
            })
            .unwrap_or(0)
    }
}

impl fmt::Debug for Fib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fib")
            .field("routes", &self.route_count)
            .field("next_hops", &self.next_hops.in_use())
            .finish_non_exhaustive()
    }
}

// ===== impl FibReader =====

/// The reader side of the FIB; cheap to clone, one per worker.
#[derive(Clone)]
pub struct FibReader {
    published: Arc<ArcSwap<Snapshot>>,
}

impl FibReader {
    /// The next hop of the longest prefix that holds `dst`.
    pub fn lookup(&self, dst: IpAddr) -> Option<NextHop> {
        match dst {
            IpAddr::V4(a) => self.lookup_v4(a),
            IpAddr::V6(a) => self.lookup_v6(a),
        }
    }

    /// Longest-prefix match for an IPv4 destination.
    #[inline]
    pub fn lookup_v4(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.published.load().lookup_v4(u32::from(dst))
    }

    /// Longest-prefix match for an IPv6 destination.
    #[inline]
    pub fn lookup_v6(&self, dst: Ipv6Addr) -> Option<NextHop> {
        self.published.load().lookup_v6(u128::from(dst))
    }

    /// Looks up `dsts[i]` into `out[i]` against one snapshot, for
    /// `min(dsts.len(), out.len())` addresses.
    #[inline]
    pub fn lookup_v4_batch(&self, dsts: &[Ipv4Addr], out: &mut [Option<NextHop>]) {
        self.published.load().lookup_v4_batch(dsts, out);
    }

    /// Looks up `dsts[i]` into `out[i]` against one snapshot, for
    /// `min(dsts.len(), out.len())` addresses.
    pub fn lookup_v6_batch(&self, dsts: &[Ipv6Addr], out: &mut [Option<NextHop>]) {
        self.published.load().lookup_v6_batch(dsts, out);
    }

    /// The FIB as it is now, for a batch of lookups that should all see the
    /// same version and pay the atomic load once. Hold it for one batch, not
    /// longer: it keeps that version's memory alive.
    #[inline]
    pub fn snapshot(&self) -> FibSnapshot {
        FibSnapshot {
            guard: self.published.load(),
        }
    }
}

impl fmt::Debug for FibReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FibReader").finish_non_exhaustive()
    }
}

// ===== impl FibSnapshot =====

/// One version of the FIB, held for a batch of lookups (see
/// [`FibReader::snapshot`]).
pub struct FibSnapshot {
    guard: arc_swap::Guard<Arc<Snapshot>>,
}

impl FibSnapshot {
    /// The next hop of the longest prefix that holds `dst`.
    #[inline]
    pub fn lookup(&self, dst: IpAddr) -> Option<NextHop> {
        match dst {
            IpAddr::V4(a) => self.lookup_v4(a),
            IpAddr::V6(a) => self.lookup_v6(a),
        }
    }

    /// Longest-prefix match for an IPv4 destination.
    #[inline]
    pub fn lookup_v4(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.guard.lookup_v4(u32::from(dst))
    }

    /// Longest-prefix match for an IPv6 destination.
    #[inline]
    pub fn lookup_v6(&self, dst: Ipv6Addr) -> Option<NextHop> {
        self.guard.lookup_v6(u128::from(dst))
    }

    /// Looks up `dsts[i]` into `out[i]`, for `min(dsts.len(), out.len())`
    /// addresses.
    #[inline]
    pub fn lookup_v4_batch(&self, dsts: &[Ipv4Addr], out: &mut [Option<NextHop>]) {
        self.guard.lookup_v4_batch(dsts, out);
    }

    /// Looks up `dsts[i]` into `out[i]`, for `min(dsts.len(), out.len())`
    /// addresses.
    pub fn lookup_v6_batch(&self, dsts: &[Ipv6Addr], out: &mut [Option<NextHop>]) {
        self.guard.lookup_v6_batch(dsts, out);
    }
}

impl fmt::Debug for FibSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FibSnapshot").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
