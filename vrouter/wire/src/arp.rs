//! ARP for IPv4 over Ethernet (RFC 826), the only kind the vrouter answers.
//!
//! Proxy ARP runs on every ARP frame a pod sends, so it first calls
//! [`speculative_target_ip`], which reads the target IP at its fixed offset
//! without validating anything else. The test can have false positives (a
//! non-ARP or malformed payload whose bytes 24..28 happen to match), which
//! the full parse then rejects, but never a false negative: every valid
//! Ethernet/IPv4 ARP packet has its target protocol address exactly there.
//!
//! Hand-written rather than etherparse's `ArpPacket`: proxy ARP turns the
//! request into the reply in the same buffer, and etherparse's ARP type is an
//! owned copy of 1 KiB of address buffers.

use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::ethernet::{EtherType, MacAddr};
use crate::macros::enum_with_unknown;

enum_with_unknown! {
    /// ARP hardware type.
    pub enum Hardware(u16) {
        /// Ethernet (1).
        Ethernet = 1,
    }
}

enum_with_unknown! {
    /// ARP operation.
    pub enum Operation(u16) {
        /// Who has the target protocol address? (1)
        Request = 1,
        /// The sender has it. (2)
        Reply = 2,
    }
}

/// Byte ranges of the fields of an Ethernet/IPv4 ARP packet.
pub mod field {
    use core::ops::Range;

    /// Hardware type.
    pub const HTYPE: Range<usize> = 0..2;
    /// Protocol type (an ethertype).
    pub const PTYPE: Range<usize> = 2..4;
    /// Hardware address length.
    pub const HLEN: usize = 4;
    /// Protocol address length.
    pub const PLEN: usize = 5;
    /// Operation.
    pub const OPER: Range<usize> = 6..8;
    /// Sender hardware address.
    pub const SHA: Range<usize> = 8..14;
    /// Sender protocol address.
    pub const SPA: Range<usize> = 14..18;
    /// Target hardware address.
    pub const THA: Range<usize> = 18..24;
    /// Target protocol address.
    pub const TPA: Range<usize> = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = field::TPA.end;

/// The target IP of what may be an ARP packet, read without any validation.
///
/// `payload` is the Ethernet payload (after the tag, if any). Returns `None`
/// only when the payload is too short to be an Ethernet/IPv4 ARP packet, so
/// a caller that skips frames for which this returns `None` or an address it
/// does not answer for never skips a frame it should answer.
#[inline]
pub fn speculative_target_ip(payload: &[u8]) -> Option<Ipv4Addr> {
    let b = payload.get(field::TPA)?;
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

/// Whether `payload` may be an ARP packet whose target IP is `addr`
/// (dumbo's `test_speculative_tpa`). False positives possible, false
/// negatives never.
#[inline]
pub fn test_speculative_tpa(payload: &[u8], addr: Ipv4Addr) -> bool {
    payload.get(field::TPA) == Some(&addr.octets()[..])
}

/// A view of an ARP packet in a buffer.
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

    /// Checks that the buffer holds a whole Ethernet/IPv4 ARP packet.
    ///
    /// Only the length: the address-length fields are checked by
    /// [`ArpRepr::parse`]. The accessors below read Ethernet/IPv4 offsets.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN {
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

    fn ip_at(&self, r: core::ops::Range<usize>) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[r];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    /// Hardware type.
    #[inline]
    pub fn hardware_type(&self) -> Hardware {
        Hardware::from(self.u16_at(field::HTYPE))
    }

    /// Protocol type.
    #[inline]
    pub fn protocol_type(&self) -> EtherType {
        EtherType::from(self.u16_at(field::PTYPE))
    }

    /// Hardware address length.
    #[inline]
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    /// Protocol address length.
    #[inline]
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    /// Operation.
    #[inline]
    pub fn operation(&self) -> Operation {
        Operation::from(self.u16_at(field::OPER))
    }

    /// Sender hardware address.
    #[inline]
    pub fn source_hardware_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SHA])
    }

    /// Sender protocol address.
    #[inline]
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        self.ip_at(field::SPA)
    }

    /// Target hardware address.
    #[inline]
    pub fn target_hardware_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::THA])
    }

    /// Target protocol address.
    #[inline]
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        self.ip_at(field::TPA)
    }

    /// Whether the fixed fields say Ethernet/IPv4 (htype 1, ptype 0x0800,
    /// hlen 6, plen 4).
    #[inline]
    pub fn is_ethernet_ipv4(&self) -> bool {
        let d = self.buffer.as_ref();
        d[..6] == [0x00, 0x01, 0x08, 0x00, 6, 4]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the operation.
    #[inline]
    pub fn set_operation(&mut self, op: Operation) {
        self.buffer.as_mut()[field::OPER].copy_from_slice(&u16::from(op).to_be_bytes());
    }

    /// Sets the sender hardware address.
    #[inline]
    pub fn set_source_hardware_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&a.0);
    }

    /// Sets the sender protocol address.
    #[inline]
    pub fn set_source_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&a.octets());
    }

    /// Sets the target hardware address.
    #[inline]
    pub fn set_target_hardware_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&a.0);
    }

    /// Sets the target protocol address.
    #[inline]
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&a.octets());
    }

    /// Turns a request into the reply "`target IP` is at `our_mac`", in
    /// place: operation 2, the requester becomes the target, and the sender
    /// becomes (`our_mac`, the requested IP). The Ethernet header around it
    /// is the caller's (swap MACs, set the source to `our_mac`).
    #[inline]
    pub fn make_reply_in_place(&mut self, our_mac: MacAddr) {
        let d = self.buffer.as_mut();
        let mut sha = [0u8; 6];
        let mut spa = [0u8; 4];
        let mut tpa = [0u8; 4];
        sha.copy_from_slice(&d[field::SHA]);
        spa.copy_from_slice(&d[field::SPA]);
        tpa.copy_from_slice(&d[field::TPA]);
        d[field::OPER].copy_from_slice(&u16::from(Operation::Reply).to_be_bytes());
        d[field::SHA].copy_from_slice(&our_mac.0);
        d[field::SPA].copy_from_slice(&tpa);
        d[field::THA].copy_from_slice(&sha);
        d[field::TPA].copy_from_slice(&spa);
    }
}

