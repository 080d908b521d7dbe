//! The AF_PACKET fallback on veths in namespaces made by the test: the same
//! receive and transmit checks as the AF_XDP tests.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use brindle_xsk::{Desc, PacketConfig, PacketSocket, ifindex};
use common::{Enter, Netns, Seen, classify, mac, udp_frame, unique_octet, veth};

const CHUNK: usize = 2048;

#[test]
#[ignore = "requires root and network namespaces"]
fn frame_sent_from_a_namespace_arrives_in_the_packet_socket() -> Result<()> {
    let ns_a = Netns::new("pa")?;
    let ns_b = Netns::new("pb")?;
    let o = unique_octet();
    let (a_addr, b_addr) = (Ipv4Addr::new(10, 207, o, 1), Ipv4Addr::new(10, 207, o, 2));
    veth(
        &ns_a,
        "va",
        mac(7, 1),
        Some(&format!("{a_addr}/24")),
        &ns_b,
        "vb",
        mac(7, 2),
        Some(&format!("{b_addr}/24")),
    )?;
    let mut sock = ns_b.enter(|| -> Result<_> {
        Ok(PacketSocket::bind(
            ifindex("vb")?,
            &PacketConfig::default(),
        )?)
    })?;

    let payload = b"brindle-packet receive test".to_vec();
    ns_a.enter(|| UdpSocket::bind((a_addr, 0))?.send_to(&payload, (b_addr, 9999)))?;

    let mut mem = vec![0u8; 64 * CHUNK];
    let chunks: Vec<u64> = (0..64).map(|i| (i * CHUNK) as u64).collect();
    let mut descs = [Desc::default(); 64];
    let mut found = None;
    let mut seen = Vec::new();
    for _ in 0..50 {
        sock.poll_rx(100)?;
        let n = sock.rx_burst(&mut mem, &chunks, &mut descs);
        for d in &descs[..n] {
            assert_eq!(d.addr % CHUNK as u64, 256, "frames land after the headroom");
            let frame = &mem[d.addr as usize..d.addr as usize + d.len as usize];
            seen.push(classify(frame));
            if matches!(classify(frame), Seen::Udp { dport: 9999, .. }) {
                found = Some(frame.to_vec());
            }
        }
        if found.is_some() {
            break;
        }
    }
    let frame = found.with_context(|| format!("UDP frame not received; saw {seen:?}"))?;
    assert_eq!(frame[..6], mac(7, 2));
    assert_eq!(frame[6..12], mac(7, 1));
    assert_eq!(
        classify(&frame),
        Seen::Udp {
            dst: b_addr,
            dport: 9999,
            payload
        }
    );
    let stats = sock.stats()?;
    ensure!(stats.rx_packets >= 1, "{stats:?}");
    assert_eq!(stats.rx_too_long, 0);
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn frame_put_on_the_packet_tx_ring_leaves_on_the_wire() -> Result<()> {
    let ns_a = Netns::new("pa")?;
    let ns_b = Netns::new("pb")?;
    let o = unique_octet();
    let (a_addr, b_addr) = (Ipv4Addr::new(10, 208, o, 1), Ipv4Addr::new(10, 208, o, 2));
    veth(
        &ns_a,
        "va",
        mac(8, 1),
        Some(&format!("{a_addr}/24")),
        &ns_b,
        "vb",
        mac(8, 2),
        Some(&format!("{b_addr}/24")),
    )?;
    let mut sock = ns_b.enter(|| -> Result<_> {
        Ok(PacketSocket::bind(
            ifindex("vb")?,
            &PacketConfig::default(),
        )?)
    })?;
    let receiver = ns_a.enter(|| UdpSocket::bind((a_addr, 7777)))?;
    receiver.set_read_timeout(Some(Duration::from_secs(5)))?;

    let payload = b"brindle-packet transmit test";
    let frame = udp_frame(mac(8, 1), mac(8, 2), b_addr, a_addr, 4343, 7777, payload);
    let mut mem = vec![0u8; 4 * CHUNK];
    let at = CHUNK + 256;
    mem[at..at + frame.len()].copy_from_slice(&frame);
    let descs = [
        Desc {
            addr: at as u64,
            len: frame.len() as u32,
        },
        Desc {
            addr: at as u64,
            len: frame.len() as u32,
        },
    ];
    assert_eq!(sock.tx_burst(&mem, &descs), 2);
    assert!(sock.kick_tx()?);
    for _ in 0..2 {
        let mut buf = [0u8; 128];
        let (len, from) = receiver
            .recv_from(&mut buf)
            .context("frame never reached the peer")?;
        assert_eq!(&buf[..len], payload);
        assert_eq!(from, (b_addr, 4343).into());
    }
    // A descriptor outside the caller's memory is taken and counted, not sent.
    assert_eq!(
        sock.tx_burst(
            &mem,
            &[Desc {
                addr: 1 << 40,
                len: 60
            }]
        ),
        1
    );
    assert_eq!(sock.stats()?.tx_wrong_format, 1);
    Ok(())
}
