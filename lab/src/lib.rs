//! The local lab: N "nodes" as network namespaces on an underlay of one or
//! two IPv4 subnets joined by a router namespace, each node running the
//! release `brindle-vrouter serve` and `brindle-ctrl` against one etcd, P
//! pods per node made by exec'ing the plugins of the conflist deploy/ ships
//! (the real `brindle` CNI plugin first) as a runtime does, then all-pairs
//! ping, the path each node pair's traffic takes, and a throughput run.
//!
//! ```text
//!                    brl-underlay: the router (ip_forward) and etcd
//!          br0 10.99.0.254/24 ─── kernel routing ─── br1 10.99.1.254/24
//!            │               │                            │
//!      brl-n1 eth0     brl-n2 eth0                  brl-n3 eth0
//!      10.99.0.11      10.99.0.12                   10.99.1.13
//!      vrouter, ctrl   vrouter, ctrl                vrouter, ctrl
//!       │       │       │       │                    │       │
//!   brl-n1p1 brl-n1p2 brl-n2p1 brl-n2p2          brl-n3p1 brl-n3p2
//! ```
//!
//! With one subnet every node hangs off `br0`. Each node's default route
//! is the router's address on its subnet, so BGP (node to node, full mesh),
//! etcd and tunnels to the other subnet are routed by the kernel of the
//! router namespace, as by a top-of-rack router.
//!
//! Everything the lab creates carries the prefix `brl-` (namespaces, bpffs
//! pins) or lives under the state directory, so [`down`] can always remove
//! a lab interrupted at any point: it kills every process in a `brl-`
//! namespace, deletes the namespaces and the state directory.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
pub use brindle_cni::config::InterfaceKind;
use serde_json::Value;

mod cni;
mod density;
mod exec;
mod hostpath;
mod podbench;
mod policy;
mod teardown;

use cni::{CONFLIST, Pod, cni_add, cni_conf_dir, cni_del, install_cni};
pub use density::DensityReport;
use exec::{in_ns, ip, sh, sh_within, succeeds_within, wait_for};
pub use hostpath::{ConnRow, ConnectivityReport};
pub use podbench::{BenchRow, Figure, PodBench, PodBenchSpec};
pub use policy::PolicyReport;
use teardown::{OWNER, process_identity, running_owner, spawn_daemon};
pub use teardown::{Stopped, Teardown, down, lab_namespaces};

/// How long one `brindlectl` call or metrics scrape may take: brindlectl
/// bounds its own socket reads and writes; this bounds the whole process.
const CLI_TIMEOUT: Duration = Duration::from_secs(20);

/// The prefix of every namespace and pin the lab makes.
pub const PREFIX: &str = "brl-";
/// Where the lab keeps configs, logs, sockets and pid files.
pub const STATE_DIR: &str = "/run/brindle-lab";
const UNDERLAY_NS: &str = "brl-underlay";
/// The router's address on the first subnet; etcd listens there.
const ETCD_ADDR: &str = "10.99.0.254";
/// Held for the whole of [`run`]: two labs in one process (two tests of
/// one test binary run on parallel threads) would share every name.
static RUNNING: Mutex<()> = Mutex::new(());

/// What to run.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The directory holding the release binaries.
    pub bin_dir: PathBuf,
    pub nodes: u8,
    pub pods: u8,
    /// `none`, `ipip`, `vxlan` or `cross-subnet`.
    pub encap: String,
    /// Underlay subnets: 1 (every node on 10.99.0.0/24) or 2 (the last
    /// third of the nodes, at least one, on 10.99.1.0/24 behind the router).
    pub subnets: u8,
    /// Seconds of the TCP throughput run; 0 skips it.
    pub throughput_secs: u32,
    /// Leave the lab running at the end.
    pub keep: bool,
    /// Extra pods added to node 1 by parallel ADDs, probed, measured and
    /// deleted (issue 17); 0 skips that step.
    pub density: u16,
    /// Seconds over which the density step measures the idle vrouter
    /// (after as many to settle).
    pub density_idle_secs: u32,
    /// Network policy cases run on real traffic (issue 15: nine pods in
    /// three namespaces probed all pairs per case); 0 skips the step,
    /// `usize::MAX` runs every case.
    pub policy_cases: usize,
    /// The pod benchmark (iperf3 between pods beside the kernel's
    /// Calico-shaped path built in the same run; issue 13), if any.
    pub pod_bench: Option<PodBenchSpec>,
    /// The pods' interface (the conflist's `interfaceKind`): a veth whose
    /// host end the vrouter takes by AF_XDP, or a TAP in the pod that it
    /// attaches one queue per worker of (issue 13).
    pub pod_interface: InterfaceKind,
    /// The vrouter's host port `brindle0` (issue 14): ctrl's
    /// `[vrouter] host_port`, the kernel's routes into it and natOutgoing.
    pub host_port: bool,
}

