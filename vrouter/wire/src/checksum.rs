//! The internet checksum: RFC 1071 (full), RFC 1624 (incremental update) and
//! the IPv4 pseudo-header used by UDP.
//!
//! Sums here are "folded" 16-bit one's-complement sums, not yet inverted; the
//! value that goes on the wire is `!sum`. [`data`] sums a byte slice,
//! [`combine`] adds sums, [`result`] turns a sum into the wire value.

use std::net::Ipv4Addr;

use crate::ip::IpProtocol;

/// Folds a wide accumulator into a 16-bit one's-complement sum.
#[inline]
fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// One's-complement sum of `data` read as big-endian 16-bit words, a final
/// odd byte padded with zero (RFC 1071 §4.1).
///
/// Reads 4 bytes at a time into a 64-bit accumulator: the carries are folded
/// once at the end, which is what makes this fast enough for full UDP
/// payloads.
#[inline]
pub fn data(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        acc += u64::from(u16::from_be_bytes([p[0], p[1]]));
    }
    if let [last] = pairs.remainder() {
        acc += u64::from(*last) << 8;
    }
    fold(acc)
}

/// One's-complement sum of several sums.
#[inline]
pub fn combine(sums: &[u16]) -> u16 {
    fold(sums.iter().map(|&s| u64::from(s)).sum())
}

/// The value to put in a checksum field for a region whose sum is `sum`.
#[inline]
pub fn result(sum: u16) -> u16 {
    !sum
}

/// The RFC 1071 checksum of `bytes`, ready for the wire. A header whose
/// checksum field holds this value sums to `0xffff`.
#[inline]
pub fn checksum(bytes: &[u8]) -> u16 {
    result(data(bytes))
}

/// Whether a region that includes its own checksum field verifies.
#[inline]
pub fn verifies(bytes: &[u8]) -> bool {
    data(bytes) == 0xffff
}

/// Sum of the IPv4 pseudo-header of UDP and TCP (RFC 768): source,
/// destination, zero, protocol, and the upper-layer length.
#[inline]
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpProtocol, length: u16) -> u16 {
    let s = src.octets();
    let d = dst.octets();
    let acc = u64::from(u16::from_be_bytes([s[0], s[1]]))
        + u64::from(u16::from_be_bytes([s[2], s[3]]))
        + u64::from(u16::from_be_bytes([d[0], d[1]]))
        + u64::from(u16::from_be_bytes([d[2], d[3]]))
        + u64::from(u8::from(protocol))
        + u64::from(length);
    fold(acc)
}

/// Sum of the IPv6 pseudo-header of upper-layer checksums (RFC 8200
/// §8.1): source, destination, upper-layer length (32 bits), and the next
/// header.
#[inline]
pub fn pseudo_header_v6(
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    next_header: IpProtocol,
    length: u32,
) -> u16 {
    let mut acc = u64::from(data(&src.octets())) + u64::from(data(&dst.octets()));
    acc += u64::from(length >> 16) + u64::from(length & 0xffff);
    acc += u64::from(u8::from(next_header));
    fold(acc)
}

/// RFC 1624 incremental update: the new checksum field after one 16-bit word
/// covered by `checksum` changes from `old` to `new`.
///
/// Uses eqn. 3, `HC' = ~(~HC + ~m + m')`, which (unlike eqn. 2 of RFC 1141)
/// never produces `0x0000` for a header whose checksum should be `0xffff`'s
/// complement, so the result equals a full recomputation bit for bit.
#[inline]
pub fn update_u16(checksum: u16, old: u16, new: u16) -> u16 {
    let acc = u64::from(!checksum) + u64::from(!old) + u64::from(new);
    !fold(acc)
}

/// RFC 1624 update for a 32-bit field (an IPv4 address, for NAT-like
/// rewrites): two 16-bit updates.
#[inline]
pub fn update_u32(checksum: u16, old: u32, new: u32) -> u16 {
    let c = update_u16(checksum, (old >> 16) as u16, (new >> 16) as u16);
    update_u16(c, old as u16, new as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7
    /// sum to 0xddf2.
    #[test]
    fn rfc1071_example_sums_to_ddf2() {
        assert_eq!(
            data(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
    }

    #[test]
    fn odd_length_pads_the_last_byte_with_zero() {
        assert_eq!(data(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
        assert_eq!(data(&[0xff]), 0xff00);
        assert_eq!(data(&[]), 0);
    }

    /// RFC 1624 §4's example: HC = 0xdd2f, m = 0x5555 → m' = 0x3285 gives
    /// HC' = 0x0000 with eqn. 3.
    #[test]
    fn rfc1624_example_gives_zero_not_ffff() {
        assert_eq!(update_u16(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    #[test]
    fn incremental_update_equals_full_recomputation() {
        let mut header = [
            0x45, 0x00, 0x00, 0x54, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x01, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        let c = checksum(&header);
        header[10..12].copy_from_slice(&c.to_be_bytes());
        for ttl in (1..=64u8).rev() {
            let old = u16::from_be_bytes([header[8], header[9]]);
            header[8] = ttl - 1;
            let new = u16::from_be_bytes([header[8], header[9]]);
            let old_c = u16::from_be_bytes([header[10], header[11]]);
            let inc = update_u16(old_c, old, new);
            header[10..12].copy_from_slice(&[0, 0]);
            let full = checksum(&header);
            assert_eq!(inc, full, "ttl {ttl}");
            header[10..12].copy_from_slice(&inc.to_be_bytes());
            assert!(verifies(&header));
        }
    }
}
