//! The TAP port: one queue of a persistent multi-queue TAP device with the
//! virtio-net header (`brindle_xsk::Tap`), read and written with one
//! syscall per frame. A TAP pod's `eth0` and the host port `brindle0` are
//! TAP ports; each worker holds one queue of the device, the kernel spreads
//! the pod's flows over them.
//!
//! Receive: a frame is read straight into an arena chunk after the usual
//! headroom (`readv` of the 12-byte header, the chunk and, past it, the
//! tail of one of the worker's super-packet slots, or the port's overflow
//! buffer when none is free). Then by its header:
//!
//! - plain, without `NEEDS_CSUM`: handed on as it is;
//! - plain with `NEEDS_CSUM` (the pod's kernel left the transport checksum
//!   to us): completed in place (`brindle_wire::vnet::complete_checksum`);
//! - a super-packet (TSO/USO, up to 64 KB) that landed in a slot: the
//!   chunk's part is copied in front of the tail, the header kept at the
//!   slot's start, and the slot goes to the pipeline WHOLE (one read);
//!   `pipeline/superpkt.rs` carries it whole to a TAP pod or cuts it;
//! - a super-packet that landed in the overflow buffer (no free slot): cut
//!   here into MTU-sized segments with their checksums (`brindle_wire::gso`),
//!   one arena chunk each; segments that do not fit the caller's batch wait
//!   in the buffer for the next `rx_burst`;
//! - a header that does not parse, a super-packet `Gso` refuses, or a plain
//!   frame longer than a chunk: freed and counted ([`TapPortStats`]; the
//!   worker adds them to its `parse_error` drops).
//!
//! Transmit: a frame in a super-packet slot is written with the header it
//! came with (its `gso_type`/`gso_size`, `NEEDS_CSUM`: the pod's kernel cuts
//! and checksums it, as for a veth pair); every other frame with a zero
//! header (the vrouter's frames carry full checksums). A full device queue
//! (`EAGAIN`) stops the burst (the caller counts the rest as
//! `tx_ring_full`); any other write error (the device is down) frees the
//! frame and counts it.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use brindle_wire::gro::{Gro, Push};
use brindle_wire::gso::Gso;
use brindle_wire::vnet::{self, VnetHdr};
use brindle_xsk::TapQueue;

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll, RX_HEADROOM, SUPER_META_LEN};
use crate::port::handoff::FrameHome;

/// The largest frame a TAP hands over: a 64 KB IP packet, an Ethernet
/// header and a VLAN tag.
pub const MAX_SUPER_FRAME: usize = 65536 + 18;

/// How many counters [`TapPortStats::values`] gives.
pub const TAP_STATS: usize = 12;

