//! Outer headers for IPIP (IPv4 protocol 4, RFC 2003) and VXLAN (RFC 7348),
//! written in place in front of a payload that is already in the frame.
//!
//! The vrouter never copies a packet to encapsulate it: the frame's start
//! moves back into the headroom the port leaves in every buffer, and the
//! outer header is written into the bytes that opens up. So the emitters
//! here take the whole new frame, header bytes first, payload already in
//! place behind them, and fill lengths and checksums last, once the payload
//! length is fixed (write in place, then finalize).
//!
//! Frame layouts:
//!
//! ```text
//! IPIP : | outer Ethernet 14 | outer IPv4 20 | inner IPv4 packet ...
//!          (the inner Ethernet header is dropped: the frame grows by 20)
//! VXLAN: | outer Ethernet 14 | outer IPv4 20 | UDP 8 | VXLAN 8 | inner Ethernet frame ...
//!          (the frame grows by 50)
//! ```
//!
//! Decapsulation is the reverse: [`ipip_inner_offset`] and
//! [`vxlan_inner`] say where the inner packet starts, and the pipeline
//! moves the frame's start forward (and, for IPIP, writes a new Ethernet
//! header into the 14 bytes before the inner IPv4 header).

use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::ethernet::{self, EtherType, MacAddr};
use crate::ip::IpProtocol;
use crate::ipv4;
use crate::udp::{self, UdpChecksum};
use crate::vxlan;

/// Bytes in front of the inner IPv4 packet of an IPIP frame.
pub const IPIP_HEADER_LEN: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
/// How much an IPIP-encapsulated frame is longer than the original
/// Ethernet frame (outer IPv4 added, inner Ethernet header replaced).
pub const IPIP_GROWTH: usize = ipv4::HEADER_LEN;
/// Bytes in front of the inner Ethernet frame of a VXLAN frame.
pub const VXLAN_HEADER_LEN: usize =
    ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + vxlan::HEADER_LEN;
/// How much a VXLAN-encapsulated frame is longer than the original.
pub const VXLAN_GROWTH: usize = VXLAN_HEADER_LEN;

/// Offsets of the outer headers in an encapsulated frame.
pub mod offset {
    /// The outer IPv4 header.
    pub const OUTER_IPV4: usize = 14;
    /// The UDP header of a VXLAN frame.
    pub const UDP: usize = 34;
    /// The VXLAN header.
    pub const VXLAN: usize = 42;
    /// The inner frame of a VXLAN frame.
    pub const VXLAN_INNER: usize = 50;
    /// The inner IPv4 packet of an IPIP frame.
    pub const IPIP_INNER: usize = 34;
}

/// The outer Ethernet and IPv4 fields of a tunnel to one remote node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OuterHeader {
    /// Our uplink MAC.
    pub src_mac: MacAddr,
    /// The underlay next hop's MAC (from the neighbour table).
    pub dst_mac: MacAddr,
    /// This node's address.
    pub src_addr: Ipv4Addr,
    /// The remote node's address.
    pub dst_addr: Ipv4Addr,
    /// Outer TTL (Linux: 64 for VXLAN; IPIP inherits the inner TTL by
    /// default, which the caller does by setting this per packet).
    pub ttl: u8,
    /// Outer DSCP/ECN byte before ECN propagation (see [`outer_tos`]).
    pub tos: u8,
    /// Set DF on the outer header (Linux: IPIP yes, VXLAN no by default).
    pub dont_frag: bool,
}

/// The outer TOS byte for an inner packet whose TOS is `inner_tos`, as
/// Linux computes it (`INET_ECN_encapsulate`, RFC 6040 normal mode): the
/// configured DSCP, and the inner ECN bits copied except that CE becomes
/// ECT(0).
#[inline]
pub fn outer_tos(configured: u8, inner_tos: u8) -> u8 {
    let ecn = inner_tos & 0x03;
    let ecn = if ecn == 0x03 { 0x02 } else { ecn };
    (configured & !0x03) | ecn
}

