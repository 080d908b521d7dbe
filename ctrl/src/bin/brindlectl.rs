//! `brindlectl`: inspect and operate a node (talks to `ctrl.sock` and
//! `vrouter.sock`). Tables by default, `-o json` or `-o yaml`.
#![forbid(unsafe_code)]

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use brindle_api::endpoint::EndpointRequest;
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::ipam::{HandleId, IpamOp, IpamRequest};
use brindle_api::vrouter::VrouterRequest;
use brindle_ctrl::ctrl_api::CtrlRequest;
use brindle_ctrl::policy::ops::PolicyRequest;
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
    /// Create or replace policy resources (Kubernetes NetworkPolicy,
    /// Namespace, Pod, ServiceAccount; Calico NetworkPolicy,
    /// GlobalNetworkPolicy, Tier, GlobalNetworkSet), all or nothing.
    Apply {
        /// A file of YAML or JSON documents, `-` for stdin.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Delete the policy resources a file names, all or nothing.
    Delete {
        /// A file of YAML or JSON documents, `-` for stdin.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// Skip resources that do not exist instead of failing.
        #[arg(long)]
        ignore_not_found: bool,
    },
    /// List stored policy resources: networkpolicies, globalnetworkpolicies,
    /// tiers, globalnetworksets, namespaces, pods, serviceaccounts, all.
    Get {
        /// The kind.
        kind: String,
        /// Only this namespace.
        #[arg(short, long)]
        namespace: Option<String>,
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
    /// Network policy counters per policy and rule (denied packets,
    /// allowed flows), summed over the workers.
    PolicyStats,
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
        Command::Vrouter {
            what: VrouterCmd::PolicyStats,
        } => call(&cli.vrouter_socket, &VrouterRequest::PolicyStats)?,
        Command::Apply { file } => {
            let documents = read_input(&file)?;
            let report = call(ctrl, &PolicyRequest::PolicyApply { documents })?;
            return print_report(cli.output, &report);
        }
        Command::Delete {
            file,
            ignore_not_found,
        } => {
            let documents = read_input(&file)?;
            let req = PolicyRequest::PolicyDelete {
                documents,
                ignore_not_found,
            };
            let report = call(ctrl, &req)?;
            return print_report(cli.output, &report);
        }
        Command::Get { kind, namespace } => {
            let items = call(ctrl, &PolicyRequest::PolicyGet { kind, namespace })?;
            match cli.output {
                // A `v1 List`, as kubectl prints it: `apply -f` takes it back.
                Format::Table => print!("{}", table(&resource_rows(&items))),
                Format::Json => println!("{}", serde_json::to_string_pretty(&as_list(items))?),
                Format::Yaml => print!("{}", serde_norway::to_string(&as_list(items))?),
            }
            return Ok(());
        }
    };
    match cli.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&value)?),
        Format::Yaml => print!("{}", serde_norway::to_string(&value)?),
        Format::Table => print!("{}", table(&value)),
    }
    Ok(())
}

/// The documents of `-f`: a file, or stdin for `-`; at most what one
/// request may carry.
fn read_input(file: &Path) -> anyhow::Result<String> {
    let limit = brindle_api::framing::MAX_MESSAGE_BYTES as u64 / 2;
    let mut text = String::new();
    let read = if file == Path::new("-") {
        std::io::stdin().take(limit + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(limit + 1).read_to_string(&mut text))
    };
    read.with_context(|| format!("reading {}", file.display()))?;
    anyhow::ensure!(
        text.len() as u64 <= limit,
        "{}: larger than {limit} bytes",
        file.display()
    );
    Ok(text)
}

/// `kind namespace/name outcome` lines (kubectl's), or the report as data.
fn print_report(format: Format, report: &Value) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(report)?),
        Format::Yaml => print!("{}", serde_norway::to_string(report)?),
        Format::Table => {
            for line in report.as_array().into_iter().flatten() {
                println!("{} {}", cell(&line["resource"]), cell(&line["outcome"]));
            }
        }
    }
    Ok(())
}

fn as_list(items: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// One row per resource: kind, namespace, name and what matters of it.
fn resource_rows(items: &Value) -> Value {
    let rows: Vec<Value> = items
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let spec = &r["spec"];
            let meta = &r["metadata"];
            let api = r["apiVersion"].as_str().unwrap_or_default();
            let kind = match (r["kind"].as_str().unwrap_or_default(), api) {
                ("NetworkPolicy", "networking.k8s.io/v1") => "NetworkPolicy (k8s)".to_owned(),
                (k, _) => k.to_owned(),
            };
            let what = match kind.as_str() {
                "NetworkPolicy (k8s)" => format!("podSelector={}", compact(&spec["podSelector"])),
                "NetworkPolicy" | "GlobalNetworkPolicy" => format!(
                    "tier={} order={} selector={}",
                    spec["tier"].as_str().unwrap_or("default"),
                    cell(&spec["order"]),
                    spec["selector"].as_str().unwrap_or("all()")
                ),
                "Tier" => format!("order={}", cell(&spec["order"])),
                "GlobalNetworkSet" => format!("nets={}", cell(&spec["nets"])),
                _ => format!("labels={}", compact(&meta["labels"])),
            };
            serde_json::json!({
                "kind": kind,
                "namespace": meta["namespace"],
                "name": meta["name"],
                "spec": what,
            })
        })
        .collect();
    Value::Array(rows)
}

fn compact(v: &Value) -> String {
    match v {
        Value::Null => "{}".into(),
        other => other.to_string(),
    }
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
