//! IPv4: DIR-24-8 cut into copy-on-write chunks.
//!
//! A classic DIR-24-8 has one 2^24-entry table (`tbl24`, indexed by the top
//! 24 bits of the address) and groups of 256 entries (`tbl8`) for the /24s
//! that hold longer routes: a lookup is one memory access, two for a /25-/32.
//! We keep that lookup, but cut `tbl24` into 4096 chunks of 4096 entries,
//! each chunk covering one /12 and owning the `tbl8` groups of its /24s.
//!
//! Why chunks: readers must never see a half-applied update, and we forbid
//! `unsafe`. Chunks are immutable once published (`Arc<Chunk>`); the writer
//! copies only the chunks a change touches (16 KiB plus their tbl8 groups)
//! and the root's pointer arrays on their path (two levels of 64 pointers),
//! and publishes the new root atomically (see the crate docs). The lookup
//! costs two more loads than a flat table (the pointers, from 32 KiB that
//! stay in L1/L2).
//!
//! Memory: a flat DIR-24-8 costs 64 MiB even for ten routes. Here chunks that
//! hold one value everywhere (no route, or covered by one short route) are
//! shared: an empty FIB costs the 32 KiB root plus one 16 KiB chunk, a node
//! with a default route and its pod CIDR a few chunks. A full Internet table
//! touches every /12 and costs the full 64 MiB plus 1 KiB per /24 that holds a
//! route longer than /24. For a node daemon that is acceptable only because
//! it is paid by tables that large, never by a small cluster.
//!
//! Entry (u32): bit 31 set = `tbl8` group index in bits 0..31. Otherwise bits
//! 24..30 hold the route's prefix length plus one (0 = no route) and bits
//! 0..24 the next-hop index. The stored length is what lets an insert leave
//! longer routes alone and a removal restore the covering route.

use std::collections::HashMap;
use std::sync::Arc;

/// Entries per chunk (one chunk covers a /12).
const SLOTS: usize = 4096;
/// Chunks per group of the root, and groups in the root (64 * 64 = 4096
/// chunks of 4096 entries = 2^24 tbl24 entries).
const FANOUT: usize = 64;
/// Entries per tbl8 group.
const GROUP: usize = 256;

/// Entry flag: the rest is a tbl8 group index.
const TBL8: u32 = 1 << 31;
const DEPTH_SHIFT: u32 = 24;
const DEPTH_MASK: u32 = 0x7f << DEPTH_SHIFT;
/// Mask of the next-hop index in a route entry.
pub(crate) const INDEX_MASK: u32 = (1 << DEPTH_SHIFT) - 1;

/// The entry for a route of `len` bits with next hop `index`.
pub(crate) fn route_entry(len: u8, index: u32) -> u32 {
    ((u32::from(len) + 1) << DEPTH_SHIFT) | index
}

/// Prefix length plus one of a route entry, 0 for no route.
fn depth(entry: u32) -> u32 {
    (entry & DEPTH_MASK) >> DEPTH_SHIFT
}

/// Whether a (non-tbl8) entry holds a route.
#[inline]
pub(crate) fn is_route(entry: u32) -> bool {
    entry & DEPTH_MASK != 0
}

/// The network address of `addr` with `len` bits kept.
pub(crate) fn mask(addr: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        addr & (u32::MAX << (32 - u32::from(len)))
    }
}

/// One /12 of `tbl24` and the tbl8 groups of its /24s.
#[derive(Clone)]
pub(crate) struct Chunk {
    /// Groups of [`GROUP`] entries, back to back.
    tbl8: Vec<u32>,
    /// Group indices free for reuse.
    tbl8_free: Vec<u32>,
    tbl24: [u32; SLOTS],
}

impl Chunk {
    fn uniform(entry: u32) -> Chunk {
        Chunk {
            tbl8: Vec::new(),
            tbl8_free: Vec::new(),
            tbl24: [entry; SLOTS],
        }
    }

    fn groups_in_use(&self) -> usize {
        self.tbl8.len() / GROUP - self.tbl8_free.len()
    }

    fn alloc_group(&mut self, fill: u32) -> u32 {
        match self.tbl8_free.pop() {
            Some(group) => {
                let start = group as usize * GROUP;
                self.tbl8[start..start + GROUP].fill(fill);
                group
            }
            None => {
                let group = (self.tbl8.len() / GROUP) as u32;
                // Exact growth: chunks with many groups are common in
                // tables of long prefixes, and doubling would waste up to
                // half of their memory.
                self.tbl8.reserve_exact(GROUP);
                self.tbl8.resize(self.tbl8.len() + GROUP, fill);
                group
            }
        }
    }

