//! `serve`'s configuration: `/etc/brindle/vrouter.toml`, validated once at
//! the edge (an unknown key or a misspelt mode is an error, never a
//! default), then the flags.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use brindle_xsk::{BindMode, XdpMode};
use serde::Deserialize;

use crate::engine::{EngineConfig, IoMode, Polling};

/// `/etc/brindle/vrouter.toml` (see `deploy/systemd/vrouter.toml`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Log filter when RUST_LOG is not set.
    pub log_level: String,
    /// `text` (default) or `json` (one object per line).
    pub log_format: LogFormat,
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
    /// The VXLAN settings the workers start with (the controller's
    /// `set_node` replaces them).
    pub encap: EncapConfig,
    /// Flows each worker's connection table holds (network policy; 73
    /// bytes per slot, slots a power of two at most 7/8 full: 100,000 take
    /// 9.6 MiB per worker, 1,000,000 take 146 MiB).
    pub flows_per_worker: usize,
}

/// `[encap]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncapConfig {
    /// VXLAN's UDP port.
    pub vxlan_port: u16,
    /// VXLAN's VNI.
    pub vxlan_vni: u32,
}

impl Default for EncapConfig {
    fn default() -> Self {
        EncapConfig {
            vxlan_port: crate::wire::VXLAN_PORT,
            vxlan_vni: 4096,
        }
    }
}

/// Where the steering programs attach (`[xdp] mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpModeSetting {
    /// In the driver; fails where the driver has no XDP.
    #[default]
    Native,
    /// The kernel's generic XDP.
    Generic,
    /// Native, else generic.
    Auto,
}

impl From<XdpModeSetting> for XdpMode {
    fn from(m: XdpModeSetting) -> XdpMode {
        match m {
            XdpModeSetting::Native => XdpMode::Native,
            XdpModeSetting::Generic => XdpMode::Generic,
            XdpModeSetting::Auto => XdpMode::Auto,
        }
    }
}

/// The AF_XDP bind mode (`[xdp] bind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BindSetting {
    /// Zero-copy, else copy.
    #[default]
    Auto,
    /// Zero-copy only.
    Zerocopy,
    /// Copy only.
    Copy,
}

impl From<BindSetting> for BindMode {
    fn from(b: BindSetting) -> BindMode {
        match b {
            BindSetting::Auto => BindMode::Auto,
            BindSetting::Zerocopy => BindMode::ZeroCopy,
            BindSetting::Copy => BindMode::Copy,
        }
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// `[api]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Socket path.
    pub socket: PathBuf,
}

/// `[metrics]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Listen address; empty disables.
    pub listen: String,
}

/// `[xdp]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XdpConfig {
    /// native | generic | auto.
    pub mode: XdpModeSetting,
    /// auto | zerocopy | copy.
    pub bind: BindSetting,
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
            log_format: LogFormat::Text,
            uplink: String::new(),
            cores: "auto".into(),
            adaptive_polling: true,
            polling: None,
            api: ApiConfig::default(),
            metrics: MetricsConfig::default(),
            xdp: XdpConfig::default(),
            io: IoMode::Auto,
            encap: EncapConfig::default(),
            flows_per_worker: crate::policy::DEFAULT_FLOWS_PER_WORKER,
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
            mode: XdpModeSetting::Native,
            bind: BindSetting::Auto,
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
    /// Log format (overrides `log_format`).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
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
        if let Some(f) = self.log_format {
            cfg.log_format = f;
        }
        Ok(cfg)
    }
}

impl ServeConfig {
    /// The engine's settings.
    pub fn engine(&self) -> anyhow::Result<EngineConfig> {
        anyhow::ensure!(
            self.flows_per_worker > 0,
            "flows_per_worker must be at least 1"
        );
        Ok(EngineConfig {
            cores: parse_cores(&self.cores)?,
            polling: self.polling.unwrap_or(if self.adaptive_polling {
                Polling::Adaptive
            } else {
                Polling::Busy
            }),
            io: self.io,
            umem_frames: self.xdp.umem_frames,
            ring_size: Some(self.xdp.ring_size),
            bind: self.xdp.bind.into(),
            xdp_mode: self.xdp.mode.into(),
            flows_per_worker: self.flows_per_worker,
        })
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

/// Logs to stderr: `RUST_LOG` wins, then `level`; ANSI colours only when
/// stderr is a terminal; `json`: one object per line.
pub fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../../deploy/systemd/vrouter.toml");

    #[test]
    fn the_shipped_config_parses_to_the_defaults() {
        let c: ServeConfig = toml::from_str(SHIPPED).unwrap();
        assert_eq!(c.xdp.mode, XdpModeSetting::Native);
        assert_eq!(c.xdp.bind, BindSetting::Auto);
        assert_eq!(c.encap.vxlan_vni, 4096);
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.flows_per_worker, crate::policy::DEFAULT_FLOWS_PER_WORKER);
    }

    #[test]
    fn the_flow_table_size_is_configurable_but_never_zero() {
        let c: ServeConfig = toml::from_str("flows_per_worker = 1000000\n").unwrap();
        assert_eq!(c.engine().unwrap().flows_per_worker, 1_000_000);
        let c: ServeConfig = toml::from_str("flows_per_worker = 0\n").unwrap();
        assert!(
            c.engine()
                .unwrap_err()
                .to_string()
                .contains("flows_per_worker")
        );
    }

    #[test]
    fn a_misspelt_mode_or_key_is_an_error_not_a_default() {
        let e = toml::from_str::<ServeConfig>("[xdp]\nbind = \"zero-copy\"\n").unwrap_err();
        assert!(e.to_string().contains("zero-copy"), "{e}");
        assert!(toml::from_str::<ServeConfig>("[xdp]\nmode = \"nativ\"\n").is_err());
        assert!(toml::from_str::<ServeConfig>("[xdp]\nbnid = \"copy\"\n").is_err());
        assert!(toml::from_str::<ServeConfig>("coers = \"auto\"\n").is_err());
        assert!(toml::from_str::<ServeConfig>("io = \"xpd\"\n").is_err());
        let c: ServeConfig =
            toml::from_str("io = \"af_packet\"\nlog_format = \"json\"\n[xdp]\nbind = \"copy\"\n")
                .unwrap();
        assert_eq!(c.io, IoMode::Packet);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(BindMode::from(c.xdp.bind), BindMode::Copy);
    }
}
