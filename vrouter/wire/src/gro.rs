//! Userspace GRO: in-order TCP segments of one flow, as they come off the
//! uplink in one poll batch, coalesced into one super-packet with a
//! virtio-net header, to be written into a pod's TAP in one write.
//!
//! The rules are the kernel's (`inet_gro_receive`, `ipv6_gro_receive`,
//! `tcp_gro_receive`, `skb_gro_receive`, `tcp_gro_complete`):
//!
//! - a segment is held only if it is TCP over IPv4 without options or
//!   fragmentation (valid header checksum) or over IPv6 without extension
//!   headers, carries payload, has a valid TCP checksum and none of
//!   SYN/RST/URG/PSH/FIN (CWR may start a super-packet, not join one); anything else is passed on ([`Push::Bypass`]);
//! - a segment joins the held one if the Ethernet header, addresses,
//!   ports (and IPv6 flow label) are the same, and TTL/hop limit, TOS/
//!   traffic class, DF, the ACK number, the window, the flags other than
//!   PSH/FIN, and the TCP options are equal, the IPv4 ID follows on (or
//!   stays fixed with DF), the sequence number follows on, the payload is
//!   not larger than the first segment's (`gso_size`), it has no CWR, and
//!   the IP packet stays below 64 KB;
//! - a segment with PSH or FIN, or shorter than `gso_size`, joins and ends
//!   the super-packet ([`Push::Merged`] with `flush`);
//! - a TCP segment that does not join asks for the held one to be flushed
//!   first ([`Push::Flush`]), so a flow's order is kept.
//!
//! The super-packet keeps the first segment's headers with PSH/FIN of the
//! later ones or'ed in, the IP length and header checksum fixed, and the
//! TCP checksum field set to the pseudo-header sum with `NEEDS_CSUM`, as
//! `tcp_gro_complete` leaves it; `gso_type` TCPV4/TCPV6 (ECN bit if CWR),
//! `gso_size` the first segment's payload. A single held segment comes out
//! unchanged as a plain frame with `DATA_VALID`.
//!
//! One flow is held at a time; the buffer is allocated once, in
//! [`Gro::new`].

use crate::checksum;
use crate::gso::{Layout, be16, be32, tcp_flags};
use crate::vnet::{self, GsoType, VnetHdr};

/// Largest IP packet a super-packet may become (the kernel's
/// `GRO_LEGACY_MAX_SIZE`, exclusive).
pub const MAX_IP_LEN: usize = 65536;

/// What [`Gro::push`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// The frame is held (it started or joined the super-packet); with
    /// `flush`, the super-packet is complete and should be taken now.
    Merged {
        /// Take the super-packet now ([`Gro::take`]).
        flush: bool,
    },
    /// The frame is not for GRO: pass it on as it is. The held
    /// super-packet is not affected.
    Bypass,
    /// A TCP frame that cannot join: take the held super-packet, then
    /// push the frame again.
    Flush,
}

/// A coalesced super-packet, with its virtio-net header written in front.
#[derive(Debug)]
pub struct Coalesced<'a> {
    /// The header, as values.
    pub header: VnetHdr,
    /// How many segments were merged.
    pub segments: u16,
    /// The virtio-net header followed by the Ethernet frame: what to write
    /// into a TAP.
    pub bytes: &'a [u8],
}

impl Coalesced<'_> {
    /// The Ethernet frame, without the virtio-net header.
    pub fn frame(&self) -> &[u8] {
        &self.bytes[vnet::HEADER_LEN..]
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    layout: Layout,
    /// Bytes of the frame in the buffer (after the virtio-net header).
    len: usize,
    gso_size: usize,
    count: u16,
    next_seq: u32,
    first_id: u16,
}

/// The GRO state of one worker: at most one super-packet in the making.
pub struct Gro {
    buf: Box<[u8]>,
    held: Option<Held>,
}

impl Default for Gro {
    fn default() -> Gro {
        Gro::new()
    }
}

impl std::fmt::Debug for Gro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gro").field("held", &self.held).finish()
    }
}

/// Whether a frame's IPv4 or TCP header makes it unfit for GRO on its
/// own (checked before it is held).
fn eligible(frame: &[u8], l: &Layout) -> bool {
    if l.end == l.payload {
        return false;
    }
    if !l.v6 {
        let ip = &frame[l.l3..l.l4];
        if ip.len() != 20 || !checksum::verifies(ip) {
            return false;
        }
    }
    let sum = checksum::combine(&[
        l.pseudo_header(frame, l.end - l.l4),
        checksum::data(&frame[l.l4..l.end]),
    ]);
    sum == 0xffff
}

impl Gro {
    /// Bytes of the buffer: a virtio-net header, an Ethernet header with
    /// one tag, and the largest IP packet.
    pub const BUFFER_LEN: usize = vnet::HEADER_LEN + 18 + MAX_IP_LEN;

    /// An empty GRO state with its buffer.
    pub fn new() -> Gro {
        Gro {
            buf: vec![0; Gro::BUFFER_LEN].into_boxed_slice(),
            held: None,
        }
    }

    /// Whether a super-packet is being made.
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// Offers one Ethernet frame (no virtio-net header) to GRO.
    pub fn push(&mut self, frame: &[u8]) -> Push {
        let Ok(l) = Layout::parse(frame) else {
            return Push::Bypass;
        };
        if !l.tcp {
            return Push::Bypass;
        }
        match self.held {
            None => self.start(frame, l),
            Some(h) => {
                if self.joins(&h, frame, &l) && eligible(frame, &l) {
                    Push::Merged {
                        flush: self.append(h, frame, &l),
                    }
                } else {
                    Push::Flush
                }
            }
        }
    }