/// An Ethernet/IPv4 ARP packet, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Operation.
    pub operation: Operation,
    /// Sender hardware address.
    pub source_hardware_addr: MacAddr,
    /// Sender protocol address.
    pub source_protocol_addr: Ipv4Addr,
    /// Target hardware address.
    pub target_hardware_addr: MacAddr,
    /// Target protocol address.
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Parses an ARP packet; anything but Ethernet/IPv4 is
    /// [`Error::Unsupported`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<ArpRepr> {
        packet.check_len()?;
        if !packet.is_ethernet_ipv4() {
            return Err(Error::Unsupported);
        }
        Ok(ArpRepr {
            operation: packet.operation(),
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// Length of the packet this emits: 28.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet into the start of the buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let d = packet.buffer.as_mut();
        if d.len() < PACKET_LEN {
            return Err(Error::BufferTooSmall);
        }
        d[..6].copy_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4]);
        packet.set_operation(self.operation);
        packet.set_source_hardware_addr(self.source_hardware_addr);
        packet.set_source_protocol_addr(self.source_protocol_addr);
        packet.set_target_hardware_addr(self.target_hardware_addr);
        packet.set_target_protocol_addr(self.target_protocol_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ARP request Linux sent in `tests/vectors/arp_icmp_echo.hex`
    /// (Ethernet payload only): who has 192.168.100.254, tell .1.
    static REQUEST_BYTES: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // Ethernet/IPv4, request
        0x02, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xc0, 0xa8, 0x64, 0x01, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xa8, 0x64, 0xfe, // target
    ];

    /// The reply Linux sent back to it.
    static REPLY_BYTES: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, // Ethernet/IPv4, reply
        0x02, 0x00, 0x00, 0x00, 0x00, 0x1a, 0xc0, 0xa8, 0x64, 0xfe, // sender
        0x02, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xc0, 0xa8, 0x64, 0x01, // target
    ];

    const A_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
    const R_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x1a]);
    const A_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
    const R_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 254);

    fn request_repr() -> ArpRepr {
        ArpRepr {
            operation: Operation::Request,
            source_hardware_addr: A_MAC,
            source_protocol_addr: A_IP,
            target_hardware_addr: MacAddr::ZERO,
            target_protocol_addr: R_IP,
        }
    }

    #[test]
    fn test_deconstruct() {
        let p = Packet::new_checked(&REQUEST_BYTES[..]).unwrap();
        assert_eq!(p.hardware_type(), Hardware::Ethernet);
        assert_eq!(p.protocol_type(), EtherType::Ipv4);
        assert_eq!(p.hardware_len(), 6);
        assert_eq!(p.protocol_len(), 4);
        assert_eq!(p.operation(), Operation::Request);
        assert_eq!(p.source_hardware_addr(), A_MAC);
        assert_eq!(p.source_protocol_addr(), A_IP);
        assert_eq!(p.target_hardware_addr(), MacAddr::ZERO);
        assert_eq!(p.target_protocol_addr(), R_IP);
    }

    #[test]
    fn test_construct() {
        let mut bytes = vec![0xa5; 28];
        bytes[..6].copy_from_slice(&[0x00, 0x01, 0x08, 0x00, 0x06, 0x04]);
        let mut p = Packet::new_unchecked(&mut bytes);
        p.set_operation(Operation::Request);
        p.set_source_hardware_addr(A_MAC);
        p.set_source_protocol_addr(A_IP);
        p.set_target_hardware_addr(MacAddr::ZERO);
        p.set_target_protocol_addr(R_IP);
        assert_eq!(&bytes[..], &REQUEST_BYTES[..]);
    }

    #[test]
    fn test_parse() {
        let repr = ArpRepr::parse(&Packet::new_unchecked(&REQUEST_BYTES[..])).unwrap();
        assert_eq!(repr, request_repr());
    }

    #[test]
    fn test_emit() {
        let mut bytes = vec![0xa5; 28];
        request_repr()
            .emit(&mut Packet::new_unchecked(&mut bytes))
            .unwrap();
        assert_eq!(&bytes[..], &REQUEST_BYTES[..]);
    }

    #[test]
    fn reply_in_place_equals_the_kernels_reply() {
        let mut bytes = REQUEST_BYTES;
        Packet::new_checked(&mut bytes[..])
            .unwrap()
            .make_reply_in_place(R_MAC);
        assert_eq!(bytes, REPLY_BYTES);
    }

    #[test]
    fn speculative_target_ip_has_no_false_negatives() {
        assert_eq!(speculative_target_ip(&REQUEST_BYTES), Some(R_IP));
        assert!(test_speculative_tpa(&REQUEST_BYTES, R_IP));
        assert!(!test_speculative_tpa(&REQUEST_BYTES, A_IP));
        for n in 0..28 {
            assert_eq!(speculative_target_ip(&REQUEST_BYTES[..n]), None);
            assert_eq!(
                Packet::new_checked(&REQUEST_BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn other_hardware_or_address_lengths_are_unsupported() {
        let mut bytes = REQUEST_BYTES;
        bytes[4] = 8;
        assert_eq!(
            ArpRepr::parse(&Packet::new_unchecked(&bytes[..])),
            Err(Error::Unsupported)
        );
        let mut bytes = REQUEST_BYTES;
        bytes[1] = 6; // IEEE 802
        assert_eq!(
            ArpRepr::parse(&Packet::new_unchecked(&bytes[..])),
            Err(Error::Unsupported)
        );
    }
}
