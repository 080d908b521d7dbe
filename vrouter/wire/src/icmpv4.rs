//! ICMP for IPv4 (RFC 792): echo, and the two errors a router sends.
//!
//! The vrouter generates ICMP only when it must drop: time exceeded (type
//! 11, code 0) when a TTL runs out, and destination unreachable /
//! fragmentation needed (type 3, code 4, with the next-hop MTU of RFC 1191)
//! when a DF packet is larger than the egress MTU. Both quote the original
//! IP header plus the first 8 bytes of its payload.
//! [`emit_error_in_place`] rewrites the dropped frame into the error, so
//! even this slow path needs no second buffer.
//!
//! Hand-written rather than etherparse's `Icmpv4Slice`/`PacketBuilder`: the
//! builder writes into a new buffer, and the error is built in the dropped
//! frame's own buffer.

use std::net::Ipv4Addr;

use crate::checksum;
use crate::error::{Error, Result};
use crate::ethernet::{self, EtherType, MacAddr};
use crate::ip::IpProtocol;
use crate::ipv4;
use crate::macros::enum_with_unknown;

enum_with_unknown! {
    /// ICMPv4 message type.
    pub enum Message(u8) {
        /// Echo reply (0).
        EchoReply = 0,
        /// Destination unreachable (3).
        DstUnreachable = 3,
        /// Redirect (5).
        Redirect = 5,
        /// Echo request (8).
        EchoRequest = 8,
        /// Time exceeded (11).
        TimeExceeded = 11,
        /// Parameter problem (12).
        ParamProblem = 12,
    }
}

impl Message {
    /// Whether this type is an error message (which must never cause
    /// another error, RFC 1812 §4.3.2.7).
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Message::DstUnreachable
                | Message::Redirect
                | Message::TimeExceeded
                | Message::ParamProblem
                | Message::Unknown(4)
        )
    }
}

/// Code of destination unreachable: fragmentation needed and DF set.
pub const CODE_FRAG_NEEDED: u8 = 4;
/// Code of time exceeded: TTL exceeded in transit.
pub const CODE_TTL_EXCEEDED: u8 = 0;

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Message type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum over the whole ICMP message.
    pub const CHECKSUM: Range<usize> = 2..4;
    /// Echo identifier.
    pub const ECHO_IDENT: Range<usize> = 4..6;
    /// Echo sequence number.
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    /// Next-hop MTU of fragmentation needed (RFC 1191).
    pub const NEXT_HOP_MTU: Range<usize> = 6..8;
    /// The four bytes after the checksum, whatever the type.
    pub const REST_OF_HEADER: Range<usize> = 4..8;
}

/// Length of the ICMP header.
pub const HEADER_LEN: usize = 8;

/// A view of an ICMPv4 message in a buffer (the IPv4 payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the 8-byte header.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let d = &self.buffer.as_ref()[r];
        u16::from_be_bytes([d[0], d[1]])
    }

    /// Message type.
    #[inline]
    pub fn msg_type(&self) -> Message {
        Message::from(self.buffer.as_ref()[field::TYPE])
    }

    /// Code.
    #[inline]
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// Checksum as on the wire.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Echo identifier.
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        self.u16_at(field::ECHO_IDENT)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq_no(&self) -> u16 {
        self.u16_at(field::ECHO_SEQNO)
    }

    /// Next-hop MTU (meaningful for type 3 code 4).
    #[inline]
    pub fn next_hop_mtu(&self) -> u16 {
        self.u16_at(field::NEXT_HOP_MTU)
    }

    /// Whether the checksum over the whole buffer verifies.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::verifies(self.buffer.as_ref())
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// Everything after the 8-byte header (echo data, or the quote).
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the message type.
    #[inline]
    pub fn set_msg_type(&mut self, t: Message) {
        self.buffer.as_mut()[field::TYPE] = u8::from(t);
    }

    /// Sets the code.
    #[inline]
    pub fn set_msg_code(&mut self, c: u8) {
        self.buffer.as_mut()[field::CODE] = c;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, c: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }

    /// Sets the echo identifier.
    #[inline]
    pub fn set_echo_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_IDENT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the echo sequence number.
    #[inline]
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_SEQNO].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the 4 bytes after the checksum.
    #[inline]
    pub fn set_rest_of_header(&mut self, v: u32) {
        self.buffer.as_mut()[field::REST_OF_HEADER].copy_from_slice(&v.to_be_bytes());
    }

    /// Computes the checksum over the whole buffer and writes it.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }

    /// Everything after the header, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// An ICMPv4 message, as values. `data` is the echo payload or the quoted
