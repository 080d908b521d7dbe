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
//!   handed to its owner worker; the host port; a TAP pod whose flow with
//!   the sender another worker keeps, see `police.rs`; UDP): cut into MTU-sized
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
        from: super::From,
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
            self.one(arena, ingress, from, desc, tx, cx);
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
            self.one(arena, ingress, from, seg, tx, cx);
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
        let (nh, src) = match hdr.gso_type {
            GsoType::TcpV4 => {
                let s: [u8; 4] = frame.get(l3 + 12..l3 + 16)?.try_into().ok()?;
                let d: [u8; 4] = frame.get(l3 + 16..l3 + 20)?.try_into().ok()?;
                (cx.fib.lookup_v4(d.into()), cx.fib.lookup_v4(s.into()))
            }
            GsoType::TcpV6 => {
                let s: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
                let d: [u8; 16] = frame.get(l3 + 24..l3 + 40)?.try_into().ok()?;
                (cx.fib.lookup_v6(d.into()), cx.fib.lookup_v6(s.into()))
            }
            _ => (None, None),
        };
        let Some(NextHop::Local { port }) = nh else {
            return None;
        };
        // A flow another worker keeps (`Pipeline::keeper`): cut, so the
        // segments can go there (chunks cross workers, slots do not).
        if self.flows.tracking() {
            let elsewhere = match self.ports.get(cx.ingress).map(|e| e.kind) {
                Some(PortKind::Host) => self.host_keeper(self.pod_of(src), Some(port)).is_some(),
                Some(PortKind::Pod) => self.flows.pair_home(cx.ingress, port).is_some(),
                _ => false,
            };
            if elsewhere {
                return None;
            }
        }
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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Instant;

    use brindle_wire::checksum;
    use brindle_wire::vnet::{self, NEEDS_CSUM};

    use super::*;
    use crate::endpoint::{Endpoint, GATEWAY_MAC, PortTable};
    use crate::fib::Fib;
    use crate::pipeline::PipelineConfig;

    const A: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 3);
    const C: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 4);
    const A_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const B_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];
    const C_MAC: [u8; 6] = [2, 0, 0, 0, 0, 4];
    const MSS: usize = 1400;

    fn sum16(words: &[u8]) -> u32 {
        words
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum()
    }

    fn fold(mut s: u32) -> u16 {
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// A TCP/IPv4 super-packet from `src` to `dst` of 3 segments' payload
    /// as a pod's kernel hands it over: its TCP checksum field holds the
    /// pseudo-header sum (`NEEDS_CSUM`); and its virtio-net header.
    fn super_packet(src: Ipv4Addr, dst: Ipv4Addr) -> (VnetHdr, Vec<u8>) {
        let payload: Vec<u8> = (0..3 * MSS).map(|i| (i * 7 % 251) as u8).collect();
        let tot = 20 + 20 + payload.len();
        let mut f = Vec::new();
        f.extend_from_slice(&GATEWAY_MAC);
        f.extend_from_slice(&A_MAC);
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![
            0x45,
            0,
            (tot >> 8) as u8,
            tot as u8,
            0,
            1,
            0x40,
            0,
            64,
            6,
            0,
            0,
        ];
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        let c = !fold(sum16(&ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        let mut tcp = vec![
            0x1f, 0x90, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff,
        ];
        let mut pseudo = sum16(&src.octets()) + sum16(&dst.octets()) + 6;
        pseudo += (20 + payload.len()) as u32;
        tcp.extend_from_slice(&fold(pseudo).to_be_bytes());
        tcp.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&tcp);
        f.extend_from_slice(&payload);
        let hdr = VnetHdr {
            flags: NEEDS_CSUM,
            gso_type: GsoType::TcpV4,
            hdr_len: 54,
            gso_size: MSS as u16,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::PLAIN
        };
        (hdr, f)
    }

    struct Rig {
        arena: FrameArena,
        pipeline: Pipeline,
        tx: TxBatches,
        slots: usize,
    }

    /// Pods A and B on TAP ports (they take super-packets whole), C on a
    /// port that does not (a veth pod), all with MTU 1500.
    fn rig() -> Rig {
        let mut arena = FrameArena::new_heap(256, 2048);
        arena.add_super_slots(4);
        let mut ports = PortTable::default();
        let (mut fib, reader) = Fib::new();
        for (addr, mac, whole) in [(A, A_MAC, true), (B, B_MAC, true), (C, C_MAC, false)] {
            let id = ports.push(Endpoint::pod(vec![IpAddr::V4(addr)], Some(mac), 1500));
            ports.set_takes_super(id, whole);
            fib.insert(
                format!("{addr}/32").parse().unwrap(),
                NextHop::Local { port: id },
            );
        }
        let cfg = PipelineConfig::new(Ipv4Addr::new(192, 168, 0, 1), 24);
        let slots = arena.super_free_count();
        Rig {
            arena,
            pipeline: Pipeline::new(cfg, ports, reader),
            tx: TxBatches::new(3),
            slots,
        }
    }

    impl Rig {
        /// Puts the super-packet in a slot and runs it in from pod A.
        fn send(&mut self, hdr: &VnetHdr, frame: &[u8]) {
            let slot = self.arena.alloc_super().unwrap();
            let buf = self.arena.super_slot_mut(slot);
            hdr.emit(&mut buf[..vnet::HEADER_LEN]).unwrap();
            let at = RX_HEADROOM as usize;
            buf[at..at + frame.len()].copy_from_slice(frame);
            let desc = FrameDesc {
                addr: slot + u64::from(RX_HEADROOM),
                len: frame.len() as u32,
            };
            self.pipeline
                .process(&mut self.arena, 0, &[desc], &mut self.tx, Instant::now());
        }

        /// The frames queued on `port`, with the header of a super-packet.
        fn take(&mut self, port: PortId) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
            let batch = std::mem::take(self.tx.batch_mut(port).unwrap());
            let out = batch
                .iter()
                .map(|d| {
                    let hdr = self
                        .arena
                        .is_super(d.addr)
                        .then(|| self.arena.super_slot(d.addr)[..SUPER_META_LEN].to_vec());
                    (hdr, self.arena.data(*d).to_vec())
                })
                .collect();
            for d in &batch {
                self.arena.free(d.addr);
            }
            out
        }
    }

    #[test]
    fn a_super_packet_to_a_tap_pod_goes_whole_with_its_header_and_partial_checksum() {
        let mut r = rig();
        let (hdr, frame) = super_packet(A, B);
        r.send(&hdr, &frame);
        let out = r.take(1);
        assert_eq!(out.len(), 1);
        let (got_hdr, got) = &out[0];
        let mut want_hdr = [0u8; vnet::HEADER_LEN];
        hdr.emit(&mut want_hdr).unwrap();
        assert_eq!(got_hdr.as_deref(), Some(&want_hdr[..]));
        assert_eq!(got.len(), frame.len());
        assert_eq!(&got[..6], &B_MAC);
        assert_eq!(&got[6..12], &GATEWAY_MAC);
        assert_eq!(got[14 + 8], 63, "TTL");
        assert!(checksum::verifies(&got[14..34]), "IP header checksum");
        // The TCP checksum is left to the receiver: still the pseudo sum.
        assert_eq!(&got[34 + 16..34 + 18], &frame[34 + 16..34 + 18]);
        assert_eq!(&got[34..], &frame[34..]);
        let c = r.pipeline.counters();
        assert_eq!((c.super_whole, c.super_cut), (1, 0));
        assert_eq!((c.rx_packets, c.forwarded), (1, 1));
        assert_eq!(r.arena.super_free_count(), r.slots, "slot back");
    }

    #[test]
    fn a_super_packet_to_another_port_is_cut_into_checksummed_segments() {
        let mut r = rig();
        let (hdr, frame) = super_packet(A, C);
        r.send(&hdr, &frame);
        let out = r.take(2);
        assert_eq!(out.len(), 3);
        let mut payload = Vec::new();
        for (h, seg) in &out {
            assert!(h.is_none(), "a plain frame");
            assert_eq!(seg.len(), 14 + 40 + MSS);
            assert_eq!(&seg[..6], &C_MAC);
            assert_eq!(seg[14 + 8], 63);
            assert!(checksum::verifies(&seg[14..34]));
            let tcp_len = seg.len() - 34;
            let mut s = sum16(&seg[26..34]) + 6 + tcp_len as u32;
            s += sum16(&seg[34..]);
            assert_eq!(fold(s), 0xffff, "TCP checksum complete");
            payload.extend_from_slice(&seg[54..]);
        }
        assert_eq!(payload, frame[54..]);
        let c = r.pipeline.counters();
        assert_eq!((c.super_whole, c.super_cut, c.rx_packets), (0, 1, 3));
        assert_eq!(r.arena.super_free_count(), r.slots);
    }

    #[test]
    fn a_spoofed_super_packet_is_dropped_whole_and_its_slot_freed() {
        let mut r = rig();
        let (hdr, frame) = super_packet(C, B);
        r.send(&hdr, &frame);
        assert!(r.take(1).is_empty());
        let c = r.pipeline.counters();
        assert_eq!(c.drops_for(DropReason::Spoofed), 1);
        assert_eq!((c.rx_packets, c.super_whole), (1, 1));
        assert!(c.balanced());
        assert_eq!(r.arena.super_free_count(), r.slots);
    }

    #[test]
    fn a_super_packet_whose_segments_exceed_the_mtu_is_not_carried_whole() {
        let mut r = rig();
        if let Some(ep) = r.pipeline.ports_mut().get_mut(1) {
            ep.mtu = 1400;
        }
        let (hdr, frame) = super_packet(A, B);
        r.send(&hdr, &frame);
        let c = *r.pipeline.counters();
        assert_eq!((c.super_whole, c.super_cut), (0, 1));
        // Each 1440-byte segment meets the MTU check: none leaves.
        assert!(r.take(1).is_empty());
        assert_eq!(c.drops_for(DropReason::Mtu) + c.icmp_generated, 3);
        let _ = r.take(0);
        assert_eq!(r.arena.super_free_count(), r.slots);
    }
}
