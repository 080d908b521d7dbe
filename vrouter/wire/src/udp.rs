//! UDP (RFC 768) over IPv4.
//!
//! A checksum of zero means "not computed" over IPv4. Linux sends VXLAN with
//! a zero outer UDP checksum unless the device has `udpcsum`; the emitter
//! takes the choice as [`UdpChecksum`].

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
