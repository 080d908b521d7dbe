//! Helpers of the root-only daemon tests: namespaces and Calico-shaped pods
//! made by the test and deleted on drop, and the vrouter process, stopped
//! and reaped on drop (also when an assertion fails).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// `<prefix><pid>x<n>`, at most 15 bytes (it names interfaces too).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}{}x{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} too long");
    name
}

pub fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("spawn {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A namespace, deleted (with its veths) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Result<Netns> {
        let name = unique(prefix);
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A pod as Calico's CNI plugin makes it: eth0 with a /32 and a fixed MAC,
/// a link-scope route to 169.254.1.1 and the default route via it; the
/// host end of its veth `host_if` sits in `node`, up, without an address.
pub fn pod(node: &Netns, host_if: &str, addr: &str, mac: &str) -> Result<Netns> {
    pod_with_queues(node, host_if, addr, mac, 1)
}

/// [`pod`] with `queues` queues on both ends of the veth; with more than
/// one, the pod transmits on its last queue only (XPS), so its frames reach
/// the host end's last receive queue and the XDP program sees that queue.
pub fn pod_with_queues(
    node: &Netns,
    host_if: &str,
    addr: &str,
    mac: &str,
    queues: u32,
) -> Result<Netns> {
    let ns = Netns::new("vp")?;
    let q = queues.to_string();
    node.ip(&[
        "link",
        "add",
        host_if,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &ns.name,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
    ])?;
    node.ip(&["link", "set", host_if, "up"])?;
    ns.ip(&["link", "set", "eth0", "address", mac])?;
    ns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&[
        "route",
        "add",
        "169.254.1.1",
        "dev",
        "eth0",
        "scope",
        "link",
    ])?;
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ])?;
    if queues > 1 {
        // Every CPU transmits on the last queue.
        let cpus = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(63);
        let all = format!("{:x}", (1u64 << cpus) - 1);
        for i in 0..queues {
            let mask = if i == queues - 1 { all.as_str() } else { "0" };
            ns.exec(&[
                "sh",
                "-c",
                &format!("echo {mask} > /sys/class/net/eth0/queues/tx-{i}/xps_cpus"),
            ])?;
        }
    }
    Ok(ns)
}

/// The vrouter process: SIGTERM and reaped on drop, also when the test
/// fails; `stop` returns its last line (the counters).
pub struct Vrouter {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    ready: String,
}

impl Vrouter {
    pub fn start(node: &Netns, args: &[&str]) -> Result<Vrouter> {
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &node.name,
                env!("CARGO_BIN_EXE_brindle-vrouter"),
            ])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn brindle-vrouter")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut v = Vrouter {
            child: Some(child),
            lines,
            ready: String::new(),
        };
        // A guard against a hang, not a timing assertion.
        let first = v
            .lines
            .recv_timeout(Duration::from_secs(30))
            .context("brindle-vrouter did not start")?;
        if !(first.starts_with("running") || first.starts_with("serving")) {
            bail!("unexpected first line {first:?}");
        }
        v.ready = first;
        Ok(v)
    }

    /// The line the process printed when it was ready.
    pub fn ready_line(&self) -> &str {
        &self.ready
    }

    /// Kills the process with SIGKILL (no clean-up of its own).
    pub fn kill(mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    pub fn stop(mut self) -> Result<String> {
        let mut child = self.child.take().context("already stopped")?;
        run(&["kill", "-TERM", &child.id().to_string()])?;
        let status = child.wait()?;
        if !status.success() {
            bail!("brindle-vrouter exited with {status}");
        }
        let last: Vec<String> = self.lines.try_iter().collect();
        last.into_iter()
            .rev()
            .find(|l| l.starts_with("stopped"))
            .context("no counters printed")
    }
}

impl Drop for Vrouter {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .output();
            let _ = child.wait();
        }
    }
}

pub fn counter(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs `f` on a thread inside `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::thread::JoinHandle<Result<T>> {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
        f()
    })
}

/// A TCP exchange, like an SSH session or a kubelet probe: a listener on
/// `addr` in `server` answers "pong" to the "ping" a client in `client`
/// sends. Fails if either side does.
pub fn tcp_exchange(server: &Netns, client: &Netns, addr: &str) -> Result<()> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let (tx, rx) = mpsc::channel();
    let bind = format!("{addr}:0");
    let srv = in_netns(server, move || {
        let l = TcpListener::bind(&bind)?;
        tx.send(l.local_addr()?)?;
        let (mut s, _) = l.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        anyhow::ensure!(&buf == b"ping", "server got {buf:?}");
        s.write_all(b"pong")?;
        Ok(())
    });
    let listen = rx
        .recv_timeout(Duration::from_secs(5))
        .context("listener did not start")?;
    let cli = in_netns(client, move || {
        let mut s = TcpStream::connect_timeout(&listen, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        anyhow::ensure!(&buf == b"pong", "client got {buf:?}");
        Ok(())
    });
    let client_result = cli.join().map_err(|_| anyhow::anyhow!("client panicked"))?;
    if client_result.is_err() {
        // Unblock the listener so its thread ends.
        let _ = std::net::TcpStream::connect_timeout(&listen, Duration::from_millis(100));
    }
    client_result?;
    srv.join().map_err(|_| anyhow::anyhow!("server panicked"))?
}

/// Starts `tcpdump -n -c 1 FILTER` on `ifname` in `ns` and waits until it
/// listens; `finish` returns what it printed.
pub struct Capture {
    child: Option<Child>,
}

impl Capture {
    pub fn start(ns: &Netns, ifname: &str, filter: &str) -> Result<Capture> {
        let mut child = Command::new("ip")
            .args([
                "netns", "exec", &ns.name, "timeout", "20", "tcpdump", "-n", "-e", "-v",
            ])
            .args(["-c", "1", "-i", ifname, filter])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn tcpdump")?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("listening on") => break,
                Some(Ok(_)) => continue,
                _ => bail!("tcpdump did not start"),
            }
        }
        Ok(Capture { child: Some(child) })
    }

    pub fn finish(mut self) -> Result<String> {
        let child = self.child.take().context("finished")?;
        let out = child.wait_with_output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // TERM, which `timeout` passes on to tcpdump (KILL would orphan it).
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .output();
            let _ = c.wait();
        }
    }
}
