//! `brindle-ipam admin ...`: the IPAM views and repairs, as tables or JSON,
//! through the daemon's socket or directly on a datastore. The daemon's CLI
//! (`brindlectl ipam ...`) sends the same `IpamOp` requests on
//! `/run/brindle/ctrl.sock`.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use brindle_api::ipam::{
    AllocateResult, BlockView, GcReport, HandleId, HandleView, IpamOp, IpamStatus, PoolView,
    ReleaseResult,
};
use brindle_ipam::config::{Backend, Mode, PluginConfig, StoreKind};
use brindle_ipam::model::{Encapsulation, IpamConfig, Pool};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(name = "brindle-ipam admin", about = "Brindle IPAM views and repairs")]
pub struct Admin {
    /// How to reach the IPAM state.
    #[arg(long, value_enum, default_value = "auto", global = true)]
    mode: ModeArg,
    /// The node daemon's socket.
    #[arg(long, default_value = brindle_api::CTRL_SOCKET, global = true)]
    socket: PathBuf,
    /// Standalone datastore.
    #[arg(long, value_enum, default_value = "embedded", global = true)]
    store: StoreArg,
    /// Embedded database file.
    #[arg(long, default_value = brindle_ipam::config::DEFAULT_EMBEDDED_PATH, global = true)]
    embedded_path: PathBuf,
    /// etcd client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', global = true)]
    etcd_endpoints: Vec<String>,
    /// Key prefix in the datastore.
    #[arg(long, default_value = brindle_ipam::config::DEFAULT_ETCD_PREFIX, global = true)]
    prefix: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    output: Output,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    Auto,
    Daemon,
    Standalone,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StoreArg {
    Embedded,
    Etcd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Pools with usage.
    Pools,
    /// Blocks with affinity and usage.
    Blocks,
    /// Allocations by handle.
    Handles,
    /// Release one address, whoever holds it.
    Release {
        /// The address.
        address: IpAddr,
    },
    /// Release the handles of nodes that no longer exist, and their empty blocks.
    Gc {
        /// The nodes that still exist (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        live_nodes: Vec<String>,
    },
    /// Datastore reachability and free addresses.
    Status,
    /// Standalone only: check the invariants between blocks and handles.
    Audit,
    /// Standalone only: create or replace a pool.
    PoolAdd {
        /// Pool name.
        #[arg(long)]
        name: String,
        /// Pool CIDR.
        #[arg(long)]
        cidr: ipnet::IpNet,
        /// Block prefix length.
        #[arg(long)]
        block_size: Option<u8>,
        /// Encapsulation (none, ipip, ipip_cross_subnet, vxlan, vxlan_cross_subnet).
        #[arg(long, default_value = "none")]
        encapsulation: String,
        /// Outgoing NAT.
        #[arg(long)]
        nat_outgoing: bool,
        /// Node selector.
        #[arg(long, default_value = "all()")]
        node_selector: String,
        /// Create the pool disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// Standalone only: set strict affinity and the per-node block cap.
    ConfigSet {
        /// Never borrow from other nodes' blocks.
        #[arg(long)]
        strict_affinity: bool,
        /// Most blocks per node (0: no limit).
        #[arg(long, default_value_t = 0)]
        max_blocks_per_host: u32,
    },
    /// Test and benchmark helper: allocate `count` addresses for `node`
    /// (handles `stress/<tag>-<i>/eth0`), print them as JSON; with
    /// `--release`, release them instead.
    #[command(hide = true)]
    Stress {
        #[arg(long)]
        node: String,
        #[arg(long)]
        tag: String,
        #[arg(long)]
        count: u32,
        #[arg(long)]
        release: bool,
    },
}

fn print<T: Serialize>(
    out: &mut impl Write,
    output: Output,
    v: &T,
    table: impl FnOnce() -> Vec<Vec<String>>,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, v)?;
            writeln!(out)?;
        }
        Output::Table => {
            let rows = table();
            let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
                .map(|c| {
                    rows.iter()
                        .map(|r| r.get(c).map_or(0, String::len))
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for r in rows {
                let line: Vec<String> = r
                    .iter()
                    .zip(&widths)
                    .map(|(cell, w)| format!("{cell:<w$}"))
                    .collect();
                writeln!(out, "{}", line.join("  ").trim_end())?;
            }
        }
    }
    Ok(())
}

fn header(cols: &[&str]) -> Vec<String> {
    cols.iter().map(|c| c.to_string()).collect()
}

/// Runs the admin command line `args` (without the leading `admin`).
pub fn run(args: &[String], out: &mut impl Write) -> anyhow::Result<()> {
    let a = Admin::try_parse_from(
        std::iter::once("brindle-ipam admin".to_owned()).chain(args.iter().cloned()),
    )?;
    let cfg = PluginConfig {
        mode: match a.mode {
            ModeArg::Auto => Mode::Auto,
            ModeArg::Daemon => Mode::Daemon,
            ModeArg::Standalone => Mode::Standalone,
        },
        socket: a.socket.clone(),
        store: match a.store {
            StoreArg::Embedded => StoreKind::Embedded,
            StoreArg::Etcd => StoreKind::Etcd,
        },
        embedded_path: a.embedded_path.clone(),
        etcd_endpoints: a.etcd_endpoints.clone(),
        prefix: a.prefix.clone(),
        ..PluginConfig::default()
    };
    let mut backend = Backend::open(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let o = a.output;
    macro_rules! call {
        ($op:expr) => {
            backend.call($op).map_err(|e| anyhow::anyhow!("{e}"))?
        };
    }
    match a.command {
        AdminCommand::Pools => {
            let pools: Vec<PoolView> = call!(IpamOp::IpamListPools);
            print(out, o, &pools, || {
                let mut rows = vec![header(&[
                    "NAME",
                    "CIDR",
                    "BLOCK",
                    "ENCAP",
                    "NAT",
                    "SELECTOR",
                    "DISABLED",
                    "BLOCKS",
                    "ALLOCATED",
                    "CAPACITY",
                ])];
                rows.extend(pools.iter().map(|p| {
                    vec![
                        p.name.clone(),
                        p.cidr.to_string(),
                        format!("/{}", p.block_size),
                        p.encapsulation.to_string(),
                        p.nat_outgoing.to_string(),
                        p.node_selector.clone(),
                        p.disabled.to_string(),
                        p.blocks.to_string(),
                        p.allocated.to_string(),
                        p.capacity.to_string(),
                    ]
                }));
                rows
            })
        }
        AdminCommand::Blocks => {
            let blocks: Vec<BlockView> = call!(IpamOp::IpamListBlocks);
            print(out, o, &blocks, || {
                let mut rows = vec![header(&[
                    "BLOCK",
                    "POOL",
                    "AFFINITY",
                    "ALLOCATED",
                    "USABLE",
                ])];
                rows.extend(blocks.iter().map(|b| {
                    vec![
                        b.cidr.to_string(),
                        b.pool.clone(),
                        b.affinity.clone().unwrap_or_else(|| "-".into()),
                        b.allocated.to_string(),
                        b.usable.to_string(),
                    ]
                }));
                rows
            })
        }
        AdminCommand::Handles => {
            let handles: Vec<HandleView> = call!(IpamOp::IpamListHandles);
            print(out, o, &handles, || {
                let mut rows = vec![header(&["HANDLE", "NODE", "POD", "ADDRESSES"])];
                rows.extend(handles.iter().map(|h| {
                    let pod = match (&h.attrs.namespace, &h.attrs.pod) {
                        (Some(ns), Some(p)) => format!("{ns}/{p}"),
                        (None, Some(p)) => p.clone(),
                        _ => "-".into(),
                    };
                    let addrs: Vec<String> = h.addresses.iter().map(IpAddr::to_string).collect();
                    vec![
                        h.handle.to_string(),
                        h.attrs.node.clone(),
                        pod,
                        addrs.join(","),
                    ]
                }));
                rows
            })
        }
        AdminCommand::Release { address } => {
            let r: ReleaseResult = call!(IpamOp::IpamReleaseAddress { address });
            print(out, o, &r, || {
                vec![vec![if r.released.is_empty() {
                    format!("{address} was not allocated")
                } else {
                    format!("released {address}")
                }]]
            })
        }
        AdminCommand::Gc { live_nodes } => {
            let r: GcReport = call!(IpamOp::IpamGcNodes { live_nodes });
            print(out, o, &r, || {
                vec![vec![format!(
                    "released {} handles, {} addresses; deleted {} blocks",
                    r.handles.len(),
                    r.addresses.len(),
                    r.blocks.len()
                )]]
            })
        }
        AdminCommand::Status => {
            let s: IpamStatus = call!(IpamOp::IpamStatus);
            print(out, o, &s, || {
                vec![
                    header(&["DATASTORE", "POOLS", "FREE"]),
                    vec![s.datastore.clone(), s.pools.to_string(), s.free.to_string()],
                ]
            })
        }
        AdminCommand::Audit => {
            let Backend::Local(ipam) = &backend else {
                bail!("audit needs --mode standalone")
            };
            let problems = ipam.audit().map_err(|e| anyhow::anyhow!("{e}"))?;
            print(out, o, &problems, || {
                if problems.is_empty() {
                    vec![vec!["consistent".into()]]
                } else {
                    problems.iter().map(|p| vec![p.clone()]).collect()
                }
            })?;
            if !problems.is_empty() {
                bail!("{} problems", problems.len());
            }
            Ok(())
        }
        AdminCommand::PoolAdd {
            name,
            cidr,
            block_size,
            encapsulation,
            nat_outgoing,
            node_selector,
            disabled,
        } => {
            let Backend::Local(ipam) = &backend else {
                bail!("pool-add needs --mode standalone")
            };
            let encapsulation: Encapsulation =
                serde_json::from_value(serde_json::Value::String(encapsulation.clone()))
                    .with_context(|| format!("encapsulation {encapsulation:?}"))?;
            let pool = Pool {
                block_size,
                encapsulation,
                nat_outgoing,
                node_selector,
                disabled,
                ..Pool::new(&name, cidr)
            };
            ipam.put_pool(&pool).map_err(|e| anyhow::anyhow!("{e}"))?;
            print(out, o, &pool, || {
                vec![vec![format!("pool {name} {cidr} saved")]]
            })
        }
        AdminCommand::ConfigSet {
            strict_affinity,
            max_blocks_per_host,
        } => {
            let Backend::Local(ipam) = &backend else {
                bail!("config-set needs --mode standalone")
            };
            let c = IpamConfig {
                strict_affinity,
                max_blocks_per_host,
            };
            ipam.set_config(&c).map_err(|e| anyhow::anyhow!("{e}"))?;
            print(out, o, &c, || vec![vec!["saved".into()]])
        }
        AdminCommand::Stress {
            node,
            tag,
            count,
            release,
        } => {
            let mut got = Vec::new();
            for i in 0..count {
                let handle = HandleId {
                    network: "stress".into(),
                    container_id: format!("{tag}-{i}"),
                    ifname: "eth0".into(),
                };
                if release {
                    let r: ReleaseResult = call!(IpamOp::IpamReleaseHandle { handle });
                    got.extend(r.released);
                } else {
                    let r: AllocateResult = call!(IpamOp::IpamAllocate {
                        handle,
                        node: node.clone(),
                        node_labels: Default::default(),
                        attrs: Default::default(),
                        pools: Vec::new(),
                        ipv4: true,
                        ipv6: false,
                    });
                    got.extend(r.addresses.into_iter().map(|a| a.address.addr()));
                }
            }
            serde_json::to_writer(&mut *out, &got)?;
            writeln!(out)?;
            Ok(())
        }
    }
}