impl LabConfig {
    /// The defaults of `cargo xtask lab`: 3 nodes, 2 pods each, IPIP, two
    /// subnets, a 3 s throughput run, torn down at the end.
    pub fn new(bin_dir: PathBuf) -> LabConfig {
        LabConfig {
            bin_dir,
            nodes: 3,
            pods: 2,
            encap: "ipip".into(),
            subnets: 2,
            throughput_secs: 3,
            keep: false,
            density: 0,
            density_idle_secs: 5,
            policy_cases: 0,
            pod_interface: InterfaceKind::Veth,
            pod_bench: None,
            host_port: false,
        }
    }

    /// The underlay subnet (0 or 1) node `n` is on.
    pub fn subnet_of(&self, n: u8) -> u8 {
        let on_second = if self.subnets >= 2 {
            (self.nodes / 3).max(1)
        } else {
            0
        };
        u8::from(n > self.nodes.saturating_sub(on_second))
    }

    /// Node `n`'s underlay address: 10.99.<subnet>.<10 + n>.
    pub fn node_addr(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, self.subnet_of(n), 10 + n)
    }

    /// The path traffic from node `a` to node `b` must take: `native`,
    /// `ipip` or `vxlan`.
    pub fn expected_path(&self, a: u8, b: u8) -> &'static str {
        match self.encap.as_str() {
            "none" => "native",
            "vxlan" => "vxlan",
            "cross-subnet" if self.subnet_of(a) == self.subnet_of(b) => "native",
            _ => "ipip",
        }
    }

    fn check(&self) -> Result<()> {
        if !(2..=200).contains(&self.nodes) || !(1..=50).contains(&self.pods) {
            bail!("nodes 2..=200, pods 1..=50");
        }
        if self.density > 250 {
            bail!("density: at most 250 pods");
        }
        if !(1..=2).contains(&self.subnets) {
            bail!("subnets: 1 or 2");
        }
        if self.encap == "none" && self.subnets != 1 {
            // Native routing hands pod packets to the underlay as they are:
            // the router between the subnets knows no pod routes (it does
            // not peer BGP), exactly like Calico's ipipMode: Never.
            bail!("--encap none routes natively, so every node must share one subnet: --subnets 1");
        }
        encap_key(&self.encap)?;
        Ok(())
    }
}

/// The path one node's vrouter gives the traffic for another node's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePath {
    pub from: u8,
    pub to: u8,
    /// `native`, `ipip`, `vxlan`, or `missing` (no route).
    pub kind: String,
    /// The vrouter route, e.g. `10.244.16.128/26 native via 10.99.0.12 (eth0)`.
    pub route: String,
    /// What the encapsulation mode and topology call for.
    pub expected: String,
}

/// What the run proved.
#[derive(Debug, Clone, Default)]
pub struct LabReport {
    pub nodes: u8,
    pub pods: usize,
    pub pairs_ok: usize,
    pub pairs_total: usize,
    /// The pod pairs that did not answer, `from -> to`.
    pub failed_pairs: Vec<String>,
    /// For each ordered pair of nodes, the path its pods' traffic takes.
    pub paths: Vec<NodePath>,
    pub mbit_per_s: Option<f64>,
    /// The step that failed, if one did.
    pub failed_step: Option<String>,
    /// Every metric name node 1's brindle-ctrl and brindle-vrouter export
    /// (sample names, as a dashboard queries them), scraped after the
    /// traffic: the dashboard test checks deploy/grafana against them.
    pub metric_names: std::collections::BTreeSet<String>,
    /// The density step's figures, when it ran.
    pub density: Option<DensityReport>,
    /// The pod benchmark's table, when it ran.
    pub pod_bench: Option<PodBench>,
    /// The policy step's truth tables, when it ran.
    pub policy: Option<PolicyReport>,
    /// The connectivity table of issue 14 (host, nodes, outside, Service).
    pub connectivity: Option<ConnectivityReport>,
    /// The final teardown (none with `keep`).
    pub teardown: Option<Teardown>,
}

