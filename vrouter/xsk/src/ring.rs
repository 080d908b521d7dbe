//! The four AF_XDP rings: single-producer single-consumer queues in memory
//! shared with the kernel. Indices are free-running `u32` counters; the slot
//! is `index & (size - 1)`. Each side acquire-loads the other side's index
//! and release-stores its own, and caches the other side's index so the
//! shared cache line is touched once per batch, not once per entry.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::Desc;
use crate::sys::{Mmap, XDP_RING_NEED_WAKEUP, XdpRingOffset};

/// Entries a producer may still write, given both free-running indices.
#[inline]
pub(crate) fn free_slots(size: u32, producer: u32, consumer: u32) -> u32 {
    size - producer.wrapping_sub(consumer)
}

/// Entries a consumer may read, given both free-running indices.
#[inline]
pub(crate) fn ready_slots(producer: u32, consumer: u32) -> u32 {
    producer.wrapping_sub(consumer)
}

/// Where one ring lives in its mapping.
struct RingMap {
    mem: Mmap,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
}

impl RingMap {
    fn new(mem: Mmap, off: &XdpRingOffset, size: u32) -> RingMap {
        RingMap {
            mem,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: off.flags as usize,
            desc: off.desc as usize,
            mask: size - 1,
        }
    }

    fn producer(&self) -> &AtomicU32 {
        self.mem.atomic_u32(self.producer)
    }

    fn consumer(&self) -> &AtomicU32 {
        self.mem.atomic_u32(self.consumer)
    }

    fn needs_wakeup(&self) -> bool {
        self.mem.atomic_u32(self.flags).load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }
}

/// Bytes to map for a ring of `size` entries of `entry` bytes.
pub(crate) fn ring_map_len(off: &XdpRingOffset, size: u32, entry: usize) -> usize {
    off.desc as usize + size as usize * entry
}

// ===== producer rings: fill (u64 addresses), TX (descriptors) =====

/// A ring this process produces into (fill or TX).
pub(crate) struct ProducerRing {
    map: RingMap,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
}

impl ProducerRing {
    pub(crate) fn new(mem: Mmap, off: &XdpRingOffset, size: u32) -> ProducerRing {
        let map = RingMap::new(mem, off, size);
        let cached_prod = map.producer().load(Ordering::Relaxed);
        let cached_cons = map.consumer().load(Ordering::Acquire);
        ProducerRing {
            map,
            size,
            cached_prod,
            cached_cons,
        }
    }

    /// Free entries, refreshing the kernel's consumer index only when the
    /// cached one does not show `wanted` free.
    fn free(&mut self, wanted: u32) -> u32 {
        let free = free_slots(self.size, self.cached_prod, self.cached_cons);
        if free >= wanted {
            return free;
        }
        self.cached_cons = self.map.consumer().load(Ordering::Acquire);
        free_slots(self.size, self.cached_prod, self.cached_cons)
    }

    /// Entries written but not yet taken by the kernel (refreshes).
    pub(crate) fn outstanding(&mut self) -> u32 {
        self.cached_cons = self.map.consumer().load(Ordering::Acquire);
        ready_slots(self.cached_prod, self.cached_cons)
    }

    pub(crate) fn needs_wakeup(&self) -> bool {
        self.map.needs_wakeup()
    }

    /// Writes as many of `addrs` as fit; returns how many.
    pub(crate) fn produce_addrs(&mut self, addrs: &[u64]) -> usize {
        let n = self.free(addrs.len() as u32).min(addrs.len() as u32);
        for (i, &addr) in addrs[..n as usize].iter().enumerate() {
            let slot = (self.cached_prod.wrapping_add(i as u32) & self.map.mask) as usize;
            self.map.mem.write_u64(self.map.desc + slot * 8, addr);
        }
        self.publish(n)
    }