    fn start(&mut self, frame: &[u8], l: Layout) -> Push {
        let flags = frame[l.l4 + 13];
        let stop =
            tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG | tcp_flags::PSH | tcp_flags::FIN;
        if flags & stop != 0 || !eligible(frame, &l) || l.end + vnet::HEADER_LEN > self.buf.len() {
            return Push::Bypass;
        }
        let h = vnet::HEADER_LEN;
        self.buf[h..h + l.end].copy_from_slice(&frame[..l.end]);
        let payload = l.end - l.payload;
        self.held = Some(Held {
            layout: l,
            len: l.end,
            gso_size: payload,
            count: 1,
            next_seq: be32(frame, l.l4 + 4).wrapping_add(payload as u32),
            first_id: if l.v6 { 0 } else { be16(frame, l.l3 + 4) },
        });
        Push::Merged { flush: false }
    }

    /// The kernel's same-flow and no-flush tests.
    fn joins(&self, h: &Held, frame: &[u8], l: &Layout) -> bool {
        let held = &self.buf[vnet::HEADER_LEN..vnet::HEADER_LEN + h.len];
        let hl = &h.layout;
        if l.l3 != hl.l3 || l.v6 != hl.v6 || l.payload - l.l4 != hl.payload - hl.l4 {
            return false;
        }
        // Ethernet header, then the IP header but for the lengths, ID and
        // checksum.
        if frame[..l.l3] != held[..hl.l3] {
            return false;
        }
        let (a, b) = (&frame[l.l3..l.l4], &held[hl.l3..hl.l4]);
        if l.v6 {
            if a[..4] != b[..4] || a[6..40] != b[6..40] {
                return false;
            }
        } else {
            let df = be16(a, 6) & 0x4000 != 0;
            let id = be16(a, 4);
            let id_ok = id == h.first_id.wrapping_add(h.count) || (df && id == h.first_id);
            if a.len() != b.len() || a[..2] != b[..2] || a[6..10] != b[6..10] || a[12..] != b[12..]
            {
                return false;
            }
            if !id_ok {
                return false;
            }
        }
        // TCP: ports, ACK, offset/flags (but CWR/PSH/FIN)/window, options;
        // sequence on, CWR not set, size.
        let (a, b) = (&frame[l.l4..l.payload], &held[hl.l4..hl.payload]);
        let flags_a = a[13];
        let ignore = tcp_flags::CWR | tcp_flags::PSH | tcp_flags::FIN;
        if a[..4] != b[..4]
            || a[8..13] != b[8..13]
            || (flags_a ^ b[13]) & !ignore != 0
            || a[14..16] != b[14..16]
            || a[20..] != b[20..]
            || flags_a & tcp_flags::CWR != 0
        {
            return false;
        }
        let payload = l.end - l.payload;
        be32(frame, l.l4 + 4) == h.next_seq
            && payload > 0
            && payload <= h.gso_size
            && h.len - hl.l3 + payload < MAX_IP_LEN
            && h.count < u16::MAX
    }

    /// Appends the payload; returns whether the super-packet is complete.
    fn append(&mut self, mut h: Held, frame: &[u8], l: &Layout) -> bool {
        let payload = &frame[l.payload..l.end];
        let at = vnet::HEADER_LEN + h.len;
        self.buf[at..at + payload.len()].copy_from_slice(payload);
        h.len += payload.len();
        h.count += 1;
        h.next_seq = h.next_seq.wrapping_add(payload.len() as u32);
        let flags = frame[l.l4 + 13];
        let end_flags = flags & (tcp_flags::PSH | tcp_flags::FIN);
        self.buf[vnet::HEADER_LEN + h.layout.l4 + 13] |= end_flags;
        self.held = Some(h);
        end_flags != 0 || payload.len() < h.gso_size
    }

    /// Takes the held super-packet (if any), ready to write into a TAP.
    pub fn take(&mut self) -> Option<Coalesced<'_>> {
        let h = self.held.take()?;
        let l = h.layout;
        let v = vnet::HEADER_LEN;
        let header = if h.count == 1 {
            VnetHdr {
                flags: vnet::DATA_VALID,
                ..VnetHdr::PLAIN
            }
        } else {
            let frame = &mut self.buf[v..v + h.len];
            l.finish_ip(frame, h.len, h.first_id);
            let pseudo = l.pseudo_header(frame, h.len - l.l4);
            frame[l.l4 + 16..l.l4 + 18].copy_from_slice(&pseudo.to_be_bytes());
            VnetHdr {
                flags: vnet::NEEDS_CSUM,
                gso_type: if l.v6 { GsoType::TcpV6 } else { GsoType::TcpV4 },
                ecn: frame[l.l4 + 13] & tcp_flags::CWR != 0,
                hdr_len: l.payload as u16,
                gso_size: h.gso_size as u16,
                csum_start: l.l4 as u16,
                csum_offset: 16,
                num_buffers: 0,
            }
        };
        // The buffer always has room for the header.
        let _ = header.emit(&mut self.buf[..v]);
        Some(Coalesced {
            header,
            segments: h.count,
            bytes: &self.buf[..v + h.len],
        })
    }
}
