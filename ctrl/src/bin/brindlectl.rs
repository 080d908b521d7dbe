//! `brindlectl`: inspect and operate a node (talks to `ctrl.sock` and
//! `vrouter.sock`). Tables by default, `-o json` or `-o yaml`.
#![forbid(unsafe_code)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use brindle_api::endpoint::EndpointRequest;
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::ipam::{HandleId, IpamOp, IpamRequest};
use brindle_api::vrouter::VrouterRequest;
use brindle_ctrl::ctrl_api::CtrlRequest;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;

#[derive(Parser)]
#[command(name = "brindlectl", about = "Inspect and operate a Brindle node")]
struct Cli {
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: Format,
    /// The node daemon's socket.
    #[arg(long, env = "BRINDLE_API_SOCKET", default_value = brindle_api::CTRL_SOCKET, global = true)]
    ctrl_socket: PathBuf,
    /// The vrouter's socket.
    #[arg(long, env = "BRINDLE_VROUTER_SOCKET", default_value = brindle_api::VROUTER_SOCKET, global = true)]
    vrouter_socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
    Yaml,
}

#[derive(Subcommand)]
enum Command {
    /// This node: name, address, AS, datastore, vrouter, blocks, nodes.
    Node {
        #[command(subcommand)]
        what: NodeCmd,
    },
    /// BGP peers and routes.
    Bgp {
        #[command(subcommand)]
        what: BgpCmd,
    },
    /// Endpoints on this node.
    Endpoints {
        /// Only this network.
        #[arg(long)]
        network: Option<String>,
    },
    /// IPAM views and operations.
    Ipam {
        #[command(subcommand)]
        what: IpamCmd,
    },
    /// The vrouter's counters and FIB.
    Vrouter {
        #[command(subcommand)]
        what: VrouterCmd,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Status of this node.
    Status,
}

#[derive(Subcommand)]
enum BgpCmd {
    /// Peers with state and counters.
    Peers,
    /// Every path, best marked.
    Routes,
}

#[derive(Subcommand)]
enum IpamCmd {
    /// Pools.
    Pools,
    /// Blocks.
    Blocks,
    /// Handles.
    Handles,
    /// Release an address, or every address of a handle (network/container/ifname).
    Release {
        /// An IP address or a handle.
        what: String,
    },
    /// Release the handles of nodes not listed.
    Gc {
        /// The nodes still alive.
        #[arg(long = "live-node", required = true)]
        live_nodes: Vec<String>,
    },
}

#[derive(Subcommand)]
enum VrouterCmd {
    /// Counters per worker.
    Stats,
    /// The FIB.
    Routes,
}

fn ipam(op: IpamOp) -> IpamRequest {
    IpamRequest {
        v: PROTOCOL_VERSION,
        op,
    }
}

fn call<R: serde::Serialize>(socket: &PathBuf, req: &R) -> anyhow::Result<Value> {
    let mut c = Client::connect(socket, Duration::from_secs(10))
        .with_context(|| format!("connecting to {}", socket.display()))?;
    Ok(c.call(req)?)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let ctrl = &cli.ctrl_socket;
    let value = match cli.command {
        Command::Node {
            what: NodeCmd::Status,
        } => call(ctrl, &CtrlRequest::CtrlNodeStatus)?,
        Command::Bgp {
            what: BgpCmd::Peers,
        } => call(ctrl, &CtrlRequest::CtrlBgpPeers)?,
        Command::Bgp {
            what: BgpCmd::Routes,
        } => call(ctrl, &CtrlRequest::CtrlBgpRoutes)?,
        Command::Endpoints { network } => call(ctrl, &EndpointRequest::ListEndpoints { network })?,
        Command::Ipam { what } => {
            let op = match what {
                IpamCmd::Pools => IpamOp::IpamListPools,
                IpamCmd::Blocks => IpamOp::IpamListBlocks,
                IpamCmd::Handles => IpamOp::IpamListHandles,
                IpamCmd::Release { what } => match what.parse::<IpAddr>() {
                    Ok(address) => IpamOp::IpamReleaseAddress { address },
                    Err(_) => {
                        let parts: Vec<&str> = what.split('/').collect();
                        let [network, container_id, ifname] = parts[..] else {
                            anyhow::bail!(
                                "{what:?}: expected an IP address or network/container/ifname"
                            );
                        };
                        IpamOp::IpamReleaseHandle {
                            handle: HandleId {
                                network: network.into(),
                                container_id: container_id.into(),
                                ifname: ifname.into(),
                            },
                        }
                    }
                },
                IpamCmd::Gc { live_nodes } => IpamOp::IpamGcNodes { live_nodes },
            };
            call(ctrl, &ipam(op))?
        }
        Command::Vrouter {
            what: VrouterCmd::Stats,
        } => call(&cli.vrouter_socket, &VrouterRequest::GetStats)?,
        Command::Vrouter {
            what: VrouterCmd::Routes,
        } => call(&cli.vrouter_socket, &VrouterRequest::DumpRoutes)?,
    };
    match cli.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&value)?),
        Format::Yaml => print!("{}", serde_norway::to_string(&value)?),
        Format::Table => print!("{}", table(&value)),
    }
    Ok(())
}