/// original datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4Repr<'a> {
    /// Echo request.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Payload.
        data: &'a [u8],
    },
    /// Echo reply.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Payload.
        data: &'a [u8],
    },
    /// Destination unreachable.
    DstUnreachable {
        /// Code (4: fragmentation needed).
        code: u8,
        /// Next-hop MTU (RFC 1191; 0 for other codes).
        next_hop_mtu: u16,
        /// The original IP header and at least 8 bytes of its payload.
        data: &'a [u8],
    },
    /// Time exceeded.
    TimeExceeded {
        /// Code (0: TTL exceeded in transit).
        code: u8,
        /// The original IP header and at least 8 bytes of its payload.
        data: &'a [u8],
    },
    /// Any other type, kept as read.
    Other {
        /// Type.
        msg_type: u8,
        /// Code.
        code: u8,
        /// The 4 bytes after the checksum.
        rest_of_header: u32,
        /// The rest.
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Parses a message, verifying its checksum.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Icmpv4Repr<'a>> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(Error::Checksum);
        }
        let data = packet.data();
        Ok(match packet.msg_type() {
            Message::EchoRequest => Icmpv4Repr::EchoRequest {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            Message::EchoReply => Icmpv4Repr::EchoReply {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            Message::DstUnreachable => Icmpv4Repr::DstUnreachable {
                code: packet.msg_code(),
                next_hop_mtu: packet.next_hop_mtu(),
                data,
            },
            Message::TimeExceeded => Icmpv4Repr::TimeExceeded {
                code: packet.msg_code(),
                data,
            },
            other => {
                let r = &packet.buffer.as_ref()[field::REST_OF_HEADER];
                Icmpv4Repr::Other {
                    msg_type: u8::from(other),
                    code: packet.msg_code(),
                    rest_of_header: u32::from_be_bytes([r[0], r[1], r[2], r[3]]),
                    data,
                }
            }
        })
    }

    fn data(&self) -> &'a [u8] {
        match *self {
            Icmpv4Repr::EchoRequest { data, .. }
            | Icmpv4Repr::EchoReply { data, .. }
            | Icmpv4Repr::DstUnreachable { data, .. }
            | Icmpv4Repr::TimeExceeded { data, .. }
            | Icmpv4Repr::Other { data, .. } => data,
        }
    }

    /// Length of the message this emits: 8 plus the data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.data().len()
    }

    /// Writes the message and its checksum. The buffer must be exactly
    /// [`Icmpv4Repr::buffer_len`] long or longer; only that much is written
    /// and checksummed.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let len = self.buffer_len();
        let buf = packet.buffer.as_mut();
        if buf.len() < len {
            return Err(Error::BufferTooSmall);
        }
        let mut p = Packet::new_unchecked(&mut buf[..len]);
        let (t, code, rest) = match *self {
            Icmpv4Repr::EchoRequest { ident, seq_no, .. } => (
                Message::EchoRequest,
                0,
                (u32::from(ident) << 16) | u32::from(seq_no),
            ),
            Icmpv4Repr::EchoReply { ident, seq_no, .. } => (
                Message::EchoReply,
                0,
                (u32::from(ident) << 16) | u32::from(seq_no),
            ),
            Icmpv4Repr::DstUnreachable {
                code, next_hop_mtu, ..
            } => (Message::DstUnreachable, code, u32::from(next_hop_mtu)),
            Icmpv4Repr::TimeExceeded { code, .. } => (Message::TimeExceeded, code, 0),
            Icmpv4Repr::Other {
                msg_type,
                code,
                rest_of_header,
                ..
            } => (Message::from(msg_type), code, rest_of_header),
        };
        p.set_msg_type(t);
        p.set_msg_code(code);
        p.set_rest_of_header(rest);
        p.data_mut().copy_from_slice(self.data());
        p.fill_checksum();
        Ok(())
    }
}

/// Which error to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4Error {
    /// Time exceeded, TTL exceeded in transit (type 11, code 0).
    TimeExceeded,
    /// Destination unreachable, fragmentation needed and DF set (type 3,
    /// code 4), with the MTU of the next hop.
    FragmentationNeeded {
        /// The egress MTU the packet did not fit.
        next_hop_mtu: u16,
    },
}

