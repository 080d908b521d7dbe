use std::net::IpAddr;

use super::parse::{seen_v4, seen_v6};

fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let len = (p.len() + l4.len()) as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p.extend_from_slice(l4);
    p
}

#[test]
fn a_tcp_segment_gives_ports_and_flags() {
    let mut tcp = [0u8; 20];
    tcp[..4].copy_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
    tcp[13] = 0x12;
    let s = seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 6, &tcp)).expect("parses");
    assert_eq!(s.tuple.src, IpAddr::from([10, 0, 0, 1]));
    assert_eq!((s.tuple.src_port, s.tuple.dst_port), (40000, 80));
    assert_eq!(s.tcp_flags, 0x12);
    // Truncated: not trackable.
    assert!(seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 6, &tcp[..10])).is_none());
}

#[test]
fn an_echo_uses_its_identifier_and_an_error_quotes_its_flow() {
    let echo = [8, 0, 0, 0, 0x12, 0x34, 0, 1];
    let s = seen_v4(&v4([10, 0, 0, 1], [10, 0, 0, 2], 1, &echo)).expect("parses");
    assert_eq!((s.tuple.src_port, s.tuple.dst_port), (0x1234, 0x1234));
    assert_eq!(s.icmp, Some((8, 0)));
    let quoted = v4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        17,
        &[0x9c, 0x40, 0, 53, 0, 8, 0, 0],
    );
    let mut err = vec![3, 3, 0, 0, 0, 0, 0, 0];
    err.extend_from_slice(&quoted);
    let s = seen_v4(&v4([10, 0, 0, 2], [10, 0, 0, 1], 1, &err)).expect("parses");
    let q = s.quoted.expect("the quote is read");
    assert_eq!((q.protocol, q.src_port, q.dst_port), (17, 40000, 53));
}

#[test]
fn a_later_fragment_is_not_trackable_and_ipv6_reads_its_ports() {
    let mut p = v4([10, 0, 0, 1], [10, 0, 0, 2], 17, &[0; 8]);
    p[6..8].copy_from_slice(&[0x00, 0x10]);
    assert!(seen_v4(&p).is_none());
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
    v6.extend_from_slice(&[0xfd; 16]);
    v6.extend_from_slice(&[0xfe; 16]);
    v6.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    let s = seen_v6(&v6).expect("parses");
    assert_eq!(
        (s.tuple.protocol, s.tuple.src_port, s.tuple.dst_port),
        (17, 40000, 53)
    );
}
