//! IPv6 fixed headers (RFC 8200): enough to classify and forward.
//!
//! The vrouter forwards IPv6 by destination and hop limit; it does not walk
//! extension headers, so [`Packet::next_header`] is the first one (which
//! for pod traffic is almost always TCP, UDP or ICMPv6). There is no header
//! checksum, so [`Packet::decrement_hop_limit`] is a single byte write.
//!
//! Hand-written rather than etherparse's `Ipv6HeaderSlice` for the same
//! reason as IPv4: the hop limit is rewritten in place.

use std::net::Ipv6Addr;

use crate::error::{Error, Result};
use crate::ip::IpProtocol;

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Version (4 bits), traffic class (8), flow label (20).
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    /// Payload length (everything after the fixed header).
    pub const LENGTH: Range<usize> = 4..6;
    /// Next header.
    pub const NXT_HDR: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC_ADDR: Range<usize> = 8..24;
    /// Destination address.
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// A view of an IPv6 packet in a buffer.
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

    /// Checks version 6 and `40 + payload length <= buffer`.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let d = self.buffer.as_ref();
        if d.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 6 {
            return Err(Error::Malformed);
        }
        if d.len() < HEADER_LEN + usize::from(self.payload_len()) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word0(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::VER_TC_FLOW];
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
    }

    /// IP version (6).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Traffic class.
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length.
    #[inline]
    pub fn payload_len(&self) -> u16 {
        let d = &self.buffer.as_ref()[field::LENGTH];
        u16::from_be_bytes([d[0], d[1]])
    }

    /// Total length: fixed header plus payload.
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len())
    }

    /// Next header (the first extension header or the upper layer).
    #[inline]
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::NXT_HDR])
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        Ipv6Addr::from(a)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        Ipv6Addr::from(a)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload (extension headers included), up to the payload length.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.total_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_word0(&mut self, w: u32) {
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    }

    /// Sets version 6, keeping traffic class and flow label.
    #[inline]
    pub fn set_version(&mut self) {
        let w = (self.word0() & 0x0fff_ffff) | (6 << 28);
        self.set_word0(w);
    }

    /// Sets the traffic class.
    #[inline]
    pub fn set_traffic_class(&mut self, tc: u8) {
        let w = (self.word0() & 0xf00f_ffff) | (u32::from(tc) << 20);
        self.set_word0(w);
    }

    /// Sets the flow label (low 20 bits).
    #[inline]
    pub fn set_flow_label(&mut self, label: u32) {
        let w = (self.word0() & 0xfff0_0000) | (label & 0x000f_ffff);
        self.set_word0(w);
    }

    /// Sets the payload length.
    #[inline]
    pub fn set_payload_len(&mut self, len: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, p: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = u8::from(p);
    }

    /// Sets the hop limit.
    #[inline]
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = h;
    }

    /// Decrements the hop limit, returning the new value; 0 stays 0 (the
    /// caller checks `hop_limit() <= 1` first).
    #[inline]
    pub fn decrement_hop_limit(&mut self) -> u8 {
        let d = self.buffer.as_mut();
        d[field::HOP_LIMIT] = d[field::HOP_LIMIT].saturating_sub(1);
        d[field::HOP_LIMIT]
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }

    /// The payload, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.total_len();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// An IPv6 fixed header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header.
    pub next_header: IpProtocol,
    /// Payload length.
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Parses the fixed header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Ipv6Repr> {
        packet.check_len()?;
        Ok(Ipv6Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    /// Length of the header this emits (40).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header into the start of the buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        if packet.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::BufferTooSmall);
        }
        let len = u16::try_from(self.payload_len).map_err(|_| Error::BufferTooSmall)?;
        packet.set_word0(
            (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000f_ffff),
        );
        packet.set_payload_len(len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICMPv6 echo request Linux sent in
    /// `tests/vectors/ipv6_icmp_echo.hex`: fd00::1 → fd00::fe, flow label
    /// 0xe0804, hop limit 64, 64 bytes of payload.
    const ECHO_REQUEST_HEX: &str = "600e080400403a40\
        fd000000000000000000000000000001fd0000000000000000000000000000fe\
        8000bbdc6e23000160930c6b0000000027b2070000000000101112131415161718191a1b1c1d1e1f\
        202122232425262728292a2b2c2d2e2f3031323334353637";

    fn bytes() -> Vec<u8> {
        hex::decode(ECHO_REQUEST_HEX).unwrap()
    }

    fn repr() -> Ipv6Repr {
        Ipv6Repr {
            src_addr: "fd00::1".parse().unwrap(),
            dst_addr: "fd00::fe".parse().unwrap(),
            next_header: IpProtocol::Icmpv6,
            payload_len: 64,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0xe0804,
        }
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0);
        assert_eq!(p.flow_label(), 0xe0804);
        assert_eq!(p.payload_len(), 64);
        assert_eq!(p.next_header(), IpProtocol::Icmpv6);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr(), "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "fd00::fe".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.payload(), &b[40..]);
    }

    #[test]
    fn test_construct() {
        let b = bytes();
        let mut out = vec![0xa5; b.len()];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_version();
        p.set_traffic_class(0);
        p.set_flow_label(0xe0804);
        p.set_payload_len(64);
        p.set_next_header(IpProtocol::Icmpv6);
        p.set_hop_limit(64);
        p.set_src_addr("fd00::1".parse().unwrap());
        p.set_dst_addr("fd00::fe".parse().unwrap());
        p.payload_mut().copy_from_slice(&b[40..]);
        assert_eq!(out, b);
    }

    #[test]
    fn test_parse() {
        let b = bytes();
        assert_eq!(Ipv6Repr::parse(&Packet::new_unchecked(&b[..])), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let b = bytes();
        let mut out = vec![0xa5; b.len()];
        out[40..].copy_from_slice(&b[40..]);
        repr().emit(&mut Packet::new_unchecked(&mut out)).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn hop_limit_decrements_and_stops_at_zero() {
        let mut b = bytes();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        assert_eq!(p.decrement_hop_limit(), 63);
        p.set_hop_limit(0);
        assert_eq!(p.decrement_hop_limit(), 0);
    }

    #[test]
    fn truncated_or_wrong_version_is_an_error() {
        let b = bytes();
        for n in 0..b.len() {
            assert_eq!(Packet::new_checked(&b[..n]), Err(Error::Truncated), "{n}");
        }
        let mut v4 = b.clone();
        v4[0] = 0x45;
        assert_eq!(Packet::new_checked(&v4[..]), Err(Error::Malformed));
    }
}
