//! ICMPv6 (RFC 4443): the messages a router sends when it must drop an
//! IPv6 packet, built in place, plus a view of any ICMPv6 message.
//!
//! Time exceeded (type 3, code 0) when the hop limit runs out; packet too
//! big (type 2, with the MTU) when a packet does not fit the egress link:
//! IPv6 routers never fragment, so without packet too big every IPv6 flow
//! larger than a tunnel's MTU is a black hole. Both quote as much of the
//! invoking packet as fits in the IPv6 minimum MTU of 1280 bytes (RFC 4443
//! §2.4 (c)), which is also what Linux sends.
//!
//! Neighbor discovery (RFC 4861) gets the same treatment as ARP: a
//! speculative target prefilter ([`speculative_ns_target`]) and a neighbor
//! advertisement built in place from the solicitation
//! ([`emit_neighbor_advert_in_place`]), for a proxy that answers pods'
//! solicitations for their IPv6 gateway.
//!
//! Hand-written rather than etherparse's `Icmpv6Slice`: the error is built
//! in the dropped frame's own buffer.

use std::net::Ipv6Addr;

use crate::checksum;
use crate::error::{Error, Result};
use crate::ethernet::{self, EtherType, MacAddr};
use crate::ip::IpProtocol;
use crate::ipv6;
use crate::macros::enum_with_unknown;

enum_with_unknown! {
    /// ICMPv6 message type.
    pub enum Message(u8) {
        /// Destination unreachable (1).
        DstUnreachable = 1,
        /// Packet too big (2).
        PacketTooBig = 2,
        /// Time exceeded (3).
        TimeExceeded = 3,
        /// Parameter problem (4).
        ParamProblem = 4,
        /// Echo request (128).
        EchoRequest = 128,
        /// Echo reply (129).
        EchoReply = 129,
        /// Router solicitation (133).
        RouterSolicit = 133,
        /// Router advertisement (134).
        RouterAdvert = 134,
        /// Neighbor solicitation (135).
        NeighborSolicit = 135,
        /// Neighbor advertisement (136).
        NeighborAdvert = 136,
        /// Redirect (137).
        Redirect = 137,
    }
}

impl Message {
    /// Whether this is an error message (types 0–127), which must never
    /// cause another error (RFC 4443 §2.4 (e)).
    pub fn is_error(self) -> bool {
        u8::from(self) < 128
    }
}

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Message type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum over the pseudo-header and the whole message.
    pub const CHECKSUM: Range<usize> = 2..4;
    /// The MTU of packet too big.
    pub const MTU: Range<usize> = 4..8;
    /// Echo identifier.
    pub const ECHO_IDENT: Range<usize> = 4..6;
    /// Echo sequence number.
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    /// The four bytes after the checksum, whatever the type.
    pub const REST_OF_HEADER: Range<usize> = 4..8;
}

/// Length of the ICMPv6 header.
pub const HEADER_LEN: usize = 8;

/// The IPv6 minimum MTU, which bounds an error message (RFC 4443).
pub const MIN_MTU: usize = 1280;

/// A view of an ICMPv6 message in a buffer (the IPv6 payload).
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

    /// The MTU of a packet too big message.
    #[inline]
    pub fn mtu(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::MTU];
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
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

    /// The four bytes after the checksum.
    #[inline]
    pub fn rest_of_header(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::REST_OF_HEADER];
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
    }

    /// Whether the checksum verifies over the pseudo-header of `src` →
    /// `dst` and the whole buffer.
    #[inline]
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let d = self.buffer.as_ref();
        let Ok(len) = u32::try_from(d.len()) else {
            return false;
        };
        checksum::combine(&[
            checksum::pseudo_header_v6(src, dst, IpProtocol::Icmpv6, len),
            checksum::data(d),
        ]) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// Everything after the 8-byte header.
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

    /// Sets the four bytes after the checksum (the MTU, or echo
    /// identifier and sequence number).
    #[inline]
    pub fn set_rest_of_header(&mut self, v: u32) {
        self.buffer.as_mut()[field::REST_OF_HEADER].copy_from_slice(&v.to_be_bytes());
    }

    /// Computes the checksum over the pseudo-header and the whole buffer
    /// and writes it.
    #[inline]
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let d = self.buffer.as_ref();
        let len = u32::try_from(d.len()).unwrap_or(u32::MAX);
        let c = checksum::result(checksum::combine(&[
            checksum::pseudo_header_v6(src, dst, IpProtocol::Icmpv6, len),
            checksum::data(d),
        ]));
        self.set_checksum(c);
    }

    /// Everything after the header, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// An ICMPv6 message, as values: echo and the errors are typed, anything
