//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` listener.
//!
//! The HTTP side is a hand-written minimal HTTP/1.1 responder over tokio:
//! three GET paths, one response per connection (`Connection: close`). The
//! workspace has no HTTP server crate, and this listener serves a scraper
//! and a probe on loopback, which does not justify adding one.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::debug;

use crate::health::HealthWatch;

/// Label of the peers-by-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The FSM state (`Established`, `Active`, ...).
    pub state: String,
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// BGP peers by state.
    pub bgp_peers: Family<StateLabel, Gauge>,
    /// Prefixes received from all peers.
    pub bgp_prefixes_in: Gauge,
    /// Prefixes advertised to all peers.
    pub bgp_prefixes_out: Gauge,
    /// UPDATE messages received since start (all peers).
    pub bgp_updates_in: Gauge,
    /// Endpoints on this node.
    pub endpoints: Gauge,
    /// Time to apply one vrouter request (or one resync).
    pub programming_seconds: Histogram,
    /// 1 when the vrouter answered last time.
    pub vrouter_reachable: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `brindle_ctrl` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("brindle_ctrl");
        let m = Metrics {
            bgp_peers: Family::default(),
            bgp_prefixes_in: Gauge::default(),
            bgp_prefixes_out: Gauge::default(),
            bgp_updates_in: Gauge::default(),
            endpoints: Gauge::default(),
            programming_seconds: Histogram::new(exponential_buckets(0.000_05, 4.0, 10)),
            vrouter_reachable: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("bgp_peers", "BGP peers by state", m.bgp_peers.clone());
        registry.register(
            "bgp_prefixes_in",
            "Prefixes received from BGP peers",
            m.bgp_prefixes_in.clone(),
        );
        registry.register(
            "bgp_prefixes_out",
            "Prefixes advertised to BGP peers",
            m.bgp_prefixes_out.clone(),
        );
        registry.register(
            "bgp_updates_in",
            "UPDATE messages received from current peers",
            m.bgp_updates_in.clone(),
        );
        registry.register("endpoints", "Endpoints on this node", m.endpoints.clone());
        registry.register(
            "programming_seconds",
            "Time to apply one vrouter request or resync",
            m.programming_seconds.clone(),
        );
        registry.register(
            "vrouter_reachable",
            "1 when the vrouter answered last time",
            m.vrouter_reachable.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz`
/// (datastore and vrouter reachable, [`crate::health::Health::ready`])
/// until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: HealthWatch,
) -> std::io::Result<()> {
    loop {
        let (mut stream, peer) = listener.accept().await?;
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            // Read the request head (we need only its first line).
            while len < buf.len() {
                match stream.read(&mut buf[len..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => len += n,
                }
                if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let mut words = head.split_whitespace();
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let (status, body) = match (method, path) {
                ("GET", "/metrics") => ("200 OK", metrics.encode()),
                ("GET", "/healthz") => ("200 OK", "ok\n".to_owned()),
                ("GET", "/readyz") if health.borrow().ready() => ("200 OK", "ready\n".to_owned()),
                ("GET", "/readyz") => ("503 Service Unavailable", "not ready\n".to_owned()),
                ("GET", _) => ("404 Not Found", "not found\n".to_owned()),
                _ => ("405 Method Not Allowed", "GET only\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                debug!(%peer, error = %e, "metrics client went away");
            }
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_metric_with_its_labels() {
        let m = Metrics::new();
        m.bgp_peers
            .get_or_create(&StateLabel {
                state: "Established".into(),
            })
            .set(2);
        m.endpoints.set(3);
        m.programming_seconds.observe(0.001);
        let text = m.encode();
        assert!(
            text.contains("brindle_ctrl_bgp_peers{state=\"Established\"} 2"),
            "{text}"
        );
        assert!(text.contains("brindle_ctrl_endpoints 3"), "{text}");
        assert!(
            text.contains("brindle_ctrl_programming_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("brindle_ctrl_vrouter_reachable 0"), "{text}");
    }

    #[tokio::test]
    async fn readyz_follows_the_flag_and_metrics_is_served() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (health, health_rx) = tokio::sync::watch::channel(crate::health::Health::default());
        let task = tokio::spawn(serve(listener, Arc::new(Metrics::new()), health_rx));
        async fn get(addr: SocketAddr, path: &str) -> String {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.send_replace(crate::health::Health {
            datastore_ok: true,
            vrouter_reachable: Some(true),
        });
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get(addr, "/metrics")
                .await
                .contains("brindle_ctrl_endpoints")
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
