//! The TAP port: one queue of a persistent multi-queue TAP device with the
//! virtio-net header (`brindle_xsk::Tap`), read and written with one
//! syscall per frame. A TAP pod's `eth0` and the host port `brindle0` are
//! TAP ports; each worker holds one queue of the device, the kernel spreads
//! the pod's flows over them.
//!
//! Receive: a frame is read straight into an arena chunk after the usual
//! headroom (`readv` of the 12-byte header, the chunk and, past it, the
//! port's overflow buffer). Then by its header:
//!
//! - plain, without `NEEDS_CSUM`: handed on as it is;
//! - plain with `NEEDS_CSUM` (the pod's kernel left the transport checksum
//!   to us): completed in place (`brindle_wire::vnet::complete_checksum`);
//! - a super-packet (TSO/USO, up to 64 KB, it landed in the overflow
//!   buffer): cut into MTU-sized segments with their checksums
//!   (`brindle_wire::gso`), one arena chunk each; segments that do not fit
//!   the caller's batch wait in the buffer for the next `rx_burst`;
//! - a header that does not parse, a super-packet `Gso` refuses, or a plain
//!   frame longer than a chunk: freed and counted ([`TapPortStats`]; the
//!   worker adds them to its `parse_error` drops).
//!
//! Transmit: every frame is written with a zero header (nothing to do: the
//! vrouter's frames carry full checksums). A full device queue (`EAGAIN`)
//! stops the burst (the caller counts the rest as `tx_ring_full`); any other
//! write error (the device is down) frees the frame and counts it.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use brindle_wire::gso::Gso;
use brindle_wire::vnet::{self, VnetHdr};
use brindle_xsk::TapQueue;

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll, RX_HEADROOM};
use crate::port::handoff::FrameHome;

/// The largest frame a TAP hands over: a 64 KB IP packet, an Ethernet
/// header and a VLAN tag.
pub const MAX_SUPER_FRAME: usize = 65536 + 18;

/// Counters of one TAP port (all its queues), shared with the control
/// side.
#[derive(Debug, Default)]
pub struct TapPortStats {
    /// Frames read with a header that does not parse or a super-packet the
    /// segmenter refuses (freed).
    pub rx_malformed: AtomicU64,
    /// Plain frames longer than an arena chunk (freed).
    pub rx_oversize: AtomicU64,
    /// Super-packets read (each became several frames).
    pub rx_super: AtomicU64,
    /// Segments cut from them.
    pub rx_segments: AtomicU64,
    /// Frames whose checksum the port completed (`NEEDS_CSUM`).
    pub rx_csum_completed: AtomicU64,
    /// Reads that failed with an error other than "empty".
    pub rx_errors: AtomicU64,
    /// Writes that failed with an error other than "full" (frame freed).
    pub tx_errors: AtomicU64,
}

impl TapPortStats {
    fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
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
    /// Frames dropped on receive since the worker last asked.
    rx_dropped: u64,
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
            rx_dropped: 0,
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
        let read = {
            let data = &mut arena.chunk_mut(chunk)[RX_HEADROOM as usize..];
            let mut iov = [
                IoSliceMut::new(&mut hdr),
                IoSliceMut::new(data),
                IoSliceMut::new(&mut self.overflow[room..]),
            ];
            self.queue.read_vectored(&mut iov)
        };
        let n = match read {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Err(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(None),
            Err(_) => {
                // EIO and friends: the device went away. Nothing was read.
                TapPortStats::bump(&self.stats.rx_errors, 1);
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
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let hdr = [0u8; vnet::HEADER_LEN];
        let mut taken = 0;
        for d in descs {
            let frame = arena.data(*d);
            match self
                .queue
                .write_vectored(&[IoSlice::new(&hdr), IoSlice::new(frame)])
            {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => TapPortStats::bump(&self.stats.tx_errors, 1),
            }
            taken += 1;
        }
        for d in &descs[..taken] {
            match &self.home {
                Some(h) => h.free(arena, d.addr),
                None => arena.free(d.addr),
            }
        }
        taken
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }

    fn take_rx_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.rx_dropped)
    }

    fn wait_fds<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        use std::os::fd::AsFd;
        out.push(self.queue.as_fd());
    }
}
