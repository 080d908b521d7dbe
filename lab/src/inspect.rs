//! Looking into a running lab: brindlectl on a node, the vrouters' routes
//! as node-to-node paths, and the daemons' Prometheus counters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::exec::{in_ns, sh_within};
use crate::{LabConfig, NodePath, node_dir, node_ns};

/// How long one `brindlectl` call or metrics scrape may take: brindlectl
/// bounds its own socket reads and writes; this bounds the whole process.
const CLI_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn brindlectl(cfg: &LabConfig, n: u8, args: &[&str]) -> Result<String> {
    let dir = node_dir(n);
    sh_within(
        in_ns(&node_ns(n), cfg.bin_dir.join("brindlectl"))
            .arg("--ctrl-socket")
            .arg(dir.join("ctrl.sock"))
            .arg("--vrouter-socket")
            .arg(dir.join("vrouter.sock"))
            .args(args),
        CLI_TIMEOUT,
    )
}

pub(crate) fn brindlectl_json(cfg: &LabConfig, n: u8, args: &[&str]) -> Result<Vec<Value>> {
    let mut full = vec!["-o", "json"];
    full.extend_from_slice(args);
    Ok(serde_json::from_str(&brindlectl(cfg, n, &full)?)?)
}

/// The kind and description of the route in `routes` (a vrouter's route
/// dump) that leads to node `to`: its target names the node's address as
/// tunnel remote or gateway.
pub(crate) fn path_to(cfg: &LabConfig, routes: &[Value], to: u8) -> (String, String) {
    let addr = cfg.node_addr(to).to_string();
    for r in routes {
        let t = &r["target"];
        let prefix = r["prefix"].as_str().unwrap_or("?");
        match t["kind"].as_str() {
            Some("encap") if t["remote"].as_str() == Some(addr.as_str()) => {
                let encap = t["encap"].as_str().unwrap_or("?").to_owned();
                let route = format!("{prefix} {encap} to {addr}");
                return (encap, route);
            }
            Some("gateway") if t["via"].as_str() == Some(addr.as_str()) => {
                let port = t["port"].as_str().unwrap_or("?");
                return (
                    "native".into(),
                    format!("{prefix} native via {addr} ({port})"),
                );
            }
            _ => {}
        }
    }
    ("missing".into(), format!("no route to {addr}"))
}

/// Every ordered node pair's path, from the sender's vrouter routes.
pub(crate) fn paths(cfg: &LabConfig) -> Result<Vec<NodePath>> {
    let mut out = Vec::new();
    for a in 1..=cfg.nodes {
        let routes = brindlectl_json(cfg, a, &["vrouter", "routes"])
            .with_context(|| format!("brindlectl vrouter routes on {}", node_ns(a)))?;
        for b in (1..=cfg.nodes).filter(|&b| b != a) {
            let (kind, route) = path_to(cfg, &routes, b);
            out.push(NodePath {
                from: a,
                to: b,
                kind,
                route,
                expected: cfg.expected_path(a, b).into(),
            });
        }
    }
    Ok(out)
}

/// The Prometheus text a daemon of node `n` serves on its loopback `port`.
pub(crate) fn scrape(n: u8, port: u16) -> Result<String> {
    // `ip netns exec` with bash's /dev/tcp: the endpoint listens on the
    // node's loopback, which only a process in its namespace reaches.
    sh_within(
        in_ns(&node_ns(n), "bash").args([
            "-c",
            &format!(
                "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
            ),
        ]),
        CLI_TIMEOUT,
    )
    .with_context(|| format!("scraping {}:{port}", node_ns(n)))
}

/// The sample names of a Prometheus text exposition (what a query names:
/// `x_total`, `x_bucket`, ...), plus, for families without samples yet,
/// the names their `# TYPE` line implies.
pub fn metric_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
            }
        } else if !line.starts_with('#')
            && let Some(name) = line.split(['{', ' ']).next()
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && line.len() > name.len()
        {
            out.insert(name.to_owned());
        }
    }
    out
}

/// The vrouter's forwarding, tunnel and drop counters on node `n`, summed
/// over its workers, from its Prometheus endpoint: the proof of which
/// traffic was encapsulated, and of why any was dropped.
pub(crate) fn counters_line(n: u8) -> String {
    let text = match scrape(n, 9092) {
        Ok(t) => t,
        Err(e) => return format!("metrics: {e:#}"),
    };
    let sums = worker_counters(&text);
    let shown: Vec<String> = sums
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if shown.is_empty() {
        "every forwarding counter is zero".into()
    } else {
        shown.join(" ")
    }
}

/// Sums `brindle_vrouter_worker_*_total` samples over the workers, keyed
/// by the name without prefix and suffix (`encap_ipip`, `forwarded`), drops
/// by their reason (`drop:no_route`).
pub(crate) fn worker_counters(metrics: &str) -> BTreeMap<String, u64> {
    const WANTED: [&str; 6] = [
        "forwarded",
        "encap_ipip",
        "encap_vxlan",
        "decap_ipip",
        "decap_vxlan",
        "drops",
    ];
    let mut sums = BTreeMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix("brindle_vrouter_worker_") else {
            continue;
        };
        let Some((series, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let name = name.strip_suffix("_total").unwrap_or(name);
        if !WANTED.contains(&name) {
            continue;
        }
        let key = match labels.split_once("reason=\"") {
            Some((_, r)) => format!("drop:{}", r.split('"').next().unwrap_or("?")),
            None => name.to_owned(),
        };
        // Counters are integers; the text format writes them as floats.
        *sums.entry(key).or_default() += value as u64;
    }
    sums
}