    /// Writes as many of `descs` as fit; returns how many.
    pub(crate) fn produce_descs(&mut self, descs: &[Desc]) -> usize {
        let n = self.free(descs.len() as u32).min(descs.len() as u32);
        for (i, d) in descs[..n as usize].iter().enumerate() {
            let slot = (self.cached_prod.wrapping_add(i as u32) & self.map.mask) as usize;
            let at = self.map.desc + slot * 16;
            self.map.mem.write_u64(at, d.addr);
            self.map.mem.write_u32(at + 8, d.len);
            self.map.mem.write_u32(at + 12, 0);
        }
        self.publish(n)
    }

    fn publish(&mut self, n: u32) -> usize {
        if n > 0 {
            self.cached_prod = self.cached_prod.wrapping_add(n);
            // Release: the entries written above become visible before the
            // kernel sees the new producer index.
            self.map
                .producer()
                .store(self.cached_prod, Ordering::Release);
        }
        n as usize
    }
}

// ===== consumer rings: completion (u64 addresses), RX (descriptors) =====

/// A ring this process consumes from (completion or RX).
pub(crate) struct ConsumerRing {
    map: RingMap,
    cached_prod: u32,
    cached_cons: u32,
}

impl ConsumerRing {
    pub(crate) fn new(mem: Mmap, off: &XdpRingOffset, size: u32) -> ConsumerRing {
        let map = RingMap::new(mem, off, size);
        let cached_cons = map.consumer().load(Ordering::Relaxed);
        let cached_prod = map.producer().load(Ordering::Acquire);
        ConsumerRing {
            map,
            cached_prod,
            cached_cons,
        }
    }

    fn ready(&mut self, wanted: u32) -> u32 {
        let ready = ready_slots(self.cached_prod, self.cached_cons);
        if ready >= wanted {
            return ready;
        }
        self.cached_prod = self.map.producer().load(Ordering::Acquire);
        ready_slots(self.cached_prod, self.cached_cons)
    }

    /// Reads up to `out.len()` addresses; returns how many.
    pub(crate) fn consume_addrs(&mut self, out: &mut [u64]) -> usize {
        let n = self.ready(out.len() as u32).min(out.len() as u32);
        for (i, o) in out[..n as usize].iter_mut().enumerate() {
            let slot = (self.cached_cons.wrapping_add(i as u32) & self.map.mask) as usize;
            *o = self.map.mem.read_u64(self.map.desc + slot * 8);
        }
        self.release(n)
    }

    /// Reads up to `out.len()` descriptors; returns how many.
    pub(crate) fn consume_descs(&mut self, out: &mut [Desc]) -> usize {
        let n = self.ready(out.len() as u32).min(out.len() as u32);
        for (i, o) in out[..n as usize].iter_mut().enumerate() {
            let slot = (self.cached_cons.wrapping_add(i as u32) & self.map.mask) as usize;
            let at = self.map.desc + slot * 16;
            *o = Desc {
                addr: self.map.mem.read_u64(at),
                len: self.map.mem.read_u32(at + 8),
            };
        }
        self.release(n)
    }

