//! UDP (RFC 768) over IPv4.
//!
//! A checksum of zero means "not computed" over IPv4. Linux sends VXLAN with
//! a zero outer UDP checksum unless the device has `udpcsum`; the emitter
//! takes the choice as [`UdpChecksum`].
//!
//! Hand-written rather than etherparse's `UdpSlice`: the VXLAN outer UDP
//! header is written in place in front of a payload that is already there.

use std::net::Ipv4Addr;

use crate::checksum;
use crate::error::{Error, Result};
use crate::ip::IpProtocol;

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Source port.
    pub const SRC_PORT: Range<usize> = 0..2;
    /// Destination port.
    pub const DST_PORT: Range<usize> = 2..4;
    /// Length of header plus payload.
    pub const LENGTH: Range<usize> = 4..6;
    /// Checksum (0: none).
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

/// Whether an emitter computes the UDP checksum or leaves it zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UdpChecksum {
    /// Leave the checksum 0 ("not computed"), as Linux does for VXLAN by
    /// default (`noudpcsum`): the inner frame has its own checksums and the
    /// outer one costs a pass over every byte.
    #[default]
    Zero,
    /// Compute it over the pseudo-header, header and payload.
    Compute,
}

/// A view of a UDP datagram in a buffer.
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

    /// Checks `8 <= length field <= buffer`.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let d = self.buffer.as_ref();
        if d.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = usize::from(self.len());
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if d.len() < len {
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

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Length of header plus payload.
    #[inline]
    pub fn len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Whether the length field says there is no payload.
    #[inline]
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// Checksum as on the wire.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Whether the checksum verifies; a zero checksum (not computed)
    /// always does.
    #[inline]
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let len = self.len();
        let d = &self.buffer.as_ref()[..usize::from(len)];
        checksum::combine(&[
            checksum::pseudo_header_v4(src, dst, IpProtocol::Udp, len),
            checksum::data(d),
        ]) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, up to the length field.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let len = usize::from(self.len());
        &self.buffer.as_ref()[HEADER_LEN..len]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::DST_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the length field.
    #[inline]
    pub fn set_len(&mut self, len: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, c: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }

    /// Computes the checksum over pseudo-header, header and payload (up to
    /// the length field, which must already be set and within the buffer)
    /// and writes it; a computed 0 is sent as 0xffff (RFC 768).
    #[inline]
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let len = self.len();
        let d = &self.buffer.as_ref()[..usize::from(len)];
        let c = checksum::result(checksum::combine(&[
            checksum::pseudo_header_v4(src, dst, IpProtocol::Udp, len),
            checksum::data(d),
        ]));
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }

    /// The payload, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..len]
    }
}

/// A UDP header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length (the length field minus 8).
    pub payload_len: usize,
}

