//! Userspace GSO: a TCP or UDP super-packet, as a TAP with `IFF_VNET_HDR`
//! hands it over, cut into segments the way the Linux kernel's software
//! GSO does (`tcp_gso_segment`, `__udp_gso_segment`, `inet_gso_segment`).
//!
//! [`Gso::new`] checks the frame against its [`VnetHdr`] once; then
//! [`Gso::write`] writes segment `i` into a buffer the caller provides
//! (a UMEM frame, with room in front for outer headers), so nothing is
//! allocated per packet. Each segment gets the headers of the super-packet
//! with:
//!
//! - IPv4: total length, identification `id + i` (as Linux without
//!   `SKB_GSO_TCP_FIXEDID`), the header checksum; IPv6: payload length;
//! - TCP: sequence number `seq + i * gso_size`; CWR only on the first
//!   segment, FIN and PSH only on the last; the full checksum;
//! - UDP (USO): length and the full checksum (0 sent as `0xffff`).
//!
//! The transport checksum is always computed over the segment, whatever
//! the super-packet's field held (a pseudo-header sum with `NEEDS_CSUM`, or
//! nothing useful), so every segment leaves with valid checksums.
//! Supported: Ethernet (one VLAN tag allowed), IPv4 with options, IPv6
//! without extension headers; anything else is [`Error::Unsupported`].

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::error::{Error, Result};
use crate::ethernet::{EtherType, Frame};
use crate::ip::IpProtocol;
use crate::vnet::{GsoType, VnetHdr};

/// TCP flag bits in byte 13 of the header.
pub(crate) mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const URG: u8 = 0x20;
    pub const CWR: u8 = 0x80;
}

/// Where the headers of an Ethernet/IP/TCP-or-UDP frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Start of the IP header.
    pub l3: usize,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Start of the TCP/UDP header.
    pub l4: usize,
    /// TCP (else UDP).
    pub tcp: bool,
    /// Start of the payload (end of the headers).
    pub payload: usize,
    /// End of the IP packet (Ethernet padding excluded).
    pub end: usize,
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

impl Layout {
    /// Finds the headers, checking every length. IPv4 fragments, IPv6
    /// extension headers and other transports are `Unsupported`.
    pub(crate) fn parse(frame: &[u8]) -> Result<Layout> {
        let eth = Frame::new_checked(frame)?;
        let l3 = eth.header_len();
        let (v6, proto, l4, end) = match eth.ethertype() {
            EtherType::Ipv4 => {
                let ip = frame.get(l3..l3 + 20).ok_or(Error::Truncated)?;
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                if ip[0] >> 4 != 4 || ihl < 20 {
                    return Err(Error::Malformed);
                }
                let total = usize::from(be16(ip, 2));
                if total < ihl {
                    return Err(Error::Malformed);
                }
                if l3 + total > frame.len() {
                    return Err(Error::Truncated);
                }
                if be16(ip, 6) & 0x3fff != 0 {
                    return Err(Error::Unsupported);
                }
                (false, ip[9], l3 + ihl, l3 + total)
            }
            EtherType::Ipv6 => {
                let ip = frame.get(l3..l3 + 40).ok_or(Error::Truncated)?;
                if ip[0] >> 4 != 6 {
                    return Err(Error::Malformed);
                }
                let end = l3 + 40 + usize::from(be16(ip, 4));
                if end > frame.len() {
                    return Err(Error::Truncated);
                }
                (true, ip[6], l3 + 40, end)
            }
            _ => return Err(Error::Unsupported),
        };
        let (tcp, payload) = match IpProtocol::from(proto) {
            IpProtocol::Tcp => {
                let off = frame.get(l4 + 12).ok_or(Error::Truncated)?;
                let doff = usize::from(off >> 4) * 4;
                if doff < 20 {
                    return Err(Error::Malformed);
                }
                (true, l4 + doff)
            }
            IpProtocol::Udp => (false, l4 + 8),
            _ => return Err(Error::Unsupported),
        };
        if payload > end {
            return Err(Error::Truncated);
        }
        Ok(Layout {
            l3,
            v6,
            l4,
            tcp,
            payload,
            end,
        })
    }

    /// Offset of the transport checksum from the transport header.
    pub(crate) fn csum_offset(&self) -> usize {
        if self.tcp { 16 } else { 6 }
    }

    /// The pseudo-header sum of this frame for a transport length `len`.
    pub(crate) fn pseudo_header(&self, frame: &[u8], len: usize) -> u16 {
        let proto = if self.tcp {
            IpProtocol::Tcp
        } else {
            IpProtocol::Udp
        };
        let ip = &frame[self.l3..];
        if self.v6 {
            let src: [u8; 16] = ip[8..24].try_into().unwrap_or([0; 16]);
            let dst: [u8; 16] = ip[24..40].try_into().unwrap_or([0; 16]);
            checksum::pseudo_header_v6(Ipv6Addr::from(src), Ipv6Addr::from(dst), proto, len as u32)
        } else {
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            checksum::pseudo_header_v4(src, dst, proto, len as u16)
        }
    }

