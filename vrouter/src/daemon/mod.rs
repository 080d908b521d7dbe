//! The running dataplane: the static `run` mode (ports, routes and
//! neighbours from flags or a TOML file, no controller) and the `serve`
//! daemon (programmed over the Unix socket of `brindle_api::vrouter`), with
//! the worker thread ([`engine`]), the control state ([`control`]) and the
//! metrics/health endpoint ([`metrics`]).

pub mod control;
pub mod engine;
pub mod metrics;
pub mod neighbors;
pub mod run;
pub mod serve;
pub mod spec;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::Context;

use crate::daemon::run::RunConfig;
use crate::daemon::spec::{CpuSpec, FileConfig, IoMode, NeighSpec, Polling, PortSpec, RouteSpec};

/// Flags of `brindle-vrouter run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// A TOML file with the same settings (`ports`, `routes`, `neighbors`,
    /// `node`, `underlay_prefix_len`, `vxlan_vni`, `vxlan_port`, `cpu`,
    /// `polling`, `io`, `umem_frames`); flags add to its lists and override
    /// its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A port: `IF` (appliance: every frame to the vrouter), `IF=uplink`,
    /// `IF=host` or `IF=pod:ADDR[,ADDR]` (proxy ARP, anti-spoofing, a /32
    /// route per address). Repeat for each port.
    #[arg(long = "port", value_name = "IF[=KIND]")]
    pub ports: Vec<PortSpec>,
    /// A route: `CIDR=PORT`, `CIDR=ipip:REMOTE`, `CIDR=vxlan:REMOTE`,
    /// `CIDR=via:GW@PORT`, `CIDR=blackhole` or `CIDR=host`.
    #[arg(long = "route", value_name = "CIDR=TARGET")]
    pub routes: Vec<RouteSpec>,
    /// A static neighbour `IP=MAC[@PORT]`. Inside a prefix routed to a
    /// port, it is that port's peer.
    #[arg(long = "neighbor", value_name = "IP=MAC")]
    pub neighbors: Vec<NeighSpec>,
    /// The node's underlay address (tunnel endpoint).
    #[arg(long)]
    pub node: Option<Ipv4Addr>,
    /// Prefix length of the underlay subnet [default: 24].
    #[arg(long)]
    pub underlay_prefix_len: Option<u8>,
    /// VXLAN VNI [default: 4096].
    #[arg(long)]
    pub vxlan_vni: Option<u32>,
    /// VXLAN UDP port [default: 4789].
    #[arg(long)]
    pub vxlan_port: Option<u16>,
    /// Worker cores: one worker per core, each pinned: `1`, `0,1`, `0-1`
    /// or `auto` (every core this process may use). Without it, one
    /// unpinned worker.
    #[arg(long, value_name = "CPUS")]
    pub cpu: Option<String>,
    /// Polling policy [default: adaptive].
    #[arg(long, value_enum)]
    pub polling: Option<Polling>,
    /// Socket kind [default: auto].
    #[arg(long, value_enum)]
    pub io: Option<IoMode>,
    /// UMEM frames of 2048 B; registering the UMEM counts against
    /// RLIMIT_MEMLOCK [default: 4096 = 8 MiB].
    #[arg(long)]
    pub umem_frames: Option<u32>,
}

impl RunArgs {
    /// Merges the file (if any) and the flags.
    pub fn resolve(self) -> anyhow::Result<RunConfig> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read {}", path.display()))?;
                match toml::from_str::<FileConfig>(&text) {
                    Ok(c) => c,
                    Err(e) => {
                        // The node daemon's file (deploy/systemd/vrouter.toml)
                        // belongs to `serve`; say so rather than list keys.
                        let daemon_keys = ["cores", "api", "metrics", "xdp", "uplink"];
                        let looks_like_daemon = toml::from_str::<toml::Table>(&text)
                            .is_ok_and(|t| daemon_keys.iter().any(|k| t.contains_key(*k)));
                        if looks_like_daemon {
                            anyhow::bail!(
                                "{} is a daemon config (cores, [api], [metrics], [xdp]): run `brindle-vrouter serve --config {}`",
                                path.display(),
                                path.display()
                            );
                        }
                        return Err(e).with_context(|| format!("parse {}", path.display()));
                    }
                }
            }
            None => FileConfig::default(),
        };
        let mut ports: Vec<PortSpec> = file
            .ports
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        ports.extend(self.ports);
        let mut routes: Vec<RouteSpec> = file
            .routes
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        routes.extend(self.routes);
        let mut neighbors: Vec<NeighSpec> = file
            .neighbors
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        neighbors.extend(self.neighbors);
        Ok(RunConfig {
            ports,
            routes,
            neighbors,
            node: self.node.or(file.node),
            underlay_prefix_len: self
                .underlay_prefix_len
                .or(file.underlay_prefix_len)
                .unwrap_or(24),
            vxlan_vni: self.vxlan_vni.or(file.vxlan_vni).unwrap_or(4096),
            vxlan_port: self
                .vxlan_port
                .or(file.vxlan_port)
                .unwrap_or(crate::wire::VXLAN_PORT),
            cores: match self.cpu.map(CpuSpec::List).or(file.cpu) {
                Some(spec) => spec.cores()?,
                None => Vec::new(),
            },
            polling: self.polling.or(file.polling).unwrap_or_default(),
            io: self.io.or(file.io).unwrap_or_default(),
            umem_frames: self.umem_frames.or(file.umem_frames).unwrap_or(4096),
        })
    }
}
