//! Frames, the arena they live in, and the [`Port`] trait.
//!
//! A worker owns one [`FrameArena`]: a contiguous region cut into fixed-size
//! chunks. With AF_XDP the region is the UMEM shared by every socket the worker
//! owns, so a frame received on one port is transmitted on another by handing
//! over its descriptor, with no copy; in tests and benchmarks it is a heap
//! buffer. A [`FrameDesc`] is exactly an AF_XDP descriptor: the offset of the
//! packet's first byte in the arena and its length. Bytes between the chunk's
//! start and `addr` are headroom, so an encapsulating worker prepends the outer
//! header in place by moving `addr` back ([`FrameDesc::prepend`]).
//!
//! Ownership of frames is linear: a frame is either in the arena's free list,
//! owned by a port (fill ring, RX ring, TX ring, completion ring), or owned by
//! the worker between `rx_burst` and `tx_burst`. The worker gives every frame
//! it drops back with [`FrameArena::free`]; ports take free frames to refill
//! their RX side and return transmitted ones when the TX completes.

use std::time::Instant;

/// Default chunk size: one page holds two frames, and a 1500-byte packet plus
/// an encapsulation header plus the XDP headroom fits.
pub const DEFAULT_FRAME_SIZE: u32 = 2048;

/// Headroom the kernel leaves in front of every AF_XDP RX frame
/// (`XDP_PACKET_HEADROOM`); in-memory ports leave the same, so encapsulation
/// behaves identically on both.
pub const RX_HEADROOM: u32 = 256;

/// `addr`'s offset in its `frame_size` chunk. Chunk sizes are powers of two
/// (the arena insists), so this is a mask, not a division: it runs several
/// times per packet.
#[inline]
fn offset_in_chunk(addr: u64, frame_size: u32) -> u64 {
    let fs = u64::from(frame_size);
    if fs.is_power_of_two() {
        addr & (fs - 1)
    } else {
        addr % fs.max(1)
    }
}

/// Index of a port in a worker's port table.
pub use brindle_fib::PortId;

/// One packet in the arena: `len` bytes starting at byte `addr` of the arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameDesc {
    /// Offset of the packet's first byte from the start of the arena.
    pub addr: u64,
    /// Length of the packet in bytes.
    pub len: u32,
}

impl FrameDesc {
    /// Bytes free in front of the packet within its chunk.
    #[inline]
    pub fn headroom(&self, frame_size: u32) -> u32 {
        offset_in_chunk(self.addr, frame_size) as u32
    }

    /// Grows the packet by `n` bytes at the front (for an outer header).
    /// Returns `false`, changing nothing, if the chunk has less headroom.
    #[inline]
    pub fn prepend(&mut self, n: u32, frame_size: u32) -> bool {
        if self.headroom(frame_size) < n {
            return false;
        }
        self.addr -= u64::from(n);
        self.len += n;
        true
    }

    /// Drops `n` bytes from the front of the packet (decapsulation).
    /// Returns `false`, changing nothing, if the packet is shorter than `n`.
    #[inline]
    pub fn strip_front(&mut self, n: u32) -> bool {
        if self.len < n {
            return false;
        }
        self.addr += u64::from(n);
        self.len -= n;
        true
    }
}

/// Backing memory of an arena: a heap buffer, or the mmap'ed UMEM.
pub trait ArenaMemory: Send {
    /// The whole region.
    fn bytes(&self) -> &[u8];
    /// The whole region, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl ArenaMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A region cut into `frame_size` chunks, with a free list of chunks.
///
/// The free list is a stack allocated once at construction, so taking and
/// returning frames never allocates.
pub struct FrameArena {
    mem: Box<dyn ArenaMemory>,
    frame_size: u32,
    frames: u32,
    free: Vec<u64>,
    /// Bytes of `mem`: addresses from here on are super-packet slots.
    main_len: u64,
    /// Super-packet slots ([`FrameArena::add_super_slots`]): a heap region
    /// after `mem` in the address space, never handed to the kernel.
    big: Vec<u8>,
    big_free: Vec<u64>,
}

/// Bytes of a super-packet slot: the headroom (whose first
/// [`SUPER_META_LEN`] bytes keep the frame's virtio-net header), a 64 KiB
/// IP packet and its Ethernet header with a VLAN tag, rounded up to whole
/// chunks so a slot starts on a chunk boundary.
pub fn super_slot_size(frame_size: u32) -> u64 {
    let need = u64::from(RX_HEADROOM) + 65536 + 18;
    need.div_ceil(u64::from(frame_size)) * u64::from(frame_size)
}

/// Bytes at the start of a super-packet slot that keep the frame's
/// virtio-net header.
pub const SUPER_META_LEN: usize = 12;

impl FrameArena {
    /// A heap-backed arena of `frames` chunks of `frame_size` bytes, all free.
    pub fn new_heap(frames: u32, frame_size: u32) -> Self {
        let bytes = frames as usize * frame_size as usize;
        Self::from_memory(Box::new(vec![0u8; bytes]), frame_size)
    }

