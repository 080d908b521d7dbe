//! The probe frames: Ethernet + IPv4 + UDP, built once with brindle-wire,
//! then re-stamped in place before every transmission with a sequence
//! number and a CLOCK_MONOTONIC timestamp. Only the UDP checksum changes
//! with the stamp, so it is updated from a precomputed base sum rather than
//! recomputed over the frame.
//!
//! UDP payload layout (18 bytes, what a 64-byte frame has room for):
//! `seq: u64 BE | timestamp_ns: u64 BE | tag: u16 BE`. The tag names the
//! trial, so stragglers of an earlier trial are never counted.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use brindle_wire::checksum;
use brindle_wire::udp::UdpChecksum;
use brindle_wire::{EtherType, EthernetFrame, EthernetRepr, IpProtocol, Ipv4Packet, Ipv4Repr};
use brindle_wire::{MacAddr, UdpPacket, UdpRepr};
use serde::Serialize;

/// Ethernet header length (untagged).
pub const ETH_LEN: usize = 14;
/// Offset of the UDP header in a probe frame.
pub const UDP_OFFSET: usize = ETH_LEN + 20;
/// Offset of the UDP payload (the probe) in a probe frame.
pub const PROBE_OFFSET: usize = UDP_OFFSET + 8;
/// Probe bytes: seq, timestamp, tag.
pub const PROBE_LEN: usize = 18;
/// The smallest frame on the wire (with its 4-byte FCS), RFC 2544.
pub const MIN_WIRE_SIZE: u16 = 64;
/// The largest untagged frame on the wire for a 1500-byte MTU.
pub const MAX_WIRE_SIZE: u16 = 1518;
/// Bytes the FCS adds on the wire; veth and AF_XDP never see it.
pub const FCS_LEN: u16 = 4;
/// Preamble, start delimiter and inter-frame gap: what a wire-rate figure
/// in bits per second counts beside the frame.
pub const WIRE_OVERHEAD: u16 = 20;

/// Simple IMIX (7:4:1 of 64, 594 and 1518 bytes on the wire, i.e. IP
/// packets of 46, 576 and 1500 bytes), interleaved: the large frames are
/// spread over the cycle, never two of a size class in a row where the
/// ratio allows, as frames of many flows mix on a real link.
pub const IMIX: [u16; 12] = [64, 594, 64, 64, 594, 64, 1518, 64, 594, 64, 64, 594];

/// A frame size as on the wire, FCS included (RFC 2544 convention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FrameSize {
    /// Every frame this many bytes, 64 to 1518.
    Fixed(u16),
    /// The 7:4:1 simple IMIX.
    Imix,
}

/// Why a frame size was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameSizeError {
    /// Not a number and not "imix".
    #[error("frame size {0:?}: expected a number of bytes (64..=1518) or \"imix\"")]
    Syntax(String),
    /// Outside 64..=1518.
    #[error("frame size {0} outside {MIN_WIRE_SIZE}..={MAX_WIRE_SIZE} bytes")]
    Range(u16),
}

impl FrameSize {
    /// Sizes on the wire of the frames this spreads over the UMEM chunks,
    /// chunk `i` taking entry `i % len`.
    pub fn pattern(&self) -> &[u16] {
        match self {
            FrameSize::Fixed(s) => std::slice::from_ref(s),
            FrameSize::Imix => &IMIX,
        }
    }

    /// Mean size on the wire.
    pub fn mean_wire_size(&self) -> f64 {
        let p = self.pattern();
        p.iter().map(|&s| f64::from(s)).sum::<f64>() / p.len() as f64
    }

    /// A short label for tables and plots.
    pub fn label(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for FrameSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameSize::Fixed(s) => write!(f, "{s}"),
            FrameSize::Imix => f.write_str("imix"),
        }
    }
}

impl FromStr for FrameSize {
    type Err = FrameSizeError;

    fn from_str(s: &str) -> Result<FrameSize, FrameSizeError> {
        if s.eq_ignore_ascii_case("imix") {
            return Ok(FrameSize::Imix);
        }
        let n: u16 = s
            .trim()
            .parse()
            .map_err(|_| FrameSizeError::Syntax(s.to_owned()))?;
        if !(MIN_WIRE_SIZE..=MAX_WIRE_SIZE).contains(&n) {
            return Err(FrameSizeError::Range(n));
        }
        Ok(FrameSize::Fixed(n))
    }
}

