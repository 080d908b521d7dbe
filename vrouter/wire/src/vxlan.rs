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
