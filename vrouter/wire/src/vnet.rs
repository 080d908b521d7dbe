//! The virtio-net header (`virtio_net_hdr_v1`) in front of every frame a
//! TAP device with `IFF_VNET_HDR` hands over or takes: 12 bytes,
//! little-endian (the TAP is set to `TUNSETVNETLE`).
//!
//! It says whether the frame's transport checksum is still to be completed
//! (`NEEDS_CSUM` with `csum_start`/`csum_offset`: the field holds the
//! pseudo-header sum, the sender sums from `csum_start` to the end) and
//! whether the frame is a super-packet to be cut into `gso_size` pieces
//! (`gso_type`). [`crate::gso`] cuts super-packets, [`crate::gro`] makes
//! them; [`complete_checksum`] finishes a frame that is not segmented.

use core::ops::Range;

use crate::checksum;
use crate::error::{Error, Result};
use crate::macros::enum_with_unknown;

/// Bytes of the header: flags, gso_type, hdr_len, gso_size, csum_start,
/// csum_offset, num_buffers.
pub const HEADER_LEN: usize = 12;

/// Byte ranges of the header's fields.
pub mod field {
    use super::Range;
    /// Flags ([`super::NEEDS_CSUM`], [`super::DATA_VALID`]).
    pub const FLAGS: usize = 0;
    /// GSO type, with [`super::GSO_ECN`] or'ed in.
    pub const GSO_TYPE: usize = 1;
    /// Length of the headers (a hint; Linux writes the linear length).
    pub const HDR_LEN: Range<usize> = 2..4;
    /// Payload bytes per segment.
    pub const GSO_SIZE: Range<usize> = 4..6;
    /// Where the checksummed region starts, from the frame's start.
    pub const CSUM_START: Range<usize> = 6..8;
    /// Where the checksum field is, from `csum_start`.
    pub const CSUM_OFFSET: Range<usize> = 8..10;
    /// Number of merged receive buffers (0 for a TAP).
    pub const NUM_BUFFERS: Range<usize> = 10..12;
}

/// Flag: the transport checksum is partial and must be completed.
pub const NEEDS_CSUM: u8 = 1;
/// Flag: the checksums were verified by whoever wrote the frame.
pub const DATA_VALID: u8 = 2;
/// Bit or'ed into the GSO type: the flow uses ECN (CWR may be set).
pub const GSO_ECN: u8 = 0x80;

enum_with_unknown! {
    /// What kind of super-packet the frame is (`VIRTIO_NET_HDR_GSO_*`).
    pub enum GsoType(u8) {
        /// A plain frame.
        None = 0,
        /// TCP over IPv4, cut at `gso_size` payload bytes.
        TcpV4 = 1,
        /// UDP fragmented at the IP layer (UFO; not produced by Brindle).
        Ufo = 3,
        /// TCP over IPv6.
        TcpV6 = 4,
        /// UDP over IPv4 or IPv6 cut into datagrams (USO).
        UdpL4 = 5,
    }
}

/// The header as values; [`VnetHdr::PLAIN`] is a frame with nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VnetHdr {
    /// [`NEEDS_CSUM`] and/or [`DATA_VALID`].
    pub flags: u8,
    /// The super-packet kind.
    pub gso_type: GsoType,
    /// The ECN bit of the GSO type.
    pub ecn: bool,
    /// Header length hint.
    pub hdr_len: u16,
    /// Payload bytes per segment (0 for a plain frame).
    pub gso_size: u16,
    /// Start of the checksummed region.
    pub csum_start: u16,
    /// Offset of the checksum field from `csum_start`.
    pub csum_offset: u16,
    /// Merged receive buffers (0).
    pub num_buffers: u16,
}

fn le16(b: &[u8], r: Range<usize>) -> u16 {
    u16::from_le_bytes([b[r.start], b[r.start + 1]])
}

impl VnetHdr {
    /// A plain frame with nothing left to do.
    pub const PLAIN: VnetHdr = VnetHdr {
        flags: 0,
        gso_type: GsoType::None,
        ecn: false,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
        num_buffers: 0,
    };

