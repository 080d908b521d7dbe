//! The live-frames generator on a veth pair made by the test: every frame
//! the program runs arrives at the peer's UDP socket, once, with its own
//! sequence number and a timestamp taken while it was sent.

mod common;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use anyhow::{Result, ensure};
use brindle_xsk::{FlowRotation, LiveFrameConfig, LiveFrameGenerator, ifindex};
use common::{Enter, Netns, mac, udp_frame, unique_octet, veth};
use nix::sys::socket::{setsockopt, sockopt};
use nix::time::{ClockId, clock_gettime};

fn monotonic_ns() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// A kernel that refuses live frames outright (EPERM: seen on a 6.18 VM
/// kernel whose root lacks CAP_SYS_RESOURCE) cannot run these tests: they
/// say so on stderr and pass. Any other error still fails them.
fn not_run(e: &brindle_xsk::Error) {
    eprintln!("NOT RUN: this kernel refuses BPF_PROG_TEST_RUN live frames: {e}");
}

/// Payload: seq (8, big-endian) | timestamp (8) | marker.
const SEQ_OFFSET: u16 = 14 + 20 + 8;
const ROUNDS: u32 = 10;
const PER_ROUND: u32 = 100;

#[test]
#[ignore = "requires root and network namespaces"]
fn every_generated_frame_arrives_once_with_its_own_sequence_number() -> Result<()> {
    let ns_gen = Netns::new("lg")?;
    let ns_sink = Netns::new("ls")?;
    let o = unique_octet();
    let (gen_addr, sink_addr) = (Ipv4Addr::new(10, 208, o, 1), Ipv4Addr::new(10, 208, o, 2));
    veth(
        &ns_gen,
        "lg0",
        mac(9, 1),
        Some(&format!("{gen_addr}/24")),
        &ns_sink,
        "ls0",
        mac(9, 2),
        Some(&format!("{sink_addr}/24")),
    )?;
    // XDP frames redirected into a veth need NAPI on its peer: GRO gives it
    // without an XDP program there.
    ns_sink.exec(&["ethtool", "-K", "ls0", "gro", "on"])?;

    let sock = ns_sink.enter(|| UdpSocket::bind((sink_addr, 9000)))?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    // A datagram made from an XDP frame is charged a whole page: room for
    // a round of them, above net.core.rmem_max.
    setsockopt(&sock, sockopt::RcvBufForce, &(4 << 20))?;
    let mut payload = vec![0u8; 16];
    payload.extend_from_slice(b"brindle-live");
    // UDP checksum 0: the stamps change the payload after it is built.
    let frame = udp_frame(
        mac(9, 2),
        mac(9, 1),
        gen_addr,
        sink_addr,
        4000,
        9000,
        &payload,
    );

    let before = monotonic_ns();
    let mut seqs = BTreeSet::new();
    let mut received = 0u32;
    let mut last_ts = 0u64;
    let mut buf = [0u8; 2048];
    let Some((next_seq, after)) = ns_gen.enter(|| -> Result<Option<(u64, u64)>> {
        let mut generator = LiveFrameGenerator::new(
            &frame,
            LiveFrameConfig {
                egress_ifindex: ifindex("lg0")?,
                ingress_ifindex: 0,
                rx_queue: 0,
                batch_size: 32,
                seq_offset: Some(SEQ_OFFSET),
                timestamp_offset: Some(SEQ_OFFSET + 8),
                flows: None,
            },
        )?;
        generator.set_next_seq(5)?;
        for round in 0..ROUNDS {
            match generator.send(PER_ROUND) {
                Err(e) if round == 0 && e.is_live_frames_refused() => {
                    not_run(&e);
                    return Ok(None);
                }
                r => r?,
            }
            // The peer's receive work ran in the batch's softirq: the
            // datagrams are queued by now. Drain them between rounds so
            // the socket buffer never overflows.
            for _ in 0..PER_ROUND {
                let n = sock.recv(&mut buf).map_err(|e| {
                    let stats = |ns: &Netns, dev: &str| {
                        ns.exec(&["ethtool", "-S", dev]).unwrap_or_default()
                            + &ns.ip(&["-s", "link", "show", dev]).unwrap_or_default()
                    };
                    anyhow::anyhow!(
                        "after {received} datagrams: {e}\n{}\n{}",
                        stats(&ns_gen, "lg0"),
                        stats(&ns_sink, "ls0")
                    )
                })?;
                ensure!(n == payload.len(), "payload length {n}");
                ensure!(&buf[16..n] == b"brindle-live", "foreign datagram");
                let seq = u64::from_be_bytes(buf[..8].try_into()?);
                let ts = u64::from_be_bytes(buf[8..16].try_into()?);
                ensure!(seqs.insert(seq), "sequence number {seq} twice");
                ensure!(ts >= last_ts, "timestamps go back: {ts} after {last_ts}");
                last_ts = ts;
                received += 1;
            }
        }
        Ok(Some((generator.next_seq()?, monotonic_ns())))
    })?
    else {
        return Ok(());
    };

    // Nothing more than what was sent.
    ensure!(
        sock.recv(&mut buf).is_err(),
        "a datagram beyond the {} sent",
        ROUNDS * PER_ROUND
    );
    assert_eq!(received, ROUNDS * PER_ROUND);
    assert_eq!(next_seq, 5 + u64::from(ROUNDS * PER_ROUND));
    let expected: BTreeSet<u64> = (5..next_seq).collect();
    assert_eq!(seqs, expected, "every number from the start, each once");
    assert!(
        (before..=after).contains(&last_ts),
        "timestamp {last_ts} is CLOCK_MONOTONIC between {before} and {after}"
    );
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_paced_timed_run_rotates_flows_and_its_count_is_what_arrived() -> Result<()> {
    const RATE: f64 = 2_000.0;
    const FLOWS: u16 = 4;
    let ns_gen = Netns::new("lg")?;
    let ns_sink = Netns::new("ls")?;
    let o = unique_octet();
    let (gen_addr, sink_addr) = (Ipv4Addr::new(10, 208, o, 1), Ipv4Addr::new(10, 208, o, 2));
    veth(
        &ns_gen,
        "lg0",
        mac(9, 1),
        Some(&format!("{gen_addr}/24")),
        &ns_sink,
        "ls0",
        mac(9, 2),
        Some(&format!("{sink_addr}/24")),
    )?;
    ns_sink.exec(&["ethtool", "-K", "ls0", "gro", "on"])?;
    let sock = ns_sink.enter(|| UdpSocket::bind((sink_addr, 9000)))?;
    sock.set_read_timeout(Some(Duration::from_millis(300)))?;
    setsockopt(&sock, sockopt::RcvBufForce, &(16 << 20))?;
    let payload = vec![0u8; 16];
    let frame = udp_frame(
        mac(9, 2),
        mac(9, 1),
        gen_addr,
        sink_addr,
        4000,
        9000,
        &payload,
    );

    let started = std::time::Instant::now();
    let Some(sent) = ns_gen.enter(|| -> Result<Option<u64>> {
        let mut generator = LiveFrameGenerator::new(
            &frame,
            LiveFrameConfig {
                egress_ifindex: ifindex("lg0")?,
                ingress_ifindex: 0,
                rx_queue: 0,
                batch_size: 0,
                seq_offset: Some(SEQ_OFFSET),
                timestamp_offset: Some(SEQ_OFFSET + 8),
                flows: Some(FlowRotation {
                    offset: 14 + 20,
                    base: 5000,
                    count: FLOWS,
                }),
            },
        )?;
        generator.set_rate(Some(RATE), 8)?;
        let sent = match generator.send_for(Duration::from_millis(400), &|| false) {
            Err(e) if e.is_live_frames_refused() => {
                not_run(&e);
                return Ok(None);
            }
            r => r?,
        };
        ensure!(generator.next_seq()? == sent, "the counter started at 0");
        Ok(Some(sent))
    })?
    else {
        return Ok(());
    };
    let elapsed = started.elapsed().as_secs_f64();

    let mut seqs = BTreeSet::new();
    let mut per_flow = [0u64; FLOWS as usize];
    let mut buf = [0u8; 2048];
    while let Ok((n, from)) = sock.recv_from(&mut buf) {
        ensure!(n == payload.len(), "payload length {n}");
        let seq = u64::from_be_bytes(buf[..8].try_into()?);
        ensure!(seqs.insert(seq), "sequence number {seq} twice");
        let flow = from.port().wrapping_sub(5000);
        ensure!(flow < FLOWS, "source port {}", from.port());
        ensure!(
            u64::from(flow) == seq % u64::from(FLOWS),
            "seq {seq} from flow {flow}"
        );
        per_flow[usize::from(flow)] += 1;
    }
    ensure!(sent > 0, "nothing sent");
    assert_eq!(seqs.len() as u64, sent, "every frame sent arrived, once");
    assert_eq!(seqs, (0..sent).collect::<BTreeSet<u64>>());
    let rotation = FlowRotation {
        offset: 34,
        base: 5000,
        count: FLOWS,
    };
    for (k, &n) in per_flow.iter().enumerate() {
        assert_eq!(n, rotation.frames_of(k as u16, 0, sent), "flow {k}");
    }
    // Paced: never more than the rate allows over the whole run, plus the
    // first frame and the burst allowance.
    assert!(
        (sent as f64) <= RATE * elapsed + 1.0 + 8.0,
        "{sent} frames in {elapsed:.3} s at {RATE} pps"
    );
    Ok(())
}
