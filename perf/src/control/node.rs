//! One Brindle node in network namespaces, as a cluster runs it: a node
//! namespace with `eth0` (10.0.0.2/24) towards an upstream namespace
//! (10.0.0.1/24: the top-of-rack router, where GoBGP runs), the release
//! `brindle-vrouter serve` (native XDP, AF_XDP copy mode on the uplink)
//! and `brindle-ctrl` with its embedded datastore, sockets and state in a
//! directory of its own. Everything is removed on drop: the daemons get
//! SIGTERM (SIGKILL after 3 s), the namespaces (and the pods' veths in
//! them) are deleted, the bpffs pins and the state directory removed.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brindle_api::framing::Client;
use brindle_api::vrouter::{Stats, VrouterRequest};
use serde_json::{Value, json};

use crate::topo::{self, Netns};

/// The node's underlay address.
pub const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The upstream router's address (the explicit BGP peer).
pub const UPSTREAM_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The node's AS.
pub const NODE_AS: u32 = 64512;
/// The node's pod pool.
pub const POOL: &str = "10.244.0.0/16";

/// A daemon started by us, stopped on drop.
pub struct Daemon {
    name: String,
    child: Child,
}

impl Daemon {
    /// Starts `program args` in `ns` with `env` (inherited `BRINDLE_*`
    /// variables removed: the daemons refuse unknown ones), output to `log`.
    pub fn spawn(
        ns: &Netns,
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, String)],
        log: &Path,
    ) -> Result<Daemon> {
        let out = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .arg(program)
            .args(args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("BRINDLE_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("start {name} ({})", program.display()))?;
        Ok(Daemon {
            name: name.to_owned(),
            child,
        })
    }

    /// Its process id (`ip netns exec` execs the program in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if it has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited: {status}", self.name);
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed on drop (the state directory, the bpffs pins).
pub struct StateDir(pub PathBuf);

impl StateDir {
    /// `/run/brindle-perf-<unique>`.
    pub fn new(role: &str) -> Result<StateDir> {
        let path = PathBuf::from(format!("/run/brindle-perf-{}", topo::unique(role)));
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(StateDir(path))
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What a node runs.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Directory of the release binaries.
    pub bin_dir: PathBuf,
    /// Explicit BGP peers of `brindle-ctrl`: (address, AS).
    pub bgp_peers: Vec<(Ipv4Addr, u32)>,
    /// Start `brindle-ctrl` (false: the vrouter alone).
    pub ctrl: bool,
}

/// A running node. Fields drop in order: daemons first, then the
/// namespaces, then the state directory.
pub struct Node {
    /// `brindle-ctrl`, when started.
    pub ctrl: Option<Daemon>,
    /// When `brindle-ctrl` was started.
    pub ctrl_started: Instant,
    /// `brindle-vrouter serve`.
    pub vrouter: Daemon,
    /// The node's namespace.
    pub ns: Netns,
    /// The upstream router's namespace.
    pub upstream: Netns,
    /// The vrouter's bpffs pins (removed once the vrouter is gone).
    _bpffs: StateDir,
    /// Configs, sockets, logs, the embedded datastore.
    pub dir: StateDir,
    /// The binaries.
    pub bin_dir: PathBuf,
    /// The node's name in the registry.
    pub name: String,
}

impl Node {
    /// Builds the namespaces, runs `prepare` in the upstream namespace
    /// (GoBGP loaded before our daemon exists), starts the vrouter, waits
    /// for its socket, then starts the daemon (not waiting for it: see
    /// [`Node::wait_ready`]).
    pub fn start<T>(
        opts: &NodeOptions,
        prepare: impl FnOnce(&Netns, &Path) -> Result<T>,
    ) -> Result<(Node, T)> {
        for bin in ["brindle-vrouter", "brindle-ctrl", "brindle", "brindle-ipam"] {
            let p = opts.bin_dir.join(bin);
            if !p.exists() {
                bail!(
                    "{} missing: cargo build --release -p brindle-ctrl -p brindle-vrouter -p brindle-cni -p brindle-ipam",
                    p.display()
                );
            }
        }
        let dir = StateDir::new("n")?;
        let upstream = Netns::new("u")?;
        let ns = Netns::new("n")?;
        let name = ns.name.clone();
        ns.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &upstream.name,
        ])?;
        ns.ip(&["addr", "add", &format!("{NODE_ADDR}/24"), "dev", "eth0"])?;
        upstream.ip(&["addr", "add", &format!("{UPSTREAM_ADDR}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        upstream.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &UPSTREAM_ADDR.to_string()])?;
        ns.sysctl(&["net.ipv4.ip_forward=1"])?;
        let prepared = prepare(&upstream, &dir.0)?;

        let d = dir.0.clone();
        let bpffs = PathBuf::from(format!("/sys/fs/bpf/{name}"));
        let vrouter_toml = d.join("vrouter.toml");
        fs::write(
            &vrouter_toml,
            format!(
                "uplink = \"eth0\"\ncores = \"auto\"\nadaptive_polling = true\n\
                 [api]\nsocket = \"{d}/vrouter.sock\"\n[metrics]\nlisten = \"127.0.0.1:9092\"\n\
                 [xdp]\nmode = \"native\"\nbind = \"copy\"\nbpffs = \"{b}\"\n",
                d = d.display(),
                b = bpffs.display()
            ),
        )?;
        let vrouter_toml = vrouter_toml.display().to_string();
        let mut vrouter = Daemon::spawn(
            &ns,
            "brindle-vrouter",
            &opts.bin_dir.join("brindle-vrouter"),
            &["serve", "--config", &vrouter_toml],
            &[],
            &d.join("vrouter.log"),
        )?;
        let vsock = d.join("vrouter.sock");
        wait_for("the vrouter's socket", Duration::from_secs(20), || {
            vrouter.check_alive()?;
            Ok(vrouter_stats(&vsock).is_ok())
        })?;

        let mut node_toml =
            String::from("# brindle-perf control: every other key by environment\n");
        for (addr, asn) in &opts.bgp_peers {
            node_toml.push_str(&format!(
                "[[bgp.peers]]\naddress = \"{addr}\"\nas_number = {asn}\n"
            ));
        }
        fs::write(d.join("node.toml"), node_toml)?;
        let env: Vec<(&str, String)> = vec![
            ("BRINDLE_CONFIG", d.join("node.toml").display().to_string()),
            ("BRINDLE_NODE_NAME", name.clone()),
            ("BRINDLE_NODE_ADDRESS", NODE_ADDR.to_string()),
            (
                "BRINDLE_API_SOCKET",
                d.join("ctrl.sock").display().to_string(),
            ),
            ("BRINDLE_VROUTER_SOCKET", vsock.display().to_string()),
            ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
            ("BRINDLE_DATASTORE_TYPE", "embedded".into()),
            (
                "BRINDLE_DATASTORE_PATH",
                d.join("store").display().to_string(),
            ),
            ("BRINDLE_BGP_AS_NUMBER", NODE_AS.to_string()),
            ("BRINDLE_IPAM_DEFAULT_POOL_CIDR", POOL.into()),
            ("BRINDLE_IPAM_BLOCK_SIZE", "26".into()),
            ("BRINDLE_IPAM_ENCAPSULATION", "ipip".into()),
            ("BRINDLE_METRICS_LISTEN", "127.0.0.1:9091".into()),
            ("BRINDLE_LOG_LEVEL", "warn".into()),
        ];
        let ctrl_started = Instant::now();
        let ctrl = if opts.ctrl {
            Some(Daemon::spawn(
                &ns,
                "brindle-ctrl",
                &opts.bin_dir.join("brindle-ctrl"),
                &[],
                &env,
                &d.join("ctrl.log"),
            )?)
        } else {
            None
        };
        let node = Node {
            ctrl,
            ctrl_started,
            vrouter,
            ns,
            upstream,
            _bpffs: StateDir(bpffs),
            dir,
            bin_dir: opts.bin_dir.clone(),
            name,
        };
        Ok((node, prepared))
    }

    /// Waits until the daemon answers `status` with ready (datastore and
    /// vrouter reachable).
    pub fn wait_ready(&mut self) -> Result<()> {
        let csock = self.ctrl_socket();
        let Some(ctrl) = self.ctrl.as_mut() else {
            bail!("brindle-ctrl was not started");
        };
        let waited = wait_for("brindle-ctrl ready", Duration::from_secs(30), || {
            ctrl.check_alive()?;
            Ok(ctrl_call(&csock, &json!({"op": "status"}))
                .is_ok_and(|s| s["ready"].as_bool().unwrap_or(false)))
        });
        waited.with_context(|| self.logs())
    }

    /// `ctrl.sock`.
    pub fn ctrl_socket(&self) -> PathBuf {
        self.dir.0.join("ctrl.sock")
    }

    /// `vrouter.sock`.
    pub fn vrouter_socket(&self) -> PathBuf {
        self.dir.0.join("vrouter.sock")
    }

    /// The tails of both daemons' logs, for an error message.
    pub fn logs(&self) -> String {
        let tail = |f: &str| {
            let text = fs::read_to_string(self.dir.0.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!(
            "vrouter.log:\n{}\nctrl.log:\n{}",
            tail("vrouter.log"),
            tail("ctrl.log")
        )
    }
}

/// Polls `ok` every 50 ms until it says yes, fails, or `timeout` passes.
pub fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    loop {
        if ok()? {
            return Ok(());
        }
        if topo::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted while waiting for {what}");
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One request on the node daemon's socket (JSON lines).
pub fn ctrl_call(socket: &Path, request: &Value) -> Result<Value> {
    let mut c = Client::connect(socket, Duration::from_secs(10))?;
    Ok(c.call(request)?)
}

/// One request on the vrouter's socket.
pub fn vrouter_call<T: serde::de::DeserializeOwned>(
    socket: &Path,
    request: &VrouterRequest,
) -> Result<T> {
    let mut c = Client::connect(socket, Duration::from_secs(30))?;
    Ok(c.call(request)?)
}

/// The vrouter's counters (routes in the FIB, ports).
pub fn vrouter_stats(socket: &Path) -> Result<Stats> {
    vrouter_call(socket, &VrouterRequest::GetStats)
}