    /// An arena over `mem` (for example a UMEM), every chunk free.
    ///
    /// # Panics
    /// If `frame_size` is zero or not a power of two (AF_XDP's aligned mode
    /// needs a power of two, and chunk arithmetic relies on it).
    pub fn from_memory(mem: Box<dyn ArenaMemory>, frame_size: u32) -> Self {
        assert!(
            frame_size.is_power_of_two(),
            "frame size must be a power of two"
        );
        let frames = (mem.bytes().len() / frame_size as usize) as u32;
        // Pushed in reverse so that frames are handed out from address 0 up,
        // which makes test output and captures easier to read.
        let free = (0..frames)
            .rev()
            .map(|i| u64::from(i) * u64::from(frame_size))
            .collect();
        FrameArena {
            mem,
            frame_size,
            frames,
            free,
            main_len: u64::from(frames) * u64::from(frame_size),
            big: Vec::new(),
            big_free: Vec::new(),
        }
    }

    /// Adds `n` super-packet slots ([`super_slot_size`] each, about 66 KiB
    /// with 2 KiB chunks) on the heap: TAP ports carry a pod's TSO
    /// super-packets in them, whole, to another TAP port. Replaces any
    /// slots added before (call it before frames are in flight).
    pub fn add_super_slots(&mut self, n: u32) {
        let slot = super_slot_size(self.frame_size);
        self.big = vec![0u8; (slot * u64::from(n)) as usize];
        self.big_free = (0..u64::from(n))
            .rev()
            .map(|i| self.main_len + i * slot)
            .collect();
    }

    /// Whether `addr` is in a super-packet slot.
    #[inline]
    pub fn is_super(&self, addr: u64) -> bool {
        addr >= self.main_len
    }

    /// Takes a free super-packet slot; returns the address of its first
    /// byte (the frame goes at `RX_HEADROOM` past it).
    #[inline]
    pub fn alloc_super(&mut self) -> Option<u64> {
        self.big_free.pop()
    }

    /// Free super-packet slots.
    pub fn super_free_count(&self) -> usize {
        self.big_free.len()
    }

    /// The whole super-packet slot that holds `addr`, writable.
    #[inline]
    pub fn super_slot_mut(&mut self, addr: u64) -> &mut [u8] {
        let slot = super_slot_size(self.frame_size);
        let i = (addr - self.main_len) / slot;
        let at = (i * slot) as usize;
        &mut self.big[at..at + slot as usize]
    }

    /// The super-packet slot that holds `addr`.
    #[inline]
    pub fn super_slot(&self, addr: u64) -> &[u8] {
        let slot = super_slot_size(self.frame_size);
        let i = (addr - self.main_len) / slot;
        let at = (i * slot) as usize;
        &self.big[at..at + slot as usize]
    }

    /// Chunk `chunk` (of the main region) and the super-packet slot `slot`,
    /// both writable (to read a frame over both).
    pub fn chunk_and_super_mut(&mut self, chunk: u64, slot: u64) -> (&mut [u8], &mut [u8]) {
        let size = super_slot_size(self.frame_size);
        let at = ((slot - self.main_len) / size * size) as usize;
        let base = self.chunk_base(chunk) as usize;
        let fs = self.frame_size as usize;
        (
            &mut self.mem.bytes_mut()[base..base + fs],
            &mut self.big[at..at + size as usize],
        )
    }

    /// Chunk size in bytes.
    #[inline]
    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// Number of chunks.
    #[inline]
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Number of chunks in the free list.
    #[inline]
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The address of the first byte of the chunk that holds `addr`.
    #[inline]
    pub fn chunk_base(&self, addr: u64) -> u64 {
        if self.is_super(addr) {
            let slot = super_slot_size(self.frame_size);
            return self.main_len + (addr - self.main_len) / slot * slot;
        }
        addr - offset_in_chunk(addr, self.frame_size)
    }

