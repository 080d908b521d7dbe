//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` listener.
//!
//! The HTTP side is a hand-written minimal HTTP/1.1 responder over tokio:
//! three GET paths, one response per connection (`Connection: close`). The
//! workspace has no HTTP server crate, and this listener serves a scraper
//! and probes, which does not justify adding one. It is bounded
//! ([`ServeLimits`]): 64 clients at once, 5 s for the request head and 5 s
//! for the answer, a 4 KiB head (431 beyond), so one stuck or hostile
//! client never stalls the liveness probe.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::debug;

use crate::health::HealthWatch;

/// Label of the peers-by-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The FSM state (`Established`, `Active`, ...).
    pub state: String,
}

/// Label of the IPAM GC counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `leaked_handle`, `dead_node_handle` or `dead_node_block`.
    pub reason: String,
}

/// Label of the `ctrl.sock` request histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// The request's `op` (`ipam_allocate`, `add_endpoint`, ...; `other`
    /// for anything else, so a client cannot grow the label set).
    pub op: String,
}

/// The ops of `ctrl.sock` that get their own label: the CNI plugin's ADD
/// (`ipam_allocate`, `add_endpoint`) and DEL (`delete_endpoint`,
/// `ipam_release_handle`), and the rest the plugins send; `ctrl_*` (brindlectl)
/// share `ctrl`.
const LABELLED_OPS: &[&str] = &[
    "ipam_allocate",
    "ipam_release_handle",
    "ipam_release_address",
    "ipam_query_handle",
    "ipam_gc_attachments",
    "ipam_status",
    "add_endpoint",
    "delete_endpoint",
    "get_endpoint",
    "list_endpoints",
    "gc_endpoints",
    "status",
];

/// The label for a request's `op`.
pub fn op_label(op: &str) -> OpLabel {
    let op = if LABELLED_OPS.contains(&op) {
        op
    } else if op.starts_with("ctrl_") {
        "ctrl"
    } else {
        "other"
    };
    OpLabel { op: op.to_owned() }
}

fn request_histogram() -> Histogram {
    // 0.1 ms .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_1, 2.0, 15))
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
    /// What the automatic IPAM GC released, by reason.
    pub ipam_gc_released: Family<ReasonLabel, Counter>,
    /// Blocks affine to this node.
    pub ipam_blocks: Gauge,
    /// Addresses allocated in this node's blocks.
    pub ipam_addresses_allocated: Gauge,
    /// Addresses this node's blocks can hand out.
    pub ipam_addresses_usable: Gauge,
    /// This node's pod addresses in other nodes' blocks, announced as host
    /// routes.
    pub borrowed_addresses: Gauge,
    /// Time to answer one `ctrl.sock` request, by op.
    pub api_request_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// Kubernetes API watch failures (`[datastore.kubernetes]`).
    pub kube_watch_errors: Counter,
    /// Kubernetes objects left out because policy refuses them.
    pub kube_objects_dropped: Counter,
    /// Policies the compiler holds (every kind of policy; not tiers, sets
    /// or pods).
    pub policies: Gauge,
    /// Local endpoints with a policy program.
    pub policy_programs: Gauge,
    /// The policy generation last sent to the vrouter.
    pub policy_generation: Gauge,
    /// Time to compile one batch of policy changes.
    pub policy_compile_seconds: Histogram,
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
            ipam_gc_released: Family::default(),
            ipam_blocks: Gauge::default(),
            ipam_addresses_allocated: Gauge::default(),
            ipam_addresses_usable: Gauge::default(),
            borrowed_addresses: Gauge::default(),
            api_request_seconds: Family::new_with_constructor(request_histogram),
            kube_watch_errors: Counter::default(),
            kube_objects_dropped: Counter::default(),
            policies: Gauge::default(),
            policy_programs: Gauge::default(),
            policy_generation: Gauge::default(),
            policy_compile_seconds: Histogram::new(exponential_buckets(0.000_05, 4.0, 10)),
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
        registry.register(
            "ipam_gc_released",
            "Handles and blocks the automatic IPAM GC released, by reason",
            m.ipam_gc_released.clone(),
        );
        registry.register(
            "ipam_blocks",
            "IPAM blocks affine to this node",
            m.ipam_blocks.clone(),
        );
        registry.register(
            "ipam_addresses_allocated",
            "Addresses allocated in this node's blocks",
            m.ipam_addresses_allocated.clone(),
        );
        registry.register(
            "ipam_addresses_usable",
            "Addresses this node's blocks can hand out",
            m.ipam_addresses_usable.clone(),
        );
        registry.register(
            "borrowed_addresses",
            "This node's pod addresses in other nodes' blocks (borrowed when the pool had no block to claim), announced over BGP as host routes",
            m.borrowed_addresses.clone(),
        );
        registry.register(
            "api_request_seconds",
            "Time to answer one ctrl.sock request (the CNI plugin's IPAM and endpoint ops: ADD is ipam_allocate + add_endpoint, DEL delete_endpoint + ipam_release_handle), by op",
            m.api_request_seconds.clone(),
        );
        registry.register(
            "kube_watch_errors",
            "Kubernetes API list/watch failures, each retried after a backoff (410 Gone among them)",
            m.kube_watch_errors.clone(),
        );
        registry.register(
            "kube_objects_dropped",
            "Kubernetes objects left out because brindle-policy refuses them",
            m.kube_objects_dropped.clone(),
        );
        registry.register(
            "policies",
            "Network policies compiled (Kubernetes and Calico, namespaced and global)",
            m.policies.clone(),
        );
        registry.register(
            "policy_programs",
            "Local endpoints with a policy program",
            m.policy_programs.clone(),
        );
        registry.register(
            "policy_generation",
            "The policy generation last sent to the vrouter",
            m.policy_generation.clone(),
        );
        registry.register(
            "policy_compile_seconds",
            "Time to compile one batch of policy changes into programs and sets",
            m.policy_compile_seconds.clone(),
        );
        // Every reason and the CNI plugin's ADD/DEL ops exist from the
        // start (at zero): an empty family is not exported at all, and a
        // dashboard's rate() needs the series before the first event.
        for reason in ["leaked_handle", "dead_node_handle", "dead_node_block"] {
            drop(m.ipam_gc_released.get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            }));
        }
        for op in [
            "ipam_allocate",
            "add_endpoint",
            "delete_endpoint",
            "ipam_release_handle",
        ] {
            drop(m.api_request_seconds.get_or_create(&op_label(op)));
        }
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