    fn free_group(&mut self, group: u32) {
        self.tbl8_free.push(group);
        if self.groups_in_use() == 0 {
            self.tbl8 = Vec::new();
            self.tbl8_free = Vec::new();
        }
    }

    fn group_mut(&mut self, group: u32) -> &mut [u32] {
        let start = group as usize * GROUP;
        &mut self.tbl8[start..start + GROUP]
    }

    /// Bytes this chunk owns.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Chunk>() + 4 * (self.tbl8.capacity() + self.tbl8_free.capacity())
    }
}

/// 64 chunk pointers (a /6 of the address space).
type ChunkGroup = [Arc<Chunk>; FANOUT];

/// The published IPv4 table: immutable once a reader can see it.
///
/// The root has two levels of 64 pointers rather than one of 4096 so that a
/// single route change copies 2 x 512 bytes of pointers (and adjusts 128
/// reference counts), not 32 KiB (4096); the extra load hits the same 32 KiB
/// of pointers the flat root had, which stay in L1/L2.
#[derive(Clone)]
pub(crate) struct V4Table {
    groups: Box<[Arc<ChunkGroup>; FANOUT]>,
}

impl V4Table {
    /// The entry for `addr`: a route entry, or 0 for no route.
    #[inline(always)]
    pub(crate) fn lookup(&self, addr: u32) -> u32 {
        // Both indices are 12 bits wide and the arrays have 4096 elements,
        // so the compiler drops the bounds checks.
        let group = &self.groups[(addr >> 26) as usize];
        let chunk = &group[((addr >> 20) & 0x3f) as usize];
        let entry = chunk.tbl24[((addr >> 8) & 0xfff) as usize];
        if entry & TBL8 == 0 {
            entry
        } else {
            let at = (((entry & !TBL8) as usize) << 8) | (addr & 0xff) as usize;
            chunk.tbl8.get(at).copied().unwrap_or(0)
        }
    }

    /// Bytes of the root and of every distinct chunk.
    pub(crate) fn bytes(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        let mut total = std::mem::size_of::<[Arc<ChunkGroup>; FANOUT]>();
        for group in self.groups.iter() {
            total += std::mem::size_of::<ChunkGroup>();
            for chunk in group.iter() {
                if seen.insert(Arc::as_ptr(chunk)) {
                    total += chunk.bytes();
                }
            }
        }
        total
    }

    fn chunk(&self, index: usize) -> &Arc<Chunk> {
        &self.groups[index / FANOUT][index % FANOUT]
    }

    /// The pointer to chunk `index`, in a group of this table's own.
    fn chunk_slot(&mut self, index: usize) -> &mut Arc<Chunk> {
        &mut Arc::make_mut(&mut self.groups[index / FANOUT])[index % FANOUT]
    }
}

/// How a change rewrites the entries under its prefix.
#[derive(Clone, Copy)]
enum Rewrite {
    /// Insert or replace a route of this depth (length + 1): overwrite every
    /// entry set by a route no longer than it.
    Insert { depth: u32, entry: u32 },
    /// Remove the route of this depth: the entries it set (exactly those of
    /// its depth under its prefix) fall back to the covering route.
    Remove { depth: u32, fallback: u32 },
}

impl Rewrite {
    #[inline]
    fn apply(self, old: u32) -> u32 {
        match self {
            Rewrite::Insert { depth: d, entry } if depth(old) <= d => entry,
            Rewrite::Remove { depth: d, fallback } if depth(old) == d => fallback,
            _ => old,
        }
    }
}

/// The writer's side: builds new [`V4Table`]s from the published one.
pub(crate) struct V4Writer {
    /// Chunks holding one entry everywhere, shared between slots and tables.
    uniform: HashMap<u32, Arc<Chunk>>,
}

impl V4Writer {
    pub(crate) fn new() -> (V4Writer, V4Table) {
        let mut writer = V4Writer {
            uniform: HashMap::new(),
        };
        let empty = writer.uniform_chunk(0);
        let group: Arc<ChunkGroup> = Arc::new(std::array::from_fn(|_| empty.clone()));
        let groups = Box::new(std::array::from_fn(|_| group.clone()));
        (writer, V4Table { groups })
    }

    fn uniform_chunk(&mut self, entry: u32) -> Arc<Chunk> {
        self.uniform
            .entry(entry)
            .or_insert_with(|| Arc::new(Chunk::uniform(entry)))
            .clone()
    }

