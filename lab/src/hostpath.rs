//! Everything a pod talks to besides other pods (issue 14), as one
//! connectivity table: the node (host) → pods on it and on other nodes,
//! pods → their node's and other nodes' addresses, pods → the outside (the
//! router, which knows no pod route: only a masqueraded packet is
//! answered, and the address it sees is printed), and one Service with
//! kube-proxy's iptables rule shapes installed on every node by Debian's
//! iptables (KUBE-SERVICES → KUBE-SVC → KUBE-SEP DNAT with `statistic
//! --mode random`, a NodePort, KUBE-MARK-MASQ / KUBE-POSTROUTING): pod →
//! ClusterIP, node → ClusterIP, router → NodePort of a node with no backend.

use std::fmt;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cni::Pod;
use crate::config::encap_key;
use crate::exec::{in_ns, sh, sh_within, wait_for};
use crate::inspect::paths;
use crate::{ETCD_ADDR, LabConfig, UNDERLAY_NS, node_ns};

/// The Service's ClusterIP, port, the backends' port and the NodePort.
const CLUSTER_IP: &str = "10.96.0.10";
const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
const NODE_PORT: u16 = 30080;
/// Where the router's listener tells a client the address it came from.
const ECHO_PORT: u16 = 7100;
/// Connections per Service check (the DNAT picks a backend at random).
const SERVICE_TRIES: usize = 6;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnRow {
    /// What is checked (`host -> remote pod`, `pod -> ClusterIP`, …).
    pub what: String,
    pub from: String,
    pub to: String,
    pub ok: bool,
    /// What was seen (the source address the router saw, the backends
    /// that answered), or why it failed.
    pub detail: String,
}

/// The table, for one encapsulation mode of the pool.
#[derive(Debug, Clone, Default)]
pub struct ConnectivityReport {
    /// The lab's mode the table ran in (`ipip`, `vxlan`, `cross-subnet`,
    /// `none`).
    pub encap: String,
    pub rows: Vec<ConnRow>,
}

impl ConnectivityReport {
    pub fn success(&self) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| r.ok)
    }

    /// The rows of one kind (`what`).
    pub fn of(&self, what: &str) -> Vec<&ConnRow> {
        self.rows.iter().filter(|r| r.what == what).collect()
    }
}

impl fmt::Display for ConnectivityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<28} {:<14} {:<22} {:<5} detail",
            "what", "from", "to", "ok"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<28} {:<14} {:<22} {:<5} {}",
                r.what,
                r.from,
                r.to,
                if r.ok { "ok" } else { "FAIL" },
                r.detail
            )?;
        }
        let ok = self.rows.iter().filter(|r| r.ok).count();
        write!(f, "{ok}/{} rows ok ({})", self.rows.len(), self.encap)
    }
}

