//! The local lab: N "nodes" as network namespaces on an underlay bridge,
//! each running the release `brindle-vrouter serve` and `brindle-ctrl`
//! against one etcd, P pods per node made by exec'ing the real `brindle`
//! CNI plugin, then all-pairs ping and a throughput run.
//!
//! Everything the lab creates carries the prefix `brl-` (namespaces, bpffs
//! pins) or lives under the state directory, so [`down`] can always remove
//! a lab interrupted at any point: it kills every process in a `brl-`
//! namespace, deletes the namespaces and the state directory.

use std::fs;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The prefix of every namespace and pin the lab makes.
pub const PREFIX: &str = "brl-";
/// Where the lab keeps configs, logs, sockets and pid files.
pub const STATE_DIR: &str = "/run/brindle-lab";
const UNDERLAY_NS: &str = "brl-underlay";
const ETCD_ADDR: &str = "10.99.0.254";
const NETWORK: &str = "k8s-pod-network";

/// The daemons this process started, reaped by [`down`] so none is left
/// as a zombie while the caller (a test) keeps running.
static CHILDREN: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// What to run.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The directory holding the release binaries.
    pub bin_dir: PathBuf,
    pub nodes: u8,
    pub pods: u8,
    /// `ipip`, `vxlan` or `cross-subnet`.
    pub encap: String,
    /// Seconds of the TCP throughput run; 0 skips it.
    pub throughput_secs: u32,
    /// Leave the lab running at the end.
    pub keep: bool,
}

/// What the run proved.
#[derive(Debug, Clone, Default)]
pub struct LabReport {
    pub nodes: u8,
    pub pods: usize,
    pub pairs_ok: usize,
    pub pairs_total: usize,
    pub mbit_per_s: Option<f64>,
    /// The step that failed, if one did.
    pub failed_step: Option<String>,
}

impl LabReport {
    pub fn success(&self) -> bool {
        self.failed_step.is_none() && self.pairs_ok == self.pairs_total && self.pairs_total > 0
    }
}

struct Pod {
    node: u8,
    name: String,
    ip: Ipv4Addr,
    add_result: Value,
}

fn node_ns(n: u8) -> String {
    format!("{PREFIX}n{n}")
}

fn node_addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, 10 + n)
}

fn state() -> PathBuf {
    PathBuf::from(STATE_DIR)
}

fn sh(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String> {
    sh(Command::new("ip").args(args))
}

/// A command run in a namespace. Inherited `BRINDLE_*` variables (the
/// smoke test's own gate, a developer's shell) are removed: the daemons
/// treat every `BRINDLE_` variable as configuration and refuse unknown ones.
fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BRINDLE_") {
            c.env_remove(key);
        }
    }
    c
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(250));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// The lab's namespaces that exist now.
pub fn lab_namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_owned)
        .collect()
}

/// Removes everything a lab (finished, kept or interrupted) left behind.
pub fn down() -> Result<()> {
    for ns in lab_namespaces() {
        for signal in ["-TERM", "-KILL"] {
            let pids = ip(&["netns", "pids", &ns]).unwrap_or_default();
            let pids: Vec<&str> = pids.split_whitespace().collect();
            if pids.is_empty() {
                break;
            }
            let _ = Command::new("kill")
                .arg(signal)
                .args(&pids)
                .stderr(Stdio::null())
                .status();
            let _ = wait_for("processes to exit", Duration::from_secs(3), || {
                ip(&["netns", "pids", &ns])
                    .map(|p| p.trim().is_empty())
                    .unwrap_or(true)
            });
        }
        // Pods first would not matter: deleting a namespace deletes its veths.
        let _ = ip(&["netns", "del", &ns]);
    }
    // Processes started outside a namespace (none today), by pid file.
    if let Ok(entries) = fs::read_dir(state()) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "pid")
                && let Ok(pid) = fs::read_to_string(e.path())
                && started_by_lab(pid.trim())
            {
                let _ = Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    for mut child in CHILDREN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .drain(..)
    {
        let _ = child.kill();
        let _ = child.wait();
    }
    if let Ok(entries) = fs::read_dir("/sys/fs/bpf") {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(PREFIX) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = fs::remove_dir_all(state());
    let left = lab_namespaces();
    if !left.is_empty() {
        bail!("namespaces left after lab down: {left:?}");
    }
    Ok(())
}

/// Whether a pid (from a pid file) is still one of the lab's processes
/// and not a recycled pid: its arguments or environment name the state dir.
fn started_by_lab(pid: &str) -> bool {
    ["cmdline", "environ"].iter().any(|f| {
        fs::read(format!("/proc/{pid}/{f}"))
            .is_ok_and(|b| String::from_utf8_lossy(&b).contains(STATE_DIR))
    })
}

/// Starts a daemon in a namespace, logging into the state dir.
fn spawn_daemon(
    ns: &str,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
) -> Result<()> {
    let log = fs::File::create(state().join(format!("{name}.log")))?;
    let child = in_ns(ns, program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    fs::write(state().join(format!("{name}.pid")), child.id().to_string())?;
    CHILDREN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(child);
    Ok(())
}

fn step(name: &str) {
    eprintln!("\n==== lab: {name} ====");
}

/// Runs the whole lab; tears it down at the end unless `keep`.
pub fn run(cfg: &LabConfig) -> Result<LabReport> {
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
            if let Err(e) = cni(cfg, pod.node, &pod.name, "DEL", Some(&pod.add_result)) {
                eprintln!("CNI DEL {}: {e:#}", pod.name);
            }
        }
        down()?;
    } else {
        if let Some(p) = pods.first() {
            eprintln!(
                "\nthe lab keeps running. Enter a pod:  ip netns exec {} bash   (its address {})",
                p.name, p.ip
            );
        }
        eprintln!(
            "logs and sockets: {STATE_DIR}; brindlectl: ip netns exec {} {}/brindlectl --ctrl-socket {STATE_DIR}/n1/ctrl.sock bgp peers\n\
             remove it:  cargo xtask lab down",
            node_ns(1),
            cfg.bin_dir.display()
        );
    }
    Ok(report)
}