impl LabReport {
    pub fn success(&self) -> bool {
        self.failed_step.is_none()
            && self.pairs_ok == self.pairs_total
            && self.pairs_total > 0
            && self.paths.iter().all(|p| p.kind == p.expected)
            && self.density.as_ref().is_none_or(DensityReport::success)
            && self.policy.as_ref().is_none_or(PolicyReport::success)
            && self
                .connectivity
                .as_ref()
                .is_none_or(ConnectivityReport::success)
    }
}

fn node_ns(n: u8) -> String {
    format!("{PREFIX}n{n}")
}

fn state() -> PathBuf {
    PathBuf::from(STATE_DIR)
}

fn node_dir(n: u8) -> PathBuf {
    state().join(format!("n{n}"))
}

fn step(name: &str) {
    eprintln!("\n==== lab: {name} ====");
}

/// Runs the whole lab; tears it down at the end unless `keep`.
pub fn run(cfg: &LabConfig) -> Result<LabReport> {
    cfg.check()?;
    let _one_lab_per_process = RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(owner) = running_owner() {
        // A lab whose run is still going (another shell, another test):
        // tearing it down would fail that run for no reason of its own.
        bail!(
            "another lab run (pid {owner}) is in progress: wait for it, or remove it with `cargo xtask lab down`"
        );
    }
    let mut report = LabReport {
        nodes: cfg.nodes,
        ..LabReport::default()
    };
    let mut pods = Vec::new();
    let result = run_steps(cfg, &mut report, &mut pods);
    if let Err(e) = &result {
        eprintln!("lab: FAILED: {e:#}");
        if report.failed_step.is_none() {
            report.failed_step = Some(format!("{e:#}"));
        }
    }
    if !cfg.keep {
        step("teardown");
        for pod in pods.iter().rev() {
            if let Err(e) = cni_del(pod) {
                eprintln!("CNI DEL {}: {e:#}", pod.name);
                report
                    .failed_step
                    .get_or_insert_with(|| format!("CNI DEL {}: {e:#}", pod.name));
            }
        }
        let t = down()?;
        eprintln!("{t}");
        report.teardown = Some(t);
    } else {
        if let Some(p) = pods.first() {
            eprintln!(
                "\nthe lab keeps running. Enter a pod:  ip netns exec {} bash   (its address {})",
                p.name, p.ip
            );
        }
        eprintln!(
            "a node:  ip netns exec {n1} bash   (its conflist: {conf})\n\
             logs, sockets, configs: {STATE_DIR}\n\
             brindlectl:  ip netns exec {n1} {bin}/brindlectl --ctrl-socket {STATE_DIR}/n1/ctrl.sock \
             --vrouter-socket {STATE_DIR}/n1/vrouter.sock bgp peers   (or: vrouter routes, vrouter stats, endpoints)\n\
             remove it:  cargo xtask lab down",
            n1 = node_ns(1),
            conf = cni_conf_dir(1).join(CONFLIST).display(),
            bin = cfg.bin_dir.display()
        );
    }
    Ok(report)
}

/// The pool's `encapsulation` for a lab mode.
fn encap_key(encap: &str) -> Result<&'static str> {
    Ok(match encap {
        "none" => "none",
        "ipip" => "ipip",
        "vxlan" => "vxlan",
        "cross-subnet" => "ipip_cross_subnet",
        other => bail!("unknown encapsulation {other:?}: none | ipip | vxlan | cross-subnet"),
    })
}

