//! Where the IPAM state lives, as the plugin's `ipam` config section and the
//! admin command's flags describe it, and the [`Backend`] that reaches it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use brindle_api::framing::{Client, FramingError, RemoteError, RemoteErrorKind};
use brindle_api::ipam::{IpamOp, IpamRequest};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::allocator::Ipam;
use crate::model::{IpamConfig, Pool};
use crate::server::handle_request;
use crate::store::{Datastore, EmbeddedMode, EmbeddedStore, EtcdStore};

/// Default embedded database file.
pub const DEFAULT_EMBEDDED_PATH: &str = "/var/lib/brindle/ipam.redb";
/// Default key prefix in etcd.
pub const DEFAULT_ETCD_PREFIX: &str = "/brindle/ipam";

/// How the plugin reaches the IPAM state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The daemon's socket when it answers, else the datastore directly.
    #[default]
    Auto,
    /// Only through the daemon's socket.
    Daemon,
    /// Only the datastore directly (like host-local; no daemon needed).
    Standalone,
}

/// Which datastore standalone mode opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// The redb file at `embedded_path`.
    #[default]
    Embedded,
    /// etcd v3 at `etcd_endpoints`.
    Etcd,
}

/// The plugin's keys in the `ipam` section (beside `type`). Unknown keys are
/// ignored, as the CNI spec asks.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct PluginConfig {
    /// How to reach the state.
    pub mode: Mode,
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Standalone datastore.
    pub store: StoreKind,
    /// Embedded database file.
    pub embedded_path: PathBuf,
    /// etcd client URLs.
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in the datastore.
    pub prefix: String,
    /// Socket and datastore timeout, milliseconds.
    pub timeout_ms: u64,
    /// This node's name; default `$NODENAME`, else the kernel host name.
    pub node: Option<String>,
    /// This node's labels, for pool node selectors.
    pub node_labels: BTreeMap<String, String>,
    /// Allocate an IPv4 address.
    pub assign_ipv4: bool,
    /// Allocate an IPv6 address.
    pub assign_ipv6: bool,
    /// Restrict to these pools (names).
    pub pools: Vec<String>,
    /// Standalone only: pools created in the datastore when absent.
    pub bootstrap_pools: Vec<Pool>,
    /// Standalone only: IPAM settings written when none exist yet.
    pub bootstrap_config: Option<IpamConfig>,
    /// Routes returned in the ADD result; default a default route per family.
    pub routes: Option<Vec<RouteConf>>,
}

/// A route in the plugin config.
#[derive(Debug, Clone, Deserialize)]
pub struct RouteConf {
    /// Destination.
    pub dst: ipnet::IpNet,
    /// Gateway, if any.
    #[serde(default)]
    pub gw: Option<std::net::IpAddr>,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            mode: Mode::Auto,
            socket: PathBuf::from(brindle_api::CTRL_SOCKET),
            store: StoreKind::Embedded,
            embedded_path: PathBuf::from(DEFAULT_EMBEDDED_PATH),
            etcd_endpoints: Vec::new(),
            prefix: DEFAULT_ETCD_PREFIX.to_owned(),
            timeout_ms: 10_000,
            node: None,
            node_labels: BTreeMap::new(),
            assign_ipv4: true,
            assign_ipv6: false,
            pools: Vec::new(),
            bootstrap_pools: Vec::new(),
            bootstrap_config: None,
            routes: None,
        }
    }
}

impl PluginConfig {
    /// The timeout as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// This node's name.
    pub fn node_name(&self) -> String {
        self.node
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| std::env::var("NODENAME").ok().filter(|n| !n.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "localhost".to_owned())
    }
}

fn remote(kind: RemoteErrorKind, message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind,
        message: message.into(),
    }
}

/// A reachable IPAM: the daemon over its socket, or a datastore opened here.
pub enum Backend {
    /// The node daemon.
    Daemon(Client),
    /// A datastore opened by this process.
    Local(Ipam<Box<dyn Datastore>>),
}

impl Backend {
    /// Connects as `cfg` says. `Auto` tries the socket first.
    pub fn open(cfg: &PluginConfig) -> Result<Backend, RemoteError> {
        let try_daemon = || Client::connect(&cfg.socket, cfg.timeout());
        match cfg.mode {
            Mode::Daemon => try_daemon().map(Backend::Daemon).map_err(|e| {
                remote(
                    RemoteErrorKind::TryAgainLater,
                    format!("node daemon at {}: {e}", cfg.socket.display()),
                )
            }),
            Mode::Auto => match try_daemon() {
                Ok(c) => Ok(Backend::Daemon(c)),
                Err(e) => {
                    tracing::debug!(socket = %cfg.socket.display(), error = %e, "no daemon, opening the datastore");
                    Self::open_local(cfg)
                }
            },
            Mode::Standalone => Self::open_local(cfg),
        }
    }

    /// Opens the configured datastore in this process and applies the
    /// bootstrap pools and settings.
    pub fn open_local(cfg: &PluginConfig) -> Result<Backend, RemoteError> {
        let unavailable =
            |e: crate::store::StoreError| remote(RemoteErrorKind::TryAgainLater, e.to_string());
        let store: Box<dyn Datastore> = match cfg.store {
            StoreKind::Embedded => Box::new(
                EmbeddedStore::open(&cfg.embedded_path, EmbeddedMode::Shared, cfg.timeout())
                    .map_err(unavailable)?,
            ),
            StoreKind::Etcd => {
                if cfg.etcd_endpoints.is_empty() {
                    return Err(remote(
                        RemoteErrorKind::InvalidRequest,
                        "store is etcd but etcd_endpoints is empty",
                    ));
                }
                Box::new(
                    EtcdStore::connect(&cfg.etcd_endpoints, cfg.timeout()).map_err(unavailable)?,
                )
            }
        };
        let ipam = Ipam::new(store, &cfg.prefix).with_retry_deadline(cfg.timeout());
        let to_remote = |e: crate::IpamError| remote(e.kind(), e.to_string());
        if !cfg.bootstrap_pools.is_empty() || cfg.bootstrap_config.is_some() {
            let existing = ipam.pools().map_err(to_remote)?;
            for p in &cfg.bootstrap_pools {
                if !existing.iter().any(|e| e.name == p.name) {
                    ipam.put_pool(p).map_err(to_remote)?;
                }
            }
            if let Some(c) = &cfg.bootstrap_config {
                ipam.set_config_if_absent(c).map_err(to_remote)?;
            }
        }
        Ok(Backend::Local(ipam))
    }

    /// Sends one request and decodes its result.
    pub fn call<T: DeserializeOwned>(&mut self, op: IpamOp) -> Result<T, RemoteError> {
        let value: Value = match self {
            Backend::Daemon(client) => {
                client
                    .call::<_, Value>(&IpamRequest::new(op))
                    .map_err(|e| match e {
                        FramingError::Remote(r) => r,
                        other => remote(
                            RemoteErrorKind::TryAgainLater,
                            format!("node daemon: {other}"),
                        ),
                    })?
            }
            Backend::Local(ipam) => handle_request(ipam, IpamRequest::new(op)).into_result()?,
        };
        serde_json::from_value(value)
            .map_err(|e| remote(RemoteErrorKind::Internal, format!("unexpected reply: {e}")))
    }

    /// `daemon` or the datastore kind.
    pub fn describe(&self) -> &'static str {
        match self {
            Backend::Daemon(_) => "daemon",
            Backend::Local(i) => i.store().kind(),
        }
    }
}
