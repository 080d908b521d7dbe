//! Borrowed addresses on real traffic (issue 14 item 5, `LabConfig.borrow`,
//! `cargo xtask lab --borrow`): the default pool is 10.244.0.0/27 in /28
//! blocks, room for two blocks. Nodes 1 and 2 claim one each with their
//! first pods; node 3 can claim none, so its pods' addresses are borrowed
//! from node 1's or node 2's block (IPAM picks; its last resort, as Calico's). The all-pairs
//! ping before this step already sends every pod's traffic to them; this
//! step checks why it works and that it stops cleanly:
//!
//! - node 3 announces each of its pods' addresses as a /32 and no block;
//! - every other node's vrouter routes each /32 to node 3 (the block's
//!   owner too, where the rest of the block is a blackhole), and with the
//!   host port its kernel routes it into `brindle0` (proto 73);
//! - each borrowed pod answers a ping from a pod on every other node (and
//!   from every node's host with the host port);
//! - after the last borrowed pod's DEL its /32 is withdrawn everywhere.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use serde_json::Value;

use crate::cni::{Pod, cni_del};
use crate::exec::{in_ns, sh_within, succeeds_within, wait_for};
use crate::inspect::{brindlectl, brindlectl_json};
use crate::{LabConfig, node_ns};

/// The node whose pods borrow.
const BORROWER: u8 = 3;

/// ctrl's environment for the borrow lab: a pool of two /28 blocks.
pub(crate) fn ctrl_env() -> Vec<(&'static str, String)> {
    vec![
        ("BRINDLE_IPAM_DEFAULT_POOL_CIDR", "10.244.0.0/27".into()),
        ("BRINDLE_IPAM_BLOCK_SIZE", "28".into()),
    ]
}

/// What the lab config must be for node 3 to borrow and the pool to hold
/// every pod.
pub(crate) fn check(cfg: &LabConfig) -> Result<()> {
    if cfg.nodes != 3 || cfg.pods > 8 || cfg.density > 0 || cfg.policy_cases > 0 {
        bail!(
            "--borrow: 3 nodes, at most 8 pods each, no density or policy step (the pool has 32 addresses)"
        );
    }
    if cfg.pod_bench.is_some() {
        bail!("--borrow: no pod benchmark (its pods need a larger pool)");
    }
    Ok(())
}

/// What the step saw.
#[derive(Debug, Clone, Default)]
pub struct BorrowReport {
    /// Node 3's pods and their borrowed addresses.
    pub borrowed: Vec<(String, Ipv4Addr)>,
    /// The block they were borrowed from and its node.
    pub lender: Option<(IpNet, u8)>,
    /// Routes to a borrowed /32 checked on the other nodes (vrouter, and
    /// the kernel's with the host port).
    pub routes_checked: usize,
    /// Pings to a borrowed pod that were answered, of those sent.
    pub pings_ok: usize,
    pub pings: usize,
    /// The DELeted borrowed pod's /32 left every node.
    pub withdrawn: bool,
    /// What did not hold.
    pub problems: Vec<String>,
}

impl BorrowReport {
    pub fn success(&self) -> bool {
        self.problems.is_empty()
            && !self.borrowed.is_empty()
            && self.pings > 0
            && self.pings_ok == self.pings
            && self.withdrawn
    }
}

impl fmt::Display for BorrowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pods: Vec<String> = self
            .borrowed
            .iter()
            .map(|(p, ip)| format!("{p} {ip}"))
            .collect();
        writeln!(f, "borrowed on node {BORROWER}: {}", pods.join(", "))?;
        if let Some((block, n)) = &self.lender {
            writeln!(f, "from {block}, the block of {}", node_ns(*n))?;
        }
        writeln!(
            f,
            "routes to the /32s on the other nodes: {}; pings answered {}/{}; withdrawn after DEL: {}",
            self.routes_checked, self.pings_ok, self.pings, self.withdrawn
        )?;
        for p in &self.problems {
            writeln!(f, "FAIL {p}")?;
        }
        Ok(())
    }
}

fn status(cfg: &LabConfig, n: u8) -> Result<Value> {
    let text = brindlectl(cfg, n, &["-o", "json", "node", "status"])?;
    serde_json::from_str(&text).context("brindlectl node status")
}

fn nets(v: &Value) -> Vec<IpNet> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Node `n`'s vrouter routes `prefix` to `node` (encapsulated or natively).
fn vrouter_routes_to(cfg: &LabConfig, n: u8, prefix: IpNet, node: Ipv4Addr) -> bool {
    let node = node.to_string();
    brindlectl_json(cfg, n, &["vrouter", "routes"])
        .unwrap_or_default()
        .iter()
        .any(|r| {
            let t = &r["target"];
            r["prefix"].as_str() == Some(prefix.to_string().as_str())
                && (t["remote"].as_str() == Some(node.as_str())
                    || t["via"].as_str() == Some(node.as_str()))
        })
}

fn vrouter_has(cfg: &LabConfig, n: u8, prefix: IpNet) -> bool {
    brindlectl_json(cfg, n, &["vrouter", "routes"])
        .unwrap_or_default()
        .iter()
        .any(|r| r["prefix"].as_str() == Some(prefix.to_string().as_str()))
}