impl UdpRepr {
    /// Parses a header; a non-zero checksum must verify against the
    /// pseudo-header of `src`/`dst`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<UdpRepr> {
        packet.check_len()?;
        if !packet.verify_checksum(src, dst) {
            return Err(Error::Checksum);
        }
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: usize::from(packet.len()) - HEADER_LEN,
        })
    }

    /// Length of the header this emits (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the start of the buffer, in front of a
    /// payload of `payload_len` bytes already in place. With
    /// [`UdpChecksum::Compute`] the buffer must hold the payload too.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        csum: UdpChecksum,
    ) -> Result<()> {
        let total = HEADER_LEN + self.payload_len;
        let len = u16::try_from(total).map_err(|_| Error::BufferTooSmall)?;
        let have = packet.buffer.as_ref().len();
        if have < HEADER_LEN || (csum == UdpChecksum::Compute && have < total) {
            return Err(Error::BufferTooSmall);
        }
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        match csum {
            UdpChecksum::Zero => packet.set_checksum(0),
            UdpChecksum::Compute => packet.fill_checksum(src, dst),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outer UDP datagram of a VXLAN frame Linux sent with its default
    /// `udpcsum` (`tests/vectors/vxlan_default_csum_icmp_echo.hex`): port
    /// 52417 → 8472, 58 bytes, checksum 0x7224 over 192.168.100.1 →
    /// 192.168.100.254, payload a VXLAN header and an ARP request.
    const DATAGRAM_HEX: &str = "ccc12118003a7224\
        0800000000100100ffffffffffff020000000e1108060001080006040001020000000e110af50001\
        0000000000000af50002";

    const SRC: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 254);

    fn bytes() -> Vec<u8> {
        hex::decode(DATAGRAM_HEX).unwrap()
    }

    fn repr() -> UdpRepr {
        UdpRepr {
            src_port: 52417,
            dst_port: 8472,
            payload_len: 50,
        }
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.src_port(), 52417);
        assert_eq!(p.dst_port(), 8472);
        assert_eq!(p.len(), 58);
        assert!(!p.is_empty());
        assert_eq!(p.checksum(), 0x7224);
        assert!(p.verify_checksum(SRC, DST));
        assert!(!p.verify_checksum(DST, Ipv4Addr::new(192, 168, 100, 2)));
        assert_eq!(p.payload(), &b[8..]);
    }

    #[test]
    fn test_construct() {
        let b = bytes();
        let mut out = vec![0xa5; b.len()];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_src_port(52417);
        p.set_dst_port(8472);
        p.set_len(58);
        p.payload_mut().copy_from_slice(&b[8..]);
        p.fill_checksum(SRC, DST);
        assert_eq!(out, b);
    }

    #[test]
    fn test_parse() {
        let b = bytes();
        assert_eq!(
            UdpRepr::parse(&Packet::new_unchecked(&b[..]), SRC, DST),
            Ok(repr())
        );
        let mut bad = b.clone();
        bad[20] ^= 0x40;
        assert_eq!(
            UdpRepr::parse(&Packet::new_unchecked(&bad[..]), SRC, DST),
            Err(Error::Checksum)
        );
    }

    #[test]
    fn test_emit() {
        let b = bytes();
        let mut out = vec![0xa5; b.len()];
        out[8..].copy_from_slice(&b[8..]);
        repr()
            .emit(
                &mut Packet::new_unchecked(&mut out),
                SRC,
                DST,
                UdpChecksum::Compute,
            )
            .unwrap();
        assert_eq!(out, b);
        repr()
            .emit(
                &mut Packet::new_unchecked(&mut out),
                SRC,
                DST,
                UdpChecksum::Zero,
            )
            .unwrap();
        assert_eq!(&out[6..8], &[0, 0]);
        assert!(
            Packet::new_checked(&out[..])
                .unwrap()
                .verify_checksum(DST, SRC)
        );
        // With Zero only the header has to fit.
        let mut header_only = vec![0xa5; 8];
        repr()
            .emit(
                &mut Packet::new_unchecked(&mut header_only),
                SRC,
                DST,
                UdpChecksum::Zero,
            )
            .unwrap();
        assert_eq!(header_only, hex::decode("ccc12118003a0000").unwrap());
        assert_eq!(
            repr().emit(
                &mut Packet::new_unchecked(&mut header_only),
                SRC,
                DST,
                UdpChecksum::Compute
            ),
            Err(Error::BufferTooSmall)
        );
    }

    #[test]
    fn truncated_or_short_length_is_an_error() {
        let b = bytes();
        for n in 0..b.len() {
            assert_eq!(Packet::new_checked(&b[..n]), Err(Error::Truncated), "{n}");
        }
        let mut short = b.clone();
        short[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(Packet::new_checked(&short[..]), Err(Error::Malformed));
    }

    #[test]
    fn a_computed_zero_checksum_is_sent_as_ffff() {
        // Find a source port whose checksum computes to zero: the field is
        // then 0xffff, because 0 would mean "no checksum".
        let mut b = vec![0u8; 8];
        let mut p = Packet::new_unchecked(&mut b);
        p.set_dst_port(0);
        p.set_len(8);
        let zero = Ipv4Addr::UNSPECIFIED;
        // sum = src_port + 17 + 8 + 8 (pseudo length and UDP length);
        // !sum == 0 when sum == 0xffff.
        p.set_src_port(0xffff - 33);
        p.fill_checksum(zero, zero);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum(zero, zero));
    }
}