/// Addresses of the probe stream; flow `i` uses UDP source port
/// `base_src_port + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSpec {
    /// Destination MAC: the next hop (router port or the sink).
    pub dst_mac: MacAddr,
    /// Source MAC: the generator's interface.
    pub src_mac: MacAddr,
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address (the sink).
    pub dst_ip: Ipv4Addr,
    /// UDP source port of flow 0.
    pub base_src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

impl FlowSpec {
    /// UDP source port of `flow`.
    pub fn src_port(&self, flow: u16) -> u16 {
        self.base_src_port.wrapping_add(flow)
    }
}

/// A built frame ready to stamp: its bytes (no FCS) and the folded sum of
/// everything the UDP checksum covers, taken with a zero probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// Frame bytes, FCS excluded.
    pub bytes: Vec<u8>,
    /// One's-complement sum of pseudo-header + UDP header (checksum 0) +
    /// payload with seq and timestamp zero and the tag in place.
    pub base_sum: u16,
    /// The flow this frame belongs to.
    pub flow: u16,
}

/// Why a template could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The size leaves no room for the probe.
    #[error("frame size {0} bytes has no room for the {PROBE_LEN}-byte probe")]
    TooSmall(u16),
    /// brindle-wire refused a header.
    #[error("emitting a header: {0}")]
    Wire(#[from] brindle_wire::Error),
}

/// Builds the frame of `flow`, `wire_size` bytes on the wire (FCS
/// included), with `tag` in its probe.
pub fn build(spec: &FlowSpec, flow: u16, wire_size: u16, tag: u16) -> Result<Template, BuildError> {
    let len = usize::from(wire_size.saturating_sub(FCS_LEN));
    if len < PROBE_OFFSET + PROBE_LEN {
        return Err(BuildError::TooSmall(wire_size));
    }
    let mut bytes = vec![0u8; len];
    let udp_len = len - UDP_OFFSET;
    // The payload first: the UDP checksum is computed over it.
    let tail = &mut bytes[PROBE_OFFSET..];
    tail[16..18].copy_from_slice(&tag.to_be_bytes());
    for (i, b) in tail[PROBE_LEN..].iter_mut().enumerate() {
        // A visible pattern, so a capture shows where padding starts.
        *b = i as u8;
    }
    EthernetRepr {
        src_addr: spec.src_mac,
        dst_addr: spec.dst_mac,
        vlan: None,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut bytes[..]))?;
    Ipv4Repr {
        src_addr: spec.src_ip,
        dst_addr: spec.dst_ip,
        protocol: IpProtocol::Udp,
        payload_len: udp_len,
        ttl: 64,
        tos: 0,
        ident: 0,
        dont_frag: true,
        more_frags: false,
        frag_offset: 0,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut bytes[ETH_LEN..]))?;
    let udp = UdpRepr {
        src_port: spec.src_port(flow),
        dst_port: spec.dst_port,
        payload_len: udp_len - 8,
    };
    udp.emit(
        &mut UdpPacket::new_unchecked(&mut bytes[UDP_OFFSET..]),
        spec.src_ip,
        spec.dst_ip,
        UdpChecksum::Zero,
    )?;
    let pseudo =
        checksum::pseudo_header_v4(spec.src_ip, spec.dst_ip, IpProtocol::Udp, udp_len as u16);
    let base_sum = checksum::combine(&[pseudo, checksum::data(&bytes[UDP_OFFSET..])]);
    let mut template = Template {
        bytes,
        base_sum,
        flow,
    };
    stamp(&mut template.bytes, base_sum, 0, 0);
    Ok(template)
}

/// The frame of `flow` for the live-frames generator: as [`build`], but
/// with UDP checksum 0 ("no checksum", legal for UDP over IPv4), because
/// its XDP program writes seq and time into each copy and updates nothing.
pub fn build_unchecksummed(
    spec: &FlowSpec,
    flow: u16,
    wire_size: u16,
    tag: u16,
) -> Result<Vec<u8>, BuildError> {
    let mut bytes = build(spec, flow, wire_size, tag)?.bytes;
    bytes[UDP_OFFSET + 6..UDP_OFFSET + 8].fill(0);
    Ok(bytes)
}

/// Folded one's-complement sum of a u64 read as four big-endian words.
#[inline]
fn sum_u64(x: u64) -> u64 {
    (x >> 48) + ((x >> 32) & 0xffff) + ((x >> 16) & 0xffff) + (x & 0xffff)
}

