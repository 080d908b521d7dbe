//! IPv4 headers (RFC 791), options skipped by the header length.
//!
//! The view reads the header length from IHL, so [`Packet::payload`] starts
//! after any options, and the payload ends at the total length, not at the
//! end of the buffer (Ethernet pads short frames to 60 bytes).
//!
//! [`Packet::decrement_ttl`] is the forwarding step: one byte changes, and
//! the checksum follows by RFC 1624 instead of a full recomputation.
//!
//! Hand-written rather than etherparse's `Ipv4HeaderSlice`: the TTL and
//! checksum are rewritten in place on every forwarded packet, and the outer
//! header of an encapsulated packet is written into headroom.

use std::net::Ipv4Addr;

use crate::checksum;
use crate::error::{Error, Result};
use crate::ip::IpProtocol;

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Version (high nibble) and IHL (low nibble, in 32-bit words).
    pub const VER_IHL: usize = 0;
    /// DSCP (6 bits) and ECN (2 bits).
    pub const DSCP_ECN: usize = 1;
    /// Total length: header plus payload.
    pub const LENGTH: Range<usize> = 2..4;
    /// Identification.
    pub const IDENT: Range<usize> = 4..6;
    /// Flags (3 bits) and fragment offset (13 bits, in 8-byte units).
    pub const FLG_OFF: Range<usize> = 6..8;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol of the payload.
    pub const PROTOCOL: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: Range<usize> = 10..12;
    /// Source address.
    pub const SRC_ADDR: Range<usize> = 12..16;
    /// Destination address.
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;

/// A view of an IPv4 packet in a buffer.
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

    /// Wraps `buffer` after [`Packet::check_len`]: no accessor panics.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks version 4, `20 <= header length <= total length <= buffer`.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let d = self.buffer.as_ref();
        if d.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::Malformed);
        }
        let hl = self.header_len();
        let tl = usize::from(self.total_len());
        if hl < HEADER_LEN || tl < hl {
            return Err(Error::Malformed);
        }
        if d.len() < hl || d.len() < tl {
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

    /// IP version (4).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4), options included.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// DSCP.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// ECN.
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x03
    }

    /// The whole second byte (DSCP and ECN): what encapsulation copies to
    /// the outer header.
    #[inline]
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// Total length: header plus payload.
    #[inline]
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// Don't fragment.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// More fragments.
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & 0x1fff) << 3
    }

    /// Whether this is a fragment (MF set or a non-zero offset).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.u16_at(field::FLG_OFF) & 0x3fff != 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload.
    #[inline]
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// Header checksum as on the wire.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::SRC_ADDR];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::DST_ADDR];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    /// Whether the header checksum verifies (options included).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::verifies(&self.buffer.as_ref()[..self.header_len()])
    }

    /// The options bytes (empty without options).
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// The header and the first 8 bytes of the payload (or all of it if
    /// shorter): what an ICMP error quotes (RFC 792).
    #[inline]
    pub fn icmp_quote(&self) -> &[u8] {
        let end = (self.header_len() + 8).min(usize::from(self.total_len()));
        &self.buffer.as_ref()[..end]
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload: from the end of the options to the total length.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let hl = self.header_len();
        let tl = usize::from(self.total_len());
        &self.buffer.as_ref()[hl..tl]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length in bytes (a multiple of 4).
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((len / 4) as u8 & 0x0f);
    }

    /// Sets DSCP and ECN as one byte.
    #[inline]
    pub fn set_tos(&mut self, tos: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = tos;
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, len: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, ident: u16) {
        self.buffer.as_mut()[field::IDENT].copy_from_slice(&ident.to_be_bytes());
    }

    /// Sets flags and fragment offset: DF, MF, offset in bytes.
    #[inline]
    pub fn set_flags_and_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let v = if dont_frag { FLAG_DF } else { 0 }
            | if more_frags { FLAG_MF } else { 0 }
            | ((offset >> 3) & 0x1fff);
        self.buffer.as_mut()[field::FLG_OFF].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the TTL without touching the checksum.
    #[inline]
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, p: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = u8::from(p);
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, c: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }

    /// Computes the header checksum (options included) and writes it.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(c);
    }

    /// Decrements the TTL by one and updates the checksum incrementally
    /// (RFC 1624), returning the new TTL. A TTL of 0 is left alone (and 0
    /// returned): the caller checks `ttl() <= 1` first and answers with ICMP
    /// time exceeded instead of forwarding.
    #[inline]
    pub fn decrement_ttl(&mut self) -> u8 {
        let d = self.buffer.as_mut();
        let ttl = d[field::TTL];
        if ttl == 0 {
            return 0;
        }
        d[field::TTL] = ttl - 1;
        // RFC 1624 with m' = m - 0x0100: HC' = HC + 0x0100 in one's
        // complement (Linux's `ip_decrease_ttl`). A result of 0xffff
        // becomes 0x0000, which is what a full recomputation gives for a
        // non-zero header, so the two always agree bit for bit (a property
        // test checks it).
        let c = u32::from(u16::from_be_bytes([
            d[field::CHECKSUM.start],
            d[field::CHECKSUM.start + 1],
        ])) + 0x0100;
        let c = (c + u32::from(c >= 0xffff)) as u16;
        d[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        ttl - 1
    }

    /// The payload, writable (from the end of the options to the total
    /// length).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let tl = usize::from(self.total_len());
        &mut self.buffer.as_mut()[hl..tl]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// An IPv4 header without options, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: IpProtocol,
    /// Payload length in bytes (total length minus header length).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP and ECN as one byte.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// More fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes (a multiple of 8).
    pub frag_offset: u16,
}