/// The UDP source port for a flow hash, in `[min, max)`, as Linux's
/// `udp_flow_src_port` picks it (so ECMP in the underlay spreads flows):
/// the hash is folded with itself shifted, then scaled into the range.
#[inline]
pub fn flow_source_port(hash: u32, min: u16, max: u16) -> u16 {
    let hash = hash ^ (hash << 16);
    let span = u64::from(max.saturating_sub(min));
    ((u64::from(hash) * span) >> 32) as u16 + min
}

/// Linux's default VXLAN source port range: the local port range
/// (`net.ipv4.ip_local_port_range`, 32768 60999).
pub const VXLAN_SRC_PORT_RANGE: (u16, u16) = (32768, 60999);

/// Writes the outer Ethernet and IPv4 headers into `h` in one pass.
///
/// This is the per-packet cost of encapsulation, so it does not go through
/// the `Repr` emitters: the 34 bytes are written at fixed offsets of a
/// fixed-size array (no bounds checks) and the IPv4 checksum is summed from
/// the values directly, not re-read from memory. `tests` check it against
/// `EthernetRepr`/`Ipv4Repr`, the kernel and etherparse.
#[inline]
fn write_outer(
    outer: &OuterHeader,
    h: &mut [u8; IPIP_HEADER_LEN],
    protocol: IpProtocol,
    ip_total: u16,
    ident: u16,
) {
    let s = outer.src_addr.octets();
    let d = outer.dst_addr.octets();
    let flags: u16 = if outer.dont_frag { 0x4000 } else { 0 };
    let ver_tos = u16::from_be_bytes([0x45, outer.tos]);
    let ttl_proto = u16::from_be_bytes([outer.ttl, u8::from(protocol)]);
    let sum = u32::from(ver_tos)
        + u32::from(ip_total)
        + u32::from(ident)
        + u32::from(flags)
        + u32::from(ttl_proto)
        + u32::from(u16::from_be_bytes([s[0], s[1]]))
        + u32::from(u16::from_be_bytes([s[2], s[3]]))
        + u32::from(u16::from_be_bytes([d[0], d[1]]))
        + u32::from(u16::from_be_bytes([d[2], d[3]]));
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    let csum = !(sum as u16);

    h[0..6].copy_from_slice(&outer.dst_mac.0);
    h[6..12].copy_from_slice(&outer.src_mac.0);
    h[12..14].copy_from_slice(&u16::from(EtherType::Ipv4).to_be_bytes());
    h[14..16].copy_from_slice(&ver_tos.to_be_bytes());
    h[16..18].copy_from_slice(&ip_total.to_be_bytes());
    h[18..20].copy_from_slice(&ident.to_be_bytes());
    h[20..22].copy_from_slice(&flags.to_be_bytes());
    h[22..24].copy_from_slice(&ttl_proto.to_be_bytes());
    h[24..26].copy_from_slice(&csum.to_be_bytes());
    h[26..30].copy_from_slice(&s);
    h[30..34].copy_from_slice(&d);
}

/// An IPIP tunnel to one remote node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpipEncap {
    /// Outer Ethernet and IPv4 fields.
    pub outer: OuterHeader,
}

impl IpipEncap {
    /// Writes the outer Ethernet and IPv4 headers into `frame[..34]`, in
    /// front of the inner IPv4 packet at `frame[34..]`, which fills the
    /// rest of the slice. `ident` is the outer IP ID.
    pub fn emit(&self, frame: &mut [u8], ident: u16) -> Result<()> {
        let ip_total = u16::try_from(frame.len() - ethernet::HEADER_LEN.min(frame.len()))
            .map_err(|_| Error::BufferTooSmall)?;
        let Some(h) = frame.first_chunk_mut::<IPIP_HEADER_LEN>() else {
            return Err(Error::BufferTooSmall);
        };
        write_outer(&self.outer, h, IpProtocol::IpIp, ip_total, ident);
        Ok(())
    }
}

