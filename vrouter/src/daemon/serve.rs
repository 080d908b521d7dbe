//! `brindle-vrouter serve`: the node's dataplane daemon. It starts with no
//! ports, opens the programming socket (`/run/brindle/vrouter.sock`, mode
//! 0600) and the metrics/health endpoint (127.0.0.1:9092), and from then on
//! does what the controller asks over the socket.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use brindle_api::framing::{Reply, read_message, write_message};
use brindle_api::vrouter::VrouterRequest;
use brindle_xsk::{BindMode, Steering, SteeringConfig, Umem, UmemConfig, XdpMode};
use serde::Deserialize;

use crate::daemon::control::{Control, ControlParts};
use crate::daemon::engine::{Arenas, spawn_all};
use crate::daemon::metrics;
use crate::daemon::spec::{IoMode, Polling};
use crate::fib::Fib;
use crate::pipeline::PipelineConfig;
use crate::port::xdp::XdpPortConfig;

/// `/etc/brindle/vrouter.toml` (see `deploy/systemd/vrouter.toml`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct ServeConfig {
    /// Log filter when RUST_LOG is not set.
    pub log_level: String,
    /// The underlay interface (informational here: the controller attaches
    /// it with `add_ports`).
    pub uplink: String,
    /// CPU list of the workers' cores, or "auto" (the affinity mask).
    pub cores: String,
    /// Back off when idle instead of spinning.
    pub adaptive_polling: bool,
    /// The polling policy (`busy`, `adaptive`, `interrupt`, `busy-poll`);
    /// when set, it wins over `adaptive_polling`.
    pub polling: Option<Polling>,
    /// The programming socket.
    pub api: ApiConfig,
    /// The metrics endpoint.
    pub metrics: MetricsConfig,
    /// AF_XDP settings.
    pub xdp: XdpConfig,
    /// `af_xdp`, `af_packet` or `auto` (default).
    pub io: IoMode,
}

/// `[api]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct ApiConfig {
    /// Socket path.
    pub socket: PathBuf,
}

/// `[metrics]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct MetricsConfig {
    /// Listen address; empty disables.
    pub listen: String,
}

/// `[xdp]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct XdpConfig {
    /// native | generic | auto.
    pub mode: String,
    /// auto | zerocopy | copy.
    pub bind: String,
    /// UMEM frames (2048 B each; counts against RLIMIT_MEMLOCK).
    pub umem_frames: u32,
    /// Descriptors per ring.
    pub ring_size: u32,
    /// Where to pin (unused: programs are not pinned, so a dead vrouter
    /// leaves nothing attached).
    pub bpffs: String,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            log_level: "info".into(),
            uplink: String::new(),
            cores: "auto".into(),
            adaptive_polling: true,
            polling: None,
            api: ApiConfig::default(),
            metrics: MetricsConfig::default(),
            xdp: XdpConfig::default(),
            io: IoMode::Auto,
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            socket: PathBuf::from(brindle_api::VROUTER_SOCKET),
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:9092".into(),
        }
    }
}

impl Default for XdpConfig {
    fn default() -> Self {
        XdpConfig {
            mode: "native".into(),
            bind: "auto".into(),
            umem_frames: 4096,
            ring_size: 2048,
            bpffs: "/sys/fs/bpf/brindle".into(),
        }
    }
}

/// Flags of `brindle-vrouter serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// The config file (`/etc/brindle/vrouter.toml`); defaults when absent.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The programming socket (overrides `[api] socket`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Metrics listen address (overrides `[metrics] listen`; "" disables).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Worker cores, "2-3", "2,4" or "auto" (overrides `cores`).
    #[arg(long, env = "BRINDLE_VROUTER_CORES")]
    pub cores: Option<String>,
    /// Socket kind (overrides `io`).
    #[arg(long, value_enum)]
    pub io: Option<IoMode>,
    /// UMEM frames (overrides `[xdp] umem_frames`).
    #[arg(long)]
    pub umem_frames: Option<u32>,
    /// Polling policy (overrides `polling` and `adaptive_polling`).
    #[arg(long, value_enum)]
    pub polling: Option<Polling>,
}