    /// Takes a free chunk; returns the address of its first byte.
    #[inline]
    pub fn alloc(&mut self) -> Option<u64> {
        self.free.pop()
    }

    /// Returns the chunk that holds `addr` to the free list.
    #[inline]
    pub fn free(&mut self, addr: u64) {
        if self.is_super(addr) {
            let base = self.chunk_base(addr);
            self.big_free.push(base);
            return;
        }
        debug_assert!(self.free.len() < self.frames as usize, "double free");
        self.free.push(self.chunk_base(addr));
    }

    /// The packet's bytes.
    #[inline]
    pub fn data(&self, d: FrameDesc) -> &[u8] {
        if self.is_super(d.addr) {
            let at = (d.addr - self.main_len) as usize;
            return &self.big[at..at + d.len as usize];
        }
        &self.mem.bytes()[d.addr as usize..d.addr as usize + d.len as usize]
    }

    /// The packet's bytes, writable.
    #[inline]
    pub fn data_mut(&mut self, d: FrameDesc) -> &mut [u8] {
        if self.is_super(d.addr) {
            let at = (d.addr - self.main_len) as usize;
            return &mut self.big[at..at + d.len as usize];
        }
        &mut self.mem.bytes_mut()[d.addr as usize..d.addr as usize + d.len as usize]
    }

    /// The whole chunk that holds `addr`, writable (to build a packet in).
    #[inline]
    pub fn chunk_mut(&mut self, addr: u64) -> &mut [u8] {
        if self.is_super(addr) {
            return self.super_slot_mut(addr);
        }
        let base = self.chunk_base(addr) as usize;
        &mut self.mem.bytes_mut()[base..base + self.frame_size as usize]
    }

    /// Copies the frame `d` (any worker's chunk, not a super-packet slot)
    /// into a chunk of this arena's free list, at the same offset; `None`
    /// when none is free.
    pub fn copy_frame(&mut self, d: FrameDesc) -> Option<FrameDesc> {
        if self.is_super(d.addr) {
            return None;
        }
        let chunk = self.alloc()?;
        let off = d.addr - self.chunk_base(d.addr);
        let to = chunk + off;
        let from = d.addr as usize;
        self.mem
            .bytes_mut()
            .copy_within(from..from + d.len as usize, to as usize);
        Some(FrameDesc {
            addr: to,
            len: d.len,
        })
    }

    /// The whole region, for ports that hand it to the kernel.
    pub fn memory(&self) -> &dyn ArenaMemory {
        &*self.mem
    }

    /// The whole region, writable: a worker takes it once per batch.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.mem.bytes_mut()
    }
}

/// What a port did during one [`Port::poll`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortPoll {
    /// Frames whose transmission completed and went back to the free list.
    pub tx_completed: u32,
    /// Frames given to the RX side (fill ring) from the free list.
    pub rx_refilled: u32,
}

/// An AF_XDP port's receive rings, summed over its sockets (queues) on one
/// worker: the frames it keeps on its fill rings and the kernel's drops
/// (XDP_STATISTICS), which the pipeline's counters cannot see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Frames the port keeps on its fill rings now (its fill target).
    pub fill_target: u64,
    /// Frames the kernel dropped because a fill ring was empty.
    pub fill_ring_empty: u64,
    /// Frames the kernel dropped because an RX ring was full.
    pub rx_ring_full: u64,
    /// Frames the kernel dropped for any reason (these included).
    pub rx_dropped: u64,
}

/// A place frames come from and go to: an AF_XDP socket, an AF_PACKET
/// socket, or an in-memory queue in tests.
///
/// Shaped after smoltcp's `Device` and xsk-rs's batch rings: every call moves
/// a batch, nothing allocates, and time is passed in.
pub trait Port: Send {
    /// Interface name (for counters and logs).
    fn name(&self) -> &str;

    /// MAC address of the port's interface.
    fn mac(&self) -> [u8; 6];

    /// Largest IP packet the port transmits (the interface MTU).
    fn mtu(&self) -> u32;

    /// Moves up to `descs.len()` received frames into `descs`; returns how
    /// many. The caller owns them until it transmits or frees them.
    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize;