fn encap_key(encap: &str) -> Result<&'static str> {
    Ok(match encap {
        "ipip" => "ipip",
        "vxlan" => "vxlan",
        "cross-subnet" => "ipip_cross_subnet",
        other => bail!("unknown encapsulation {other:?}: ipip | vxlan | cross-subnet"),
    })
}

fn run_steps(cfg: &LabConfig, report: &mut LabReport, pods: &mut Vec<Pod>) -> Result<()> {
    let encap = encap_key(&cfg.encap)?;
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
    down()?;
    fs::create_dir_all(state())?;

    step("underlay: bridge in its own namespace, etcd on 10.99.0.254:2379");
    ip(&["netns", "add", UNDERLAY_NS])?;
    ip(&["-n", UNDERLAY_NS, "link", "set", "lo", "up"])?;
    ip(&["-n", UNDERLAY_NS, "link", "add", "br0", "type", "bridge"])?;
    ip(&[
        "-n",
        UNDERLAY_NS,
        "addr",
        "add",
        &format!("{ETCD_ADDR}/24"),
        "dev",
        "br0",
    ])?;
    ip(&["-n", UNDERLAY_NS, "link", "set", "br0", "up"])?;
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
            "br0",
            "up",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", node_addr(n)),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        // The pods' replies to 169.254.1.1 and forwarding between veths.
        sh(in_ns(&ns, "sysctl").args(["-qw", "net.ipv4.ip_forward=1"]))?;
    }
    wait_for("etcd", Duration::from_secs(20), || {
        in_ns(&node_ns(1), "bash")
            .args(["-c", &format!("exec 3<>/dev/tcp/{ETCD_ADDR}/2379")])
            .status()
            .is_ok_and(|s| s.success())
    })?;

    step("nodes: brindle-vrouter serve and brindle-ctrl in each node namespace");
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        let dir = state().join(format!("n{n}"));
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
            ("BRINDLE_NODE_ADDRESS", node_addr(n).to_string()),
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

    step("BGP: every node Established with every other");
    let want = usize::from(cfg.nodes - 1);
    wait_for("BGP full mesh Established", Duration::from_secs(60), || {
        (1..=cfg.nodes).all(|n| {
            brindlectl(cfg, n, &["-o", "json", "bgp", "peers"])
                .ok()
                .and_then(|s| serde_json::from_str::<Vec<Value>>(&s).ok())
                .is_some_and(|peers| {
                    peers
                        .iter()
                        .filter(|p| p["state"].as_str() == Some("Established"))
                        .count()
                        == want
                })
        })
    })?;

    step("pods: the brindle CNI plugin exec'd like a runtime");
    for n in 1..=cfg.nodes {
        for p in 1..=cfg.pods {
            let name = format!("{PREFIX}n{n}p{p}");
            ip(&["netns", "add", &name])?;
            let mut attempt = 0;
            let result = loop {
                match cni(cfg, n, &name, "ADD", None) {
                    Ok(r) => break r,
                    // CNI code 11: try again later (the vrouter not yet programmed).
                    Err(e) if attempt < 20 && e.to_string().contains("\"code\":11") => {
                        attempt += 1;
                        eprintln!("CNI ADD {name}: {e:#}; retrying");
                        thread::sleep(Duration::from_millis(500));
                    }
                    Err(e) => return Err(e),
                }
            };
            // Pods keep TX checksum offload on, as real pods do: the vrouter
            // completes the CHECKSUM_PARTIAL TCP/UDP checksums that frames
            // taken by AF_XDP never get from the kernel.
            let addr = result["ips"][0]["address"]
                .as_str()
                .context("ADD result without ips[0].address")?;
            let ip: Ipv4Addr = addr.split('/').next().unwrap_or("").parse()?;
            eprintln!("{name} on {}: {ip}", node_ns(n));
            pods.push(Pod {
                node: n,
                name,
                ip,
                add_result: result,
            });
        }
    }
    report.pods = pods.len();

    step("all-pairs ping (3 each)");
    // Let every vrouter learn the other blocks' routes.
    wait_for("routes to every block", Duration::from_secs(30), || {
        (1..=cfg.nodes).all(|n| {
            brindlectl(cfg, n, &["-o", "json", "bgp", "routes"])
                .ok()
                .and_then(|s| serde_json::from_str::<Vec<Value>>(&s).ok())
                .is_some_and(|r| r.len() >= usize::from(cfg.nodes))
        })
    })?;
    let mut matrix = String::from("from \\ to");
    for p in pods.iter() {
        matrix.push_str(&format!(" {:>12}", p.name));
    }
    matrix.push('\n');
    for a in pods.iter() {
        matrix.push_str(&format!("{:<9}", a.name));
        for b in pods.iter() {
            if a.name == b.name {
                matrix.push_str(&format!(" {:>12}", "-"));
                continue;
            }
            report.pairs_total += 1;
            let ok = in_ns(&a.name, "ping")
                .args(["-c", "3", "-i", "0.2", "-W", "2", "-q", &b.ip.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                report.pairs_ok += 1;
            }
            matrix.push_str(&format!(" {:>12}", if ok { "ok" } else { "FAIL" }));
        }
        matrix.push('\n');
    }
    println!("{matrix}");

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
        match throughput(from, to, cfg.throughput_secs) {
            Ok(m) => report.mbit_per_s = Some(m),
            Err(e) => report.failed_step = Some(format!("throughput: {e:#}")),
        }
    }

    step("brindlectl on node 1");
    for args in [&["bgp", "peers"][..], &["bgp", "routes"], &["endpoints"]] {
        println!("$ brindlectl {}", args.join(" "));
        println!(
            "{}",
            brindlectl(cfg, 1, args).unwrap_or_else(|e| format!("{e:#}"))
        );
    }
    println!(
        "| nodes | pods | pairs ok | throughput |\n|---|---|---|---|\n| {} | {} | {}/{} | {} |",
        report.nodes,
        report.pods,
        report.pairs_ok,
        report.pairs_total,
        report
            .mbit_per_s
            .map(|m| format!("{m:.0} Mbit/s"))
            .unwrap_or_else(|| "not run".into())
    );
    if report.pairs_ok != report.pairs_total {
        report.failed_step = Some(format!(
            "ping: {} of {} pairs answered",
            report.pairs_ok, report.pairs_total
        ));
    }
    Ok(())
}