/// Bounds of the metrics/health server: a slow, silent or oversized client
/// costs one task and one slot for at most the timeouts, and never delays
/// the probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once; more are closed at once.
    pub max_clients: usize,
    /// Time for the whole request head to arrive.
    pub header_timeout: Duration,
    /// Time for the answer to be written.
    pub write_timeout: Duration,
    /// Largest request head; a longer one is answered 431.
    pub max_request: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_clients: 64,
            header_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_request: 4096,
        }
    }
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz`
/// (datastore and vrouter reachable, [`crate::health::Health::ready`])
/// until the task is dropped, within [`ServeLimits::default`].
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: HealthWatch,
) -> std::io::Result<()> {
    serve_with(listener, metrics, health, ServeLimits::default()).await
}

/// [`serve`] within the given limits. Each connection is its own task, so
/// a client that connects and sends nothing holds only its slot, until the
/// header timeout.
pub async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: HealthWatch,
    limits: ServeLimits,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_clients));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            // Out of descriptors and the like: the listener itself is fine.
            Err(e) => {
                debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, limit = limits.max_clients, "metrics client refused: too many at once");
            drop(stream);
            continue;
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            answer(stream, &metrics, &health, &limits).await;
            drop(slot);
        });
    }
}

/// Why a request head could not be read.
enum HeadError {
    /// Longer than [`ServeLimits::max_request`].
    TooLarge,
    /// Closed, failed or timed out: nothing to answer.
    Gone,
}

/// Reads the request head, up to the blank line, within the limits.
async fn read_head(stream: &mut TcpStream, limits: &ServeLimits) -> Result<Vec<u8>, HeadError> {
    let mut buf = vec![0u8; limits.max_request];
    let mut len = 0;
    let read = async {
        loop {
            if len == buf.len() {
                return Err(HeadError::TooLarge);
            }
            match stream.read(&mut buf[len..]).await {
                Ok(0) | Err(_) => return Err(HeadError::Gone),
                Ok(n) => len += n,
            }
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(());
            }
        }
    };
    match tokio::time::timeout(limits.header_timeout, read).await {
        Ok(Ok(())) => {
            buf.truncate(len);
            Ok(buf)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(HeadError::Gone),
    }
}

async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    health: &HealthWatch,
    limits: &ServeLimits,
) {
    let peer = stream.peer_addr().ok();
    let (status, body) = match read_head(&mut stream, limits).await {
        Err(HeadError::Gone) => {
            debug!(?peer, "metrics client sent no complete request in time");
            return;
        }
        Err(HeadError::TooLarge) => (
            "431 Request Header Fields Too Large",
            "request too large\n".to_owned(),
        ),
        Ok(head) => {
            let head = String::from_utf8_lossy(&head);
            let mut words = head.split_whitespace();
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            match (method, path) {
                ("GET", "/metrics") => ("200 OK", metrics.encode()),
                ("GET", "/healthz") => ("200 OK", "ok\n".to_owned()),
                ("GET", "/readyz") if health.borrow().ready() => ("200 OK", "ready\n".to_owned()),
                ("GET", "/readyz") => ("503 Service Unavailable", "not ready\n".to_owned()),
                ("GET", _) => ("404 Not Found", "not found\n".to_owned()),
                _ => ("405 Method Not Allowed", "GET only\n".to_owned()),
            }
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    match tokio::time::timeout(limits.write_timeout, stream.write_all(response.as_bytes())).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(?peer, error = %e, "metrics client went away"),
        Err(_) => debug!(?peer, "metrics client did not take the answer in time"),
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
        assert!(
            text.contains("brindle_ctrl_ipam_gc_released_total{reason=\"dead_node_block\"} 0"),
            "{text}"
        );
        m.api_request_seconds
            .get_or_create(&op_label("add_endpoint"))
            .observe(0.002);
        m.api_request_seconds
            .get_or_create(&op_label("made-up"))
            .observe(0.002);
        m.ipam_addresses_allocated.set(5);
        let text = m.encode();
        assert!(
            text.contains("brindle_ctrl_api_request_seconds_count{op=\"add_endpoint\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("brindle_ctrl_api_request_seconds_count{op=\"other\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("brindle_ctrl_ipam_addresses_allocated 5"),
            "{text}"
        );
        assert!(
            text.contains("brindle_ctrl_kube_watch_errors_total 0"),
            "{text}"
        );
        assert!(
            text.contains("brindle_ctrl_kube_objects_dropped_total 0"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn readyz_follows_the_flag_and_metrics_is_served() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (health, health_rx) = tokio::sync::watch::channel(crate::health::Health::default());
        let task = tokio::spawn(serve(listener, Arc::new(Metrics::new()), health_rx));
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

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    async fn start(
        limits: ServeLimits,
    ) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_health, health_rx) = tokio::sync::watch::channel(crate::health::Health::default());
        let task = tokio::spawn(serve_with(
            listener,
            Arc::new(Metrics::new()),
            health_rx,
            limits,
        ));
        (addr, task)
    }

    #[tokio::test]
    async fn healthz_keeps_answering_while_clients_connect_and_send_nothing() {
        let (addr, task) = start(ServeLimits::default()).await;
        // Silent clients, and one that sent half a request head.
        let mut silent = Vec::new();
        for _ in 0..8 {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /metrics HTTP/1.1\r\nHost:")
            .await
            .unwrap();
        for _ in 0..3 {
            let out = get(addr, "/healthz").await;
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            assert!(out.ends_with("ok\n"), "{out}");
        }
        drop(silent);
        task.abort();
    }

    #[tokio::test]
    async fn a_silent_client_is_closed_after_the_header_timeout() {
        let (addr, task) = start(ServeLimits {
            header_timeout: Duration::from_millis(100),
            ..ServeLimits::default()
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut out = Vec::new();
        // The server closes without an answer (EOF, or a reset).
        let n = silent.read_to_end(&mut out).await.unwrap_or(0);
        assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&out));
        task.abort();
    }

    #[tokio::test]
    async fn a_request_head_over_4_kib_is_answered_431() {
        let (addr, task) = start(ServeLimits::default()).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let long = format!(
            "GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
            "a".repeat(5000)
        );
        // The server may close before it read everything: a failed write
        // is fine, the answer is what counts.
        let _ = s.write_all(long.as_bytes()).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        task.abort();
    }

    #[tokio::test]
    async fn clients_beyond_the_limit_are_closed_and_the_rest_served() {
        let (addr, task) = start(ServeLimits {
            max_clients: 2,
            ..ServeLimits::default()
        })
        .await;
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Both slots are held by silent clients: a third is closed unanswered.
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = c.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await;
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        assert!(out.is_empty(), "{:?}", String::from_utf8_lossy(&out));
        drop((_a, _b));
        task.abort();
    }
}