/// One TAP port's counters by name, for the metrics.
pub type TapStatsRow = (String, [(&'static str, u64); TAP_STATS]);

/// Counters of one TAP port (all its queues), shared with the control
/// side.
#[derive(Debug, Default)]
pub struct TapPortStats {
    /// Frames read with a header that does not parse or a super-packet the
    /// segmenter refuses (freed).
    pub rx_malformed: AtomicU64,
    /// Plain frames longer than an arena chunk (freed).
    pub rx_oversize: AtomicU64,
    /// Super-packets read.
    pub rx_super: AtomicU64,
    /// Of them, handed on whole in a super-packet slot of the arena (the
    /// pipeline carries them whole to a TAP pod or cuts them).
    pub rx_whole: AtomicU64,
    /// Segments cut at the port from the others (no slot was free).
    pub rx_segments: AtomicU64,
    /// Super-packets written whole (with their virtio-net header).
    pub tx_super: AtomicU64,
    /// Super-packets GRO made of frames of one burst (one write each).
    pub tx_gro_super: AtomicU64,
    /// The frames they held.
    pub tx_gro_segments: AtomicU64,
    /// Frames whose checksum the port completed (`NEEDS_CSUM`).
    pub rx_csum_completed: AtomicU64,
    /// Reads that failed with an error other than "empty".
    pub rx_errors: AtomicU64,
    /// Writes that failed with an error other than "full" (frame freed).
    pub tx_errors: AtomicU64,
    /// Read syscalls on the queues, the empty ones (`EAGAIN`) included: an
    /// idle port's stay at zero while the worker waits for it in epoll
    /// (issue 17); at most one more than its frames per wake-up.
    pub rx_reads: AtomicU64,
}

impl TapPortStats {
    fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Every counter by name (the metrics' `port_tap_<name>`).
    pub fn values(&self) -> [(&'static str, u64); TAP_STATS] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("rx_malformed", v(&self.rx_malformed)),
            ("rx_oversize", v(&self.rx_oversize)),
            ("rx_super", v(&self.rx_super)),
            ("rx_whole", v(&self.rx_whole)),
            ("rx_segments", v(&self.rx_segments)),
            ("tx_super", v(&self.tx_super)),
            ("tx_gro_super", v(&self.tx_gro_super)),
            ("tx_gro_segments", v(&self.tx_gro_segments)),
            ("rx_csum_completed", v(&self.rx_csum_completed)),
            ("rx_errors", v(&self.rx_errors)),
            ("tx_errors", v(&self.tx_errors)),
            ("rx_reads", v(&self.rx_reads)),
        ]
    }
}

/// A super-packet read but not yet cut up completely.
#[derive(Clone, Copy, Debug)]
struct Pending {
    hdr: VnetHdr,
    len: usize,
    next: usize,
}

/// One queue of a TAP device, a worker's part of a TAP port.
pub struct TapPort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    queue: TapQueue,
    /// Receive overflow: frames longer than a chunk continue here; the
    /// first `room` bytes stay free so the chunk's part can be copied in
    /// front, making the whole frame contiguous.
    overflow: Box<[u8]>,
    pending: Option<Pending>,
    /// A super-packet slot of the arena taken for the reads of one burst
    /// (given back at its end): a TSO frame's tail lands there and the slot
    /// goes to the pipeline whole.
    spare: Option<u64>,
    /// Frames dropped on receive since the worker last asked.
    rx_dropped: u64,
    /// The last `rx_burst` ended on an empty queue.
    drained: bool,
    /// Userspace GRO of the frames written (66 KiB buffer).
    gro: Gro,
    /// GRO super-packets written and the frames in them since the worker
    /// last asked.
    coalesced: (u64, u64),
    stats: Arc<TapPortStats>,
    home: Option<FrameHome>,
}

impl TapPort {
    /// A port on `queue`; `mac` is the vrouter's MAC on it, `mtu` the
    /// device's. `frame_size` is the arena's chunk size.
    pub fn new(
        name: &str,
        mac: [u8; 6],
        mtu: u32,
        queue: TapQueue,
        frame_size: u32,
        stats: Arc<TapPortStats>,
    ) -> TapPort {
        let room = (frame_size - RX_HEADROOM) as usize;
        TapPort {
            name: name.to_owned(),
            mac,
            mtu,
            queue,
            overflow: vec![0u8; room + MAX_SUPER_FRAME].into_boxed_slice(),
            pending: None,
            spare: None,
            rx_dropped: 0,
            drained: false,
            gro: Gro::new(),
            coalesced: (0, 0),
            stats,
            home: None,
        }
    }

    /// Chunks of other workers (frames they handed over) go back to them
    /// through `home` once written.
    pub fn set_home(&mut self, home: FrameHome) {
        self.home = Some(home);
    }

    /// The port's counters.
    pub fn stats(&self) -> &Arc<TapPortStats> {
        &self.stats
    }

    /// Writes `hdr` and `frame`; false when the queue is full (`EAGAIN`:
    /// the frame stays the caller's). Other errors count and drop it.
    fn write(&mut self, hdr: &[u8], frame: &[u8]) -> bool {
        match self
            .queue
            .write_vectored(&[IoSlice::new(hdr), IoSlice::new(frame)])
        {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(_) => {
                TapPortStats::bump(&self.stats.tx_errors, 1);
                true
            }
        }
    }

    /// Writes what GRO holds (one write with its header; a lone segment
    /// as a plain frame). Its frames were taken already: if the queue is
    /// full they are lost and counted as TX errors.
    fn flush_gro(&mut self) {
        let Some(c) = self.gro.take() else { return };
        let segments = u64::from(c.segments);
        let ok = match self.queue.write(c.bytes) {
            Ok(_) => true,
            Err(_) => {
                TapPortStats::bump(&self.stats.tx_errors, segments);
                false
            }
        };
        if ok && segments > 1 {
            TapPortStats::bump(&self.stats.tx_gro_super, 1);
            TapPortStats::bump(&self.stats.tx_gro_segments, segments);
            self.coalesced.0 += 1;
            self.coalesced.1 += segments;
        }
    }

    fn drop_rx(&mut self, counter: fn(&TapPortStats) -> &AtomicU64) {
        self.rx_dropped += 1;
        TapPortStats::bump(counter(&self.stats), 1);
    }

    /// Cuts the pending super-packet (in `overflow[..len]`) into chunks,
    /// filling `descs` from the front; returns how many were written.
    fn segment(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        let Some(p) = self.pending else { return 0 };
        let gso = match Gso::new(&p.hdr, &self.overflow[..p.len]) {
            Ok(g) => g,
            Err(_) => {
                self.pending = None;
                self.drop_rx(|s| &s.rx_malformed);
                return 0;
            }
        };
        let mut n = 0;
        let mut i = p.next;
        let mut oversize = false;
        while i < gso.count() && n < descs.len() {
            let Some(chunk) = arena.alloc() else { break };
            let buf = &mut arena.chunk_mut(chunk)[RX_HEADROOM as usize..];
            match gso.write(i, buf) {
                Ok(len) => {
                    descs[n] = FrameDesc {
                        addr: chunk + u64::from(RX_HEADROOM),
                        len: len as u32,
                    };
                    n += 1;
                }
                Err(_) => {
                    // A segment longer than a chunk (an MSS above the
                    // arena's room): the rest of the super-packet goes.
                    arena.free(chunk);
                    oversize = true;
                    break;
                }
            }
            i += 1;
        }
        let more = !oversize && i < gso.count();
        TapPortStats::bump(&self.stats.rx_segments, n as u64);
        self.pending = more.then_some(Pending { next: i, ..p });
        if oversize {
            self.drop_rx(|s| &s.rx_oversize);
        }
        n
    }

    /// Reads one frame into `chunk` (or the overflow buffer); returns the
    /// frame's descriptor in `chunk`, or `None` when the frame went to
    /// `pending` or was dropped, or `Err` when the queue is empty.
    fn read_one(&mut self, arena: &mut FrameArena, chunk: u64) -> Result<Option<FrameDesc>, ()> {
        let room = (arena.frame_size() - RX_HEADROOM) as usize;
        let mut hdr = [0u8; vnet::HEADER_LEN];
        if self.spare.is_none() {
            self.spare = arena.alloc_super();
        }
        let read = match self.spare {
            Some(slot) => {
                let (data, big) = arena.chunk_and_super_mut(chunk, slot);
                let tail = RX_HEADROOM as usize + room;
                let mut iov = [
                    IoSliceMut::new(&mut hdr),
                    IoSliceMut::new(&mut data[RX_HEADROOM as usize..]),
                    IoSliceMut::new(&mut big[tail..]),
                ];
                self.queue.read_vectored(&mut iov)
            }
            None => {
                let data = &mut arena.chunk_mut(chunk)[RX_HEADROOM as usize..];
                let mut iov = [
                    IoSliceMut::new(&mut hdr),
                    IoSliceMut::new(data),
                    IoSliceMut::new(&mut self.overflow[room..]),
                ];
                self.queue.read_vectored(&mut iov)
            }
        };
        TapPortStats::bump(&self.stats.rx_reads, 1);
        let n = match read {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.drained = true;
                return Err(());
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(None),
            Err(_) => {
                // EIO and friends: the device went away. Nothing was read;
                // it is not read again before its descriptor signals.
                TapPortStats::bump(&self.stats.rx_errors, 1);
                self.drained = true;
                return Err(());
            }
        };
        let Some(len) = n.checked_sub(vnet::HEADER_LEN).filter(|&l| l > 0) else {
            self.drop_rx(|s| &s.rx_malformed);
            return Ok(None);
        };
        let Ok(h) = VnetHdr::parse(&hdr) else {
            self.drop_rx(|s| &s.rx_malformed);
            return Ok(None);
        };
        if h.is_gso()
            && let Some(slot) = self.spare.take()
        {
            // Carried whole: the head from the chunk in front of the tail,
            // the header at the slot's start (the pipeline decides whether
            // it leaves whole or cut).
            let head = len.min(room);
            let (data, big) = arena.chunk_and_super_mut(chunk, slot);
            let at = RX_HEADROOM as usize;
            big[at..at + head].copy_from_slice(&data[at..at + head]);
            big[..SUPER_META_LEN].copy_from_slice(&hdr);
            arena.free(chunk);
            TapPortStats::bump(&self.stats.rx_super, 1);
            TapPortStats::bump(&self.stats.rx_whole, 1);
            return Ok(Some(FrameDesc {
                addr: slot + u64::from(RX_HEADROOM),
                len: len as u32,
            }));
        }
        if h.is_gso() {
            // Made contiguous in the overflow buffer: the part that landed
            // in the chunk (all of it when short) goes in front of the rest.
            let head = len.min(room);
            let chunk_bytes = &arena.chunk_mut(chunk)[RX_HEADROOM as usize..];
            self.overflow[..head].copy_from_slice(&chunk_bytes[..head]);
            self.pending = Some(Pending {
                hdr: h,
                len,
                next: 0,
            });
            TapPortStats::bump(&self.stats.rx_super, 1);
            return Ok(None);
        }
        if len > room {
            self.drop_rx(|s| &s.rx_oversize);
            return Ok(None);
        }
        let desc = FrameDesc {
            addr: chunk + u64::from(RX_HEADROOM),
            len: len as u32,
        };
        if h.needs_csum() {
            if vnet::complete_checksum(&h, arena.data_mut(desc)).is_err() {
                self.drop_rx(|s| &s.rx_malformed);
                return Ok(None);
            }
            TapPortStats::bump(&self.stats.rx_csum_completed, 1);
        }
        Ok(Some(desc))
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        self.drained = false;
        let mut n = self.segment(arena, descs);
        // A bounded number of reads per burst, so a queue that always has
        // something to drop cannot keep the worker here.
        let mut reads = 0;
        while n < descs.len() && self.pending.is_none() && reads < descs.len() {
            reads += 1;
            let Some(chunk) = arena.alloc() else { break };
            match self.read_one(arena, chunk) {
                Ok(Some(d)) => {
                    descs[n] = d;
                    n += 1;
                }
                Ok(None) => {
                    arena.free(chunk);
                    n += self.segment(arena, &mut descs[n..]);
                }
                Err(()) => {
                    arena.free(chunk);
                    break;
                }
            }
        }
        // The worker's slots are shared by all its TAP queues: none is kept
        // between bursts.
        if let Some(slot) = self.spare.take() {
            arena.free(slot);
        }
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let mut taken = 0;
        for d in descs {
            if arena.is_super(d.addr) {
                // A super-packet carries its header (and comes after what
                // GRO holds of its flow, if anything).
                self.flush_gro();
                let mut hdr = [0u8; vnet::HEADER_LEN];
                hdr.copy_from_slice(&arena.super_slot(d.addr)[..SUPER_META_LEN]);
                if !self.write(&hdr, arena.data(*d)) {
                    break;
                }
                TapPortStats::bump(&self.stats.tx_super, 1);
                taken += 1;
                continue;
            }
            // Everything else has full checksums: GRO coalesces a flow's
            // in-order TCP segments of this burst (the kernel's rules,
            // `brindle_wire::gro`), the rest goes with a zero header.
            let frame = arena.data(*d);
            let sent = loop {
                match self.gro.push(frame) {
                    Push::Merged { flush } => {
                        if flush {
                            self.flush_gro();
                        }
                        break true;
                    }
                    Push::Flush => self.flush_gro(),
                    Push::Bypass => break self.write(&[0u8; vnet::HEADER_LEN], frame),
                }
            };
            if !sent {
                break;
            }
            taken += 1;
        }
        // The end of the batch flushes, as the end of a NAPI poll does.
        self.flush_gro();
        for d in &descs[..taken] {
            match &self.home {
                Some(h) => h.free(arena, d.addr),
                None => arena.free(d.addr),
            }
        }
        taken
    }

    fn take_tx_coalesced(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.coalesced)
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }

    fn takes_super_packets(&self) -> bool {
        true
    }

    fn release(self: Box<Self>, arena: &mut FrameArena) {
        if let Some(slot) = self.spare {
            arena.free(slot);
        }
    }

    fn take_rx_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.rx_dropped)
    }

    fn wait_fds<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        use std::os::fd::AsFd;
        out.push(self.queue.as_fd());
    }

    fn rx_ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.queue.as_fd())
    }

    fn rx_drained(&self) -> bool {
        self.drained
    }
}