/// The addressing of an ICMP error the vrouter sends back to a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorHeader {
    /// Source MAC of the new frame (ours on the port it leaves by).
    pub src_mac: MacAddr,
    /// Destination MAC (usually the source MAC of the dropped frame).
    pub dst_mac: MacAddr,
    /// Source IP: the router's address (on a pod port, 169.254.1.1 or the
    /// node's address).
    pub src_addr: Ipv4Addr,
    /// TTL of the error (64).
    pub ttl: u8,
    /// IP identification of the error.
    pub ident: u16,
}

/// Length of the headers in front of the quote in an error frame built by
/// [`emit_error_in_place`]: Ethernet 14 + IPv4 20 + ICMP 8.
pub const ERROR_HEADERS_LEN: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + HEADER_LEN;

/// The largest quote: a 60-byte IPv4 header plus 8 bytes.
pub const MAX_QUOTE_LEN: usize = 60 + 8;

/// Whether the vrouter may answer this IPv4 packet with an ICMP error
/// (RFC 1812 §4.3.2.7): not an ICMP error itself, not a non-first
/// fragment, not to or from a broadcast, multicast or unspecified address.
pub fn may_send_error_about<T: AsRef<[u8]>>(ip: &ipv4::Packet<T>) -> bool {
    let src = ip.src_addr();
    let dst = ip.dst_addr();
    if src.is_unspecified()
        || src.is_broadcast()
        || src.is_multicast()
        || dst.is_broadcast()
        || dst.is_multicast()
        || ip.frag_offset() != 0
    {
        return false;
    }
    if ip.protocol() == IpProtocol::Icmp {
        let d = ip.as_ref();
        let hl = ip.header_len();
        // An ICMP packet too short to hold a type is not answered either.
        match d.get(hl) {
            Some(&t) if !Message::from(t).is_error() => {}
            _ => return false,
        }
    }
    true
}

/// How much of the original datagram an ICMP error quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Quote {
    /// The IP header (options included) and the first 8 bytes of the
    /// payload (RFC 792): enough for the sender to find the socket.
    #[default]
    HeaderPlus8,
    /// As much of the datagram as fits in a 576-byte error (RFC 1812
    /// §4.3.2.3), which is what Linux sends.
    Rfc1812,
}

/// The largest IPv4 datagram an RFC 1812 error may be.
pub const RFC1812_MAX_ERROR_LEN: usize = 576;

/// Rewrites the frame in `buf` into an ICMP error about the IPv4 packet
/// that starts at `ip_offset`, and returns the new frame length.
///
/// `buf` is the frame from its first byte to the end of the space its
/// buffer has (the UMEM chunk), not just the frame's length: the error may
/// be longer than a short original. The quote (the original header, options
/// included, plus up to 8 payload bytes, RFC 792) moves to offset 42 and
/// the new Ethernet (untagged), IPv4 and ICMP headers go in front of it.
/// The IPv4 header gets TOS 0xc0 (internetwork control, as Linux sends
/// ICMP errors), no DF, and its destination is the original source.
pub fn emit_error_in_place(
    buf: &mut [u8],
    ip_offset: usize,
    error: Icmpv4Error,
    header: &ErrorHeader,
) -> Result<usize> {
    emit_error_in_place_with(buf, ip_offset, error, header, Quote::HeaderPlus8)
}

