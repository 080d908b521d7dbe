//! Prometheus metrics and health on 127.0.0.1:9092: `/metrics`, `/healthz`
//! (the worker answers), `/readyz` (uplink attached, node address set).
//!
//! Metrics are rendered from one snapshot of each worker per scrape into a
//! fresh `prometheus-client` registry (series labelled `worker="N"`; a
//! port's series come from the workers that own it or a share of its
//! queues), so a worker never touches an
//! atomic or a lock per packet for them: its counters are plain integers in
//! its own memory, copied out on request between two polls.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::control::PortRow;
use crate::counters::DropReason;
use crate::engine::{BATCH_BUCKETS, WorkerSnapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    port: String,
    backend: String,
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortOnly {
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    tier: String,
    policy: String,
    rule: String,
    direction: String,
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    worker: String,
    reason: String,
}

/// One worker's histogram: buckets (upper bound, count), sum, count.
type WorkerHistogram = (Vec<(f64, u64)>, f64, u64);

/// The batch-size histograms of the workers' snapshots.
#[derive(Debug)]
struct BatchHistogram {
    /// Per worker: buckets, sum, count.
    workers: Vec<WorkerHistogram>,
}

impl Collector for BatchHistogram {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            "brindle_vrouter_rx_batch_frames",
            "Frames per non-empty receive burst",
            None,
            MetricType::Histogram,
        )?;
        for (i, (buckets, sum, count)) in self.workers.iter().enumerate() {
            let labels = WorkerLabels {
                worker: i.to_string(),
            };
            let mut family = metric.encode_family(&labels)?;
            family.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                *sum, *count, buckets, None,
            )?;
        }
        Ok(())
    }
}

