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
/// Fast because the one's-complement sum does not depend on byte order
/// (RFC 1071 §2 (B)): it adds 16-byte blocks as native-endian 32-bit
/// halves into two independent 64-bit accumulators (no carries to fold
/// until the end, and two dependency chains), and swaps the bytes of the
/// folded result once. About twice as fast as summing big-endian words;
/// a test compares it with the textbook loop for every length up to 2000.
#[inline]
pub fn data(data: &[u8]) -> u16 {
    let mut a: u64 = 0;
    let mut b: u64 = 0;
    let mut blocks = data.chunks_exact(16);
    for c in &mut blocks {
        let (x, y) = c.split_at(8);
        let x = u64::from_ne_bytes(x.try_into().unwrap_or([0; 8]));
        let y = u64::from_ne_bytes(y.try_into().unwrap_or([0; 8]));
        a += (x & 0xffff_ffff) + (x >> 32);
        b += (y & 0xffff_ffff) + (y >> 32);
    }
    let mut acc = a + b;
    let rest = blocks.remainder();
    let mut quads = rest.chunks_exact(4);
    for c in &mut quads {
        acc += u64::from(u32::from_ne_bytes(c.try_into().unwrap_or([0; 4])));
    }
    let tail = quads.remainder();
    let mut last = [0u8; 4];
    last[..tail.len()].copy_from_slice(tail);
    acc += u64::from(u32::from_ne_bytes(last));
    let sum = fold(acc);
    if cfg!(target_endian = "little") {
        sum.swap_bytes()
    } else {
        sum
    }
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

    /// The textbook RFC 1071 loop: big-endian 16-bit words, one at a time.
    fn reference_sum(bytes: &[u8]) -> u16 {
        let mut acc: u64 = 0;
        for pair in bytes.chunks(2) {
            let hi = u64::from(pair[0]) << 8;
            let lo = pair.get(1).map_or(0, |&b| u64::from(b));
            acc += hi | lo;
        }
        fold(acc)
    }

    #[test]
    fn fast_sum_equals_the_textbook_loop_for_every_length() {
        let mut seed = 0x1234_5678_9abc_def0_u64;
        let bytes: Vec<u8> = (0..2000)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (seed >> 33) as u8
            })
            .collect();
        for len in 0..bytes.len() {
            for start in 0..3 {
                let slice = &bytes[start.min(len)..len];
                assert_eq!(data(slice), reference_sum(slice), "len {len} start {start}");
            }
        }
        assert_eq!(data(&[0xff; 1500]), reference_sum(&[0xff; 1500]));
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