    /// Reads the header from the first [`HEADER_LEN`] bytes.
    pub fn parse(bytes: &[u8]) -> Result<VnetHdr> {
        if bytes.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let t = bytes[field::GSO_TYPE];
        Ok(VnetHdr {
            flags: bytes[field::FLAGS],
            gso_type: GsoType::from(t & !GSO_ECN),
            ecn: t & GSO_ECN != 0,
            hdr_len: le16(bytes, field::HDR_LEN),
            gso_size: le16(bytes, field::GSO_SIZE),
            csum_start: le16(bytes, field::CSUM_START),
            csum_offset: le16(bytes, field::CSUM_OFFSET),
            num_buffers: le16(bytes, field::NUM_BUFFERS),
        })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<()> {
        let out = out.get_mut(..HEADER_LEN).ok_or(Error::BufferTooSmall)?;
        out[field::FLAGS] = self.flags;
        out[field::GSO_TYPE] = u8::from(self.gso_type) | if self.ecn { GSO_ECN } else { 0 };
        out[field::HDR_LEN].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[field::GSO_SIZE].copy_from_slice(&self.gso_size.to_le_bytes());
        out[field::CSUM_START].copy_from_slice(&self.csum_start.to_le_bytes());
        out[field::CSUM_OFFSET].copy_from_slice(&self.csum_offset.to_le_bytes());
        out[field::NUM_BUFFERS].copy_from_slice(&self.num_buffers.to_le_bytes());
        Ok(())
    }

    /// Whether the transport checksum is still to be completed.
    pub fn needs_csum(&self) -> bool {
        self.flags & NEEDS_CSUM != 0
    }

    /// Whether the frame is a super-packet.
    pub fn is_gso(&self) -> bool {
        self.gso_type != GsoType::None
    }
}

/// Completes the checksum of a plain frame with `NEEDS_CSUM`, as a NIC
/// would: sums `frame[csum_start..]` (whose checksum field holds the
/// pseudo-header sum) and writes the result at `csum_start + csum_offset`.
/// A frame without `NEEDS_CSUM` is left as it is. A UDP checksum that
/// comes out 0 is written as `0xffff` (RFC 768).
pub fn complete_checksum(hdr: &VnetHdr, frame: &mut [u8]) -> Result<()> {
    if !hdr.needs_csum() {
        return Ok(());
    }
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > frame.len() || at < start {
        return Err(Error::Malformed);
    }
    let mut sum = checksum::result(checksum::data(&frame[start..]));
    // UDP's checksum field is at offset 6; 0 means "no checksum" there.
    if hdr.csum_offset == 6 && sum == 0 {
        sum = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 12] = [
        0x01, 0x81, 0x42, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0, 0,
    ];

    #[test]
    fn test_parse() {
        let h = VnetHdr::parse(&BYTES).unwrap();
        assert_eq!(
            h,
            VnetHdr {
                flags: NEEDS_CSUM,
                gso_type: GsoType::TcpV4,
                ecn: true,
                hdr_len: 66,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16,
                num_buffers: 0,
            }
        );
        assert!(h.needs_csum() && h.is_gso());
        assert_eq!(VnetHdr::parse(&BYTES[..11]), Err(Error::Truncated));
    }

    #[test]
    fn test_emit() {
        let h = VnetHdr::parse(&BYTES).unwrap();
        let mut out = vec![0xa5; 13];
        h.emit(&mut out).unwrap();
        assert_eq!(&out[..12], &BYTES);
        assert_eq!(out[12], 0xa5);
        assert_eq!(h.emit(&mut [0; 11]), Err(Error::BufferTooSmall));
    }

    #[test]
    fn unknown_gso_types_are_kept() {
        let mut b = BYTES;
        b[1] = 0x09;
        let h = VnetHdr::parse(&b).unwrap();
        assert_eq!(h.gso_type, GsoType::Unknown(9));
        let mut out = [0; 12];
        h.emit(&mut out).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn complete_checksum_writes_what_a_full_sum_gives_and_rejects_bad_offsets() {
        // Some bytes; the "field" at 4..6 starts as a partial sum 0x1234.
        let mut frame = vec![9, 8, 7, 6, 0x12, 0x34, 1, 2, 3, 4, 5];
        let hdr = VnetHdr {
            flags: NEEDS_CSUM,
            csum_start: 2,
            csum_offset: 2,
            ..VnetHdr::PLAIN
        };
        complete_checksum(&hdr, &mut frame).unwrap();
        // The region plus the extra pseudo-sum 0x1234 verifies.
        let sum = checksum::combine(&[checksum::data(&frame[2..]), 0x1234]);
        assert_eq!(sum, 0xffff);
        let bad = VnetHdr {
            csum_offset: 9,
            ..hdr
        };
        assert_eq!(complete_checksum(&bad, &mut frame), Err(Error::Malformed));
        // Without NEEDS_CSUM nothing changes.
        let before = frame.clone();
        complete_checksum(&VnetHdr::PLAIN, &mut frame).unwrap();
        assert_eq!(frame, before);
    }
}