fn run_steps(cfg: &LabConfig, report: &mut LabReport, pods: &mut Vec<Pod>) -> Result<()> {
    for bin in [
        "brindle-vrouter",
        "brindle-ctrl",
        "brindlectl",
        "brindle",
        "brindle-ipam",
    ] {
        if !cfg.bin_dir.join(bin).exists() {
            bail!(
                "{} missing: build the release binaries",
                cfg.bin_dir.join(bin).display()
            );
        }
    }
    step("remove leftovers of an earlier lab");
    let t = down()?;
    if !t.stopped.is_empty() {
        eprintln!("{t}");
    }
    fs::create_dir_all(state())?;
    fs::write(state().join(OWNER), process_identity(std::process::id())?)?;

    underlay(cfg)?;
    nodes(cfg)?;

    step("BGP: every node Established with every other");
    let want = usize::from(cfg.nodes - 1);
    wait_for("BGP full mesh Established", Duration::from_secs(60), || {
        (1..=cfg.nodes).all(|n| {
            brindlectl_json(cfg, n, &["bgp", "peers"]).is_ok_and(|peers| {
                peers
                    .iter()
                    .filter(|p| p["state"].as_str() == Some("Established"))
                    .count()
                    == want
            })
        })
    })?;

    step("pods: the conflist's plugins exec'd like a runtime (libcni)");
    install_cni(cfg)?;
    for n in 1..=cfg.nodes {
        for p in 1..=cfg.pods {
            let pod = cni_add(n, &format!("{PREFIX}n{n}p{p}"))?;
            eprintln!("{} on {}: {}", pod.name, node_ns(n), pod.ip);
            pods.push(pod);
        }
    }
    report.pods = pods.len();

    step("routes: every vrouter has a route to every other node's block");
    // Each node announces one block; its peers' vrouters get a route each.
    wait_for("routes to every block", Duration::from_secs(30), || {
        (1..=cfg.nodes).all(|n| {
            let routes = brindlectl_json(cfg, n, &["vrouter", "routes"]).unwrap_or_default();
            (1..=cfg.nodes)
                .filter(|&m| m != n)
                .all(|m| path_to(cfg, &routes, m).0 != "missing")
        })
    })
    .unwrap_or_else(|e| eprintln!("{e:#}: the path table shows which"));
    report.paths = paths(cfg)?;
    print_paths(&report.paths);

    step("all-pairs ping (3 each)");
    ping_matrix(pods, report);

    if cfg.host_port {
        step("connectivity: host, nodes, the outside (natOutgoing), a kube-proxy Service");
        let c = hostpath::run(cfg, pods)?;
        println!("{c}");
        report.connectivity = Some(c);
    }

    if cfg.policy_cases > 0 {
        step("network policy: 3 namespaces x 3 pods, TCP and UDP on 80 and 81, all pairs per case");
        let p = policy::run(cfg, pods, cfg.policy_cases)?;
        if !p.success() {
            report.failed_step.get_or_insert_with(|| format!("{p}"));
        }
        report.policy = Some(p);
    }

    if cfg.density > 0 {
        step(&format!(
            "density: {} more pods on node 1 by parallel ADDs, each pinged from node 2 and node 1",
            cfg.density
        ));
        let d = density::run(cfg, pods)?;
        println!("{d}");
        for p in d.add_failures.iter().chain(&d.del_failures) {
            println!("FAIL {p}");
        }
        for p in &d.remote_lossy {
            println!("LOSS from node 2: {p}");
        }
        for p in &d.local_lost {
            println!("LOSS from node 1: {p}");
        }
        if !d.success() {
            report.failed_step.get_or_insert_with(|| {
                format!(
                    "density: {} of {} pods lost pings from node 2, {} from node 1, {} ADD and {} DEL failures",
                    d.remote_lossy.len(),
                    d.pods,
                    d.local_lost.len(),
                    d.add_failures.len(),
                    d.del_failures.len()
                )
            });
        }
        report.density = Some(d);
    }

    if cfg.throughput_secs > 0 && cfg.nodes >= 2 {
        step("throughput: TCP between pods on node 1 and node 2");
        let from = pods
            .iter()
            .find(|p| p.node == 1)
            .context("no pod on node 1")?;
        let to = pods
            .iter()
            .find(|p| p.node == 2)
            .context("no pod on node 2")?;
        let pinged = !report.failed_pairs.iter().any(|p| {
            p.starts_with(&format!("{} (", from.name)) && p.ends_with(&format!("({})", to.ip))
        });
        if !pinged {
            // The ping failure already says what is wrong.
            println!("not run: {} does not answer {}", to.name, from.name);
        } else {
            match throughput(from, to, cfg.throughput_secs) {
                Ok(m) => report.mbit_per_s = Some(m),
                Err(e) => report.failed_step = Some(format!("throughput: {e:#}")),
            }
        }
    }

    if let Some(spec) = cfg.pod_bench {
        step("pod benchmark: iperf3 between pods, the kernel's Calico-shaped path beside");
        let b = podbench::run(pods, spec, cfg.pod_interface.as_str(), &cfg.encap)?;
        println!("{b}");
        report.pod_bench = Some(b);
    }

    step("brindlectl on node 1");
    for args in [
        &["bgp", "peers"][..],
        &["bgp", "routes"],
        &["vrouter", "routes"],
        &["endpoints"],
    ] {
        println!("$ brindlectl {}", args.join(" "));
        println!(
            "{}",
            brindlectl(cfg, 1, args).unwrap_or_else(|e| format!("{e:#}"))
        );
    }
    step("vrouter counters per node (encapsulated, decapsulated, dropped)");
    for n in 1..=cfg.nodes {
        println!("{}: {}", node_ns(n), counters_line(n));
    }
    // Not a step that can fail the run: a daemon that does not answer
    // leaves its names out, which the dashboard test reports.
    for port in [9091, 9092] {
        match scrape(1, port) {
            Ok(text) => report.metric_names.extend(metric_names(&text)),
            Err(e) => eprintln!("lab: {e:#}"),
        }
    }
    summary(cfg, report);
    Ok(())
}