/// Renders the workers' snapshots (index = worker) in the Prometheus text
/// format.
pub fn render(
    snapshots: &[WorkerSnapshot],
    ports: &[PortRow],
    taps: &[crate::port::tap::TapStatsRow],
    routes: u64,
) -> String {
    let mut registry = Registry::with_prefix("brindle_vrouter");
    let families: Vec<Family<WorkerLabels, Counter>> = (0..WORKER_SERIES.len())
        .map(|_| Family::default())
        .collect();
    let drops = Family::<DropLabels, Counter>::default();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let w = WorkerLabels {
            worker: i.to_string(),
        };
        for (f, value) in families.iter().zip(worker_values(snapshot)) {
            f.get_or_create(&w).inc_by(value);
        }
        for r in DropReason::ALL {
            drops
                .get_or_create(&DropLabels {
                    worker: i.to_string(),
                    reason: r.name().into(),
                })
                .inc_by(snapshot.counters.drops_for(r));
        }
    }
    for ((name, help), f) in WORKER_SERIES.iter().zip(families) {
        registry.register(*name, *help, f);
    }
    registry.register("worker_drops", "Frames dropped, by reason", drops);
    let held = Family::<WorkerLabels, Gauge>::default();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let w = WorkerLabels {
            worker: i.to_string(),
        };
        held.get_or_create(&w)
            .set(i64::try_from(snapshot.counters.neighbor_held).unwrap_or(i64::MAX));
    }
    registry.register(
        "worker_neighbor_held",
        "Frames waiting now for their next hop's MAC",
        held,
    );
    let flows = Family::<WorkerLabels, Gauge>::default();
    let generation = Family::<WorkerLabels, Gauge>::default();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let w = WorkerLabels {
            worker: i.to_string(),
        };
        flows
            .get_or_create(&w)
            .set(i64::try_from(snapshot.flows.flows).unwrap_or(i64::MAX));
        generation
            .get_or_create(&w)
            .set(i64::try_from(snapshot.flows.generation).unwrap_or(i64::MAX));
    }
    registry.register(
        "worker_flows",
        "Flows in the worker's table now (expired ones until swept)",
        flows,
    );
    registry.register(
        "worker_policy_generation",
        "The network policy generation the worker enforces",
        generation,
    );
    let rule_p = Family::<RuleLabels, Counter>::default();
    let rule_b = Family::<RuleLabels, Counter>::default();
    let rules = crate::policy::sum_rules(snapshots.iter().map(|s| s.rules.as_slice()));
    for (k, c) in rules {
        let l = RuleLabels {
            tier: k.tier,
            policy: k.policy,
            rule: k.rule,
            direction: k.direction.into(),
            action: k.action.into(),
        };
        rule_p.get_or_create(&l).inc_by(c.packets);
        rule_b.get_or_create(&l).inc_by(c.bytes);
    }
    registry.register(
        "policy_rule_packets",
        "Network policy: packets a rule denied, allowed flows it classified (first packet)",
        rule_p,
    );
    registry.register(
        "policy_rule_bytes",
        "Network policy: bytes of the packets counted in policy_rule_packets",
        rule_b,
    );
    let rx_p = Family::<PortLabels, Counter>::default();
    let rx_b = Family::<PortLabels, Counter>::default();
    let tx_p = Family::<PortLabels, Counter>::default();
    let tx_b = Family::<PortLabels, Counter>::default();
    for (name, id, backend, owners) in ports {
        for &w in owners {
            let l = PortLabels {
                port: name.clone(),
                backend: (*backend).into(),
                worker: w.to_string(),
            };
            let s = snapshots
                .get(w)
                .and_then(|s| s.ports.get(*id as usize).copied())
                .unwrap_or_default();
            rx_p.get_or_create(&l).inc_by(s.rx_packets);
            rx_b.get_or_create(&l).inc_by(s.rx_bytes);
            tx_p.get_or_create(&l).inc_by(s.tx_packets);
            tx_b.get_or_create(&l).inc_by(s.tx_bytes);
        }
    }
    // AF_XDP ports: the fill target and the kernel's receive drops.
    let fill = Family::<PortLabels, Gauge<i64>>::default();
    let fill_empty = Family::<PortLabels, Counter>::default();
    let ring_full = Family::<PortLabels, Counter>::default();
    let kernel_drops = Family::<PortLabels, Counter>::default();
    for (name, id, backend, owners) in ports {
        for &w in owners {
            let Some(r) = snapshots
                .get(w)
                .and_then(|s| s.rings.get(*id as usize).copied().flatten())
            else {
                continue;
            };
            let l = PortLabels {
                port: name.clone(),
                backend: (*backend).into(),
                worker: w.to_string(),
            };
            fill.get_or_create(&l)
                .set(i64::try_from(r.fill_target).unwrap_or(i64::MAX));
            fill_empty.get_or_create(&l).inc_by(r.fill_ring_empty);
            ring_full.get_or_create(&l).inc_by(r.rx_ring_full);
            kernel_drops.get_or_create(&l).inc_by(r.rx_dropped);
        }
    }
    registry.register(
        "port_xsk_fill_target",
        "Frames an AF_XDP port keeps on its fill rings (grows while the kernel drains them)",
        fill,
    );
    registry.register(
        "port_xsk_fill_ring_empty",
        "Frames the kernel dropped because the port's fill ring was empty (XDP_STATISTICS)",
        fill_empty,
    );
    registry.register(
        "port_xsk_rx_ring_full",
        "Frames the kernel dropped because the port's RX ring was full (XDP_STATISTICS)",
        ring_full,
    );
    registry.register(
        "port_xsk_rx_dropped",
        "Frames the kernel dropped on the port's sockets, any reason (XDP_STATISTICS)",
        kernel_drops,
    );
    registry.register("port_rx_packets", "Frames received on the port", rx_p);
    registry.register("port_rx_bytes", "Bytes received on the port", rx_b);
    registry.register("port_tx_packets", "Frames transmitted on the port", tx_p);
    registry.register("port_tx_bytes", "Bytes transmitted on the port", tx_b);
    if let Some((_, first)) = taps.first() {
        // One family per TAP counter, labelled by port (all its queues).
        for (i, (key, _)) in first.iter().enumerate() {
            let f = Family::<PortOnly, Counter>::default();
            for (name, values) in taps {
                f.get_or_create(&PortOnly { port: name.clone() })
                    .inc_by(values[i].1);
            }
            registry.register(
                format!("port_tap_{key}"),
                format!("TAP port counter {key} (all its queues)"),
                f,
            );
        }
    }
    let g = Gauge::<i64>::default();
    g.set(i64::try_from(routes).unwrap_or(i64::MAX));
    registry.register("routes", "Routes in the FIB", g);
    let g = Gauge::<i64>::default();
    g.set(ports.len() as i64);
    registry.register("ports", "Ports attached", g);
    registry.register_collector(Box::new(BatchHistogram {
        workers: snapshots
            .iter()
            .map(|s| {
                (
                    BATCH_BUCKETS
                        .iter()
                        .zip(s.batch_sizes)
                        .map(|(&le, n)| (le as f64, n))
                        .collect(),
                    s.batch_sum as f64,
                    s.batch_sizes.iter().sum(),
                )
            })
            .collect(),
    }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// Per-worker counter series: name and help, in [`worker_values`] order.
const WORKER_SERIES: [(&str, &str); 28] = [
    ("worker_rx_packets", "Frames received by the worker"),
    ("worker_rx_bytes", "Bytes received by the worker"),
    ("worker_tx_packets", "Frames transmitted by the worker"),
    ("worker_tx_bytes", "Bytes transmitted by the worker"),
    ("worker_forwarded", "Packets routed"),
    ("worker_arp_replies", "Proxy ARP replies"),
    ("worker_encap_ipip", "Packets encapsulated in IPIP"),
    ("worker_encap_vxlan", "Packets encapsulated in VXLAN"),
    ("worker_decap_ipip", "IPIP packets decapsulated"),
    ("worker_decap_vxlan", "VXLAN packets decapsulated"),
    ("worker_busy_polls", "Poll loops that received frames"),
    ("worker_idle_polls", "Poll loops that received none"),
    (
        "worker_handoff_out",
        "Frames sent to a port of another worker (by descriptor, shared UMEM)",
    ),
    (
        "worker_handoff_in",
        "Frames other workers handed to this worker's ports",
    ),
    (
        "worker_handoff_drops",
        "Handed-over frames the port's TX ring refused",
    ),
    (
        "worker_handoff_returned",
        "Chunks of this worker's range returned by other workers",
    ),
    (
        "worker_cpu_user_microseconds",
        "CPU time of the worker thread in user mode (pipeline, rings)",
    ),
    (
        "worker_cpu_system_microseconds",
        "CPU time of the worker thread in the kernel (sendto, recvfrom, poll)",
    ),
    (
        "worker_neighbor_released",
        "Frames sent after waiting for their next hop's MAC",
    ),
    (
        "worker_flows_new",
        "Flows classified, allowed and tracked (network policy)",
    ),
    (
        "worker_flows_revalidated",
        "Tracked flows reclassified under a newer policy and kept",
    ),
    ("worker_flows_expired", "Tracked flows that timed out"),
    (
        "worker_flows_full",
        "New flows refused because the flow table was full",
    ),
    (
        "worker_super_whole",
        "TAP super-packets (TSO) carried whole to a TAP pod (one frame each)",
    ),
    (
        "worker_super_cut",
        "TAP super-packets cut into segments before the pipeline",
    ),
    (
        "worker_gro_super",
        "Super-packets made by userspace GRO into a TAP (one write each)",
    ),
    ("worker_gro_segments", "Frames those GRO super-packets held"),
    (
        "worker_handoff_redirected",
        "Frames of a pod's flow read by another worker (a TAP pod's queue, the host port) handed unprocessed to the worker keeping the flow",
    ),
];

fn worker_values(snapshot: &WorkerSnapshot) -> [u64; 28] {
    let c = &snapshot.counters;
    let h = &snapshot.handoff;
    [
        c.rx_packets,
        c.rx_bytes,
        c.tx_packets,
        c.tx_bytes,
        c.forwarded,
        c.arp_replies,
        c.encap_ipip,
        c.encap_vxlan,
        c.decap_ipip,
        c.decap_vxlan,
        snapshot.busy_polls,
        snapshot.idle_polls,
        h.out,
        h.r#in,
        h.drops,
        h.returned,
        snapshot.cpu_user_us,
        snapshot.cpu_system_us,
        c.neighbor_released,
        snapshot.flows.table.new,
        snapshot.flows.table.revalidated,
        snapshot.flows.table.expired,
        snapshot.flows.table.full,
        c.super_whole,
        c.super_cut,
        c.gro_super,
        c.gro_segments,
        h.redirected,
    ]
}
