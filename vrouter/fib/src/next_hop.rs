//! Interned next hops.
//!
//! The lookup tables store a 24-bit index instead of the 24-byte [`NextHop`]:
//! it keeps a DIR-24-8 entry at 4 bytes and lets thousands of routes share one
//! next hop. The writer counts the routes using each index; an index whose
//! last route is gone goes back to a free list. Reusing an index is safe for
//! readers because the published table of next hops is copy-on-write: a
//! snapshot a worker still holds keeps the old contents of that slot.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{FibError, NextHop};

/// Largest number of distinct next hops alive at once (the index is 24 bits).
pub(crate) const MAX_NEXT_HOPS: usize = 1 << 24;

/// The writer's side of the next-hop table.
#[derive(Default)]
pub(crate) struct NextHopIndex {
    by_hop: HashMap<NextHop, u32>,
    /// Per index: its next hop and how many routes use it (0 = free).
    slots: Vec<(NextHop, u32)>,
    free: Vec<u32>,
}

impl NextHopIndex {
    /// The index for `next_hop`, adding it to `published` (copy-on-write) if
    /// it is new; counts one more route using it.
    pub(crate) fn acquire(
        &mut self,
        next_hop: NextHop,
        published: &mut Arc<Vec<NextHop>>,
    ) -> Result<u32, FibError> {
        if let Some(&index) = self.by_hop.get(&next_hop) {
            self.slots[index as usize].1 += 1;
            return Ok(index);
        }
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index as usize] = (next_hop, 1);
                Arc::make_mut(published)[index as usize] = next_hop;
                index
            }
            None => {
                if self.slots.len() >= MAX_NEXT_HOPS {
                    return Err(FibError::TooManyNextHops);
                }
                // The length is below 2^24, so it fits in a u32.
                let index = self.slots.len() as u32;
                self.slots.push((next_hop, 1));
                Arc::make_mut(published).push(next_hop);
                index
            }
        };
        self.by_hop.insert(next_hop, index);
        Ok(index)
    }

    /// One route fewer uses `index`; frees it when it was the last one. The
    /// caller must already have removed `index` from the working tables.
    pub(crate) fn release(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        slot.1 -= 1;
        if slot.1 == 0 {
            self.by_hop.remove(&slot.0);
            self.free.push(index);
        }
    }

    /// The next hop stored at `index`.
    pub(crate) fn get(&self, index: u32) -> NextHop {
        self.slots[index as usize].0
    }

    /// Number of distinct next hops in use.
    pub(crate) fn in_use(&self) -> usize {
        self.by_hop.len()
    }
}