    /// Offers `descs` for transmission; returns how many, from the front,
    /// the port took. The caller still owns (and must free) the rest.
    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize;

    /// Housekeeping once per loop: reap completed transmissions into the
    /// arena's free list, refill the RX side from it, and kick the kernel
    /// when it needs waking.
    fn poll(&mut self, arena: &mut FrameArena, now: Instant) -> PortPoll;

    /// Closes the port and gives every frame it still holds (fill, RX, TX
    /// and completion rings) back to `arena`, so a port detached at run time
    /// leaks no frames. The default, for ports that hold none, just drops.
    fn release(self: Box<Self>, arena: &mut FrameArena) {
        let _ = arena;
    }

    /// Whether the port takes super-packets whole (a frame in a
    /// super-packet slot of the arena, its virtio-net header at the start of
    /// the slot): TAP ports. Every other port gets MTU-sized frames.
    fn takes_super_packets(&self) -> bool {
        false
    }

    /// Frames the port read and dropped itself since the last call (a TAP
    /// frame whose virtio-net header is malformed): the worker counts them
    /// as received and dropped (`parse_error`), so the books balance.
    fn take_rx_dropped(&mut self) -> u64 {
        0
    }

    /// Super-packets the port made of frames it was given (userspace GRO
    /// into a TAP) since the last call, and how many frames they held;
    /// the frames are counted as transmitted as usual.
    fn take_tx_coalesced(&mut self) -> (u64, u64) {
        (0, 0)
    }

    /// The receive rings' fill target and the kernel's drops (AF_XDP
    /// ports; a getsockopt per socket, so for snapshots, not per poll).
    fn ring_stats(&self) -> Option<RingStats> {
        None
    }

    /// Adds to `out` the file descriptors that become readable when frames
    /// arrive, for a worker that blocks in `poll(2)` when idle (interrupt
    /// polling). Ports without any add nothing.
    fn wait_fds<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        let _ = out;
    }

    /// For a port whose receive costs a syscall even when nothing waits (a
    /// TAP queue: a `read` that returns `EAGAIN`): a descriptor that becomes
    /// readable when frames arrive, each arrival a wake-up (what
    /// edge-triggered epoll needs). The worker stops reading such a port
    /// once a burst found it empty ([`Port::rx_drained`]) and waits for all
    /// of them in one epoll set, so its loop costs one `epoll_wait` rather
    /// than a read per port (`crate::worker::Parking`). `None` (the
    /// default): the port is read every loop (an AF_XDP ring is memory).
    fn rx_ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Whether the last [`Port::rx_burst`] ended because the queue was
    /// empty (not because the batch or the arena was full, or a bound on
    /// reads): then nothing is left to read until the descriptor of
    /// [`Port::rx_ready_fd`] signals a new frame.
    fn rx_drained(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepend_moves_into_headroom_and_refuses_past_the_chunk_start() {
        let mut d = FrameDesc {
            addr: 2048 + 256,
            len: 64,
        };
        assert_eq!(d.headroom(2048), 256);
        assert!(d.prepend(50, 2048));
        assert_eq!(
            d,
            FrameDesc {
                addr: 2048 + 206,
                len: 114
            }
        );
        assert!(!d.prepend(207, 2048));
        assert_eq!(d.addr, 2048 + 206, "a refused prepend changes nothing");
        assert!(d.strip_front(50));
        assert_eq!(
            d,
            FrameDesc {
                addr: 2048 + 256,
                len: 64
            }
        );
        assert!(!d.strip_front(65));
    }

    #[test]
    fn arena_hands_out_every_chunk_once_and_takes_them_back() {
        let mut a = FrameArena::new_heap(4, 2048);
        let got: Vec<u64> = std::iter::from_fn(|| a.alloc()).collect();
        assert_eq!(got, vec![0, 2048, 4096, 6144]);
        assert_eq!(a.alloc(), None);
        a.free(4096 + 300);
        assert_eq!(a.alloc(), Some(4096), "free normalises to the chunk base");
    }

    #[test]
    fn data_views_the_packet_bytes() {
        let mut a = FrameArena::new_heap(2, 2048);
        let d = FrameDesc {
            addr: 2048 + 256,
            len: 4,
        };
        a.data_mut(d).copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(a.data(d), &[1, 2, 3, 4]);
        assert_eq!(&a.chunk_mut(d.addr)[256..260], &[1, 2, 3, 4]);
    }
}