    fn release(&mut self, n: u32) -> usize {
        if n > 0 {
            self.cached_cons = self.cached_cons.wrapping_add(n);
            // Release: our reads of the entries happen before the kernel may
            // overwrite them.
            self.map
                .consumer()
                .store(self.cached_cons, Ordering::Release);
        }
        n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring layout like the kernel's: indices and flags on their own
    /// cache lines, entries after them.
    fn layout() -> XdpRingOffset {
        XdpRingOffset {
            producer: 0,
            consumer: 64,
            flags: 128,
            desc: 192,
        }
    }

    #[test]
    fn producer_ring_stops_when_full_and_resumes_after_the_consumer_moves() {
        let off = layout();
        let mem = Mmap::anonymous(ring_map_len(&off, 4, 8)).unwrap();
        let mut ring = ProducerRing::new(mem, &off, 4);
        assert_eq!(ring.produce_addrs(&[10, 11, 12, 13, 14, 15]), 4);
        assert_eq!(ring.map.producer().load(Ordering::Acquire), 4);
        assert_eq!(ring.produce_addrs(&[14]), 0, "full");
        assert_eq!(ring.outstanding(), 4);
        // The "kernel" consumes two entries.
        ring.map.consumer().store(2, Ordering::Release);
        assert_eq!(ring.produce_addrs(&[14, 15, 16]), 2);
        // Entries 4 and 5 wrapped into slots 0 and 1.
        assert_eq!(ring.map.mem.read_u64(192), 14);
        assert_eq!(ring.map.mem.read_u64(192 + 8), 15);
        assert_eq!(ring.map.mem.read_u64(192 + 16), 12);
        assert!(!ring.needs_wakeup());
        ring.map
            .mem
            .atomic_u32(128)
            .store(XDP_RING_NEED_WAKEUP, Ordering::Relaxed);
        assert!(ring.needs_wakeup());
    }

    #[test]
    fn tx_descriptors_are_written_in_xdp_desc_layout() {
        let off = layout();
        let mem = Mmap::anonymous(ring_map_len(&off, 2, 16)).unwrap();
        let mut ring = ProducerRing::new(mem, &off, 2);
        let d = Desc {
            addr: 0x1234_5678_9abc,
            len: 60,
        };
        assert_eq!(ring.produce_descs(&[d]), 1);
        assert_eq!(ring.map.mem.read_u64(192), d.addr);
        assert_eq!(ring.map.mem.read_u32(192 + 8), 60);
        assert_eq!(ring.map.mem.read_u32(192 + 12), 0, "options");
    }

    #[test]
    fn consumer_ring_reads_what_the_producer_published_and_releases_it() {
        let off = layout();
        let mem = Mmap::anonymous(ring_map_len(&off, 4, 16)).unwrap();
        let mut ring = ConsumerRing::new(mem, &off, 4);
        let mut out = [Desc::default(); 8];
        assert_eq!(ring.consume_descs(&mut out), 0);
        // The "kernel" publishes three descriptors.
        for i in 0..3usize {
            ring.map.mem.write_u64(192 + i * 16, 2048 * i as u64 + 256);
            ring.map.mem.write_u32(192 + i * 16 + 8, 60 + i as u32);
        }
        ring.map.producer().store(3, Ordering::Release);
        assert_eq!(ring.consume_descs(&mut out[..2]), 2);
        assert_eq!(
            out[1],
            Desc {
                addr: 2048 + 256,
                len: 61
            }
        );
        assert_eq!(ring.map.consumer().load(Ordering::Acquire), 2);
        assert_eq!(ring.consume_descs(&mut out), 1);
        assert_eq!(
            out[0],
            Desc {
                addr: 4096 + 256,
                len: 62
            }
        );
        assert_eq!(ring.map.consumer().load(Ordering::Acquire), 3);
    }

    #[test]
    fn empty_ring_has_all_slots_free_and_none_ready() {
        assert_eq!(free_slots(8, 0, 0), 8);
        assert_eq!(ready_slots(0, 0), 0);
    }

    #[test]
    fn full_ring_has_no_free_slot() {
        assert_eq!(free_slots(8, 8, 0), 0);
        assert_eq!(ready_slots(8, 0), 8);
        assert_eq!(free_slots(8, 13, 5), 0);
    }

    #[test]
    fn indices_wrap_around_u32_without_losing_count() {
        let cons = u32::MAX - 2;
        let prod = cons.wrapping_add(5);
        assert!(prod < cons, "producer wrapped");
        assert_eq!(ready_slots(prod, cons), 5);
        assert_eq!(free_slots(8, prod, cons), 3);
    }

    #[test]
    fn slot_mask_cycles_through_the_ring() {
        let mask = 4u32 - 1;
        let slots: Vec<u32> = (u32::MAX - 1..=u32::MAX)
            .chain(0..3)
            .map(|i| i & mask)
            .collect();
        assert_eq!(slots, vec![2, 3, 0, 1, 2]);
    }
}
