//! An MRT TABLE_DUMP_V2 file (RFC 6396) of N IPv4 /24s, for
//! `gobgp mrt inject`: a PEER_INDEX_TABLE and one RIB_IPV4_UNICAST record
//! per prefix, each with ORIGIN IGP, AS_PATH [`ORIGIN_AS`] (four-octet) and
//! NEXT_HOP [`NEXT_HOP`].
//!
//! The one copy: `brindle-perf control` uses it as a module, and
//! `ctrl/benches/learn_routes.rs` includes this file by path (std only, so
//! it compiles in either crate without a dependency between them).

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::Path;

/// The AS of the peer the table is attributed to (GoBGP in our runs).
pub const ORIGIN_AS: u32 = 65010;
/// The next hop of every route (GoBGP's address in our runs).
pub const NEXT_HOP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Entries written after the table proper: `gobgp mrt inject` loses the
/// tail of what it streams, so the tail is padding, from 100.64.0.0/10.
pub const PADDING: u32 = 5000;

/// MRT type TABLE_DUMP_V2.
const TABLE_DUMP_V2: u16 = 13;
/// Subtypes of TABLE_DUMP_V2.
const PEER_INDEX_TABLE: u16 = 1;
const RIB_IPV4_UNICAST: u16 = 2;

/// The i-th /24 of a table of `n`: the table from 20.0.0.0 upwards (up to
/// 2^24 - 20 * 2^16 of them), then the padding from 100.64.0.0.
pub fn prefix(i: u32, n: u32) -> Ipv4Addr {
    let slash24 = if i < n {
        (20u32 << 16) + i
    } else {
        (100u32 << 16) + (64 << 8) + (i - n)
    };
    Ipv4Addr::from(slash24 << 8)
}

/// Whether `addr` is the network of one of the first `n` table prefixes
/// or of the padding after them.
pub fn is_table_prefix(addr: Ipv4Addr, n: u32) -> bool {
    let a = u32::from(addr);
    if a & 0xff != 0 {
        return false;
    }
    let slash24 = a >> 8;
    let table = (20u32 << 16)..(20u32 << 16) + n;
    let pad_start = (100u32 << 16) + (64 << 8);
    table.contains(&slash24) || (pad_start..pad_start + PADDING).contains(&slash24)
}

fn record(out: &mut Vec<u8>, subtype: u16, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("MRT record too long"))?;
    out.extend_from_slice(&0u32.to_be_bytes()); // timestamp
    out.extend_from_slice(&TABLE_DUMP_V2.to_be_bytes());
    out.extend_from_slice(&subtype.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Ok(())
}

/// The file's bytes: `n` table prefixes and [`PADDING`] after them.
pub fn table_dump(n: u32) -> io::Result<Vec<u8>> {
    let entries = n
        .checked_add(PADDING)
        .filter(|e| u64::from(*e) <= (1 << 24) - (20 << 16))
        .ok_or_else(|| io::Error::other("too many routes for 20.0.0.0 upwards"))?;
    let mut out = Vec::with_capacity(entries as usize * 50 + 64);
    let nh = NEXT_HOP.octets();
    let mut pit = Vec::new();
    pit.extend_from_slice(&nh); // collector BGP ID
    pit.extend_from_slice(&0u16.to_be_bytes()); // view name length
    pit.extend_from_slice(&1u16.to_be_bytes()); // peer count
    pit.push(0x02); // peer type: IPv4 address, four-octet AS
    pit.extend_from_slice(&nh); // peer BGP ID
    pit.extend_from_slice(&nh); // peer address
    pit.extend_from_slice(&ORIGIN_AS.to_be_bytes());
    record(&mut out, PEER_INDEX_TABLE, &pit)?;
    let asn = ORIGIN_AS.to_be_bytes();
    #[rustfmt::skip]
    let attrs: [u8; 20] = [
        0x40, 1, 1, 0,                                        // ORIGIN IGP
        0x40, 2, 6, 2, 1, asn[0], asn[1], asn[2], asn[3],     // AS_PATH SEQUENCE [ORIGIN_AS]
        0x40, 3, 4, nh[0], nh[1], nh[2], nh[3],               // NEXT_HOP
    ];
    let mut entry = Vec::with_capacity(48);
    for i in 0..entries {
        entry.clear();
        entry.extend_from_slice(&i.to_be_bytes()); // sequence number
        entry.push(24);
        entry.extend_from_slice(&prefix(i, n).octets()[..3]);
        entry.extend_from_slice(&1u16.to_be_bytes()); // entry count
        entry.extend_from_slice(&0u16.to_be_bytes()); // peer index
        entry.extend_from_slice(&0u32.to_be_bytes()); // originated time
        entry.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        entry.extend_from_slice(&attrs);
        record(&mut out, RIB_IPV4_UNICAST, &entry)?;
    }
    Ok(out)
}

/// Writes [`table_dump`] of `n` to `path`.
pub fn write_table_dump(path: &Path, n: u32) -> io::Result<()> {
    std::fs::File::create(path)?.write_all(&table_dump(n)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_route_dump_is_a_peer_index_table_then_one_rib_entry_per_prefix() {
        let bytes = table_dump(1).unwrap();
        // Header: timestamp 0, type 13, subtype 1, length 21.
        assert_eq!(&bytes[..12], &[0, 0, 0, 0, 0, 13, 0, 1, 0, 0, 0, 21]);
        let pit = &bytes[12..12 + 21];
        assert_eq!(&pit[..4], &[10, 0, 0, 1]);
        assert_eq!(&pit[4..8], &[0, 0, 0, 1]);
        assert_eq!(pit[8], 0x02);
        assert_eq!(&pit[17..21], &65010u32.to_be_bytes());
        let rib = &bytes[33..];
        assert_eq!(&rib[..12], &[0, 0, 0, 0, 0, 13, 0, 2, 0, 0, 0, 38]);
        // Sequence 0, 20.0.0.0/24, one entry from peer 0.
        assert_eq!(&rib[12..20], &[0, 0, 0, 0, 24, 20, 0, 0]);
        assert_eq!(&rib[20..22], &[0, 1]);
        // 1 + PADDING records after the peer index table, 50 bytes each.
        assert_eq!(bytes.len(), 33 + 50 * (1 + PADDING as usize));
    }

    #[test]
    fn table_and_padding_prefixes_are_recognised_and_nothing_else() {
        assert_eq!(prefix(0, 10), Ipv4Addr::new(20, 0, 0, 0));
        assert_eq!(prefix(256, 1000), Ipv4Addr::new(20, 1, 0, 0));
        assert_eq!(prefix(10, 10), Ipv4Addr::new(100, 64, 0, 0));
        assert!(is_table_prefix(Ipv4Addr::new(20, 0, 9, 0), 10));
        assert!(!is_table_prefix(Ipv4Addr::new(20, 0, 10, 0), 10));
        assert!(is_table_prefix(Ipv4Addr::new(100, 64, 0, 0), 10));
        assert!(!is_table_prefix(Ipv4Addr::new(10, 244, 0, 0), 10));
        assert!(!is_table_prefix(Ipv4Addr::new(20, 0, 0, 1), 10));
    }
}