fn brindlectl(cfg: &LabConfig, n: u8, args: &[&str]) -> Result<String> {
    let dir = state().join(format!("n{n}"));
    sh(in_ns(&node_ns(n), cfg.bin_dir.join("brindlectl"))
        .arg("--ctrl-socket")
        .arg(dir.join("ctrl.sock"))
        .arg("--vrouter-socket")
        .arg(dir.join("vrouter.sock"))
        .args(args))
}

/// Execs the brindle plugin as a runtime does (libcni: the conflist's
/// `name` and `cniVersion` injected into the plugin's config, the cached
/// ADD result as `prevResult` for DEL).
fn cni(cfg: &LabConfig, n: u8, pod: &str, command: &str, prev: Option<&Value>) -> Result<Value> {
    let dir = state().join(format!("n{n}"));
    let sock = dir.join("ctrl.sock").display().to_string();
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "brindle",
        "mtu": 0,
        // The plugin's key sizes the MTU only: cross-subnet may encapsulate,
        // so it reserves IPIP's 20 bytes like Calico's CrossSubnet does.
        "encapsulation": if cfg.encap == "vxlan" { "vxlan" } else { "ipip" },
        "ctrlSocket": sock,
        "requireDaemon": true,
        "ipam": {"type": "brindle-ipam", "mode": "daemon", "socket": sock, "node": node_ns(n)}
    });
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    let mut child = in_ns(&node_ns(n), cfg.bin_dir.join("brindle"))
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", pod)
        .env("CNI_NETNS", format!("/var/run/netns/{pod}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &cfg.bin_dir)
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=lab;K8S_POD_NAME={pod}"),
        )
        .env("NODENAME", node_ns(n))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "brindle {command} {pod}: {}: {} {}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if stdout.trim().is_empty() {
        return Ok(Value::Null);
    }
    Ok(serde_json::from_str(&stdout)?)
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
    let _ = in_ns(&from.name, "timeout")
        .args([
            secs.to_string(),
            "socat".into(),
            "-u".into(),
            "/dev/zero".into(),
            format!("TCP:{}:5001", to.ip),
        ])
        .status();
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
