//! brindle-vrouter as the node daemon (`serve`) between the router's ports,
//! programmed over its socket as brindle-ctrl programs it: both ports are
//! pods with their workload (`PortSpec.workload`), a /32 `Local` route to
//! each, and, for the policy scenarios, the compiled policy in one
//! `VrouterRequest::ApplyPolicy`. Its counters come from `GetStats` before
//! it is stopped (`serve` prints no counters).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brindle_api::framing::Client;
use brindle_api::vrouter::{
    DesiredState, Mac, PolicyEndpoint, PolicyUpdate, PortDevice, PortKind, PortSpec, Route,
    RouteTarget, Stats, VrouterRequest,
};

use crate::forwarder::NullForwarderStats;
use crate::topo::{self, RouterPorts};
use crate::traffic::TrafficError;

/// A state directory (config, socket) and a bpffs directory, removed on
/// drop.
#[derive(Debug)]
pub struct DaemonDirs {
    /// Config and socket.
    pub dir: PathBuf,
    /// The vrouter's bpffs pins.
    pub bpffs: PathBuf,
}

impl DaemonDirs {
    /// Creates both, and the config for `cpus`.
    pub fn new(cpus: &str) -> Result<DaemonDirs, TrafficError> {
        let name = topo::unique("vd");
        let dirs = DaemonDirs {
            dir: std::env::temp_dir().join(&name),
            bpffs: PathBuf::from(format!("/sys/fs/bpf/{name}")),
        };
        let io = |e: std::io::Error| TrafficError::Vrouter(format!("state directory: {e}"));
        std::fs::create_dir_all(&dirs.dir).map_err(io)?;
        std::fs::write(
            dirs.config(),
            format!(
                "cores = \"{cpus}\"\nadaptive_polling = true\n[api]\nsocket = \"{}\"\n\
                 [metrics]\nlisten = \"\"\n[xdp]\nmode = \"native\"\nbind = \"copy\"\nbpffs = \"{}\"\n",
                dirs.socket().display(),
                dirs.bpffs.display()
            ),
        )
        .map_err(io)?;
        Ok(dirs)
    }

    /// `vrouter.toml`.
    pub fn config(&self) -> PathBuf {
        self.dir.join("vrouter.toml")
    }

    /// `vrouter.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("vrouter.sock")
    }
}

impl Drop for DaemonDirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.bpffs);
    }
}

fn call<T: serde::de::DeserializeOwned>(
    socket: &Path,
    what: &str,
    request: &VrouterRequest,
) -> Result<T, TrafficError> {
    let mut c = Client::connect(socket, Duration::from_secs(30))
        .map_err(|e| TrafficError::Vrouter(format!("connect {}: {e}", socket.display())))?;
    c.call(request)
        .map_err(|e| TrafficError::Vrouter(format!("{what}: {e}")))
}

/// Waits (10 s at most) for the socket to answer.
pub fn wait_ready(socket: &Path) -> Result<(), TrafficError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call::<Stats>(socket, "get_stats", &VrouterRequest::GetStats) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The two pod ports, their routes, then the policy (if any) in one
/// `ApplyPolicy`.
pub fn program(
    socket: &Path,
    router: &RouterPorts,
    workloads: &(PolicyEndpoint, PolicyEndpoint),
    policy: Option<&PolicyUpdate>,
) -> Result<(), TrafficError> {
    let pod =
        |name: &str, addr: std::net::Ipv4Addr, peer: Option<Mac>, w: &PolicyEndpoint| PortSpec {
            name: name.to_owned(),
            kind: PortKind::Pod,
            addresses: vec![addr.into()],
            peer_mac: peer,
            endpoint: None,
            device: PortDevice::Xdp,
            workload: Some(w.clone()),
        };
    let local = |addr: std::net::Ipv4Addr, port: &str| Route {
        prefix: ipnet::IpNet::from(std::net::IpAddr::from(addr)),
        target: RouteTarget::Local {
            port: port.to_owned(),
        },
    };
    let state = DesiredState {
        node: None,
        ports: vec![
            pod(&router.ingress, topo::GEN_IP, None, &workloads.0),
            pod(
                &router.egress,
                topo::SINK_IP,
                Some(Mac(router.sink_mac.0)),
                &workloads.1,
            ),
        ],
        routes: vec![
            local(topo::GEN_IP, &router.ingress),
            local(topo::SINK_IP, &router.egress),
        ],
        neighbors: Vec::new(),
        policy: None,
    };
    call::<serde_json::Value>(socket, "sync", &VrouterRequest::Sync { state })?;
    if let Some(update) = policy {
        call::<serde_json::Value>(
            socket,
            "apply_policy",
            &VrouterRequest::ApplyPolicy {
                update: update.clone(),
            },
        )?;
    }
    Ok(())
}

/// Forwarded (frames sent), drops (every reason) and polls, over workers;
/// the policy drops separately.
pub fn counters(socket: &Path) -> Result<(NullForwarderStats, u64), TrafficError> {
    let stats: Stats = call(socket, "get_stats", &VrouterRequest::GetStats)?;
    let mut s = NullForwarderStats::default();
    let mut denied = 0;
    for w in &stats.workers {
        s.forwarded += w.tx_packets;
        s.dropped += w.drops.values().sum::<u64>();
        denied += w.drops.get("policy_denied").copied().unwrap_or(0);
        *s.busy_polls.get_or_insert(0) += w.busy_polls;
        *s.idle_polls.get_or_insert(0) += w.idle_polls;
    }
    Ok((s, denied))
}