/// Node `n`'s kernel routes `prefix` into the host port (ctrl's proto 73).
fn kernel_routes_into_host_port(n: u8, prefix: IpNet) -> bool {
    sh_within(
        in_ns(&node_ns(n), "ip").args(["route", "show", "proto", "73"]),
        Duration::from_secs(10),
    )
    .is_ok_and(|out| {
        out.lines()
            .any(|l| l.split_whitespace().next() == Some(prefix.addr().to_string().as_str()))
    })
}

fn ping(ns: &str, ip: Ipv4Addr) -> bool {
    succeeds_within(
        in_ns(ns, "ping").args(["-c", "3", "-i", "0.2", "-W", "2", "-q", &ip.to_string()]),
        Duration::from_secs(20),
    )
}

/// The step; `pods` loses the borrowed pod it DELetes.
pub(crate) fn run(cfg: &LabConfig, pods: &mut Vec<Pod>) -> Result<BorrowReport> {
    let mut r = BorrowReport::default();
    let borrower_addr = cfg.node_addr(BORROWER);
    r.borrowed = pods
        .iter()
        .filter(|p| p.node == BORROWER)
        .map(|p| (p.name.clone(), p.ip))
        .collect();
    let hosts: Vec<IpNet> = r
        .borrowed
        .iter()
        .map(|(_, ip)| IpNet::from(std::net::IpAddr::V4(*ip)))
        .collect();

    // Node 3 has no block and announces each pod as a /32.
    let mut s3 = Value::Null;
    let announced = wait_for(
        "node 3 to announce its borrowed /32s",
        Duration::from_secs(20),
        || {
            s3 = status(cfg, BORROWER).unwrap_or_default();
            let mut want = hosts.clone();
            want.sort();
            nets(&s3["announced_borrowed"]) == want
        },
    );
    if announced.is_err() {
        r.problems.push(format!(
            "node 3 announces borrowed {:?}, its pods are {hosts:?}",
            nets(&s3["announced_borrowed"])
        ));
    }
    if !nets(&s3["announced_blocks"]).is_empty() {
        r.problems.push(format!(
            "node 3 announces blocks {:?}: the pool let it claim one",
            nets(&s3["announced_blocks"])
        ));
    }
    for n in (1..=cfg.nodes).filter(|&n| n != BORROWER) {
        let blocks = nets(&status(cfg, n)?["announced_blocks"]);
        if let Some(b) = blocks
            .iter()
            .find(|b| hosts.first().is_some_and(|h| b.contains(h)))
        {
            r.lender = Some((*b, n));
        }
    }
    if r.lender.is_none() {
        r.problems
            .push("no other node announces the block of node 3's addresses".into());
    }

    // Every other node routes each /32 to node 3, in the vrouter and, with
    // the host port, in the kernel.
    for n in (1..=cfg.nodes).filter(|&n| n != BORROWER) {
        for h in &hosts {
            let ok = wait_for("the /32 route", Duration::from_secs(20), || {
                vrouter_routes_to(cfg, n, *h, borrower_addr)
            });
            r.routes_checked += 1;
            if ok.is_err() {
                r.problems.push(format!(
                    "{}'s vrouter has no route {h} to {borrower_addr}",
                    node_ns(n)
                ));
            }
            if cfg.host_port {
                r.routes_checked += 1;
                if wait_for("the kernel's /32", Duration::from_secs(20), || {
                    kernel_routes_into_host_port(n, *h)
                })
                .is_err()
                {
                    r.problems
                        .push(format!("{}'s kernel has no proto 73 route {h}", node_ns(n)));
                }
            }
        }
    }

    // Pings from a pod on each other node (and from each node's host with
    // the host port).
    for (name, ip) in &r.borrowed.clone() {
        let mut from: Vec<String> = (1..=cfg.nodes)
            .filter(|&n| n != BORROWER)
            .filter_map(|n| pods.iter().find(|p| p.node == n).map(|p| p.name.clone()))
            .collect();
        if cfg.host_port {
            from.extend((1..=cfg.nodes).map(node_ns));
        }
        for ns in from {
            r.pings += 1;
            if ping(&ns, *ip) {
                r.pings_ok += 1;
            } else {
                r.problems.push(format!("{ns} -> {name} ({ip}): no answer"));
            }
        }
    }

    // DEL of the last borrowed pod withdraws its /32 everywhere.
    if let Some(i) = pods.iter().rposition(|p| p.node == BORROWER) {
        let pod = pods.remove(i);
        cni_del(&pod).with_context(|| format!("CNI DEL {}", pod.name))?;
        let h = IpNet::from(std::net::IpAddr::V4(pod.ip));
        r.withdrawn = wait_for("the /32 to go", Duration::from_secs(20), || {
            (1..=cfg.nodes).filter(|&n| n != BORROWER).all(|n| {
                !(vrouter_has(cfg, n, h) || cfg.host_port && kernel_routes_into_host_port(n, h))
            }) && status(cfg, BORROWER).is_ok_and(|s| !nets(&s["announced_borrowed"]).contains(&h))
        })
        .is_ok();
        if !r.withdrawn {
            r.problems.push(format!(
                "{h} still routed or announced after {}'s DEL",
                pod.name
            ));
        }
    }
    Ok(r)
}
