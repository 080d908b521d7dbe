//! Prometheus metrics and health on 127.0.0.1:9092: `/metrics`, `/healthz`
//! (the worker answers), `/readyz` (uplink attached, node address set).
//!
//! Metrics are rendered from one snapshot of the worker per scrape into a
//! fresh `prometheus-client` registry, so the worker never touches an
//! atomic or a lock per packet for them: its counters are plain integers in
//! its own memory, copied out on request between two polls.

use std::net::TcpListener;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::counters::DropReason;
use crate::daemon::control::Control;
use crate::daemon::engine::{BATCH_BUCKETS, WorkerSnapshot};
use crate::daemon::serve::{http_get, http_reply};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    port: String,
    backend: String,
    worker: String,
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

/// The batch-size histogram of one snapshot, encoded as a histogram.
#[derive(Debug)]
struct BatchHistogram {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl Collector for BatchHistogram {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let labels = WorkerLabels { worker: "0".into() };
        let mut metric = encoder.encode_descriptor(
            "brindle_vrouter_rx_batch_frames",
            "Frames per non-empty receive burst",
            None,
            MetricType::Histogram,
        )?;
        let mut family = metric.encode_family(&labels)?;
        family.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.sum,
            self.count,
            &self.buckets,
            None,
        )
    }
}

/// Renders the snapshot in the Prometheus text format.
pub fn render(
    snapshot: &WorkerSnapshot,
    ports: &[(String, crate::frame::PortId, &'static str)],
    routes: u64,
) -> String {
    let mut registry = Registry::with_prefix("brindle_vrouter");
    let w = WorkerLabels { worker: "0".into() };
    let c = &snapshot.counters;
    for (name, help, value) in [
        (
            "worker_rx_packets",
            "Frames received by the worker",
            c.rx_packets,
        ),
        (
            "worker_rx_bytes",
            "Bytes received by the worker",
            c.rx_bytes,
        ),
        (
            "worker_tx_packets",
            "Frames transmitted by the worker",
            c.tx_packets,
        ),
        (
            "worker_tx_bytes",
            "Bytes transmitted by the worker",
            c.tx_bytes,
        ),
        ("worker_forwarded", "Packets routed", c.forwarded),
        ("worker_arp_replies", "Proxy ARP replies", c.arp_replies),
        (
            "worker_encap_ipip",
            "Packets encapsulated in IPIP",
            c.encap_ipip,
        ),
        (
            "worker_encap_vxlan",
            "Packets encapsulated in VXLAN",
            c.encap_vxlan,
        ),
        (
            "worker_decap_ipip",
            "IPIP packets decapsulated",
            c.decap_ipip,
        ),
        (
            "worker_decap_vxlan",
            "VXLAN packets decapsulated",
            c.decap_vxlan,
        ),
        (
            "worker_busy_polls",
            "Poll loops that received frames",
            snapshot.busy_polls,
        ),
        (
            "worker_idle_polls",
            "Poll loops that received none",
            snapshot.idle_polls,
        ),
    ] {
        let f = Family::<WorkerLabels, Counter>::default();
        f.get_or_create(&w).inc_by(value);
        registry.register(name, help, f);
    }
    let drops = Family::<DropLabels, Counter>::default();
    for r in DropReason::ALL {
        drops
            .get_or_create(&DropLabels {
                worker: "0".into(),
                reason: r.name().into(),
            })
            .inc_by(c.drops_for(r));
    }
    registry.register("worker_drops", "Frames dropped, by reason", drops);
    let rx_p = Family::<PortLabels, Counter>::default();
    let rx_b = Family::<PortLabels, Counter>::default();
    let tx_p = Family::<PortLabels, Counter>::default();
    let tx_b = Family::<PortLabels, Counter>::default();
    for (name, id, backend) in ports {
        let l = PortLabels {
            port: name.clone(),
            backend: (*backend).into(),
            worker: "0".into(),
        };
        let s = snapshot
            .ports
            .get(*id as usize)
            .copied()
            .unwrap_or_default();
        rx_p.get_or_create(&l).inc_by(s.rx_packets);
        rx_b.get_or_create(&l).inc_by(s.rx_bytes);
        tx_p.get_or_create(&l).inc_by(s.tx_packets);
        tx_b.get_or_create(&l).inc_by(s.tx_bytes);
    }
    registry.register("port_rx_packets", "Frames received on the port", rx_p);
    registry.register("port_rx_bytes", "Bytes received on the port", rx_b);
    registry.register("port_tx_packets", "Frames transmitted on the port", tx_p);
    registry.register("port_tx_bytes", "Bytes transmitted on the port", tx_b);
    let g = Gauge::<i64>::default();
    g.set(i64::try_from(routes).unwrap_or(i64::MAX));
    registry.register("routes", "Routes in the FIB", g);
    let g = Gauge::<i64>::default();
    g.set(ports.len() as i64);
    registry.register("ports", "Ports attached", g);
    registry.register_collector(Box::new(BatchHistogram {
        buckets: BATCH_BUCKETS
            .iter()
            .zip(snapshot.batch_sizes)
            .map(|(&le, n)| (le as f64, n))
            .collect(),
        sum: snapshot.batch_sum as f64,
        count: snapshot.batch_sizes.iter().sum(),
    }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process exits.
pub fn serve_http(listener: TcpListener, control: &Mutex<Control>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let Some(path) = http_get(&mut stream) else {
            http_reply(
                &mut stream,
                "400 Bad Request",
                "text/plain",
                "bad request\n",
            );
            continue;
        };
        let c = control.lock().unwrap_or_else(|e| e.into_inner());
        match path.as_str() {
            "/metrics" => {
                let snap = c.snapshot().unwrap_or_default();
                let body = render(&snap, &c.port_names(), c.routes());
                drop(c);
                http_reply(
                    &mut stream,
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    &body,
                );
            }
            "/healthz" | "/readyz" => {
                let h = c.health();
                drop(c);
                let ok = if path == "/healthz" { h.live } else { h.ready };
                let body = if ok {
                    "ok\n".to_owned()
                } else {
                    format!("{}\n", h.problems.join("; "))
                };
                let status = if ok {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                http_reply(&mut stream, status, "text/plain", &body);
            }
            _ => {
                drop(c);
                http_reply(&mut stream, "404 Not Found", "text/plain", "not found\n");
            }
        }
    }
}