impl ServeArgs {
    /// File, then flags.
    pub fn resolve(&self) -> anyhow::Result<ServeConfig> {
        let mut cfg = match &self.config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("parse {}", p.display()))?
            }
            None => ServeConfig::default(),
        };
        if let Some(s) = &self.socket {
            cfg.api.socket = s.clone();
        }
        if let Some(m) = &self.metrics {
            cfg.metrics.listen = m.clone();
        }
        if let Some(c) = &self.cores {
            cfg.cores = c.clone();
        }
        if let Some(io) = self.io {
            cfg.io = io;
        }
        if let Some(n) = self.umem_frames {
            cfg.xdp.umem_frames = n;
        }
        if let Some(p) = self.polling {
            cfg.polling = Some(p);
        }
        Ok(cfg)
    }
}

/// Parses a CPU list ("2-3", "2,4", "0") or "auto" (the cores this process
/// may run on).
pub fn parse_cores(s: &str) -> anyhow::Result<Vec<usize>> {
    if s.trim() == "auto" {
        let mut ids: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort_unstable();
        return Ok(ids);
    }
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                anyhow::ensure!(a <= b && b - a < 4096, "bad CPU range {part}");
                out.extend(a..=b);
            }
            None => out.push(part.parse()?),
        }
    }
    anyhow::ensure!(!out.is_empty(), "empty CPU list {s:?}");
    Ok(out)
}

/// Builds the workers (one per configured core, over one shared UMEM) and
/// starts them; returns the control state.
pub fn start(cfg: &ServeConfig, stop: Arc<AtomicBool>) -> anyhow::Result<Control> {
    let cores = parse_cores(&cfg.cores)?;
    let (fib, reader) = Fib::new();
    drop(reader);
    let pipeline = PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24);
    let frames = cfg.xdp.umem_frames;
    let heap = |why: String| -> anyhow::Result<Arenas> {
        if cores.len() > 1 {
            tracing::warn!(
                ?cores,
                "{why}: one worker (AF_PACKET frames live in a heap arena that workers cannot share)"
            );
        }
        Ok(Arenas::heap(frames)?)
    };
    let (arenas, steering) = match cfg.io {
        IoMode::Packet => (heap("io = af_packet".into())?, None),
        io => {
            let opened = Umem::new(UmemConfig {
                frame_count: frames,
                ..UmemConfig::default()
            })
            .and_then(|u| Ok((u, Steering::new(SteeringConfig::default())?)));
            match opened {
                Ok((umem, steering)) => (
                    Arenas::shared_umem(umem, cores.len().max(1))?,
                    Some(steering),
                ),
                Err(e) if io == IoMode::Auto => {
                    tracing::warn!(error = %e, "AF_XDP unavailable: ports use AF_PACKET (one copy per frame)");
                    (heap(format!("AF_XDP unavailable ({e})"))?, None)
                }
                Err(e) => return Err(e).context("UMEM and steering maps"),
            }
        }
    };
    let umem = arenas.umem.clone();
    let homes = arenas.homes.clone();
    let mut xdp = XdpPortConfig {
        umem_frames: arenas.arenas[0].frames(),
        frame_size: arenas.arenas[0].frame_size(),
        ..XdpPortConfig::default()
    };
    xdp.socket.rx_size = cfg.xdp.ring_size;
    xdp.socket.tx_size = cfg.xdp.ring_size;
    xdp.socket.fill_size = cfg.xdp.ring_size;
    xdp.socket.comp_size = cfg.xdp.ring_size;
    xdp.fill_budget = xdp.fill_budget.min(cfg.xdp.ring_size);
    xdp.socket.mode = match cfg.xdp.bind.as_str() {
        "zerocopy" => BindMode::ZeroCopy,
        "copy" => BindMode::Copy,
        _ => BindMode::Auto,
    };
    xdp.xdp_mode = match cfg.xdp.mode.as_str() {
        "native" => XdpMode::Native,
        "generic" => XdpMode::Generic,
        _ => XdpMode::Auto,
    };
    let polling = cfg.polling.unwrap_or(if cfg.adaptive_polling {
        Polling::Adaptive
    } else {
        Polling::Busy
    });
    if polling == Polling::BusyPoll {
        xdp.socket.busy_poll = Some(crate::daemon::run::BUSY_POLL);
    }
    let workers = arenas.into_workers(&pipeline, &fib);
    let handles = spawn_all(workers, &cores, polling, &stop).context("start the workers")?;
    tracing::info!(workers = handles.len(), ?cores, ?polling, "workers started");
    Ok(Control::new(ControlParts {
        workers: handles,
        homes,
        fib,
        steering,
        umem,
        xdp,
        io: cfg.io,
        pipeline,
    }))
}