    /// Sets the IP length fields for a packet ending at `end` and, for
    /// IPv4, the identification and header checksum.
    pub(crate) fn finish_ip(&self, frame: &mut [u8], end: usize, ident: u16) {
        if self.v6 {
            put16(frame, self.l3 + 4, (end - self.l3 - 40) as u16);
        } else {
            put16(frame, self.l3 + 2, (end - self.l3) as u16);
            put16(frame, self.l3 + 4, ident);
            put16(frame, self.l3 + 10, 0);
            let c = checksum::checksum(&frame[self.l3..self.l4]);
            put16(frame, self.l3 + 10, c);
        }
    }
}

/// A checked super-packet, ready to be cut.
#[derive(Debug, Clone, Copy)]
pub struct Gso<'a> {
    frame: &'a [u8],
    layout: Layout,
    mss: usize,
    count: usize,
}

impl<'a> Gso<'a> {
    /// Checks `frame` (the Ethernet frame after the virtio-net header)
    /// against `hdr`: the GSO type must match the headers (TCPV4: IPv4/TCP,
    /// TCPV6: IPv6/TCP, UDP_L4: UDP), `gso_size` must not be 0, with
    /// `NEEDS_CSUM` the checksum must be the transport's, and each segment
    /// must fit an IP packet. Plain frames, UFO and unknown types are
    /// `Unsupported`.
    pub fn new(hdr: &VnetHdr, frame: &'a [u8]) -> Result<Gso<'a>> {
        let layout = Layout::parse(frame)?;
        let fits = match hdr.gso_type {
            GsoType::TcpV4 => layout.tcp && !layout.v6,
            GsoType::TcpV6 => layout.tcp && layout.v6,
            GsoType::UdpL4 => !layout.tcp,
            _ => return Err(Error::Unsupported),
        };
        if !fits || hdr.gso_size == 0 {
            return Err(Error::Malformed);
        }
        if hdr.needs_csum()
            && (usize::from(hdr.csum_start) != layout.l4
                || usize::from(hdr.csum_offset) != layout.csum_offset())
        {
            return Err(Error::Malformed);
        }
        let mss = usize::from(hdr.gso_size);
        let payload = layout.end - layout.payload;
        if payload == 0 {
            return Err(Error::Malformed);
        }
        // Each segment's IP length must fit its 16-bit field.
        let ip_hdrs = layout.payload - layout.l3 - if layout.v6 { 40 } else { 0 };
        if ip_hdrs + mss.min(payload) > usize::from(u16::MAX) {
            return Err(Error::Malformed);
        }
        Ok(Gso {
            frame,
            layout,
            mss,
            count: payload.div_ceil(mss),
        })
    }

    /// How many segments the super-packet makes.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of headers (Ethernet, IP, TCP/UDP) each segment starts with.
    pub fn header_len(&self) -> usize {
        self.layout.payload
    }

    /// Payload bytes per segment (the last may have fewer).
    pub fn segment_size(&self) -> usize {
        self.mss
    }

    /// Where the IP header starts (the Ethernet header's length).
    pub fn l3_offset(&self) -> usize {
        self.layout.l3
    }

    /// IP bytes of a full segment (IP and transport headers and
    /// `gso_size` payload bytes): what must fit the egress MTU.
    pub fn ip_segment_len(&self) -> usize {
        self.layout.payload - self.layout.l3 + self.mss
    }

    /// Bytes of segment `i` (headers included), 0 if there is no such
    /// segment.
    pub fn segment_len(&self, i: usize) -> usize {
        let start = self.layout.payload + i.saturating_mul(self.mss);
        if i >= self.count {
            return 0;
        }
        self.layout.payload + (self.layout.end - start).min(self.mss)
    }

    /// Writes segment `i` into the front of `out` and returns its length.
    /// `Malformed` if `i` is not below [`Gso::count`], `BufferTooSmall`
    /// if `out` is shorter than [`Gso::segment_len`].
    pub fn write(&self, i: usize, out: &mut [u8]) -> Result<usize> {
        if i >= self.count {
            return Err(Error::Malformed);
        }
        let len = self.segment_len(i);
        let out = out.get_mut(..len).ok_or(Error::BufferTooSmall)?;
        let l = self.layout;
        let h = l.payload;
        let from = h + i * self.mss;
        out[..h].copy_from_slice(&self.frame[..h]);
        out[h..].copy_from_slice(&self.frame[from..from + (len - h)]);
        let ident = if l.v6 {
            0
        } else {
            be16(self.frame, l.l3 + 4).wrapping_add(i as u16)
        };
        l.finish_ip(out, len, ident);
        let t = l.l4;
        if l.tcp {
            let seq = be32(self.frame, t + 4).wrapping_add((i * self.mss) as u32);
            out[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
            if i > 0 {
                out[t + 13] &= !tcp_flags::CWR;
            }
            if i + 1 < self.count {
                out[t + 13] &= !(tcp_flags::FIN | tcp_flags::PSH);
            }
        } else {
            put16(out, t + 4, (len - t) as u16);
        }
        let at = t + l.csum_offset();
        put16(out, at, 0);
        let sum = checksum::combine(&[l.pseudo_header(out, len - t), checksum::data(&out[t..])]);
        let mut c = checksum::result(sum);
        if !l.tcp && c == 0 {
            c = 0xffff;
        }
        put16(out, at, c);
        Ok(len)
    }
}
