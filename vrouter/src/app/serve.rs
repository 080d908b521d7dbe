//! `brindle-vrouter serve`: the node's dataplane daemon. It starts with no
//! ports, opens the programming socket (`/run/brindle/vrouter.sock`, mode
//! 0600) and the metrics/health endpoint (127.0.0.1:9092), and from then on
//! does what the controller asks over the socket.
//!
//! Neighbours: the controller follows the kernel's neighbour table over
//! netlink and sends `set_neighbors`; the vrouter only asks the kernel to
//! resolve the next hops its routes lack (after each change, then once a
//! second while some lack a MAC), and reads no table itself.

use std::io::BufReader;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use brindle_api::framing::{Reply, read_message, write_message};
use brindle_api::vrouter::VrouterRequest;

use super::config::ServeConfig;
use super::http;
use super::signals::stop_on_signals;
use crate::control::{Control, Daemon};
use crate::engine::Dataplane;
use crate::pipeline::PipelineConfig;

/// Answers requests on one connection until it closes.
fn serve_connection(stream: UnixStream, control: &Mutex<Daemon>) {
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

/// The whole daemon: workers, socket, metrics; stops on SIGINT/SIGTERM.
pub fn serve(cfg: &ServeConfig) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let engine = cfg.engine()?;
    let mut pipeline = PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24);
    pipeline.vxlan_vni = cfg.encap.vxlan_vni;
    pipeline.vxlan_port = cfg.encap.vxlan_port;
    let dataplane = Dataplane::open(&engine, &pipeline, &stop)?;
    tracing::info!(workers = dataplane.worker_count(), cores = ?engine.cores, polling = ?engine.polling, "workers started");
    let control: Arc<Mutex<Daemon>> = Arc::new(Mutex::new(Control::new(dataplane, pipeline)));
    let listener = bind_socket(&cfg.api.socket)?;
    listener.set_nonblocking(true)?;
    if !cfg.metrics.listen.is_empty() {
        let tcp = TcpListener::bind(&cfg.metrics.listen)
            .with_context(|| format!("metrics listener {}", cfg.metrics.listen))?;
        let c = control.clone();
        let s = stop.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || http::serve_http(tcp, c, &s))?;
    }
    println!(
        "serving: socket {} metrics {} boot_id {}",
        cfg.api.socket.display(),
        cfg.metrics.listen,
        control.lock().unwrap_or_else(|e| e.into_inner()).boot_id()
    );
    let mut last_resolve = Instant::now();
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
        if last_resolve.elapsed() >= Duration::from_secs(1) {
            // The distinct next hops only: a few per node, never the routes.
            control
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .resolve_missing();
            last_resolve = Instant::now();
        }
    }
    let started = Instant::now();
    let _ = std::fs::remove_file(&cfg.api.socket);
    // The metrics and connection threads may still hold the control; the
    // workers are stopped and joined through it all the same.
    control.lock().unwrap_or_else(|e| e.into_inner()).shutdown();
    tracing::info!(ms = started.elapsed().as_millis() as u64, "workers stopped");
    println!("stopped");
    Ok(())
}