impl Ipv4Repr {
    /// Parses a header, verifying the checksum. Options are skipped, not
    /// kept: `payload_len` is measured after them.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Ipv4Repr> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(Error::Checksum);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            ttl: packet.ttl(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
            more_frags: packet.more_frags(),
            frag_offset: packet.frag_offset(),
        })
    }

    /// Length of the header this emits (20: no options).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header with its checksum into the start of the
    /// buffer. The payload is not touched: encapsulation writes the header
    /// in front of a payload that is already in place.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        if packet.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::BufferTooSmall);
        }
        let total = HEADER_LEN + self.payload_len;
        let total = u16::try_from(total).map_err(|_| Error::BufferTooSmall)?;
        packet.set_header_len(HEADER_LEN);
        packet.set_tos(self.tos);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_flags_and_offset(self.dont_frag, self.more_frags, self.frag_offset);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 packet of the echo request Linux sent in
    /// `tests/vectors/arp_icmp_echo.hex` (84 bytes, DF, TTL 64).
    const ECHO_REQUEST_HEX: &str = "45000054371e40004001b93ac0a86401c0a864fe\
        080089916ca6000159930c6b00000000d4f5080000000000101112131415161718191a1b1c1d1e1f\
        202122232425262728292a2b2c2d2e2f3031323334353637";

    /// An echo request with a 40-byte record-route option (IHL 15), from
    /// `tests/vectors/ipv4_options.hex`.
    const OPTIONS_HEX: &str = "4f00007c38d64000400160a1c0a86401c0a864fe\
        01072708c0a864010000000000000000000000000000000000000000000000000000000000000000\
        080045786f49000167930c6b000000000b6c050000000000101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637";

    fn bytes(h: &str) -> Vec<u8> {
        hex::decode(h).unwrap()
    }

    fn echo_repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(192, 168, 100, 1),
            dst_addr: Ipv4Addr::new(192, 168, 100, 254),
            protocol: IpProtocol::Icmp,
            payload_len: 64,
            ttl: 64,
            tos: 0,
            ident: 0x371e,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
        }
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes(ECHO_REQUEST_HEX);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp(), 0);
        assert_eq!(p.ecn(), 0);
        assert_eq!(p.total_len(), 84);
        assert_eq!(p.ident(), 0x371e);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.frag_offset(), 0);
        assert!(!p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), IpProtocol::Icmp);
        assert_eq!(p.checksum(), 0xb93a);
        assert_eq!(p.src_addr(), Ipv4Addr::new(192, 168, 100, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(192, 168, 100, 254));
        assert!(p.verify_checksum());
        assert_eq!(p.options(), &[] as &[u8]);
        assert_eq!(p.payload(), &b[20..]);
        assert_eq!(p.icmp_quote(), &b[..28]);
    }

    #[test]
    fn test_construct() {
        let b = bytes(ECHO_REQUEST_HEX);
        let mut out = vec![0xa5; 84];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_header_len(20);
        p.set_tos(0);
        p.set_total_len(84);
        p.set_ident(0x371e);
        p.set_flags_and_offset(true, false, 0);
        p.set_ttl(64);
        p.set_protocol(IpProtocol::Icmp);
        p.set_src_addr(Ipv4Addr::new(192, 168, 100, 1));
        p.set_dst_addr(Ipv4Addr::new(192, 168, 100, 254));
        p.payload_mut().copy_from_slice(&b[20..]);
        p.fill_checksum();
        assert_eq!(out, b);
    }

    #[test]
    fn test_parse() {
        let b = bytes(ECHO_REQUEST_HEX);
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Ok(echo_repr())
        );
    }

    #[test]
    fn test_emit() {
        let b = bytes(ECHO_REQUEST_HEX);
        let mut out = vec![0xa5; 84];
        out[20..].copy_from_slice(&b[20..]);
        echo_repr()
            .emit(&mut Packet::new_unchecked(&mut out))
            .unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn options_are_skipped_by_the_header_length() {
        let b = bytes(OPTIONS_HEX);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 60);
        assert_eq!(p.options().len(), 40);
        assert_eq!(p.options()[0], 0x01); // NOP, then record route (7)
        assert_eq!(p.options()[1], 0x07);
        assert_eq!(p.payload()[0], 0x08); // ICMP echo request
        assert_eq!(p.payload().len(), 124 - 60);
        assert!(p.verify_checksum());
        assert_eq!(p.icmp_quote().len(), 68);
        let repr = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(repr.payload_len, 64);
    }

    #[test]
    fn decrement_ttl_keeps_the_checksum_valid_with_and_without_options() {
        for h in [ECHO_REQUEST_HEX, OPTIONS_HEX] {
            let mut b = bytes(h);
            let mut p = Packet::new_checked(&mut b[..]).unwrap();
            for expected in (0..64u8).rev() {
                assert_eq!(p.decrement_ttl(), expected);
                assert!(p.verify_checksum(), "ttl {expected}");
            }
            assert_eq!(p.decrement_ttl(), 0);
            assert!(p.verify_checksum());
        }
    }

    #[test]
    fn padding_after_the_total_length_is_not_payload() {
        let mut b = bytes(ECHO_REQUEST_HEX);
        b.extend_from_slice(&[0u8; 6]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload().len(), 64);
    }

    #[test]
    fn truncated_or_malformed_headers_are_errors() {
        let b = bytes(OPTIONS_HEX);
        for n in 0..b.len() {
            assert_eq!(Packet::new_checked(&b[..n]), Err(Error::Truncated), "{n}");
        }
        let mut v6 = bytes(ECHO_REQUEST_HEX);
        v6[0] = 0x65;
        assert_eq!(Packet::new_checked(&v6[..]), Err(Error::Malformed));
        let mut short_ihl = bytes(ECHO_REQUEST_HEX);
        short_ihl[0] = 0x44;
        assert_eq!(Packet::new_checked(&short_ihl[..]), Err(Error::Malformed));
        let mut short_total = bytes(ECHO_REQUEST_HEX);
        short_total[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert_eq!(Packet::new_checked(&short_total[..]), Err(Error::Malformed));
        let mut bad_sum = bytes(ECHO_REQUEST_HEX);
        bad_sum[10] ^= 1;
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&bad_sum[..])),
            Err(Error::Checksum)
        );
    }

    /// Every checksum value a header can have (the identification sweeps
    /// all 65536 values): the incremental TTL update equals a full
    /// recomputation, including the 0x0000 / 0xffff edge.
    #[test]
    fn decrement_ttl_equals_full_recomputation_for_every_checksum() {
        let mut b = bytes(ECHO_REQUEST_HEX);
        for ident in 0..=u16::MAX {
            let mut p = Packet::new_unchecked(&mut b[..20]);
            p.set_ttl(64);
            p.set_ident(ident);
            p.fill_checksum();
            p.decrement_ttl();
            let incremental = p.checksum();
            p.fill_checksum();
            assert_eq!(incremental, p.checksum(), "ident {ident:#x}");
        }
    }
}