/// Writes `seq` and `timestamp_ns` into a frame built by [`build`] (any
/// length from `PROBE_OFFSET + 16`) and sets its UDP checksum from
/// `base_sum` without reading the rest of the frame. Frames too short are
/// left alone.
#[inline]
pub fn stamp(frame: &mut [u8], base_sum: u16, seq: u64, timestamp_ns: u64) {
    let Some(probe) = frame.get_mut(PROBE_OFFSET..PROBE_OFFSET + 16) else {
        return;
    };
    probe[..8].copy_from_slice(&seq.to_be_bytes());
    probe[8..16].copy_from_slice(&timestamp_ns.to_be_bytes());
    let mut acc = u64::from(base_sum) + sum_u64(seq) + sum_u64(timestamp_ns);
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    let mut csum = !(acc as u16);
    // RFC 768: a computed zero goes on the wire as all ones.
    if csum == 0 {
        csum = 0xffff;
    }
    frame[UDP_OFFSET + 6..UDP_OFFSET + 8].copy_from_slice(&csum.to_be_bytes());
}

/// What the sink reads from a probe frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Sequence number (one counter per generator, over all flows).
    pub seq: u64,
    /// CLOCK_MONOTONIC nanoseconds when the generator queued the frame.
    pub timestamp_ns: u64,
    /// The trial's tag.
    pub tag: u16,
    /// UDP source port (the flow).
    pub src_port: u16,
}

/// Reads the probe of a received frame: a cheap check of the fixed offsets
/// (untagged Ethernet, IPv4 without options, UDP), no checksum. `None` for
/// anything else; never panics.
#[inline]
pub fn read_probe(frame: &[u8]) -> Option<Probe> {
    let head = frame.get(..PROBE_OFFSET + PROBE_LEN)?;
    if head[12..14] != [0x08, 0x00] || head[ETH_LEN] != 0x45 || head[ETH_LEN + 9] != 17 {
        return None;
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[o..o + 8]);
        u64::from_be_bytes(b)
    };
    Some(Probe {
        seq: u64_at(PROBE_OFFSET),
        timestamp_ns: u64_at(PROBE_OFFSET + 8),
        tag: u16::from_be_bytes([head[PROBE_OFFSET + 16], head[PROBE_OFFSET + 17]]),
        src_port: u16::from_be_bytes([head[UDP_OFFSET], head[UDP_OFFSET + 1]]),
    })
}

#[cfg(test)]
mod tests {
    use brindle_wire::{Ipv4Packet, UdpPacket};

    use super::*;

    fn spec() -> FlowSpec {
        FlowSpec {
            dst_mac: MacAddr([0x02, 0, 0, 0, 0, 2]),
            src_mac: MacAddr([0x02, 0, 0, 0, 0, 1]),
            src_ip: Ipv4Addr::new(10, 201, 1, 2),
            dst_ip: Ipv4Addr::new(10, 201, 2, 2),
            base_src_port: 10_000,
            dst_port: 9,
        }
    }

    #[test]
    fn live_frames_carry_no_udp_checksum_and_parse_with_any_stamp() {
        for size in [64u16, 594, 1518] {
            let mut f = build_unchecksummed(&spec(), 3, size, 0xbeef).unwrap();
            assert_eq!(f.len(), usize::from(size) - 4);
            // What the XDP program writes: big-endian seq and time.
            f[PROBE_OFFSET..PROBE_OFFSET + 8].copy_from_slice(&77u64.to_be_bytes());
            f[PROBE_OFFSET + 8..PROBE_OFFSET + 16].copy_from_slice(&u64::MAX.to_be_bytes());
            let eth = EthernetFrame::new_checked(&f[..]).unwrap();
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            let ip_repr = Ipv4Repr::parse(&ip).expect("ipv4 checksum verifies");
            let udp = UdpPacket::new_checked(ip.payload()).unwrap();
            assert_eq!(udp.checksum(), 0);
            let udp_repr = UdpRepr::parse(&udp, ip_repr.src_addr, ip_repr.dst_addr)
                .expect("checksum 0 means none");
            assert_eq!(udp_repr.src_port, 10_003);
            let p = read_probe(&f).unwrap();
            assert_eq!((p.seq, p.timestamp_ns, p.tag), (77, u64::MAX, 0xbeef));
        }
    }

