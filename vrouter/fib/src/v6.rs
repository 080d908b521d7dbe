//! IPv6: a path-compressed multibit trie of stride 6 with bitmap nodes.
//!
//! Each node consumes 6 bits of the address (64 slots). A node keeps two
//! 64-bit maps, as in poptrie: which slots hold a route (`leaf_bits`) and
//! which have a child (`child_bits`); the values and children are packed
//! arrays indexed by the popcount of the map below the slot, so a node with
//! one route costs a few dozen bytes, not 64 pointers.
//!
//! A route of length `L > 0` lives in the node at depth `(L - 1) / 6`,
//! expanded over the `2^(6 * (depth + 1) - L)` slots it covers (a /48 takes
//! one slot of a depth-7 node); `::/0` fills the root. Routes are not pushed
//! down into deeper nodes: the lookup remembers the last route it passed.
//! This keeps an update local: changing one route rebuilds one node and
//! copies its ancestors (path copying); the new root is published with the
//! rest of the snapshot, so readers never see a half-changed trie.
//!
//! Path compression: a node with no route and one child is not stored; its
//! parent points straight at the child, which records its own depth and
//! prefix. A lookup checks that prefix and stops (with the best route so far)
//! on a mismatch. Sparse tables (one /48 under each of 100k /32s) thus cost
//! about four node visits per lookup instead of eight.

use std::collections::HashMap;
use std::sync::Arc;

/// Bits consumed per level.
const STRIDE: u32 = 6;
/// Depth of the deepest node (bits 126..128).
const MAX_DEPTH: u32 = 128 / STRIDE;

/// The mask keeping the first `len` bits.
fn prefix_mask(len: u32) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    }
}

/// The 6-bit slot of `addr` in a node at `depth`; bits past the end of the
/// address read as zero.
#[inline(always)]
fn slot(addr: u128, depth: u32) -> u32 {
    ((addr << (STRIDE * depth)) >> (128 - STRIDE)) as u32
}

/// The depth of the node that holds a route of `len` bits.
pub(crate) fn node_depth(len: u8) -> u32 {
    let depth = u32::from(len).saturating_sub(1) / STRIDE;
    debug_assert!(depth <= MAX_DEPTH);
    depth
}

/// One trie node: immutable once published.
pub(crate) struct Node {
    /// The first `6 * depth` bits of every address under this node.
    prefix: u128,
    prefix_mask: u128,
    depth: u32,
    leaf_bits: u64,
    child_bits: u64,
    /// One allocation per node (one cache miss per level, not two): a
    /// [`Slot::Leaf`] per set bit of `leaf_bits`, then a [`Slot::Child`]
    /// per set bit of `child_bits`.
    slots: Box<[Slot]>,
}

/// What a node holds for one of its set bits.
#[derive(Clone)]
enum Slot {
    /// A next-hop index.
    Leaf(u32),
    /// A child node.
    Child(Arc<Node>),
}

impl Node {
    fn leaf_count(&self) -> usize {
        self.leaf_bits.count_ones() as usize
    }
}

/// The routes the writer knows, per prefix length: network -> next-hop index.
pub(crate) type RoutesByLen = [HashMap<u128, u32>];

/// The next-hop index of the longest route holding `addr`.
#[inline]
pub(crate) fn lookup(root: &Node, addr: u128) -> Option<u32> {
    let mut best = None;
    let mut node = Some(root);
    while let Some(n) = node {
        node = step(n, addr, &mut best);
    }
    best
}

/// Lookups walked in lockstep, one level per round.
const LANES: usize = 8;

/// Looks up `addrs[i]` into `out[i]`. The walks of [`LANES`] addresses
/// advance together, one level per round: a walk is a chain of dependent
/// cache misses, and interleaving eight chains keeps eight misses in flight
/// instead of one (memory-level parallelism).
pub(crate) fn lookup_batch(root: &Node, addrs: &[u128], out: &mut [Option<u32>]) {
    for (addrs, out) in addrs.chunks(LANES).zip(out.chunks_mut(LANES)) {
        let mut nodes: [Option<&Node>; LANES] = [None; LANES];
        let mut best: [Option<u32>; LANES] = [None; LANES];
        for node in nodes.iter_mut().take(addrs.len()) {
            *node = Some(root);
        }
        let mut walking = true;
        while walking {
            walking = false;
            for ((node, best), addr) in nodes.iter_mut().zip(best.iter_mut()).zip(addrs) {
                if let Some(n) = *node {
                    *node = step(n, *addr, best);
                    walking |= node.is_some();
                }
            }
        }
        for (slot, best) in out.iter_mut().zip(best) {
            *slot = best;
        }
    }
}

/// One level of a walk: records the route this node holds for `addr` in
/// `best` and returns the child to visit next, if any.
#[inline(always)]
fn step<'a>(node: &'a Node, addr: u128, best: &mut Option<u32>) -> Option<&'a Node> {
    if addr & node.prefix_mask != node.prefix {
        // A compressed path this address leaves.
        return None;
    }
    let bit = 1u64 << slot(addr, node.depth);
    let below = bit - 1;
    if node.leaf_bits & bit != 0
        && let Some(Slot::Leaf(index)) = node
            .slots
            .get((node.leaf_bits & below).count_ones() as usize)
    {
        *best = Some(*index);
    }
    if node.child_bits & bit == 0 {
        return None;
    }
    let at = node.leaf_count() + (node.child_bits & below).count_ones() as usize;
    match node.slots.get(at) {
        Some(Slot::Child(child)) => Some(child),
        _ => None,
    }
}