/// Answers requests on one connection until it closes.
fn serve_connection(stream: UnixStream, control: &Mutex<Control>) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let request: VrouterRequest = match read_message(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                let reply: Reply<()> = Reply::Error(brindle_api::framing::RemoteError {
                    kind: brindle_api::framing::RemoteErrorKind::InvalidRequest,
                    message: e.to_string(),
                });
                let _ = write_message(&mut writer, &reply);
                return;
            }
        };
        let result = control
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handle(request);
        let reply: Reply<serde_json::Value> = result.into();
        if write_message(&mut writer, &reply).is_err() {
            return;
        }
    }
}

/// Binds the socket at `path`, mode 0600, replacing a stale one.
pub fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    if path.exists() {
        // A live vrouter answers; a stale socket file from a killed one is
        // removed.
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use by a running vrouter", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("remove stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    Ok(listener)
}

/// The whole daemon: worker, socket, metrics; stops on SIGINT/SIGTERM.
pub fn serve(cfg: &ServeConfig) -> anyhow::Result<()> {
    let stop = crate::daemon::run::stop_on_signals()?;
    let control = Arc::new(Mutex::new(start(cfg, stop.clone())?));
    let listener = bind_socket(&cfg.api.socket)?;
    listener.set_nonblocking(true)?;
    if !cfg.metrics.listen.is_empty() {
        let tcp = TcpListener::bind(&cfg.metrics.listen)
            .with_context(|| format!("metrics listener {}", cfg.metrics.listen))?;
        let c = control.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || metrics::serve_http(tcp, &c))?;
    }
    {
        let c = control.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("neighbors".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    c.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .learn_neighbors();
                    std::thread::sleep(Duration::from_millis(300));
                }
            })?;
    }
    println!(
        "serving: socket {} metrics {} boot_id {}",
        cfg.api.socket.display(),
        cfg.metrics.listen,
        control.lock().unwrap_or_else(|e| e.into_inner()).boot_id()
    );
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let c = control.clone();
                std::thread::Builder::new()
                    .name("api".into())
                    .spawn(move || serve_connection(stream, &c))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).context("accept"),
        }
    }
    let _ = std::fs::remove_file(&cfg.api.socket);
    // The metrics and connection threads may still hold the control; the
    // worker is stopped and joined through it all the same.
    control.lock().unwrap_or_else(|e| e.into_inner()).shutdown();
    println!("stopped");
    Ok(())
}

/// Minimal HTTP/1.1 for the three GET endpoints: a handful of scrapes per
/// minute need no HTTP stack, and it keeps the vrouter free of an async
/// server beside its poll loop.
pub fn http_get(stream: &mut TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() {
        let n = stream.read(&mut buf[len..]).ok()?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = std::str::from_utf8(&buf[..len]).ok()?;
    let mut parts = head.split_whitespace();
    (parts.next()? == "GET").then(|| parts.next().map(str::to_owned))?
}

/// Writes a response and closes.
pub fn http_reply(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployed_config_file_parses_with_its_documented_values() {
        let text = include_str!("../../../deploy/systemd/vrouter.toml");
        let cfg: ServeConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.cores, "auto");
        assert!(cfg.adaptive_polling);
        assert_eq!(cfg.api.socket, PathBuf::from("/run/brindle/vrouter.sock"));
        assert_eq!(cfg.metrics.listen, "127.0.0.1:9092");
        assert_eq!((cfg.xdp.umem_frames, cfg.xdp.ring_size), (4096, 2048));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cores("2-3").unwrap(), vec![2, 3]);
        assert_eq!(parse_cores("0, 2,4-5").unwrap(), vec![0, 2, 4, 5]);
        assert!(parse_cores("3-2").is_err());
        assert!(parse_cores("").is_err());
        assert!(parse_cores("x").is_err());
        assert!(!parse_cores("auto").unwrap().is_empty());
    }
}