/// One cell: scalars as they are, nested values as compact JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            a.iter().map(cell).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

/// A list of objects as aligned columns (keys of the first row); an object
/// as key/value lines (nested lists of objects as sub-tables).
fn table(v: &Value) -> String {
    match v {
        Value::Array(rows) if rows.is_empty() => "(none)\n".into(),
        Value::Array(rows) if rows.iter().all(Value::is_object) => {
            let cols: Vec<String> = rows[0]
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            let mut grid: Vec<Vec<String>> = vec![cols.iter().map(|c| c.to_uppercase()).collect()];
            for r in rows {
                grid.push(cols.iter().map(|c| cell(&r[c])).collect());
            }
            let widths: Vec<usize> = (0..cols.len())
                .map(|i| grid.iter().map(|row| row[i].len()).max().unwrap_or(0))
                .collect();
            let mut out = String::new();
            for row in grid {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                out.push_str(line.join("  ").trim_end());
                out.push('\n');
            }
            out
        }
        Value::Object(o) => {
            let mut out = String::new();
            let mut nested = String::new();
            for (k, val) in o {
                match val {
                    Value::Array(a) if a.iter().any(Value::is_object) => {
                        nested.push_str(&format!("\n{}:\n{}", k.to_uppercase(), table(val)));
                    }
                    _ => out.push_str(&format!("{k}: {}\n", cell(val))),
                }
            }
            out + &nested
        }
        other => format!("{}\n", cell(other)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_list_of_objects_is_aligned_columns() {
        let v = json!([
            {"prefix": "10.244.1.0/26", "next_hop": "192.168.0.12", "best": true, "as_path": []},
            {"prefix": "10.244.2.0/26", "next_hop": "192.168.0.13", "best": false, "as_path": [65001, 65002]},
        ]);
        assert_eq!(
            table(&v),
            "AS_PATH      BEST   NEXT_HOP      PREFIX\n\
             \x20            true   192.168.0.12  10.244.1.0/26\n\
             65001,65002  false  192.168.0.13  10.244.2.0/26\n"
        );
    }

    #[test]
    fn an_object_is_key_value_lines_with_nested_tables_last() {
        let v = json!({"name": "n1", "vrouter_reachable": false, "nodes": [{"name": "n1", "live": true}], "peer": null});
        assert_eq!(
            table(&v),
            "name: n1\npeer: -\nvrouter_reachable: false\n\nNODES:\nLIVE  NAME\ntrue  n1\n"
        );
        assert_eq!(table(&json!([])), "(none)\n");
    }
}
