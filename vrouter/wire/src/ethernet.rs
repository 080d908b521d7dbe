//! Ethernet II frames with an optional 802.1Q (or 802.1ad) tag.
//!
//! The view reads the tag if there is one, so [`Frame::ethertype`] is always
//! the ethertype of the payload and [`Frame::payload`] always starts at the
//! L3 header, tagged or not. One tag is understood; a second (QinQ) tag shows
//! up as ethertype 0x8100 in the payload, which the pipeline drops as unknown.
//!
//! Hand-written rather than etherparse's `Ethernet2Slice`: forwarding rewrites
//! both MACs in place in the UMEM frame, which a read-only slice cannot do.

use core::fmt;

use crate::error::{Error, Result};
use crate::macros::enum_with_unknown;

enum_with_unknown! {
    /// An Ethernet II ethertype (or 802.1Q TPID).
    pub enum EtherType(u16) {
        /// IPv4 (0x0800).
        Ipv4 = 0x0800,
        /// ARP (0x0806).
        Arp = 0x0806,
        /// An 802.1Q VLAN tag follows (0x8100).
        Vlan = 0x8100,
        /// An 802.1ad service tag follows (0x88a8).
        QinQ = 0x88a8,
        /// IPv6 (0x86dd).
        Ipv6 = 0x86dd,
    }
}

/// A 48-bit Ethernet (MAC) address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00 (the unknown target of an ARP request).
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The address in the first 6 bytes of `bytes`.
    ///
    /// # Panics
    /// If `bytes` is shorter than 6; views only call it on checked ranges.
    #[inline]
    pub fn from_bytes(bytes: &[u8]) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&bytes[..6]);
        MacAddr(a)
    }

    /// The six octets.
    #[inline]
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// Whether this is ff:ff:ff:ff:ff:ff.
    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the group bit is set (broadcast included).
    #[inline]
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this is a unicast address (group bit clear).
    #[inline]
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(a: [u8; 6]) -> Self {
        MacAddr(a)
    }
}

/// An 802.1Q tag control information: priority, drop eligible, VLAN ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Which TPID the tag had: [`EtherType::Vlan`] or [`EtherType::QinQ`].
    pub tpid: TagProtocol,
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// The two TPIDs a tag can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TagProtocol {
    /// 802.1Q, 0x8100.
    #[default]
    Dot1Q,
    /// 802.1ad, 0x88a8.
    Dot1Ad,
}

impl TagProtocol {
    fn ethertype(self) -> EtherType {
        match self {
            TagProtocol::Dot1Q => EtherType::Vlan,
            TagProtocol::Dot1Ad => EtherType::QinQ,
        }
    }
}

impl VlanTag {
    /// An 802.1Q tag with VLAN ID `vid`, priority 0.
    pub fn new(vid: u16) -> VlanTag {
        VlanTag {
            tpid: TagProtocol::Dot1Q,
            pcp: 0,
            dei: false,
            vid: vid & 0x0fff,
        }
    }