    /// Parses with brindle-wire, verifying both checksums; returns the UDP payload.
    fn parse_checked(frame: &[u8]) -> (Ipv4Repr, UdpRepr, Vec<u8>) {
        let eth = EthernetFrame::new_checked(frame).expect("ethernet");
        assert_eq!(eth.ethertype(), EtherType::Ipv4);
        let ip = Ipv4Packet::new_checked(eth.payload()).expect("ipv4");
        let ip_repr = Ipv4Repr::parse(&ip).expect("ipv4 checksum verifies");
        let udp = UdpPacket::new_checked(ip.payload()).expect("udp");
        assert_ne!(
            udp.checksum(),
            0,
            "the UDP checksum is computed, not left 0"
        );
        let udp_repr = UdpRepr::parse(&udp, ip_repr.src_addr, ip_repr.dst_addr)
            .expect("udp checksum verifies");
        (ip_repr, udp_repr, udp.payload().to_vec())
    }

    #[test]
    fn a_64_byte_frame_is_60_bytes_and_parses_with_correct_checksums() {
        let t = build(&spec(), 3, 64, 0xbeef).unwrap();
        assert_eq!(t.bytes.len(), 60);
        let (ip, udp, payload) = parse_checked(&t.bytes);
        assert_eq!(ip.src_addr, Ipv4Addr::new(10, 201, 1, 2));
        assert_eq!(ip.dst_addr, Ipv4Addr::new(10, 201, 2, 2));
        assert_eq!(ip.payload_len, 26);
        assert_eq!(ip.ttl, 64);
        assert_eq!(udp.src_port, 10_003);
        assert_eq!(udp.dst_port, 9);
        assert_eq!(payload.len(), PROBE_LEN);
        assert_eq!(&payload[16..18], &[0xbe, 0xef]);
    }

    #[test]
    fn stamping_keeps_the_udp_checksum_correct_for_any_seq_and_time() {
        for size in [64u16, 65, 128, 594, 1500, 1518] {
            let mut t = build(&spec(), 0, size, 7).unwrap();
            assert_eq!(t.bytes.len(), usize::from(size - 4));
            for (seq, ts) in [
                (0u64, 0u64),
                (1, 1),
                (u64::MAX, u64::MAX),
                (0x0123_4567_89ab_cdef, 1_700_000_000_123_456_789),
                (0xffff, 0xffff_0000),
            ] {
                stamp(&mut t.bytes, t.base_sum, seq, ts);
                let (_, _, payload) = parse_checked(&t.bytes);
                assert_eq!(payload[..8], seq.to_be_bytes());
                assert_eq!(payload[8..16], ts.to_be_bytes());
                let p = read_probe(&t.bytes).unwrap();
                assert_eq!(
                    (p.seq, p.timestamp_ns, p.tag, p.src_port),
                    (seq, ts, 7, 10_000)
                );
            }
        }
    }

    #[test]
    fn sizes_outside_64_to_1518_and_garbage_are_refused() {
        assert_eq!("64".parse::<FrameSize>(), Ok(FrameSize::Fixed(64)));
        assert_eq!("IMIX".parse::<FrameSize>(), Ok(FrameSize::Imix));
        assert_eq!("63".parse::<FrameSize>(), Err(FrameSizeError::Range(63)));
        assert_eq!(
            "1519".parse::<FrameSize>(),
            Err(FrameSizeError::Range(1519))
        );
        assert!(matches!(
            "big".parse::<FrameSize>(),
            Err(FrameSizeError::Syntax(_))
        ));
        assert!(matches!(
            build(&spec(), 0, 40, 0),
            Err(BuildError::TooSmall(40))
        ));
    }

    #[test]
    fn imix_mean_is_the_7_4_1_mix() {
        let mean = FrameSize::Imix.mean_wire_size();
        assert!((mean - (7.0 * 64.0 + 4.0 * 594.0 + 1518.0) / 12.0).abs() < 1e-9);
        let count = |n: u16| IMIX.iter().filter(|&&s| s == n).count();
        assert_eq!((count(64), count(594), count(1518)), (7, 4, 1));
    }

    #[test]
    fn imix_is_interleaved_not_in_runs_of_one_size() {
        // No two large frames in a row, also across the wrap of the cycle.
        for i in 0..IMIX.len() {
            let (a, b) = (IMIX[i], IMIX[(i + 1) % IMIX.len()]);
            assert!(a == 64 || b == 64, "{a} then {b} at {i}");
        }
    }

    #[test]
    fn read_probe_refuses_short_and_foreign_frames_without_panicking() {
        let t = build(&spec(), 0, 64, 1).unwrap();
        for cut in 0..t.bytes.len() {
            assert_eq!(read_probe(&t.bytes[..cut]), None, "prefix of {cut} bytes");
        }
        let mut arp = t.bytes.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(read_probe(&arp), None);
        let mut tcp = t.bytes.clone();
        tcp[ETH_LEN + 9] = 6;
        assert_eq!(read_probe(&tcp), None);
    }
}
