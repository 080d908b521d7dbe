//! Super-packets from TAP ports (issue 13, DESIGN "How a pod's frames
//! travel"): a pod's TSO packet, up to 64 KB, in a super-packet slot of the
//! arena with its virtio-net header at the start of the slot.
//!
//! - TCP over IPv4 or IPv6 to a port that takes it whole (a TAP pod: its
//!   queues are on every worker, so always this worker's) and whose MTU
//!   fits one segment (`gso_size` plus the IP and TCP headers): routed,
//!   checked (anti-spoofing, network policy and the flow table see it as
//!   its first segment), MAC-rewritten and TTL/hop-limit-decremented as ONE
//!   frame; the virtio-net header travels with it and the receiving pod's
//!   kernel finishes the checksum (`NEEDS_CSUM`) as it would for a veth
//!   pair. One read and one write per super-packet; the counters count it
//!   once (`rx_packets`/`tx_packets` 1, `super_whole` 1).
//! - Anywhere else (the uplink, encapsulated or not; a veth pod, possibly
//!   handed to its owner worker; the host port; UDP): cut into MTU-sized
//!   segments first (`brindle_wire::gso`, full checksums), one arena chunk
//!   each, and each segment goes through the pipeline as a frame of its own
//!   (counted per segment; `super_cut` counts the super-packets). Hand-off
//!   rings carry arena chunks only, so a super-packet never crosses
//!   workers whole.

use brindle_wire::gso::Gso;
use brindle_wire::vnet::{GsoType, VnetHdr};

use super::{Cx, Pipeline, TxBatches};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::fib::NextHop;
use crate::frame::{FrameArena, FrameDesc, PortId, RX_HEADROOM, SUPER_META_LEN};

impl Pipeline {
    /// Handles the super-packet `desc` received on `ingress`.
    pub(super) fn super_packet(
        &mut self,
        arena: &mut FrameArena,
        ingress: PortId,
        from_host: bool,
        desc: FrameDesc,
        tx: &mut TxBatches,
        cx: &Cx,
    ) {
        let hdr = VnetHdr::parse(&arena.super_slot(desc.addr)[..SUPER_META_LEN]);
        let Ok(hdr) = hdr else {
            self.drop_super(arena, desc, DropReason::ParseError);
            return;
        };
        let (count, whole) = match Gso::new(&hdr, arena.data(desc)) {
            Ok(g) => (
                g.count(),
                self.carries_whole(arena.data(desc), &g, &hdr, cx),
            ),
            Err(_) => {
                self.drop_super(arena, desc, DropReason::ParseError);
                return;
            }
        };
        if let Some(segment) = whole {
            self.counters.super_whole += 1;
            self.super_segment = segment;
            self.one(arena, ingress, from_host, desc, tx, cx);
            self.super_segment = 0;
            return;
        }
        self.counters.super_cut += 1;
        let slot = arena.chunk_base(desc.addr);
        let off = (desc.addr - slot) as usize;
        let len = desc.len as usize;
        for i in 0..count {
            let Some(chunk) = arena.alloc() else {
                // Out of chunks: the rest of the super-packet is lost as one.
                self.counters.rx_packets += 1;
                self.counters.drop(DropReason::NoRoom);
                break;
            };
            let (c, s) = arena.chunk_and_super_mut(chunk, slot);
            let written = Gso::new(&hdr, &s[off..off + len])
                .and_then(|g| g.write(i, &mut c[RX_HEADROOM as usize..]));
            let Ok(n) = written else {
                arena.free(chunk);
                self.counters.rx_packets += 1;
                self.counters.drop(DropReason::NoRoom);
                break;
            };
            let seg = FrameDesc {
                addr: chunk + u64::from(RX_HEADROOM),
                len: n as u32,
            };
            self.one(arena, ingress, from_host, seg, tx, cx);
        }
        arena.free(desc.addr);
    }

    fn drop_super(&mut self, arena: &mut FrameArena, desc: FrameDesc, reason: DropReason) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += u64::from(desc.len);
        self.counters.drop(reason);
        arena.free(desc.addr);
    }

    /// Whether the TCP super-packet `frame` (checked by `g`) goes whole:
    /// its route is a pod port that takes super-packets, and one segment
    /// (`gso_size` plus the IP and TCP headers) fits that port's MTU.
    /// Returns the segment's IP length then (the pipeline checks it, not
    /// the super-packet's length, against the egress MTU).
    fn carries_whole(&self, frame: &[u8], g: &Gso<'_>, hdr: &VnetHdr, cx: &Cx) -> Option<usize> {
        let l3 = g.l3_offset();
        let nh = match hdr.gso_type {
            GsoType::TcpV4 => {
                let d: [u8; 4] = frame.get(l3 + 16..l3 + 20)?.try_into().ok()?;
                cx.fib.lookup_v4(d.into())
            }
            GsoType::TcpV6 => {
                let d: [u8; 16] = frame.get(l3 + 24..l3 + 40)?.try_into().ok()?;
                cx.fib.lookup_v6(d.into())
            }
            _ => None,
        };
        let Some(NextHop::Local { port }) = nh else {
            return None;
        };
        let segment = g.ip_segment_len();
        let ep = self.ports.get(port)?;
        (self.ports.takes_super(port) && ep.kind == PortKind::Pod && segment <= ep.mtu as usize)
            .then_some(segment)
    }

    /// Whether the frame being handled may leave by `port` (MTU `mtu`)
    /// although longer than `mtu`: a super-packet carried whole whose
    /// segments fit.
    #[inline]
    pub(super) fn super_fits(&self, port: PortId, mtu: usize) -> bool {
        self.super_segment != 0 && self.super_segment <= mtu && self.ports.takes_super(port)
    }
}