    fn tci(&self) -> u16 {
        (u16::from(self.pcp & 0x7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }
}

/// Byte ranges of the header fields.
pub mod field {
    use core::ops::Range;

    /// Destination MAC.
    pub const DESTINATION: Range<usize> = 0..6;
    /// Source MAC.
    pub const SOURCE: Range<usize> = 6..12;
    /// Ethertype, or the TPID of a tag.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// Tag control information of a tagged frame.
    pub const TCI: Range<usize> = 14..16;
    /// Ethertype of the payload of a tagged frame.
    pub const INNER_ETHERTYPE: Range<usize> = 16..18;
    /// Start of the payload of an untagged frame.
    pub const PAYLOAD: usize = 14;
    /// Start of the payload of a tagged frame.
    pub const TAGGED_PAYLOAD: usize = 18;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = field::PAYLOAD;
/// Length of an 802.1Q-tagged Ethernet header.
pub const TAGGED_HEADER_LEN: usize = field::TAGGED_PAYLOAD;

/// A view of an Ethernet II frame in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` without checking it: accessors may panic if it is too
    /// short. Use for buffers you are about to emit into.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps `buffer` after [`Frame::check_len`]: accessors never panic.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that the buffer holds the whole header, the tag included.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || (self.is_tagged() && len < TAGGED_HEADER_LEN) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Whether the frame carries an 802.1Q or 802.1ad tag.
    #[inline]
    pub fn is_tagged(&self) -> bool {
        let data = self.buffer.as_ref();
        matches!(
            data.get(field::ETHERTYPE),
            Some([0x81, 0x00]) | Some([0x88, 0xa8])
        )
    }

    /// Length of the header: 14, or 18 with a tag.
    #[inline]
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Destination MAC.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::DESTINATION])
    }

    /// Source MAC.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SOURCE])
    }

    /// The ethertype at offset 12, the TPID if the frame is tagged.
    #[inline]
    pub fn outer_ethertype(&self) -> EtherType {
        let d = &self.buffer.as_ref()[field::ETHERTYPE];
        EtherType::from(u16::from_be_bytes([d[0], d[1]]))
    }

    /// The ethertype of the payload, behind the tag if there is one.
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        let d = self.buffer.as_ref();
        let r = if self.is_tagged() {
            field::INNER_ETHERTYPE
        } else {
            field::ETHERTYPE
        };
        EtherType::from(u16::from_be_bytes([d[r.start], d[r.start + 1]]))
    }

    /// The tag, if the frame has one.
    #[inline]
    pub fn vlan(&self) -> Option<VlanTag> {
        if !self.is_tagged() {
            return None;
        }
        let d = self.buffer.as_ref();
        let tci = u16::from_be_bytes([d[field::TCI.start], d[field::TCI.start + 1]]);
        let tpid = if self.outer_ethertype() == EtherType::QinQ {
            TagProtocol::Dot1Ad
        } else {
            TagProtocol::Dot1Q
        };
        Some(VlanTag {
            tpid,
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        })
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Frame<&'a T> {
    /// The payload: everything after the header (the L3 packet, plus any
    /// Ethernet padding; IP views cut padding off by their length field).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let hl = self.header_len();
        &self.buffer.as_ref()[hl..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr.0);
    }

    /// Sets the source MAC.
    #[inline]
    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr.0);
    }

    /// Sets the ethertype at offset 12 (the TPID of a tagged frame). To
    /// write a tag, use [`EthernetRepr::emit`].
    #[inline]
    pub fn set_outer_ethertype(&mut self, ethertype: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(ethertype).to_be_bytes());
    }

    /// Sets the ethertype of the payload (behind the tag if there is one).
    #[inline]
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        let r = if self.is_tagged() {
            field::INNER_ETHERTYPE
        } else {
            field::ETHERTYPE
        };
        self.buffer.as_mut()[r].copy_from_slice(&u16::from(ethertype).to_be_bytes());
    }

    /// Rewrites both MACs in place: what forwarding does to every frame.
    #[inline]
    pub fn rewrite_addrs(&mut self, src: MacAddr, dst: MacAddr) {
        let d = self.buffer.as_mut();
        d[field::DESTINATION].copy_from_slice(&dst.0);
        d[field::SOURCE].copy_from_slice(&src.0);
    }

    /// Swaps source and destination MAC (for replies built in place).
    #[inline]
    pub fn swap_addrs(&mut self) {
        let d = self.buffer.as_mut();
        let (dst, rest) = d.split_at_mut(6);
        dst.swap_with_slice(&mut rest[..6]);
    }

    /// The payload, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Frame<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The header of an Ethernet frame, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src_addr: MacAddr,
    /// Destination MAC.
    pub dst_addr: MacAddr,
    /// The tag, if any.
    pub vlan: Option<VlanTag>,
    /// Ethertype of the payload.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Reads the header of a checked frame.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&T>) -> Result<EthernetRepr> {
        frame.check_len()?;
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            vlan: frame.vlan(),
            ethertype: frame.ethertype(),
        })
    }

    /// Length of the header this emits: 14, or 18 with a tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header into the start of `buffer`, which must be at least
    /// [`EthernetRepr::buffer_len`] long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) -> Result<()> {
        let d = frame.buffer.as_mut();
        if d.len() < self.buffer_len() {
            return Err(Error::BufferTooSmall);
        }
        d[field::DESTINATION].copy_from_slice(&self.dst_addr.0);
        d[field::SOURCE].copy_from_slice(&self.src_addr.0);
        match self.vlan {
            None => d[field::ETHERTYPE].copy_from_slice(&u16::from(self.ethertype).to_be_bytes()),
            Some(tag) => {
                d[field::ETHERTYPE].copy_from_slice(&u16::from(tag.tpid.ethertype()).to_be_bytes());
                d[field::TCI].copy_from_slice(&tag.tci().to_be_bytes());
                d[field::INNER_ETHERTYPE].copy_from_slice(&u16::from(self.ethertype).to_be_bytes());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static FRAME_BYTES: [u8; 16] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x1a, // dst
        0x02, 0x00, 0x00, 0x00, 0x00, 0x0a, // src
        0x08, 0x00, // IPv4
        0xaa, 0xbb,
    ];

    static TAGGED_BYTES: [u8; 20] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
        0x02, 0x00, 0x00, 0x00, 0x00, 0x0a, // src
        0x81, 0x00, 0x60, 0x64, // 802.1Q, PCP 3, VID 100
        0x08, 0x06, // ARP
        0xaa, 0xbb,
    ];

    const DST: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x1a]);
    const SRC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);

    #[test]
    fn test_deconstruct() {
        let f = Frame::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(f.dst_addr(), DST);
        assert_eq!(f.src_addr(), SRC);
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.vlan(), None);
        assert_eq!(f.header_len(), 14);
        assert_eq!(f.payload(), &[0xaa, 0xbb]);

        let t = Frame::new_checked(&TAGGED_BYTES[..]).unwrap();
        assert!(t.dst_addr().is_broadcast());
        assert_eq!(t.outer_ethertype(), EtherType::Vlan);
        assert_eq!(t.ethertype(), EtherType::Arp);
        assert_eq!(
            t.vlan(),
            Some(VlanTag {
                tpid: TagProtocol::Dot1Q,
                pcp: 3,
                dei: false,
                vid: 100
            })
        );
        assert_eq!(t.header_len(), 18);
        assert_eq!(t.payload(), &[0xaa, 0xbb]);
    }

    #[test]
    fn test_construct() {
        let mut bytes = vec![0xa5; 16];
        let mut f = Frame::new_unchecked(&mut bytes);
        f.set_dst_addr(DST);
        f.set_src_addr(SRC);
        f.set_ethertype(EtherType::Ipv4);
        f.payload_mut().copy_from_slice(&[0xaa, 0xbb]);
        assert_eq!(&bytes[..], &FRAME_BYTES[..]);
    }

    #[test]
    fn test_parse() {
        let repr = EthernetRepr::parse(&Frame::new_unchecked(&TAGGED_BYTES[..])).unwrap();
        assert_eq!(
            repr,
            EthernetRepr {
                src_addr: SRC,
                dst_addr: MacAddr::BROADCAST,
                vlan: Some(VlanTag {
                    tpid: TagProtocol::Dot1Q,
                    pcp: 3,
                    dei: false,
                    vid: 100
                }),
                ethertype: EtherType::Arp,
            }
        );
    }

    #[test]
    fn test_emit() {
        let repr = EthernetRepr {
            src_addr: SRC,
            dst_addr: MacAddr::BROADCAST,
            vlan: Some(VlanTag {
                tpid: TagProtocol::Dot1Q,
                pcp: 3,
                dei: false,
                vid: 100,
            }),
            ethertype: EtherType::Arp,
        };
        assert_eq!(repr.buffer_len(), 18);
        let mut bytes = vec![0xa5; 20];
        repr.emit(&mut Frame::new_unchecked(&mut bytes)).unwrap();
        bytes[18..].copy_from_slice(&[0xaa, 0xbb]);
        assert_eq!(&bytes[..], &TAGGED_BYTES[..]);
    }

    #[test]
    fn truncated_at_every_length_is_an_error() {
        for n in 0..14 {
            assert_eq!(Frame::new_checked(&FRAME_BYTES[..n]), Err(Error::Truncated));
        }
        for n in 0..18 {
            assert_eq!(
                Frame::new_checked(&TAGGED_BYTES[..n]).err(),
                Some(Error::Truncated),
                "{n}"
            );
        }
        assert!(Frame::new_checked(&TAGGED_BYTES[..18]).is_ok());
    }

    #[test]
    fn qinq_tpid_is_a_tag_and_rewrites_keep_the_payload() {
        let mut bytes = TAGGED_BYTES;
        bytes[12..14].copy_from_slice(&[0x88, 0xa8]);
        let mut f = Frame::new_checked(&mut bytes[..]).unwrap();
        assert_eq!(f.vlan().unwrap().tpid, TagProtocol::Dot1Ad);
        f.rewrite_addrs(SRC, DST);
        f.swap_addrs();
        assert_eq!(f.dst_addr(), SRC);
        assert_eq!(f.src_addr(), DST);
        assert_eq!(f.ethertype(), EtherType::Arp);
        assert_eq!(&bytes[18..], &[0xaa, 0xbb]);
    }

    #[test]
    fn unknown_ethertypes_round_trip() {
        assert_eq!(EtherType::from(0x88cc), EtherType::Unknown(0x88cc));
        assert_eq!(u16::from(EtherType::Unknown(0x88cc)), 0x88cc);
        assert_eq!(MacAddr([0xee; 6]).to_string(), "ee:ee:ee:ee:ee:ee");
        assert!(MacAddr([0x33, 0x33, 0, 0, 0, 1]).is_multicast());
    }
}
