//! The worker loop: bursts larger than one `rx_burst`, a small arena that
//! runs dry, a host port, and native routes via a gateway.

use std::net::Ipv4Addr;
use std::time::Instant;

use brindle_vrouter::demo::addr::*;
use brindle_vrouter::demo::frames::udp_frame;
use brindle_vrouter::endpoint::{Endpoint, GATEWAY_MAC};
use brindle_vrouter::fib::{Fib, NextHop};
use brindle_vrouter::frame::FrameArena;
use brindle_vrouter::pipeline::{BURST, PipelineConfig};
use brindle_vrouter::port::MemoryPort;
use brindle_vrouter::worker::Worker;

const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];
const HOST_PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];
const GW: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 254);
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

#[test]
fn a_small_arena_and_many_frames_forward_everything_over_several_polls() {
    let (mut fib, reader) = Fib::new();
    fib.insert("10.65.0.3/32".parse().unwrap(), NextHop::Local { port: 1 });
    let mut w = Worker::new(
        FrameArena::new_heap(8, 2048),
        PipelineConfig::new(NODE, 24),
        reader,
    );
    let (a, ha) = MemoryPort::new("pod-a", GATEWAY_MAC, 1500);
    let (b, hb) = MemoryPort::new("pod-b", GATEWAY_MAC, 1500);
    w.add_port(
        Box::new(a),
        Endpoint::pod(vec![POD_A.into()], Some(POD_A_MAC), 1500),
    );
    w.add_port(
        Box::new(b),
        Endpoint::pod(vec![POD_B.into()], Some(POD_B_MAC), 1500),
    );
    let frames = 3 * BURST + 5;
    for i in 0..frames {
        ha.inject(&udp_frame(
            POD_A_MAC,
            GATEWAY_MAC,
            POD_A,
            POD_B,
            64,
            &[i as u8; 18],
        ));
    }
    let now = Instant::now();
    let mut polls = 0;
    while ha.pending_rx() > 0 {
        w.poll_once(now);
        polls += 1;
        assert!(polls < 1000, "no progress");
        assert_eq!(
            w.arena().free_count(),
            8,
            "every chunk is back after each poll"
        );
    }
    let out = hb.take_transmitted();
    assert_eq!(out.len(), frames);
    // In order, each frame once.
    for (i, f) in out.iter().enumerate() {
        assert_eq!(f[f.len() - 1], i as u8);
    }
    let c = w.counters();
    assert_eq!(
        (c.rx_packets, c.tx_packets, c.dropped()),
        (frames as u64, frames as u64, 0)
    );
    assert!(polls >= frames / 8, "the arena bounds each burst");
}

#[test]
fn host_next_hops_and_gateways_leave_by_the_right_port() {
    let (mut fib, reader) = Fib::new();
    fib.insert("10.96.0.0/12".parse().unwrap(), NextHop::Host);
    fib.insert(
        "0.0.0.0/0".parse().unwrap(),
        NextHop::Gateway {
            via: GW.into(),
            port: 1,
        },
    );
    let mut w = Worker::new(
        FrameArena::new_heap(16, 2048),
        PipelineConfig::new(NODE, 24),
        reader,
    );
    let (a, ha) = MemoryPort::new("pod-a", GATEWAY_MAC, 1500);
    let (up, hup) = MemoryPort::new("uplink", UPLINK_MAC, 1500);
    let (host, hhost) = MemoryPort::new("host", HOST_MAC, 1500);
    w.add_port(
        Box::new(a),
        Endpoint::pod(vec![POD_A.into()], Some(POD_A_MAC), 1500),
    );
    w.add_port(Box::new(up), Endpoint::uplink(UPLINK_MAC, 1500));
    w.add_port(
        Box::new(host),
        Endpoint::host(HOST_MAC, HOST_PEER_MAC, 1500),
    );
    w.pipeline_mut().neigh_mut().insert(1, GW.into(), GW_MAC);
    let now = Instant::now();

    let service = Ipv4Addr::new(10, 96, 0, 10);
    ha.inject(&udp_frame(
        POD_A_MAC,
        GATEWAY_MAC,
        POD_A,
        service,
        64,
        &[1; 18],
    ));
    let internet = Ipv4Addr::new(1, 1, 1, 1);
    ha.inject(&udp_frame(
        POD_A_MAC,
        GATEWAY_MAC,
        POD_A,
        internet,
        64,
        &[2; 18],
    ));
    w.poll_once(now);

    assert_eq!(
        hhost.take_transmitted(),
        vec![udp_frame(
            HOST_MAC,
            HOST_PEER_MAC,
            POD_A,
            service,
            63,
            &[1; 18]
        )]
    );
    assert_eq!(
        hup.take_transmitted(),
        vec![udp_frame(UPLINK_MAC, GW_MAC, POD_A, internet, 63, &[2; 18])]
    );
    let c = w.counters();
    assert!(c.balanced());
    assert_eq!(c.forwarded, 2);
    assert_eq!(w.arena().free_count(), 16);
}