/// else (neighbor discovery included) is kept as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv6Repr<'a> {
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
    /// Packet too big.
    PacketTooBig {
        /// The MTU of the next hop.
        mtu: u32,
        /// As much of the invoking packet as fits.
        data: &'a [u8],
    },
    /// Time exceeded.
    TimeExceeded {
        /// Code (0: hop limit exceeded in transit).
        code: u8,
        /// As much of the invoking packet as fits.
        data: &'a [u8],
    },
    /// Any other type.
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

impl<'a> Icmpv6Repr<'a> {
    /// Parses a message, verifying its checksum against the pseudo-header
    /// of `src` → `dst`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&'a T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<Icmpv6Repr<'a>> {
        packet.check_len()?;
        if !packet.verify_checksum(src, dst) {
            return Err(Error::Checksum);
        }
        let data = packet.data();
        Ok(match packet.msg_type() {
            Message::EchoRequest => Icmpv6Repr::EchoRequest {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            Message::EchoReply => Icmpv6Repr::EchoReply {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            Message::PacketTooBig => Icmpv6Repr::PacketTooBig {
                mtu: packet.mtu(),
                data,
            },
            Message::TimeExceeded => Icmpv6Repr::TimeExceeded {
                code: packet.msg_code(),
                data,
            },
            other => Icmpv6Repr::Other {
                msg_type: u8::from(other),
                code: packet.msg_code(),
                rest_of_header: packet.rest_of_header(),
                data,
            },
        })
    }

    fn data(&self) -> &'a [u8] {
        match *self {
            Icmpv6Repr::EchoRequest { data, .. }
            | Icmpv6Repr::EchoReply { data, .. }
            | Icmpv6Repr::PacketTooBig { data, .. }
            | Icmpv6Repr::TimeExceeded { data, .. }
            | Icmpv6Repr::Other { data, .. } => data,
        }
    }

    /// Length of the message this emits: 8 plus the data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.data().len()
    }

    /// Writes the message into the first [`Icmpv6Repr::buffer_len`] bytes
    /// and checksums it for `src` → `dst`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<()> {
        let len = self.buffer_len();
        let buf = packet.buffer.as_mut();
        if buf.len() < len {
            return Err(Error::BufferTooSmall);
        }
        let mut p = Packet::new_unchecked(&mut buf[..len]);
        let (t, code, rest) = match *self {
            Icmpv6Repr::EchoRequest { ident, seq_no, .. } => (
                Message::EchoRequest,
                0,
                (u32::from(ident) << 16) | u32::from(seq_no),
            ),
            Icmpv6Repr::EchoReply { ident, seq_no, .. } => (
                Message::EchoReply,
                0,
                (u32::from(ident) << 16) | u32::from(seq_no),
            ),
            Icmpv6Repr::PacketTooBig { mtu, .. } => (Message::PacketTooBig, 0, mtu),
            Icmpv6Repr::TimeExceeded { code, .. } => (Message::TimeExceeded, code, 0),
            Icmpv6Repr::Other {
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
        p.fill_checksum(src, dst);
        Ok(())
    }
}

/// Which error to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv6Error {
    /// Time exceeded, hop limit exceeded in transit (type 3, code 0).
    TimeExceeded,
    /// Packet too big (type 2, code 0), with the egress MTU.
    PacketTooBig {
        /// The MTU the packet did not fit.
        mtu: u32,
    },
}

