//! What the connection table needs of a packet (its 5-tuple, TCP flags,
//! ICMP type and code, and for an ICMP error the quoted packet's tuple),
//! read from the IP header on. The pipeline parsed and checked the IP
//! header already; L4 bytes are read here with bounds checks only (a
//! truncated L4 header is `None`: the caller drops it as invalid).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use brindle_policy::conntrack::{Seen, Tuple, icmp_is_error};

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;
const SCTP: u8 = 132;
const UDPLITE: u8 = 136;

/// Whether the protocol has 16-bit ports in its first four bytes.
fn has_ports(protocol: u8) -> bool {
    matches!(protocol, TCP | UDP | SCTP | UDPLITE)
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The tuple of a packet of `protocol` from `src` to `dst` whose L4 header
/// is `l4`; the ICMP echo identifier stands for both ports.
fn tuple(src: IpAddr, dst: IpAddr, protocol: u8, l4: &[u8]) -> Option<Tuple> {
    let plain = Tuple {
        src,
        dst,
        protocol,
        src_port: 0,
        dst_port: 0,
    };
    if has_ports(protocol) {
        return Some(Tuple {
            src_port: be16(l4, 0)?,
            dst_port: be16(l4, 2)?,
            ..plain
        });
    }
    if protocol == ICMP || protocol == ICMPV6 {
        let t = *l4.first()?;
        let echo = match protocol {
            ICMP => matches!(t, 0 | 8),
            _ => matches!(t, 128 | 129),
        };
        if echo {
            return Some(Tuple::icmp_echo(src, dst, protocol, be16(l4, 4)?));
        }
    }
    Some(plain)
}

/// An IPv4 header at the start of `b` (at least 20 bytes, not
/// re-verified): addresses, protocol, header length, whether it is a
/// non-first fragment.
fn v4_header(b: &[u8]) -> Option<(IpAddr, IpAddr, u8, usize, bool)> {
    let ihl = usize::from(b.first()? & 0x0f) * 4;
    if ihl < 20 || b.len() < ihl {
        return None;
    }
    let src = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
    let dst = Ipv4Addr::new(b[16], b[17], b[18], b[19]);
    let offset = be16(b, 6)? & 0x1fff;
    Some((src.into(), dst.into(), b[9], ihl, offset != 0))
}

/// An IPv6 header at the start of `b`: addresses and next header (no
/// extension headers walked: a packet with one is tracked by protocol
/// without ports).
fn v6_header(b: &[u8]) -> Option<(IpAddr, IpAddr, u8)> {
    if b.len() < 40 {
        return None;
    }
    let a = |at: usize| -> IpAddr {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[at..at + 16]);
        Ipv6Addr::from(o).into()
    };
    Some((a(8), a(24), b[6]))
}

/// What the table is told of the IPv4 packet `ip` (header to end of the
/// IP packet). `None`: not trackable (a non-first fragment, a truncated L4
/// header).
pub fn seen_v4(ip: &[u8]) -> Option<Seen> {
    let (src, dst, protocol, ihl, later_fragment) = v4_header(ip)?;
    if later_fragment {
        return None;
    }
    seen(src, dst, protocol, &ip[ihl..], false)
}

/// What the table is told of the IPv6 packet `ip`.
pub fn seen_v6(ip: &[u8]) -> Option<Seen> {
    let (src, dst, protocol) = v6_header(ip)?;
    seen(src, dst, protocol, &ip[40..], true)
}

fn seen(src: IpAddr, dst: IpAddr, protocol: u8, l4: &[u8], v6: bool) -> Option<Seen> {
    let t = tuple(src, dst, protocol, l4)?;
    let tcp_flags = if protocol == TCP { *l4.get(13)? } else { 0 };
    let icmp = if protocol == ICMP || protocol == ICMPV6 {
        Some((*l4.first()?, *l4.get(1)?))
    } else {
        None
    };
    let mut s = Seen::new(t, tcp_flags, icmp);
    if let Some((ty, _)) = icmp
        && icmp_is_error(protocol, ty)
    {
        // The quoted packet starts after the 8-byte ICMP header; a quote
        // we cannot read leaves `quoted` empty (then the error is invalid
        // unless policy allows it as a flow of its own).
        let quote = l4.get(8..)?;
        s.quoted = if v6 {
            v6_header(quote).and_then(|(qs, qd, qp)| tuple(qs, qd, qp, quote.get(40..)?))
        } else {
            v4_header(quote).and_then(|(qs, qd, qp, ihl, _)| tuple(qs, qd, qp, quote.get(ihl..)?))
        };
    }
    Some(s)
}