/// The router namespace with one bridge per subnet, and etcd on it.
fn underlay(cfg: &LabConfig) -> Result<()> {
    step(&format!(
        "underlay: {} subnet(s), the router namespace {UNDERLAY_NS}, etcd on {ETCD_ADDR}:2379",
        cfg.subnets
    ));
    ip(&["netns", "add", UNDERLAY_NS])?;
    ip(&["-n", UNDERLAY_NS, "link", "set", "lo", "up"])?;
    // The kernel routes between the subnets' bridges.
    sh(in_ns(UNDERLAY_NS, "sysctl").args(["-qw", "net.ipv4.ip_forward=1"]))?;
    for s in 0..cfg.subnets {
        let br = format!("br{s}");
        ip(&["-n", UNDERLAY_NS, "link", "add", &br, "type", "bridge"])?;
        ip(&[
            "-n",
            UNDERLAY_NS,
            "addr",
            "add",
            &format!("10.99.{s}.254/24"),
            "dev",
            &br,
        ])?;
        ip(&["-n", UNDERLAY_NS, "link", "set", &br, "up"])?;
    }
    let etcd_url = format!("http://{ETCD_ADDR}:2379");
    let peer_url = "http://127.0.0.1:2380".to_string();
    spawn_daemon(
        UNDERLAY_NS,
        "etcd",
        Path::new("etcd"),
        &[
            "--name=lab".into(),
            format!("--data-dir={STATE_DIR}/etcd"),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=lab={peer_url}"),
        ],
        &[],
    )?;
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        let s = cfg.subnet_of(n);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let port = format!("n{n}");
        ip(&[
            "-n",
            UNDERLAY_NS,
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &ns,
        ])?;
        ip(&[
            "-n",
            UNDERLAY_NS,
            "link",
            "set",
            &port,
            "master",
            &format!("br{s}"),
            "up",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", cfg.node_addr(n)),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        // The router on the node's subnet reaches the other subnet (and
        // etcd), as a node's default gateway does.
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &format!("10.99.{s}.254"),
        ])?;
        // The pods' replies to 169.254.1.1 and forwarding between veths.
        sh(in_ns(&ns, "sysctl").args(["-qw", "net.ipv4.ip_forward=1"]))?;
        eprintln!(
            "{ns}: eth0 {}/24 on br{s}, default via 10.99.{s}.254",
            cfg.node_addr(n)
        );
    }
    wait_for("etcd", Duration::from_secs(20), || {
        succeeds_within(
            in_ns(&node_ns(1), "bash").args(["-c", &format!("exec 3<>/dev/tcp/{ETCD_ADDR}/2379")]),
            Duration::from_secs(5),
        )
    })
}