/// A VXLAN tunnel to one remote VTEP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VxlanEncap {
    /// Outer Ethernet and IPv4 fields.
    pub outer: OuterHeader,
    /// The VNI (Calico's default: 4096).
    pub vni: u32,
    /// The destination UDP port (4789).
    pub dst_port: u16,
    /// Whether to compute the outer UDP checksum (Linux: no, by default).
    pub udp_checksum: UdpChecksum,
}

impl VxlanEncap {
    /// Writes outer Ethernet, IPv4, UDP and VXLAN headers into
    /// `frame[..50]`, in front of the inner Ethernet frame at `frame[50..]`,
    /// which fills the rest of the slice. `ident` is the outer IP ID and
    /// `src_port` the UDP source port (see [`flow_source_port`]).
    pub fn emit(&self, frame: &mut [u8], ident: u16, src_port: u16) -> Result<()> {
        if self.vni > vxlan::MAX_VNI {
            return Err(Error::Malformed);
        }
        let ip_total = u16::try_from(frame.len() - ethernet::HEADER_LEN.min(frame.len()))
            .map_err(|_| Error::BufferTooSmall)?;
        let udp_len = ip_total.wrapping_sub(ipv4::HEADER_LEN as u16);
        let Some(h) = frame.first_chunk_mut::<VXLAN_HEADER_LEN>() else {
            return Err(Error::BufferTooSmall);
        };
        let (outer, rest) = h.split_at_mut(IPIP_HEADER_LEN);
        let outer: &mut [u8; IPIP_HEADER_LEN] =
            outer.try_into().map_err(|_| Error::BufferTooSmall)?;
        write_outer(&self.outer, outer, IpProtocol::Udp, ip_total, ident);
        // UDP header, checksum 0 for now, then VXLAN: flags I, VNI.
        let v = self.vni.to_be_bytes();
        rest[0..2].copy_from_slice(&src_port.to_be_bytes());
        rest[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        rest[4..6].copy_from_slice(&udp_len.to_be_bytes());
        rest[6..8].copy_from_slice(&[0, 0]);
        rest[8..16].copy_from_slice(&[vxlan::FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]);
        if self.udp_checksum == UdpChecksum::Compute {
            // Finalize once the whole datagram is in place.
            udp::Packet::new_unchecked(&mut frame[offset::UDP..])
                .fill_checksum(self.outer.src_addr, self.outer.dst_addr);
        }
        Ok(())
    }
}

/// Where the inner IPv4 packet of an IPIP frame starts, if `frame` is an
/// Ethernet frame (tagged or not) carrying a valid IPv4 header with protocol 4
/// and at least a minimal inner header. Outer options are skipped.
pub fn ipip_inner_offset(frame: &[u8]) -> Option<usize> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::Ipv4 {
        return None;
    }
    let l3 = eth.header_len();
    let ip = ipv4::Packet::new_checked(&frame[l3..]).ok()?;
    if ip.protocol() != IpProtocol::IpIp || ip.is_fragment() {
        return None;
    }
    let inner = l3 + ip.header_len();
    if usize::from(ip.total_len()) < ip.header_len() + ipv4::HEADER_LEN {
        return None;
    }
    Some(inner)
}

/// The outer facts of a VXLAN frame that decapsulation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VxlanDecap {
    /// The VNI.
    pub vni: u32,
    /// The outer source address (the remote VTEP).
    pub outer_src: Ipv4Addr,
    /// The outer destination address (should be ours).
    pub outer_dst: Ipv4Addr,
    /// Offset of the inner Ethernet frame.
    pub inner_offset: usize,
    /// Length of the inner Ethernet frame (from the UDP length, so outer
    /// Ethernet padding is not included).
    pub inner_len: usize,
}

