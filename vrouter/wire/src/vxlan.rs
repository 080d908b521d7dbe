//! VXLAN headers (RFC 7348): 8 bytes after UDP port 4789, then an Ethernet
//! frame.
//!
//! ```text
//! |R|R|R|R|I|R|R|R|   reserved (24)   |   VNI (24)   | reserved (8) |
//! ```
//!
//! The I flag (0x08) must be set for the VNI to be valid; receivers ignore
//! the reserved bits (RFC 7348 §5), so [`Packet::check_len`] does not look
//! at them, and [`VxlanRepr::parse`] only requires I.
//!
//! etherparse has no VXLAN type; this is the only implementation.

use crate::error::{Error, Result};

/// The IANA port for VXLAN.
pub const VXLAN_PORT: u16 = 4789;

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Flags (I = 0x08).
    pub const FLAGS: usize = 0;
    /// Reserved.
    pub const RESERVED1: Range<usize> = 1..4;
    /// The 24-bit VXLAN network identifier.
    pub const VNI: Range<usize> = 4..7;
    /// Reserved.
    pub const RESERVED2: usize = 7;
}

/// Length of the VXLAN header.
pub const HEADER_LEN: usize = 8;

/// The I flag: the VNI is valid.
pub const FLAG_I: u8 = 0x08;

/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// A view of a VXLAN header and the frame behind it.
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

    /// The flags byte.
    #[inline]
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// Whether the I flag is set (the VNI is valid).
    #[inline]
    pub fn has_vni(&self) -> bool {
        self.flags() & FLAG_I != 0
    }

    /// The 24-bit VNI.
    #[inline]
    pub fn vni(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::VNI];
        u32::from_be_bytes([0, d[0], d[1], d[2]])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The inner Ethernet frame.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the flags byte.
    #[inline]
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[field::FLAGS] = flags;
    }

    /// Sets the VNI (the low 24 bits of `vni`).
    #[inline]
    pub fn set_vni(&mut self, vni: u32) {
        let b = vni.to_be_bytes();
        self.buffer.as_mut()[field::VNI].copy_from_slice(&b[1..]);
    }

    /// Zeroes both reserved fields.
    #[inline]
    pub fn clear_reserved(&mut self) {
        let d = self.buffer.as_mut();
        d[field::RESERVED1].fill(0);
        d[field::RESERVED2] = 0;
    }

    /// The inner frame, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A VXLAN header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VxlanRepr {
    /// The 24-bit VXLAN network identifier.
    pub vni: u32,
}

impl VxlanRepr {
    /// Parses a header; without the I flag it is [`Error::Malformed`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<VxlanRepr> {
        packet.check_len()?;
        if !packet.has_vni() {
            return Err(Error::Malformed);
        }
        Ok(VxlanRepr { vni: packet.vni() })
    }

    /// Length of the header this emits (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes flags I, the VNI and zero reserved fields. A VNI wider than
    /// 24 bits is [`Error::Malformed`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        if self.vni > MAX_VNI {
            return Err(Error::Malformed);
        }
        if packet.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::BufferTooSmall);
        }
        packet.set_flags(FLAG_I);
        packet.clear_reserved();
        packet.set_vni(self.vni);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VXLAN header with VNI 4096 and the first bytes of its inner frame,
    /// as Linux sent it (`tests/vectors/vxlan_arp_icmp_echo.hex`).
    static PACKET_BYTES: [u8; 12] = [
        0x08, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, // I, VNI 4096
        0xff, 0xff, 0xff, 0xff,
    ];

    #[test]
    fn test_deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.flags(), 0x08);
        assert!(p.has_vni());
        assert_eq!(p.vni(), 4096);
        assert_eq!(p.payload(), &[0xff; 4]);
    }

    #[test]
    fn test_construct() {
        let mut out = vec![0xa5; 12];
        let mut p = Packet::new_unchecked(&mut out);
        p.set_flags(FLAG_I);
        p.clear_reserved();
        p.set_vni(4096);
        p.payload_mut().fill(0xff);
        assert_eq!(&out[..], &PACKET_BYTES[..]);
    }

    #[test]
    fn test_parse() {
        let repr = VxlanRepr::parse(&Packet::new_unchecked(&PACKET_BYTES[..])).unwrap();
        assert_eq!(repr, VxlanRepr { vni: 4096 });
        let mut no_i = PACKET_BYTES;
        no_i[0] = 0;
        assert_eq!(
            VxlanRepr::parse(&Packet::new_unchecked(&no_i[..])),
            Err(Error::Malformed)
        );
        // Reserved bits are ignored on receive (RFC 7348 §5).
        let mut reserved = PACKET_BYTES;
        reserved[0] |= 0x80;
        reserved[7] = 0x55;
        assert_eq!(
            VxlanRepr::parse(&Packet::new_unchecked(&reserved[..])),
            Ok(VxlanRepr { vni: 4096 })
        );
    }

    #[test]
    fn test_emit() {
        let mut out = vec![0xa5; 12];
        out[8..].fill(0xff);
        VxlanRepr { vni: 4096 }
            .emit(&mut Packet::new_unchecked(&mut out))
            .unwrap();
        assert_eq!(&out[..], &PACKET_BYTES[..]);
        assert_eq!(
            VxlanRepr { vni: 0x0100_0000 }.emit(&mut Packet::new_unchecked(&mut out)),
            Err(Error::Malformed)
        );
        VxlanRepr { vni: MAX_VNI }
            .emit(&mut Packet::new_unchecked(&mut out))
            .unwrap();
        assert_eq!(&out[..8], &[0x08, 0, 0, 0, 0xff, 0xff, 0xff, 0]);
    }

    #[test]
    fn truncated_at_every_length_is_an_error() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Packet::new_checked(&PACKET_BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }
}