/// `brindle-vrouter serve` and `brindle-ctrl` in each node namespace.
fn nodes(cfg: &LabConfig) -> Result<()> {
    step("nodes: brindle-vrouter serve and brindle-ctrl in each node namespace");
    let encap = encap_key(&cfg.encap)?;
    let etcd_url = format!("http://{ETCD_ADDR}:2379");
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        let dir = node_dir(n);
        fs::create_dir_all(&dir)?;
        let vrouter_toml = dir.join("vrouter.toml");
        fs::write(
            &vrouter_toml,
            format!(
                "uplink = \"eth0\"\ncores = \"auto\"\nadaptive_polling = true\n\
                 [api]\nsocket = \"{d}/vrouter.sock\"\n[metrics]\nlisten = \"127.0.0.1:9092\"\n\
                 [xdp]\nmode = \"native\"\nbind = \"copy\"\nbpffs = \"/sys/fs/bpf/{PREFIX}n{n}\"\n",
                d = dir.display()
            ),
        )?;
        spawn_daemon(
            &ns,
            &format!("n{n}-vrouter"),
            &cfg.bin_dir.join("brindle-vrouter"),
            &[
                "serve".into(),
                "--config".into(),
                vrouter_toml.display().to_string(),
            ],
            &[],
        )?;
        let node_toml = dir.join("node.toml");
        fs::write(&node_toml, "# the lab sets every key by environment\n")?;
        let env: Vec<(String, String)> = [
            ("BRINDLE_CONFIG", node_toml.display().to_string()),
            ("BRINDLE_NODE_NAME", node_ns(n)),
            ("BRINDLE_NODE_ADDRESS", cfg.node_addr(n).to_string()),
            (
                "BRINDLE_API_SOCKET",
                dir.join("ctrl.sock").display().to_string(),
            ),
            (
                "BRINDLE_VROUTER_SOCKET",
                dir.join("vrouter.sock").display().to_string(),
            ),
            ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
            ("BRINDLE_DATASTORE_TYPE", "etcd".into()),
            ("BRINDLE_DATASTORE_ENDPOINTS", etcd_url.clone()),
            ("BRINDLE_BGP_AS_NUMBER", "64512".into()),
            ("BRINDLE_BGP_NODE_TO_NODE_MESH", "true".into()),
            ("BRINDLE_IPAM_DEFAULT_POOL_CIDR", "10.244.0.0/16".into()),
            ("BRINDLE_IPAM_BLOCK_SIZE", "26".into()),
            ("BRINDLE_IPAM_ENCAPSULATION", encap.into()),
            ("BRINDLE_METRICS_LISTEN", "127.0.0.1:9091".into()),
        ]
        .into_iter()
        .chain(cfg.host_port.then(hostpath::ctrl_env).into_iter().flatten())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        spawn_daemon(
            &ns,
            &format!("n{n}-ctrl"),
            &cfg.bin_dir.join("brindle-ctrl"),
            &[],
            &env,
        )?;
        // Node 1 creates the pool; the others start once it is there.
        wait_for(
            &format!("node {n} ready (brindlectl node status)"),
            Duration::from_secs(30),
            || brindlectl(cfg, n, &["node", "status"]).is_ok(),
        )?;
    }
    Ok(())
}