/// Children killed on drop (the lab's teardown kills what is left in its
/// namespaces anyway).
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A socat server in `ns` on `port` that answers every connection with
/// `reply` (a shell word: `$SOCAT_PEERADDR` is the client's address),
/// returned once it listens (a first client sooner was refused: the first
/// pod -> outside row failed so).
fn server(ns: &str, port: u16, reply: &str) -> Result<Child> {
    let child = in_ns(ns, "socat")
        .arg(format!("TCP-LISTEN:{port},reuseaddr,fork"))
        .arg(format!("SYSTEM:echo {reply}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("socat server in {ns}"))?;
    let mut servers = Servers(vec![child]);
    wait_for(
        &format!("socat listening on {ns}:{port}"),
        Duration::from_secs(10),
        || {
            sh_within(
                in_ns(ns, "ss").args(["-Hltn", &format!("sport = :{port}")]),
                Duration::from_secs(5),
            )
            .is_ok_and(|out| !out.trim().is_empty())
        },
    )?;
    Ok(servers.0.remove(0))
}

/// What a TCP server at `addr:port` answers a client in `ns`.
fn fetch(ns: &str, addr: &str, port: u16) -> Result<String> {
    let out = sh_within(
        in_ns(ns, "socat").args([
            "-T",
            "3",
            "-u",
            &format!("TCP:{addr}:{port},connect-timeout=3"),
            "STDOUT",
        ]),
        Duration::from_secs(8),
    )?;
    Ok(out.trim().to_owned())
}

fn ping(ns: &str, addr: &str) -> bool {
    sh_within(
        in_ns(ns, "ping").args(["-c", "2", "-i", "0.2", "-W", "2", "-q", addr]),
        Duration::from_secs(10),
    )
    .is_ok()
}

fn row(what: &str, from: &str, to: &str, result: Result<String>) -> ConnRow {
    let (ok, detail) = match result {
        Ok(d) => (true, d),
        Err(e) => (
            false,
            format!("{e:#}").lines().next().unwrap_or("").to_owned(),
        ),
    };
    ConnRow {
        what: what.into(),
        from: from.into(),
        to: to.into(),
        ok,
        detail,
    }
}

fn ping_row(what: &str, from: &str, to_name: &str, addr: &str) -> ConnRow {
    let to = format!("{to_name} {addr}");
    if ping(from, addr) {
        row(what, from, &to, Ok(String::new()))
    } else {
        row(what, from, &to, Err(anyhow::anyhow!("no answer to ping")))
    }
}

/// ctrl's host port keys: one queue per vrouter worker (`cores = "auto"`).
pub(crate) fn ctrl_env() -> [(&'static str, String); 3] {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    [
        ("BRINDLE_VROUTER_HOST_PORT", "brindle0".into()),
        ("BRINDLE_VROUTER_HOST_PORT_QUEUES", workers.to_string()),
        ("BRINDLE_VROUTER_HOST_PORT_MTU", "1450".into()),
    ]
}

/// The pool's encapsulation switched to `encap` in the running lab (the
/// default pool rewritten in the datastore by `brindle-ipam admin
/// pool-add`, as an operator would): every ctrl re-reads the pools and
/// re-routes its learned prefixes and node routes. Returns the lab's
/// config in that mode once every vrouter's route to every other node
/// takes the mode's path (a timeout leaves the paths to the table's
/// first row).
pub(crate) fn switch_encap(cfg: &LabConfig, encap: &str) -> Result<LabConfig> {
    let key = encap_key(encap)?;
    if encap == "none" && cfg.subnets != 1 {
        anyhow::bail!("encapsulation none routes natively: every node must share one subnet");
    }
    pool_add(cfg, key, true)?;
    let next = LabConfig {
        encap: encap.into(),
        ..cfg.clone()
    };
    let _ = wait_for(
        &format!("every node pair's path {encap}"),
        Duration::from_secs(30),
        || paths(&next).is_ok_and(|ps| ps.iter().all(|p| p.kind == p.expected)),
    );
    Ok(next)
}

/// Rewrites the lab's default pool (`brindle-ipam admin pool-add` on
/// etcd) with the encapsulation `key` and natOutgoing `nat`.
fn pool_add(cfg: &LabConfig, key: &str, nat: bool) -> Result<()> {
    // The borrow lab's pool is two /28 blocks (borrow::ctrl_env).
    let (cidr, block) = if cfg.borrow {
        ("10.244.0.0/27", "28")
    } else {
        ("10.244.0.0/16", "26")
    };
    let etcd = format!("http://{ETCD_ADDR}:2379");
    let mut cmd = in_ns(&node_ns(1), cfg.bin_dir.join("brindle-ipam"));
    cmd.args([
        "admin",
        "--mode",
        "standalone",
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd,
        "pool-add",
        "--name",
        "default-ipv4",
        "--cidr",
        cidr,
        "--block-size",
        block,
        "--encapsulation",
        key,
    ]);
    if nat {
        cmd.arg("--nat-outgoing");
    }
    sh(&mut cmd).context("brindle-ipam admin pool-add")?;
    Ok(())
}

/// Whether every node's nftables masquerade set (`inet brindle`
/// `masq_v4`) has the pool (`on`) or is empty.
fn masquerading(cfg: &LabConfig, on: bool) -> bool {
    (1..=cfg.nodes).all(|n| {
        sh(in_ns(&node_ns(n), "nft").args(["list", "set", "inet", "brindle", "masq_v4"]))
            .is_ok_and(|out| out.contains("10.244.0.0") == on)
    })
}

/// natOutgoing off (issue 14 item 2, Calico's meaning): a pod's packets to
/// the outside leave with the pod's address. The router gets a route to
/// each probed pod via its node (as a BGP-peered top-of-rack router would
/// have) and answers with the source it saw; then natOutgoing is on again
/// and the routes go. The router's bridges compute their checksums
/// (`tx off`): a veth frame carries a partial checksum, which a wire frame
/// never does and which the vrouter's uplink path does not complete.
fn no_nat_rows(cfg: &LabConfig, first: &[&Pod], report: &mut ConnectivityReport) -> Result<()> {
    let key = encap_key(&cfg.encap)?;
    for br in ["br0", "br1"].iter().take(usize::from(cfg.subnets)) {
        sh(in_ns(UNDERLAY_NS, "ethtool").args(["-K", br, "tx", "off"]))?;
    }
    pool_add(cfg, key, false)?;
    wait_for(
        "natOutgoing off on every node",
        Duration::from_secs(20),
        || masquerading(cfg, false),
    )?;
    for p in first {
        sh(in_ns(UNDERLAY_NS, "ip").args([
            "route",
            "replace",
            &format!("{}/32", p.ip),
            "via",
            &cfg.node_addr(p.node).to_string(),
        ]))?;
    }
    for p in first {
        let pod = p.ip.to_string();
        let seen = fetch(&p.name, "10.99.0.254", ECHO_PORT).and_then(|seen| {
            if seen == pod {
                Ok(format!("router saw {seen} (the pod)"))
            } else {
                Err(anyhow::anyhow!("router saw {seen}, not the pod's {pod}"))
            }
        });
        report.rows.push(row(
            "pod -> outside TCP (no NAT)",
            &p.name,
            "10.99.0.254",
            seen,
        ));
    }
    for p in first {
        let _ = sh(in_ns(UNDERLAY_NS, "ip").args(["route", "del", &format!("{}/32", p.ip)]));
    }
    pool_add(cfg, key, true)?;
    wait_for("natOutgoing on again", Duration::from_secs(20), || {
        masquerading(cfg, true)
    })
}

/// The table over the lab's nodes and pods: one pod per node is probed.
/// The Service's rules are installed on the first run (`install_rules`)
/// and kept for the next ones.
pub(crate) fn run(
    cfg: &LabConfig,
    pods: &[Pod],
    install_rules: bool,
) -> Result<ConnectivityReport> {
    let mut report = ConnectivityReport {
        encap: cfg.encap.clone(),
        rows: Vec::new(),
    };
    let first: Vec<&Pod> = (1..=cfg.nodes)
        .filter_map(|n| pods.iter().find(|p| p.node == n))
        .collect();
    // The mode's paths first: the rows below are about them.
    let ps = paths(cfg)?;
    let wrong: Vec<String> = ps
        .iter()
        .filter(|p| p.kind != p.expected)
        .map(|p| format!("n{} -> n{}: {} (want {})", p.from, p.to, p.kind, p.expected))
        .collect();
    let kinds: std::collections::BTreeSet<&str> = ps.iter().map(|p| p.kind.as_str()).collect();
    let kinds = kinds.into_iter().collect::<Vec<_>>().join(", ");
    report.rows.push(row(
        "node paths",
        "every node",
        "every other node",
        if wrong.is_empty() {
            Ok(kinds)
        } else {
            Err(anyhow::anyhow!("{}", wrong.join("; ")))
        },
    ));
    for p in &first {
        for q in first.iter().filter(|q| q.node != p.node) {
            report.rows.push(ping_row(
                "pod -> remote pod",
                &p.name,
                &q.name,
                &q.ip.to_string(),
            ));
        }
    }
    for p in &first {
        for q in &first {
            let host = node_ns(p.node);
            let what = if p.node == q.node {
                "host -> its pod"
            } else {
                "host -> remote pod"
            };
            report
                .rows
                .push(ping_row(what, &host, &q.name, &q.ip.to_string()));
        }
    }
    for p in &first {
        for n in 1..=cfg.nodes {
            let what = if n == p.node {
                "pod -> its node"
            } else {
                "pod -> other node"
            };
            let addr = cfg.node_addr(n).to_string();
            report
                .rows
                .push(ping_row(what, &p.name, &node_ns(n), &addr));
        }
    }
    // The outside: the router's address on its first subnet. It has no
    // route to the pods: with natOutgoing it sees the node's address.
    let router = "10.99.0.254";
    let _echo = Servers(vec![server(UNDERLAY_NS, ECHO_PORT, "$SOCAT_PEERADDR")?]);
    for p in &first {
        let node_addr = cfg.node_addr(p.node).to_string();
        let seen = fetch(&p.name, router, ECHO_PORT).and_then(|seen| {
            if seen == node_addr {
                Ok(format!("router saw {seen} (the node)"))
            } else {
                Err(anyhow::anyhow!(
                    "router saw {seen}, not the node's {node_addr}"
                ))
            }
        });
        report
            .rows
            .push(row("pod -> outside TCP (NAT)", &p.name, router, seen));
        report.rows.push(ping_row(
            "pod -> outside ICMP (NAT)",
            &p.name,
            "router",
            router,
        ));
    }
    // Once per lab (the first table): natOutgoing off.
    if install_rules {
        no_nat_rows(cfg, &first, &mut report)?;
    }
    services(cfg, &first, &mut report, install_rules)?;
    Ok(report)
}

/// kube-proxy's iptables-mode rules for one Service with `backends`, as
/// `iptables-restore --noflush` input for the nat table.
pub fn kube_proxy_rules(backends: &[(String, String)], pod_cidr: &str) -> String {
    let mut r = String::from("*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-SVC-LAB",
        "KUBE-EXT-LAB",
    ] {
        r.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for (i, _) in backends.iter().enumerate() {
        r.push_str(&format!(":KUBE-SEP-LAB{i} - [0:0]\n"));
    }
    r.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n",
    );
    r.push_str(&format!(
        "-A KUBE-SERVICES -d {CLUSTER_IP}/32 -p tcp -m tcp --dport {SERVICE_PORT} -j KUBE-SVC-LAB\n\
         -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         -A KUBE-NODEPORTS -p tcp -m tcp --dport {NODE_PORT} -j KUBE-EXT-LAB\n\
         -A KUBE-EXT-LAB -j KUBE-MARK-MASQ\n\
         -A KUBE-EXT-LAB -j KUBE-SVC-LAB\n\
         -A KUBE-SVC-LAB ! -s {pod_cidr} -d {CLUSTER_IP}/32 -p tcp -m tcp --dport {SERVICE_PORT} -j KUBE-MARK-MASQ\n"
    ));
    let n = backends.len();
    for (i, (ip, _)) in backends.iter().enumerate() {
        if i + 1 < n {
            let probability = 1.0 / (n - i) as f64;
            r.push_str(&format!(
                "-A KUBE-SVC-LAB -m statistic --mode random --probability {probability:.11} -j KUBE-SEP-LAB{i}\n"
            ));
        } else {
            r.push_str(&format!("-A KUBE-SVC-LAB -j KUBE-SEP-LAB{i}\n"));
        }
        r.push_str(&format!(
            "-A KUBE-SEP-LAB{i} -s {ip}/32 -j KUBE-MARK-MASQ\n\
             -A KUBE-SEP-LAB{i} -p tcp -m tcp -j DNAT --to-destination {ip}:{BACKEND_PORT}\n"
        ));
    }
    r.push_str("COMMIT\n");
    r
}

/// The Service: backends on node 1 and node 2, its rules on every node,
/// then pod → ClusterIP (from every node's pod: a backend on this node and
/// on another), node → ClusterIP, router → NodePort of the last node (no
/// backend there: the DNATed connection crosses to another node).
fn services(
    cfg: &LabConfig,
    first: &[&Pod],
    report: &mut ConnectivityReport,
    install_rules: bool,
) -> Result<()> {
    let backends: Vec<&Pod> = first.iter().copied().take(2).collect();
    let mut servers = Servers(Vec::new());
    for b in &backends {
        servers.0.push(server(&b.name, BACKEND_PORT, &b.name)?);
    }
    let list: Vec<(String, String)> = backends
        .iter()
        .map(|b| (b.ip.to_string(), b.name.clone()))
        .collect();
    let rules = kube_proxy_rules(&list, "10.244.0.0/16");
    for n in (1..=cfg.nodes).filter(|_| install_rules) {
        let mut child = in_ns(&node_ns(n), "iptables-restore")
            .arg("--noflush")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("iptables-restore")?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin.write_all(rules.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "iptables-restore on {}: {}",
            node_ns(n),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let svc = format!("{CLUSTER_IP}:{SERVICE_PORT}");
    let tries = |ns: &str, addr: &str, port: u16| -> Result<String> {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..SERVICE_TRIES {
            seen.insert(fetch(ns, addr, port)?);
        }
        Ok(format!(
            "answered by {}",
            seen.into_iter().collect::<Vec<_>>().join(", ")
        ))
    };
    for p in first {
        report.rows.push(row(
            "pod -> ClusterIP",
            &p.name,
            &svc,
            tries(&p.name, CLUSTER_IP, SERVICE_PORT),
        ));
    }
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        report.rows.push(row(
            "host -> ClusterIP",
            &ns,
            &svc,
            tries(&ns, CLUSTER_IP, SERVICE_PORT),
        ));
    }
    let last = cfg.nodes;
    let node_port = format!("{}:{NODE_PORT}", cfg.node_addr(last));
    report.rows.push(row(
        "outside -> NodePort",
        "router",
        &node_port,
        tries(UNDERLAY_NS, &cfg.node_addr(last).to_string(), NODE_PORT),
    ));
    drop(servers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_rules_have_kube_proxys_shape() {
        let rules = kube_proxy_rules(
            &[
                ("10.244.0.5".into(), "a".into()),
                ("10.244.1.7".into(), "b".into()),
            ],
            "10.244.0.0/16",
        );
        for line in [
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-LAB",
            "-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-EXT-LAB",
            "-A KUBE-SVC-LAB -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-LAB0",
            "-A KUBE-SVC-LAB -j KUBE-SEP-LAB1",
            "-A KUBE-SEP-LAB1 -p tcp -m tcp -j DNAT --to-destination 10.244.1.7:8080",
        ] {
            assert!(rules.lines().any(|l| l == line), "{line} not in\n{rules}");
        }
        assert!(rules.starts_with("*nat\n") && rules.ends_with("COMMIT\n"));
    }
}
