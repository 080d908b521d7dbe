//! Checks that the harness itself is right, on real veths (needs root):
//! the sink counts exactly what the generator sent at a low rate, loss
//! made on purpose (an iptables DROP for one flow) is counted exactly, and
//! the latency histogram is sane. `brindle-perf selftest` and the root
//! tests run these.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Serialize;

use crate::frame::FrameSize;
use crate::runner::{RunError, flow_spec};
use crate::topo::{Shape, Topology};
use crate::traffic::{
    GeneratorConfig, GeneratorKind, GeneratorResult, Rate, Sink, SinkConfig, SinkResult,
    TrafficError, spawn_generator,
};

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures.
    pub detail: String,
}

/// Sends `rate` pps of `flows` flows for `duration` through `topology`
/// with the `kind` generator.
pub fn send_and_count(
    kind: GeneratorKind,
    topology: &Topology,
    flows: u16,
    rate: f64,
    duration: Duration,
    tag: u16,
) -> Result<(GeneratorResult, SinkResult), RunError> {
    let spec = flow_spec(topology);
    let sink = Sink::start(SinkConfig {
        queues: 1,
        endpoint: topology.sink.clone(),
        tag,
        base_src_port: spec.base_src_port,
        flows,
        frames: 1024,
    })?;
    let sent = spawn_generator(
        GeneratorConfig {
            queue: 0,
            stream: 0,
            kind,
            endpoint: topology.generator.clone(),
            flow: spec,
            flows,
            size: FrameSize::Fixed(64),
            rate: Rate::Pps(rate),
            duration,
            tag,
            cpu: None,
            frames: 1024,
        },
        Arc::new(AtomicBool::new(false)),
    )
    .join()
    .map_err(|_| TrafficError::Thread("generator"))??;
    std::thread::sleep(Duration::from_millis(200));
    let seen = sink.finish()?;
    Ok((sent, seen))
}

/// Plain veth pair, 2000 pps for 0.5 s with the `kind` generator:
/// received == sent, nothing lost or reordered, latency min > 0 and
/// p50 <= p99 <= max.
pub fn exact_count_on_a_plain_veth(
    kind: GeneratorKind,
) -> Result<(Vec<Check>, GeneratorResult, SinkResult), RunError> {
    let topology = Topology::build(Shape::Direct)?;
    let (sent, seen) = send_and_count(
        kind,
        &topology,
        4,
        2_000.0,
        Duration::from_millis(500),
        0x5e1f,
    )?;
    let c = &seen.counter;
    let mut checks = vec![Check {
        name: "sink counts exactly the frames sent".into(),
        passed: sent.sent > 0 && c.received == sent.sent && c.lost(sent.sent) == 0,
        detail: format!(
            "sent {}, received {}, foreign {}",
            sent.sent, c.received, seen.foreign
        ),
    }];
    checks.push(Check {
        name: "no reordering on one veth".into(),
        passed: c.reordered == 0,
        detail: format!("reordered {}", c.reordered),
    });
    checks.push(Check {
        name: "per-flow counts match".into(),
        passed: seen.per_flow == sent.per_flow,
        detail: format!("sent {:?}, received {:?}", sent.per_flow, seen.per_flow),
    });
    let lat = c.latency_summary();
    checks.push(Check {
        name: "latency histogram sane (0 < min <= p50 <= p99 <= max)".into(),
        passed: lat.as_ref().is_some_and(|l| {
            l.min_ns > 0
                && l.min_ns <= l.p50_ns
                && l.p50_ns <= l.p99_ns
                && l.p99_ns <= l.max_ns
                && l.count == c.received
        }),
        detail: lat.map_or("empty".into(), |l| {
            format!(
                "min {} ns, p50 {} ns, p99 {} ns, max {} ns",
                l.min_ns, l.p50_ns, l.p99_ns, l.max_ns
            )
        }),
    });
    Ok((checks, sent, seen))
}

/// Routed topology, an iptables DROP for flow `dropped` of 4 in the
/// router: the sink sees none of that flow and the loss is exactly what
/// the generator sent of it.
pub fn loss_of_one_dropped_flow_is_counted()
-> Result<(Vec<Check>, GeneratorResult, SinkResult), RunError> {
    const DROPPED: u16 = 2;
    let topology = Topology::build(Shape::Routed)?;
    let spec = flow_spec(&topology);
    let router = topology
        .first_node()
        .ok_or(TrafficError::Thread("router"))?;
    let port = spec.src_port(DROPPED).to_string();
    router.exec(&[
        "iptables", "-A", "FORWARD", "-p", "udp", "--sport", &port, "-j", "DROP",
    ])?;
    let (sent, seen) = send_and_count(
        GeneratorKind::Live,
        &topology,
        4,
        4_000.0,
        Duration::from_millis(500),
        0x5e20,
    )?;
    let c = &seen.counter;
    let dropped_sent = sent
        .per_flow
        .get(usize::from(DROPPED))
        .copied()
        .unwrap_or(0);
    let checks = vec![
        Check {
            name: "the dropped flow was sent".into(),
            passed: dropped_sent > 0,
            detail: format!("per flow sent {:?}", sent.per_flow),
        },
        Check {
            name: "loss equals the dropped flow's frames".into(),
            passed: c.lost(sent.sent) == dropped_sent && c.received == sent.sent - dropped_sent,
            detail: format!(
                "sent {}, received {}, lost {}, dropped flow sent {}",
                sent.sent,
                c.received,
                c.lost(sent.sent),
                dropped_sent
            ),
        },
        Check {
            name: "no frame of the dropped flow arrived".into(),
            passed: seen.per_flow.get(usize::from(DROPPED)) == Some(&0),
            detail: format!("per flow received {:?}", seen.per_flow),
        },
    ];
    Ok((checks, sent, seen))
}