fn brindlectl(cfg: &LabConfig, n: u8, args: &[&str]) -> Result<String> {
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

fn brindlectl_json(cfg: &LabConfig, n: u8, args: &[&str]) -> Result<Vec<Value>> {
    let mut full = vec!["-o", "json"];
    full.extend_from_slice(args);
    Ok(serde_json::from_str(&brindlectl(cfg, n, &full)?)?)
}

/// The kind and description of the route in `routes` (a vrouter's route
/// dump) that leads to node `to`: its target names the node's address as
/// tunnel remote or gateway.
fn path_to(cfg: &LabConfig, routes: &[Value], to: u8) -> (String, String) {
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
fn paths(cfg: &LabConfig) -> Result<Vec<NodePath>> {
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

fn print_paths(paths: &[NodePath]) {
    println!(
        "{:<18} {:<8} {:<8} vrouter route on the sender",
        "node pair", "path", "expected"
    );
    for p in paths {
        println!(
            "{:<18} {:<8} {:<8} {}{}",
            format!("{} -> {}", node_ns(p.from), node_ns(p.to)),
            p.kind,
            p.expected,
            p.route,
            if p.kind == p.expected { "" } else { "   WRONG" }
        );
    }
}

fn ping_matrix(pods: &[Pod], report: &mut LabReport) {
    let mut matrix = String::from("from \\ to");
    for p in pods {
        matrix.push_str(&format!(" {:>12}", p.name));
    }
    matrix.push('\n');
    for a in pods {
        matrix.push_str(&format!("{:<9}", a.name));
        for b in pods {
            if a.name == b.name {
                matrix.push_str(&format!(" {:>12}", "-"));
                continue;
            }
            report.pairs_total += 1;
            let ok = succeeds_within(
                in_ns(&a.name, "ping").args([
                    "-c",
                    "3",
                    "-i",
                    "0.2",
                    "-W",
                    "2",
                    "-q",
                    &b.ip.to_string(),
                ]),
                Duration::from_secs(20),
            );
            if ok {
                report.pairs_ok += 1;
            } else {
                report
                    .failed_pairs
                    .push(format!("{} ({}) -> {} ({})", a.name, a.ip, b.name, b.ip));
            }
            matrix.push_str(&format!(" {:>12}", if ok { "ok" } else { "FAIL" }));
        }
        matrix.push('\n');
    }
    println!("{matrix}");
}

/// The Prometheus text a daemon of node `n` serves on its loopback `port`.
fn scrape(n: u8, port: u16) -> Result<String> {
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
pub fn metric_names(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
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
fn counters_line(n: u8) -> String {
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
fn worker_counters(metrics: &str) -> BTreeMap<String, u64> {
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

fn summary(cfg: &LabConfig, report: &mut LabReport) {
    let wrong: Vec<String> = report
        .paths
        .iter()
        .filter(|p| p.kind != p.expected)
        .map(|p| {
            format!(
                "{} -> {}: {} (expected {})",
                node_ns(p.from),
                node_ns(p.to),
                p.kind,
                p.expected
            )
        })
        .collect();
    println!(
        "| encap | pod interface | subnets | nodes | pods | pairs ok | paths as expected | throughput |\n\
         |---|---|---|---|---|---|---|---|\n| {} | {} | {} | {} | {} | {}/{} | {}/{} | {} |",
        cfg.encap,
        cfg.pod_interface.as_str(),
        cfg.subnets,
        report.nodes,
        report.pods,
        report.pairs_ok,
        report.pairs_total,
        report.paths.len() - wrong.len(),
        report.paths.len(),
        report
            .mbit_per_s
            .map(|m| format!("{m:.0} Mbit/s"))
            .unwrap_or_else(|| "not run".into())
    );
    for p in &report.failed_pairs {
        println!("FAIL ping {p}");
    }
    for w in &wrong {
        println!("WRONG path {w}");
    }
    // What failed, the connectivity first: it explains the rest.
    let mut failures = Vec::new();
    if report.pairs_ok != report.pairs_total {
        failures.push(format!(
            "ping: {} of {} pairs answered (the FAIL lines name the others)",
            report.pairs_ok, report.pairs_total
        ));
    }
    if !wrong.is_empty() {
        failures.push(format!("paths: {}", wrong.join(", ")));
    }
    failures.extend(report.failed_step.take());
    if !failures.is_empty() {
        report.failed_step = Some(failures.join("; "));
    }
}

/// A TCP transfer of `secs` seconds from one pod to another through the
/// vrouters (socat both ends); the receiver's byte count over its time.
fn throughput(from: &Pod, to: &Pod, secs: u32) -> Result<f64> {
    let mut receiver = in_ns(&to.name, "socat")
        .args(["-u", "TCP-LISTEN:5001,reuseaddr", "STDOUT"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = receiver.stdout.take().context("stdout")?;
    let counter = thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        (total, first.map(|f| f.elapsed()))
    });
    thread::sleep(Duration::from_millis(500));
    // The sender stops after `secs` by itself (coreutils' timeout); the
    // bound here is for a sender stuck beyond that.
    let _ = sh_within(
        in_ns(&from.name, "timeout").args([
            secs.to_string(),
            "socat".into(),
            "-u".into(),
            "/dev/zero".into(),
            format!("TCP:{}:5001", to.ip),
        ]),
        Duration::from_secs(u64::from(secs) + 20),
    );
    // A transfer that never connected leaves the receiver listening.
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver.try_wait()?.is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    let _ = receiver.kill();
    let _ = receiver.wait();
    let (bytes, elapsed) = counter
        .join()
        .map_err(|_| anyhow::anyhow!("counter panicked"))?;
    let elapsed = elapsed.context("no byte arrived")?;
    let mbit = bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e6;
    println!(
        "throughput {} -> {}: {bytes} bytes in {elapsed:.2?}: {mbit:.0} Mbit/s",
        from.name, to.name
    );
    Ok(mbit)
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