/// Parses the outer headers of a VXLAN frame: Ethernet (tag allowed),
/// IPv4 (options skipped, not a fragment), UDP to `port`, VXLAN with the I
/// flag, and an inner frame of at least an Ethernet header.
pub fn vxlan_inner(frame: &[u8], port: u16) -> Option<VxlanDecap> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::Ipv4 {
        return None;
    }
    let l3 = eth.header_len();
    let ip = ipv4::Packet::new_checked(&frame[l3..]).ok()?;
    if ip.protocol() != IpProtocol::Udp || ip.is_fragment() {
        return None;
    }
    let l4 = l3 + ip.header_len();
    let ip_end = l3 + usize::from(ip.total_len());
    let udp = udp::Packet::new_checked(&frame[l4..ip_end]).ok()?;
    if udp.dst_port() != port {
        return None;
    }
    let vx_start = l4 + udp::HEADER_LEN;
    let udp_end = l4 + usize::from(udp.len());
    let vx = vxlan::Packet::new_checked(&frame[vx_start..udp_end]).ok()?;
    if !vx.has_vni() {
        return None;
    }
    let inner_offset = vx_start + vxlan::HEADER_LEN;
    let inner_len = udp_end - inner_offset;
    if inner_len < ethernet::HEADER_LEN {
        return None;
    }
    Some(VxlanDecap {
        vni: vx.vni(),
        outer_src: ip.src_addr(),
        outer_dst: ip.dst_addr(),
        inner_offset,
        inner_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The echo request IPv4 packet Linux sent (84 bytes).
    const INNER_HEX: &str = "45000054371e40004001b93ac0a86401c0a864fe\
        080089916ca6000159930c6b00000000d4f5080000000000101112131415161718191a1b1c1d1e1f\
        202122232425262728292a2b2c2d2e2f3031323334353637";

    /// Outer Ethernet and IPv4 of that packet in IPIP from 192.168.100.1 to
    /// 192.168.100.254, TTL 64, DF, ID 0, checked by hand: total length
    /// 20 + 84 = 0x68, protocol 4, and the checksum
    /// ~(4500+0068+0000+4000+4004+c0a8+6401+c0a8+64fe) = ~0x0fbe = 0xf041.
    const IPIP_OUTER_HEX: &str = "02000000001a02000000000a0800\
        4500006800004000\
        4004f041c0a86401c0a864fe";

    fn outer() -> OuterHeader {
        OuterHeader {
            src_mac: MacAddr([0x02, 0, 0, 0, 0, 0x0a]),
            dst_mac: MacAddr([0x02, 0, 0, 0, 0, 0x1a]),
            src_addr: Ipv4Addr::new(192, 168, 100, 1),
            dst_addr: Ipv4Addr::new(192, 168, 100, 254),
            ttl: 64,
            tos: 0,
            dont_frag: true,
        }
    }

    #[test]
    fn ipip_outer_header_matches_the_hand_checked_bytes() {
        let inner = hex::decode(INNER_HEX).unwrap();
        let mut frame = vec![0xa5; IPIP_HEADER_LEN + inner.len()];
        frame[IPIP_HEADER_LEN..].copy_from_slice(&inner);
        IpipEncap { outer: outer() }.emit(&mut frame, 0).unwrap();
        assert_eq!(hex::encode(&frame[..IPIP_HEADER_LEN]), IPIP_OUTER_HEX);
        assert_eq!(&frame[IPIP_HEADER_LEN..], &inner[..]);
        assert_eq!(ipip_inner_offset(&frame), Some(IPIP_HEADER_LEN));
    }

    #[test]
    fn ipip_decap_rejects_other_protocols_fragments_and_short_inner() {
        let inner = hex::decode(INNER_HEX).unwrap();
        let mut frame = vec![0; IPIP_HEADER_LEN + inner.len()];
        frame[IPIP_HEADER_LEN..].copy_from_slice(&inner);
        IpipEncap { outer: outer() }.emit(&mut frame, 0).unwrap();
        let mut udp = frame.clone();
        udp[23] = 17;
        assert_eq!(ipip_inner_offset(&udp), None);
        let mut frag = frame.clone();
        frag[20] |= 0x20;
        assert_eq!(ipip_inner_offset(&frag), None);
        let mut short = frame[..IPIP_HEADER_LEN + 10].to_vec();
        IpipEncap { outer: outer() }.emit(&mut short, 0).unwrap();
        assert_eq!(ipip_inner_offset(&short), None);
        for n in 0..frame.len() {
            assert_eq!(ipip_inner_offset(&frame[..n]), None, "{n}");
        }
    }

    #[test]
    fn vxlan_encap_then_decap_gives_back_the_inner_frame() {
        let mut inner = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
        inner.extend_from_slice(&hex::decode(INNER_HEX).unwrap());
        let tunnel = VxlanEncap {
            outer: OuterHeader {
                dont_frag: false,
                ..outer()
            },
            vni: 4096,
            dst_port: vxlan::VXLAN_PORT,
            udp_checksum: UdpChecksum::Zero,
        };
        let mut frame = vec![0xa5; VXLAN_HEADER_LEN + inner.len()];
        frame[VXLAN_HEADER_LEN..].copy_from_slice(&inner);
        tunnel.emit(&mut frame, 7, 49152).unwrap();
        let d = vxlan_inner(&frame, vxlan::VXLAN_PORT).unwrap();
        assert_eq!(
            d,
            VxlanDecap {
                vni: 4096,
                outer_src: Ipv4Addr::new(192, 168, 100, 1),
                outer_dst: Ipv4Addr::new(192, 168, 100, 254),
                inner_offset: 50,
                inner_len: inner.len(),
            }
        );
        assert_eq!(vxlan_inner(&frame, 8472), None);
        for n in 0..frame.len() {
            assert_eq!(vxlan_inner(&frame[..n], vxlan::VXLAN_PORT), None, "{n}");
        }
        // Ethernet padding after the UDP datagram is not inner frame.
        frame.extend_from_slice(&[0; 4]);
        assert_eq!(
            vxlan_inner(&frame, vxlan::VXLAN_PORT).unwrap().inner_len,
            inner.len()
        );
    }

    #[test]
    fn outer_tos_copies_ecn_and_turns_ce_into_ect0() {
        assert_eq!(outer_tos(0, 0x00), 0x00);
        assert_eq!(outer_tos(0, 0x01), 0x01);
        assert_eq!(outer_tos(0, 0x02), 0x02);
        assert_eq!(outer_tos(0, 0x03), 0x02);
        assert_eq!(outer_tos(0xb8, 0x03), 0xba);
    }

    #[test]
    fn flow_source_port_stays_in_range() {
        let (min, max) = VXLAN_SRC_PORT_RANGE;
        for hash in [0u32, 1, 0xffff, 0x1234_5678, u32::MAX] {
            let p = flow_source_port(hash, min, max);
            assert!((min..max).contains(&p), "{p}");
        }
        assert_ne!(
            flow_source_port(0x1234_5678, min, max),
            flow_source_port(0x8765_4321, min, max)
        );
    }

    #[test]
    fn too_short_buffers_are_errors() {
        let mut b = vec![0; VXLAN_HEADER_LEN - 1];
        let t = VxlanEncap {
            outer: outer(),
            vni: 1,
            dst_port: 4789,
            udp_checksum: UdpChecksum::Compute,
        };
        assert_eq!(t.emit(&mut b, 0, 0), Err(Error::BufferTooSmall));
        let mut big = vec![0; VXLAN_HEADER_LEN + 14];
        let wide_vni = VxlanEncap {
            vni: 0x0100_0000,
            ..t
        };
        assert_eq!(wide_vni.emit(&mut big, 0, 0), Err(Error::Malformed));
        assert_eq!(
            IpipEncap { outer: outer() }.emit(&mut b[..IPIP_HEADER_LEN - 1], 0),
            Err(Error::BufferTooSmall)
        );
    }
}