/// The addressing of an ICMPv6 error the vrouter sends back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorHeader {
    /// Source MAC of the new frame.
    pub src_mac: MacAddr,
    /// Destination MAC (usually the source MAC of the dropped frame).
    pub dst_mac: MacAddr,
    /// Source address: the router's address.
    pub src_addr: Ipv6Addr,
    /// Hop limit of the error (64).
    pub hop_limit: u8,
    /// Flow label of the error (Linux: a hash, or 0).
    pub flow_label: u32,
}

/// Length of the headers in front of the quote in an error frame:
/// Ethernet 14 + IPv6 40 + ICMPv6 8.
pub const ERROR_HEADERS_LEN: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + HEADER_LEN;

/// The largest quote: what fits in a 1280-byte error.
pub const MAX_QUOTE_LEN: usize = MIN_MTU - ipv6::HEADER_LEN - HEADER_LEN;

/// Whether the vrouter may answer this IPv6 packet with an ICMPv6 error
/// (RFC 4443 §2.4 (e)): not an ICMPv6 error itself (when ICMPv6 is the
/// first next header), not from the unspecified or a multicast address,
/// not to a multicast address.
pub fn may_send_error_about<T: AsRef<[u8]>>(ip: &ipv6::Packet<T>) -> bool {
    let src = ip.src_addr();
    if src.is_unspecified() || src.is_multicast() || ip.dst_addr().is_multicast() {
        return false;
    }
    if ip.next_header() == IpProtocol::Icmpv6 {
        match ip.as_ref().get(ipv6::HEADER_LEN) {
            Some(&t) if !Message::from(t).is_error() => {}
            _ => return false,
        }
    }
    true
}

/// Rewrites the frame in `buf` into an ICMPv6 error about the IPv6 packet
/// that starts at `ip_offset`, and returns the new frame length.
///
/// As [`crate::icmpv4::emit_error_in_place`]: `buf` runs to the end of the
/// frame's buffer space. The quote (the invoking packet, up to 1232 bytes)
/// moves to offset 62; the new Ethernet (untagged), IPv6 and ICMPv6 headers
/// go in front. The destination is the original source.
pub fn emit_error_in_place(
    buf: &mut [u8],
    ip_offset: usize,
    error: Icmpv6Error,
    header: &ErrorHeader,
) -> Result<usize> {
    let orig = buf.get(ip_offset..).ok_or(Error::Truncated)?;
    let ip = ipv6::Packet::new_checked(orig)?;
    let orig_src = ip.src_addr();
    let quote_len = ip.total_len().min(MAX_QUOTE_LEN);
    let total = ERROR_HEADERS_LEN + quote_len;
    if buf.len() < total {
        return Err(Error::BufferTooSmall);
    }
    buf.copy_within(ip_offset..ip_offset + quote_len, ERROR_HEADERS_LEN);

    ethernet::EthernetRepr {
        src_addr: header.src_mac,
        dst_addr: header.dst_mac,
        vlan: None,
        ethertype: EtherType::Ipv6,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut buf[..]))?;
    ipv6::Ipv6Repr {
        src_addr: header.src_addr,
        dst_addr: orig_src,
        next_header: IpProtocol::Icmpv6,
        payload_len: HEADER_LEN + quote_len,
        hop_limit: header.hop_limit,
        traffic_class: 0,
        flow_label: header.flow_label,
    }
    .emit(&mut ipv6::Packet::new_unchecked(
        &mut buf[ethernet::HEADER_LEN..],
    ))?;

    let icmp_start = ethernet::HEADER_LEN + ipv6::HEADER_LEN;
    let mut icmp = Packet::new_unchecked(&mut buf[icmp_start..total]);
    let (t, rest) = match error {
        Icmpv6Error::TimeExceeded => (Message::TimeExceeded, 0),
        Icmpv6Error::PacketTooBig { mtu } => (Message::PacketTooBig, mtu),
    };
    icmp.set_msg_type(t);
    icmp.set_msg_code(0);
    icmp.set_rest_of_header(rest);
    icmp.fill_checksum(header.src_addr, orig_src);
    Ok(total)
}