/// [`emit_error_in_place`] with a choice of how much to quote.
pub fn emit_error_in_place_with(
    buf: &mut [u8],
    ip_offset: usize,
    error: Icmpv4Error,
    header: &ErrorHeader,
    quote: Quote,
) -> Result<usize> {
    let orig = buf.get(ip_offset..).ok_or(Error::Truncated)?;
    let ip = ipv4::Packet::new_checked(orig)?;
    let orig_src = ip.src_addr();
    let quote_len = match quote {
        Quote::HeaderPlus8 => ip.icmp_quote().len(),
        Quote::Rfc1812 => {
            usize::from(ip.total_len()).min(RFC1812_MAX_ERROR_LEN - ipv4::HEADER_LEN - HEADER_LEN)
        }
    };
    let total = ERROR_HEADERS_LEN + quote_len;
    if buf.len() < total {
        return Err(Error::BufferTooSmall);
    }
    buf.copy_within(ip_offset..ip_offset + quote_len, ERROR_HEADERS_LEN);

    ethernet::EthernetRepr {
        src_addr: header.src_mac,
        dst_addr: header.dst_mac,
        vlan: None,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut buf[..]))?;

    let icmp_start = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
    let mut icmp = Packet::new_unchecked(&mut buf[icmp_start..total]);
    let (t, code, rest) = match error {
        Icmpv4Error::TimeExceeded => (Message::TimeExceeded, CODE_TTL_EXCEEDED, 0),
        Icmpv4Error::FragmentationNeeded { next_hop_mtu } => (
            Message::DstUnreachable,
            CODE_FRAG_NEEDED,
            u32::from(next_hop_mtu),
        ),
    };
    icmp.set_msg_type(t);
    icmp.set_msg_code(code);
    icmp.set_rest_of_header(rest);
    icmp.fill_checksum();

    ipv4::Ipv4Repr {
        src_addr: header.src_addr,
        dst_addr: orig_src,
        protocol: IpProtocol::Icmp,
        payload_len: HEADER_LEN + quote_len,
        ttl: header.ttl,
        tos: 0xc0,
        ident: header.ident,
        dont_frag: false,
        more_frags: false,
        frag_offset: 0,
    }
    .emit(&mut ipv4::Packet::new_unchecked(
        &mut buf[ethernet::HEADER_LEN..],
    ))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICMP echo request Linux sent in `tests/vectors/arp_icmp_echo.hex`.
    const ECHO_HEX: &str = "080089916ca6000159930c6b00000000d4f5080000000000\
        101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637";

    /// Fragmentation needed, MTU 1000, quoting a 20-byte header and 8
    /// bytes; checksum 0x314f.
    const FRAG_NEEDED_HEX: &str = "0304314f000003e8\
        450004cc00004000400188ddc0a86401c0a8c801080055206aa30001";

    fn bytes(h: &str) -> Vec<u8> {
        hex::decode(h).unwrap()
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes(ECHO_HEX);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.msg_type(), Message::EchoRequest);
        assert_eq!(p.msg_code(), 0);
        assert_eq!(p.checksum(), 0x8991);
        assert_eq!(p.echo_ident(), 0x6ca6);
        assert_eq!(p.echo_seq_no(), 1);
        assert!(p.verify_checksum());
        assert_eq!(p.data(), &b[8..]);

        let f = bytes(FRAG_NEEDED_HEX);
        let p = Packet::new_checked(&f[..]).unwrap();
        assert_eq!(p.msg_type(), Message::DstUnreachable);
        assert!(p.msg_type().is_error());
        assert_eq!(p.msg_code(), CODE_FRAG_NEEDED);
        assert_eq!(p.next_hop_mtu(), 1000);
        assert!(p.verify_checksum());
    }

    #[test]
    fn test_construct() {
        let b = bytes(ECHO_HEX);
        let mut out = vec![0xa5; b.len()];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_msg_type(Message::EchoRequest);
        p.set_msg_code(0);
        p.set_echo_ident(0x6ca6);
        p.set_echo_seq_no(1);
        p.data_mut().copy_from_slice(&b[8..]);
        p.fill_checksum();
        assert_eq!(out, b);
    }

    #[test]
    fn test_parse() {
        let b = bytes(ECHO_HEX);
        assert_eq!(
            Icmpv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Ok(Icmpv4Repr::EchoRequest {
                ident: 0x6ca6,
                seq_no: 1,
                data: &b[8..],
            })
        );
        let f = bytes(FRAG_NEEDED_HEX);
        assert_eq!(
            Icmpv4Repr::parse(&Packet::new_unchecked(&f[..])),
            Ok(Icmpv4Repr::DstUnreachable {
                code: 4,
                next_hop_mtu: 1000,
                data: &f[8..],
            })
        );
        let mut bad = b.clone();
        bad[9] ^= 0xff;
        assert_eq!(
            Icmpv4Repr::parse(&Packet::new_unchecked(&bad[..])),
            Err(Error::Checksum)
        );
    }

    #[test]
    fn test_emit() {
        let f = bytes(FRAG_NEEDED_HEX);
        let repr = Icmpv4Repr::DstUnreachable {
            code: 4,
            next_hop_mtu: 1000,
            data: &f[8..],
        };
        assert_eq!(repr.buffer_len(), f.len());
        let mut out = vec![0xa5; f.len()];
        repr.emit(&mut Packet::new_unchecked(&mut out)).unwrap();
        assert_eq!(out, f);
        let mut short = vec![0xa5; f.len() - 1];
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut short)),
            Err(Error::BufferTooSmall)
        );
    }

    #[test]
    fn truncated_at_every_length_is_an_error() {
        let b = bytes(ECHO_HEX);
        for n in 0..HEADER_LEN {
            assert_eq!(Packet::new_checked(&b[..n]), Err(Error::Truncated));
        }
    }

    fn header() -> ErrorHeader {
        ErrorHeader {
            src_mac: MacAddr([0xee; 6]),
            dst_mac: MacAddr([0x02, 0, 0, 0, 0, 0x0a]),
            src_addr: Ipv4Addr::new(169, 254, 1, 1),
            ttl: 64,
            ident: 0,
        }
    }

    #[test]
    fn error_in_place_behind_a_vlan_tag_quotes_the_ip_header_plus_8() {
        // A tagged frame: the IPv4 header starts at 18.
        let ip = bytes("450004cc00004000400188ddc0a86401c0a8c801080055206aa30001");
        let mut buf = vec![0xa5; 18];
        buf[12..14].copy_from_slice(&[0x81, 0x00]);
        buf.extend_from_slice(&ip);
        // The rest of the 1228-byte packet, which must be there.
        buf.resize(18 + 1228, 0);
        let len = emit_error_in_place(
            &mut buf,
            18,
            Icmpv4Error::FragmentationNeeded { next_hop_mtu: 1000 },
            &header(),
        )
        .unwrap();
        assert_eq!(len, ERROR_HEADERS_LEN + 28);
        assert_eq!(&buf[34..len], &bytes(FRAG_NEEDED_HEX)[..]);
        assert_eq!(&buf[12..14], &[0x08, 0x00]);
        let out = ipv4::Packet::new_checked(&buf[14..len]).unwrap();
        assert!(out.verify_checksum());
        assert_eq!(out.dst_addr(), Ipv4Addr::new(192, 168, 100, 1));
        assert_eq!(out.protocol(), IpProtocol::Icmp);
    }

    #[test]
    fn error_in_place_needs_room_and_a_valid_packet() {
        // A whole 28-byte datagram at offset 0 of a 28-byte buffer: the
        // error (42 + 28 bytes) does not fit.
        let mut small = vec![0u8; 28];
        ipv4::Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            protocol: IpProtocol::Udp,
            payload_len: 8,
            ttl: 1,
            tos: 0,
            ident: 0,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
        }
        .emit(&mut ipv4::Packet::new_unchecked(&mut small[..]))
        .unwrap();
        assert_eq!(
            emit_error_in_place(&mut small, 0, Icmpv4Error::TimeExceeded, &header()),
            Err(Error::BufferTooSmall)
        );
        small.resize(70, 0);
        assert_eq!(
            emit_error_in_place(&mut small, 0, Icmpv4Error::TimeExceeded, &header()),
            Ok(70)
        );
        let mut garbage = vec![0u8; 100];
        assert_eq!(
            emit_error_in_place(&mut garbage, 14, Icmpv4Error::TimeExceeded, &header()),
            Err(Error::Malformed)
        );
        assert_eq!(
            emit_error_in_place(&mut garbage, 101, Icmpv4Error::TimeExceeded, &header()),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn errors_are_not_sent_about_errors_fragments_or_broadcasts() {
        let echo = bytes("45000054371e40004001b93ac0a86401c0a864fe0800");
        let p = ipv4::Packet::new_unchecked(&echo[..]);
        assert!(may_send_error_about(&p));
        let mut err = echo.clone();
        err[20] = 11;
        assert!(!may_send_error_about(&ipv4::Packet::new_unchecked(
            &err[..]
        )));
        let mut frag = echo.clone();
        frag[6..8].copy_from_slice(&[0x00, 0x10]);
        assert!(!may_send_error_about(&ipv4::Packet::new_unchecked(
            &frag[..]
        )));
        let mut bcast = echo.clone();
        bcast[16..20].copy_from_slice(&[255; 4]);
        assert!(!may_send_error_about(&ipv4::Packet::new_unchecked(
            &bcast[..]
        )));
    }
}