/// The root after the routes of the node holding prefixes of `len` bits
/// under `network` changed in `routes`: rebuilds that node from `routes` and
/// copies its ancestors; every other node is shared with `root`.
pub(crate) fn update(
    root: Option<&Arc<Node>>,
    network: u128,
    len: u8,
    routes: &RoutesByLen,
) -> Option<Arc<Node>> {
    update_at(root, 0, network, node_depth(len), routes)
}

/// `node` is what the trie holds for the node at `depth` on the way to
/// `network`: nothing, that node, or (path compression) a deeper node.
fn update_at(
    node: Option<&Arc<Node>>,
    depth: u32,
    network: u128,
    target: u32,
    routes: &RoutesByLen,
) -> Option<Arc<Node>> {
    let (mut leaf_bits, mut leaves, mut child_bits, mut children) = match node {
        Some(n) if n.depth == depth => {
            let (leaves, children) = n.slots.split_at(n.leaf_count());
            (
                n.leaf_bits,
                leaves.to_vec(),
                n.child_bits,
                children.to_vec(),
            )
        }
        // A compressed path: this level is an empty node whose one child
        // leads to `n`.
        Some(n) => (
            0,
            Vec::new(),
            1u64 << slot(n.prefix, depth),
            vec![Slot::Child(n.clone())],
        ),
        None => (0, Vec::new(), 0, Vec::new()),
    };
    if depth == target {
        (leaf_bits, leaves) = build_leaves(depth, network, routes);
    } else {
        let bit = 1u64 << slot(network, depth);
        let at = (child_bits & (bit - 1)).count_ones() as usize;
        let old = match children.get(at) {
            Some(Slot::Child(child)) if child_bits & bit != 0 => Some(child.clone()),
            _ => None,
        };
        match (
            old.is_some(),
            update_at(old.as_ref(), depth + 1, network, target, routes),
        ) {
            (true, Some(child)) => children[at] = Slot::Child(child),
            (true, None) => {
                children.remove(at);
                child_bits &= !bit;
            }
            (false, Some(child)) => {
                children.insert(at, Slot::Child(child));
                child_bits |= bit;
            }
            (false, None) => {}
        }
    }
    match (leaf_bits, child_bits.count_ones()) {
        (0, 0) => None,
        // No route here and one way down: point the parent at the child.
        (0, 1) => match children.pop() {
            Some(Slot::Child(child)) => Some(child),
            _ => None,
        },
        _ => {
            let prefix_mask = prefix_mask(STRIDE * depth);
            leaves.extend(children);
            Some(Arc::new(Node {
                prefix: network & prefix_mask,
                prefix_mask,
                depth,
                leaf_bits,
                child_bits,
                slots: leaves.into_boxed_slice(),
            }))
        }
    }
}

/// The slots of the node at `depth` on the way to `network`, from the routes
/// of lengths `6 * depth + 1 ..= 6 * depth + 6` under it (and `::/0` at the
/// root).
fn build_leaves(depth: u32, network: u128, routes: &RoutesByLen) -> (u64, Vec<Slot>) {
    let base_len = STRIDE * depth;
    let node_prefix = network & prefix_mask(base_len);
    let mut slots: [Option<u32>; 64] = [None; 64];
    let first_len = if depth == 0 { 0 } else { base_len + 1 };
    let last_len = (base_len + STRIDE).min(128);
    for len in first_len..=last_len {
        let by_network = &routes[len as usize];
        if by_network.is_empty() {
            continue;
        }
        let extra = len - base_len;
        let span = 1usize << (STRIDE - extra);
        for sub in 0..(1u128 << extra) {
            let candidate = if extra == 0 {
                node_prefix
            } else {
                node_prefix | (sub << (128 - len))
            };
            if let Some(&index) = by_network.get(&candidate) {
                let start = (sub as usize) << (STRIDE - extra);
                slots[start..start + span].fill(Some(index));
            }
        }
    }
    let mut bits = 0u64;
    let mut leaves = Vec::new();
    for (i, value) in slots.iter().enumerate() {
        if let Some(index) = value {
            bits |= 1 << i;
            leaves.push(Slot::Leaf(*index));
        }
    }
    (bits, leaves)
}

/// Bytes of the trie under `node`.
pub(crate) fn bytes(node: &Node) -> usize {
    std::mem::size_of::<Node>()
        + std::mem::size_of::<Slot>() * node.slots.len()
        + node
            .slots
            .iter()
            .map(|s| match s {
                Slot::Child(child) => bytes(child),
                Slot::Leaf(_) => 0,
            })
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_reads_six_bits_per_level_and_pads_the_last_level_with_zeros() {
        let addr = u128::MAX;
        assert_eq!(slot(addr, 0), 63);
        assert_eq!(slot(addr, MAX_DEPTH), 0b11_0000);
        assert_eq!(slot(1u128 << 127, 0), 0b10_0000);
    }
}