    /// The entry of `chunk` if it is one of the shared uniform chunks.
    fn uniform_entry(&self, chunk: &Arc<Chunk>) -> Option<u32> {
        let entry = chunk.tbl24[0];
        let shared = self.uniform.get(&entry)?;
        Arc::ptr_eq(shared, chunk).then_some(entry)
    }

    /// Forgets shared uniform chunks no table uses any more.
    pub(crate) fn trim(&mut self) {
        self.uniform.retain(|_, chunk| Arc::strong_count(chunk) > 1);
    }

    /// Installs `entry` (a route of `len` bits) for `network` in `table`.
    pub(crate) fn insert(&mut self, table: &mut V4Table, network: u32, len: u8, entry: u32) {
        let rewrite = Rewrite::Insert {
            depth: u32::from(len) + 1,
            entry,
        };
        self.rewrite(table, network, len, rewrite);
    }

    /// Removes the route of `len` bits for `network` from `table`; its
    /// addresses now resolve to `fallback` (the covering route's entry, or 0).
    pub(crate) fn remove(&mut self, table: &mut V4Table, network: u32, len: u8, fallback: u32) {
        let rewrite = Rewrite::Remove {
            depth: u32::from(len) + 1,
            fallback,
        };
        self.rewrite(table, network, len, rewrite);
    }

    fn rewrite(&mut self, table: &mut V4Table, network: u32, len: u8, rewrite: Rewrite) {
        let first = (network >> 8) as usize;
        if len <= 24 {
            let count = 1usize << (24 - len);
            let last = first + count - 1;
            for chunk_index in (first / SLOTS)..=(last / SLOTS) {
                let lo = first.max(chunk_index * SLOTS) - chunk_index * SLOTS;
                let hi = last.min(chunk_index * SLOTS + SLOTS - 1) - chunk_index * SLOTS;
                if lo == 0 && hi == SLOTS - 1 {
                    // A route of /12 or shorter over a shared uniform chunk
                    // (the common case for short routes) swaps in another
                    // shared chunk instead of rewriting 4096 entries.
                    if let Some(entry) = self.uniform_entry(table.chunk(chunk_index)) {
                        let shared = self.uniform_chunk(rewrite.apply(entry));
                        *table.chunk_slot(chunk_index) = shared;
                        continue;
                    }
                }
                let chunk = Arc::make_mut(table.chunk_slot(chunk_index));
                for slot in lo..=hi {
                    let entry = chunk.tbl24[slot];
                    if entry & TBL8 == 0 {
                        chunk.tbl24[slot] = rewrite.apply(entry);
                    } else {
                        for e in chunk.group_mut(entry & !TBL8) {
                            *e = rewrite.apply(*e);
                        }
                    }
                }
                self.share_if_uniform(table, chunk_index);
            }
        } else {
            let chunk_index = first / SLOTS;
            let slot = first % SLOTS;
            let chunk = Arc::make_mut(table.chunk_slot(chunk_index));
            let entry = chunk.tbl24[slot];
            let group = if entry & TBL8 != 0 {
                entry & !TBL8
            } else if let Rewrite::Insert { .. } = rewrite {
                let group = chunk.alloc_group(entry);
                chunk.tbl24[slot] = TBL8 | group;
                group
            } else {
                // Removing a route longer than /24 whose /24 has no group:
                // the route was never installed; nothing to undo.
                return;
            };
            let lo = (network & 0xff) as usize;
            let count = 1usize << (32 - len);
            let entries = chunk.group_mut(group);
            for e in &mut entries[lo..lo + count] {
                *e = rewrite.apply(*e);
            }
            // A group whose entries all come from routes of /24 or shorter
            // holds one value: fold it back into tbl24.
            if entries.iter().all(|&e| depth(e) <= 25) {
                let folded = entries[0];
                chunk.tbl24[slot] = folded;
                chunk.free_group(group);
                self.share_if_uniform(table, chunk_index);
            }
        }
    }

    fn share_if_uniform(&mut self, table: &mut V4Table, chunk_index: usize) {
        let chunk = table.chunk(chunk_index);
        if chunk.groups_in_use() != 0 {
            return;
        }
        let first = chunk.tbl24[0];
        if first & TBL8 == 0 && chunk.tbl24.iter().all(|&e| e == first) {
            let shared = self.uniform_chunk(first);
            *table.chunk_slot(chunk_index) = shared;
        }
    }
}
