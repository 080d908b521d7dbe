//! Fuzz target: the wire format a vrouter receives. Any JSON that reads as
//! an `Update` is applied to a dataplane state (all or nothing) and, if
//! accepted, packets are classified through every program: nothing may
//! panic, whatever the sets and programs say.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::classify::{Packet, PolicyState};
use brindle_policy::program::{Direction, EndpointKey, Update};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(update) = serde_json::from_slice::<Update>(data) else {
        return;
    };
    let mut dp = PolicyState::default();
    if dp.apply(&update).is_err() {
        return;
    }
    let keys: Vec<EndpointKey> = update
        .programs
        .iter()
        .filter(|p| p.program.is_some())
        .map(|p| p.endpoint.clone())
        .collect();
    for k in &keys {
        for (proto, icmp) in [(6u8, None), (17, None), (1, Some((8u8, 0u8)))] {
            let pkt = Packet {
                src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
                protocol: proto,
                src_port: 40000,
                dst_port: 80,
                icmp,
            };
            let _ = dp.classify(k, Direction::Ingress, &pkt);
            let _ = dp.classify(k, Direction::Egress, &pkt);
        }
    }
});
