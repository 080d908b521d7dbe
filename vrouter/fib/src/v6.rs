//! IPv6: a multibit trie of stride 6 with bitmap-compressed nodes.
//!
//! Each node consumes 6 bits of the address (64 slots), so a /48 is reached
//! in 9 steps and a /128 in 22. A node keeps two 64-bit maps, as in poptrie:
//! which slots hold a route (`leaf_bits`) and which have a child
//! (`child_bits`); the values and children are packed arrays indexed by the
//! popcount of the map below the slot. A node with three routes costs a few
//! dozen bytes, not 64 pointers, so 100k IPv6 routes take a few MiB.
//!
//! A route of length `L` lives in the node at depth `L / 6`, expanded over
//! the `2^(6 - L % 6)` slots it covers (longer routes of the same node win).
//! Routes are not pushed down into deeper nodes: the lookup remembers the
//! last route it passed on the way down. This keeps an update local: changing
//! one route rebuilds one node and copies its ancestors (path copying), and
//! the new root is published atomically with the rest of the snapshot, so
//! readers never see a half-changed trie.

use std::collections::HashMap;
use std::sync::Arc;

/// Bits consumed per level.
const STRIDE: u32 = 6;
/// Depth of the deepest node (bits 126..128).
const MAX_DEPTH: u32 = 128 / STRIDE;

/// The network address of `addr` with `len` bits kept.
pub(crate) fn mask(addr: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        addr & (u128::MAX << (128 - u32::from(len)))
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
    let depth = u32::from(len) / STRIDE;
    debug_assert!(depth <= MAX_DEPTH);
    depth
}

/// One trie node: immutable once published.
pub(crate) struct Node {
    leaf_bits: u64,
    child_bits: u64,
    /// Next-hop indices, one per set bit of `leaf_bits`.
    leaves: Box<[u32]>,
    /// Children, one per set bit of `child_bits`.
    children: Box<[Arc<Node>]>,
}

/// The routes the writer knows, per prefix length: network -> next-hop index.
pub(crate) type RoutesByLen = [HashMap<u128, u32>];

/// The next-hop index of the longest route holding `addr`.
#[inline]
pub(crate) fn lookup(root: &Node, addr: u128) -> Option<u32> {
    let mut node = root;
    let mut best = None;
    let mut depth = 0;
    loop {
        let bit = 1u64 << slot(addr, depth);
        let below = bit - 1;
        if node.leaf_bits & bit != 0 {
            best = node
                .leaves
                .get((node.leaf_bits & below).count_ones() as usize)
                .copied();
        }
        if node.child_bits & bit == 0 {
            return best;
        }
        match node
            .children
            .get((node.child_bits & below).count_ones() as usize)
        {
            Some(child) => node = child,
            None => return best,
        }
        depth += 1;
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

fn update_at(
    node: Option<&Arc<Node>>,
    depth: u32,
    network: u128,
    target: u32,
    routes: &RoutesByLen,
) -> Option<Arc<Node>> {
    let (mut leaf_bits, mut leaves, mut child_bits, mut children) = match node {
        Some(n) => (
            n.leaf_bits,
            n.leaves.clone(),
            n.child_bits,
            n.children.to_vec(),
        ),
        None => (0, Box::default(), 0, Vec::new()),
    };
    if depth == target {
        (leaf_bits, leaves) = build_leaves(depth, network, routes);
    } else {
        let bit = 1u64 << slot(network, depth);
        let at = (child_bits & (bit - 1)).count_ones() as usize;
        let old = (child_bits & bit != 0).then(|| children[at].clone());
        match (
            old.is_some(),
            update_at(old.as_ref(), depth + 1, network, target, routes),
        ) {
            (true, Some(child)) => children[at] = child,
            (true, None) => {
                children.remove(at);
                child_bits &= !bit;
            }
            (false, Some(child)) => {
                children.insert(at, child);
                child_bits |= bit;
            }
            (false, None) => {}
        }
    }
    if leaf_bits == 0 && child_bits == 0 {
        return None;
    }
    Some(Arc::new(Node {
        leaf_bits,
        child_bits,
        leaves,
        children: children.into_boxed_slice(),
    }))
}

/// The slots of the node at `depth` on the way to `network`, from the routes
/// of lengths `6 * depth ..= 6 * depth + 5` under it.
fn build_leaves(depth: u32, network: u128, routes: &RoutesByLen) -> (u64, Box<[u32]>) {
    let base_len = STRIDE * depth;
    let node_prefix = mask(network, base_len as u8);
    let mut slots: [Option<u32>; 64] = [None; 64];
    let top_len = (base_len + STRIDE - 1).min(128);
    for len in base_len..=top_len {
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
            leaves.push(*index);
        }
    }
    (bits, leaves.into_boxed_slice())
}

/// Bytes of the trie under `node`.
pub(crate) fn bytes(node: &Node) -> usize {
    std::mem::size_of::<Node>()
        + 4 * node.leaves.len()
        + std::mem::size_of::<Arc<Node>>() * node.children.len()
        + node.children.iter().map(|c| bytes(c)).sum::<usize>()
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