/// The target address of what may be a neighbor solicitation, read
/// without validation from an ICMPv6 message (the IPv6 payload): `None`
/// only if the message is not type 135 or too short to hold a target, so
/// a proxy that skips on `None` or on a target it does not answer for
/// never skips a solicitation it should answer (the NDP twin of
/// [`crate::arp::speculative_target_ip`]).
#[inline]
pub fn speculative_ns_target(icmp: &[u8]) -> Option<Ipv6Addr> {
    if *icmp.first()? != u8::from(Message::NeighborSolicit) {
        return None;
    }
    let t: [u8; 16] = icmp.get(8..24)?.try_into().ok()?;
    Some(Ipv6Addr::from(t))
}

/// Length of the neighbor advertisement built by
/// [`emit_neighbor_advert_in_place`]: Ethernet 14 + IPv6 40 + NA 24 + a
/// target link-layer address option 8.
pub const NEIGHBOR_ADVERT_FRAME_LEN: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + 32;

/// NA flags: router, solicited, override (RFC 4861 §4.4).
const NA_FLAG_ROUTER: u32 = 0x8000_0000;
const NA_FLAG_SOLICITED: u32 = 0x4000_0000;
const NA_FLAG_OVERRIDE: u32 = 0x2000_0000;

/// Answers the neighbor solicitation at `ip_offset` of the frame in `buf`
/// with a solicited neighbor advertisement, in place: "the target is at
/// `our_mac`", from the target address to the solicitation's source, hop
/// limit 255, flags S and O (and R when `router`), with a target
/// link-layer address option. Returns the new frame length
/// ([`NEIGHBOR_ADVERT_FRAME_LEN`]); `buf` runs to the end of the buffer
/// space, as for the ICMP errors.
///
/// The solicitation is validated as RFC 4861 §7.1.1 asks (hop limit 255,
/// code 0, checksum, a unicast target). A solicitation from the
/// unspecified address (duplicate address detection) is
/// [`Error::Unsupported`]: answering it would make the sender give up its
/// address.
pub fn emit_neighbor_advert_in_place(
    buf: &mut [u8],
    ip_offset: usize,
    our_mac: MacAddr,
    router: bool,
) -> Result<usize> {
    let requester_mac = MacAddr::from_bytes(buf.get(6..12).ok_or(Error::Truncated)?);
    let orig = buf.get(ip_offset..).ok_or(Error::Truncated)?;
    let ip = ipv6::Packet::new_checked(orig)?;
    if ip.next_header() != IpProtocol::Icmpv6 || ip.hop_limit() != 255 {
        return Err(Error::Malformed);
    }
    let icmp = Packet::new_checked(ip.payload())?;
    if icmp.msg_type() != Message::NeighborSolicit
        || icmp.msg_code() != 0
        || icmp.data().len() < 16
        || !icmp.verify_checksum(ip.src_addr(), ip.dst_addr())
    {
        return Err(Error::Malformed);
    }
    let target = speculative_ns_target(ip.payload()).ok_or(Error::Malformed)?;
    if target.is_multicast() {
        return Err(Error::Malformed);
    }
    let requester = ip.src_addr();
    if requester.is_unspecified() {
        return Err(Error::Unsupported);
    }
    if buf.len() < NEIGHBOR_ADVERT_FRAME_LEN {
        return Err(Error::BufferTooSmall);
    }

    ethernet::EthernetRepr {
        src_addr: our_mac,
        dst_addr: requester_mac,
        vlan: None,
        ethertype: EtherType::Ipv6,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut buf[..]))?;
    ipv6::Ipv6Repr {
        src_addr: target,
        dst_addr: requester,
        next_header: IpProtocol::Icmpv6,
        payload_len: 32,
        hop_limit: 255,
        traffic_class: 0,
        flow_label: 0,
    }
    .emit(&mut ipv6::Packet::new_unchecked(
        &mut buf[ethernet::HEADER_LEN..],
    ))?;
    let start = ethernet::HEADER_LEN + ipv6::HEADER_LEN;
    let mut na = Packet::new_unchecked(&mut buf[start..NEIGHBOR_ADVERT_FRAME_LEN]);
    na.set_msg_type(Message::NeighborAdvert);
    na.set_msg_code(0);
    let flags = NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE | if router { NA_FLAG_ROUTER } else { 0 };
    na.set_rest_of_header(flags);
    let data = na.data_mut();
    data[..16].copy_from_slice(&target.octets());
    // Target link-layer address option: type 2, length 1 (× 8 bytes).
    data[16..18].copy_from_slice(&[2, 1]);
    data[18..24].copy_from_slice(&our_mac.0);
    na.fill_checksum(target, requester);
    Ok(NEIGHBOR_ADVERT_FRAME_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICMPv6 echo request Linux sent from fd00::1 to fd00::fe
    /// (`tests/vectors/ipv6_icmp_echo.hex`).
    const ECHO_HEX: &str = "8000bbdc6e23000160930c6b0000000027b2070000000000\
        101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637";

    fn a() -> Ipv6Addr {
        "fd00::1".parse().unwrap()
    }

    fn r() -> Ipv6Addr {
        "fd00::fe".parse().unwrap()
    }

    fn bytes() -> Vec<u8> {
        hex::decode(ECHO_HEX).unwrap()
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.msg_type(), Message::EchoRequest);
        assert!(!p.msg_type().is_error());
        assert_eq!(p.msg_code(), 0);
        assert_eq!(p.checksum(), 0xbbdc);
        assert_eq!(p.echo_ident(), 0x6e23);
        assert_eq!(p.echo_seq_no(), 1);
        assert_eq!(p.rest_of_header(), 0x6e23_0001);
        assert!(p.verify_checksum(a(), r()));
        assert!(!p.verify_checksum(r(), r()));
        assert_eq!(p.data(), &b[8..]);
    }

    #[test]
    fn test_construct() {
        let b = bytes();
        let mut out = vec![0xa5; b.len()];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_msg_type(Message::EchoRequest);
        p.set_msg_code(0);
        p.set_rest_of_header(0x6e23_0001);
        p.data_mut().copy_from_slice(&b[8..]);
        p.fill_checksum(a(), r());
        assert_eq!(out, b);
    }

    #[test]
    fn test_parse() {
        let b = bytes();
        assert_eq!(
            Icmpv6Repr::parse(&Packet::new_unchecked(&b[..]), a(), r()),
            Ok(Icmpv6Repr::EchoRequest {
                ident: 0x6e23,
                seq_no: 1,
                data: &b[8..],
            })
        );
        assert_eq!(
            Icmpv6Repr::parse(&Packet::new_unchecked(&b[..]), r(), r()),
            Err(Error::Checksum)
        );
    }

    #[test]
    fn test_emit() {
        let b = bytes();
        let repr = Icmpv6Repr::EchoRequest {
            ident: 0x6e23,
            seq_no: 1,
            data: &b[8..],
        };
        let mut out = vec![0xa5; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut out), a(), r())
            .unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn truncated_at_every_length_is_an_error() {
        let b = bytes();
        for n in 0..HEADER_LEN {
            assert_eq!(Packet::new_checked(&b[..n]), Err(Error::Truncated));
        }
    }

    #[test]
    fn packet_too_big_quotes_at_most_1232_bytes() {
        // A 1500-byte IPv6 packet at offset 14 of a 1514-byte frame.
        let mut buf = vec![0u8; 1514];
        ipv6::Ipv6Repr {
            src_addr: a(),
            dst_addr: "fd01::1".parse().unwrap(),
            next_header: IpProtocol::Udp,
            payload_len: 1460,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
        .emit(&mut ipv6::Packet::new_unchecked(&mut buf[14..]))
        .unwrap();
        let original = buf[14..14 + MAX_QUOTE_LEN].to_vec();
        let header = ErrorHeader {
            src_mac: MacAddr([0xee; 6]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_addr: r(),
            hop_limit: 64,
            flow_label: 0,
        };
        let len = emit_error_in_place(
            &mut buf,
            14,
            Icmpv6Error::PacketTooBig { mtu: 1450 },
            &header,
        )
        .unwrap();
        assert_eq!(len, 14 + MIN_MTU);
        let ip = ipv6::Packet::new_checked(&buf[14..len]).unwrap();
        assert_eq!(ip.dst_addr(), a());
        assert_eq!(ip.next_header(), IpProtocol::Icmpv6);
        let icmp = Packet::new_checked(ip.payload()).unwrap();
        assert_eq!(icmp.msg_type(), Message::PacketTooBig);
        assert_eq!(icmp.mtu(), 1450);
        assert!(icmp.verify_checksum(r(), a()));
        assert_eq!(icmp.data(), &original[..]);
        assert!(!may_send_error_about(&ip));
    }

    #[test]
    fn errors_are_not_sent_about_multicast_or_unspecified() {
        let mut b = [0u8; 48];
        let mut ip = ipv6::Packet::new_unchecked(&mut b[..]);
        ip.set_version();
        ip.set_payload_len(8);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_src_addr(a());
        ip.set_dst_addr("ff02::1".parse().unwrap());
        assert!(!may_send_error_about(&ip));
        ip.set_dst_addr(r());
        assert!(may_send_error_about(&ip));
        ip.set_src_addr(Ipv6Addr::UNSPECIFIED);
        assert!(!may_send_error_about(&ip));
    }

    /// The solicitation Linux sent from fd00::1 for fd00::fe, as a frame
    /// (`tests/vectors/ipv6_icmp_echo.hex`).
    const NS_FRAME_HEX: &str = "3333ff0000fe02000000000a86dd6000000000203afffd00000000000000\
        0000000000000001ff0200000000000000000001ff0000fe87007b9600000000fd00000000000000\
        00000000000000fe010102000000000a";

    #[test]
    fn neighbor_advert_needs_a_valid_solicitation() {
        let ns = hex::decode(NS_FRAME_HEX).unwrap();
        let mut ok = ns.clone();
        ok.resize(NEIGHBOR_ADVERT_FRAME_LEN, 0);
        assert_eq!(
            emit_neighbor_advert_in_place(&mut ok, 14, MacAddr([0xee; 6]), false),
            Ok(NEIGHBOR_ADVERT_FRAME_LEN)
        );
        let na = Packet::new_checked(&ok[54..]).unwrap();
        assert_eq!(na.msg_type(), Message::NeighborAdvert);
        assert_eq!(na.rest_of_header(), 0x6000_0000);
        assert!(na.verify_checksum(r(), a()));

        let mut hop = ns.clone();
        hop[21] = 64;
        assert_eq!(
            emit_neighbor_advert_in_place(&mut hop, 14, MacAddr([0xee; 6]), false),
            Err(Error::Malformed)
        );
        let mut bad_sum = ns.clone();
        bad_sum[57] ^= 1;
        assert_eq!(
            emit_neighbor_advert_in_place(&mut bad_sum, 14, MacAddr([0xee; 6]), false),
            Err(Error::Malformed)
        );
        // Duplicate address detection (source ::) is not answered. The
        // checksum is recomputed for the new source so only that differs.
        let mut dad = ns.clone();
        dad[22..38].fill(0);
        let mut icmp = Packet::new_unchecked(&mut dad[54..]);
        icmp.fill_checksum(Ipv6Addr::UNSPECIFIED, "ff02::1:ff00:fe".parse().unwrap());
        dad.resize(NEIGHBOR_ADVERT_FRAME_LEN, 0);
        assert_eq!(
            emit_neighbor_advert_in_place(&mut dad, 14, MacAddr([0xee; 6]), false),
            Err(Error::Unsupported)
        );
        // Every prefix is an error, never a panic.
        for n in 0..ns.len() {
            let mut p = ns[..n].to_vec();
            assert!(emit_neighbor_advert_in_place(&mut p, 14, MacAddr([0xee; 6]), false).is_err());
        }
        assert_eq!(speculative_ns_target(&ns[54..]), Some(r()));
        assert_eq!(speculative_ns_target(&ns[54..77]), None);
        assert_eq!(speculative_ns_target(&bytes()), None);
    }
}
