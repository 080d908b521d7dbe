//! Network namespaces for root-only tests: unique names, deleted on drop
//! (also when an assertion fails), plus the small tools every suite needs
//! (run a command, enter a namespace on a thread, a TCP exchange, a tcpdump
//! capture). One copy here, used as a dev-dependency by every crate's
//! namespace tests, so a fix to cleanup lands everywhere at once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// `<prefix><pid>x<n>`: unique per process and call, so two test runs (or
/// two tests in one run) never collide. At most 15 bytes because it names
/// interfaces too; panics on a prefix that makes it longer (a test bug).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}{}x{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} too long");
    name
}

/// Runs `args[0]` with the rest as arguments; its stdout, or an error with
/// both outputs when it fails.
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

/// `ip netns exec NS PROGRAM` (which execs `PROGRAM` in place, so the
/// child is the program itself and signals reach it), without the
/// inherited `BRINDLE_*` variables: the daemons treat every `BRINDLE_`
/// variable as configuration and refuse unknown ones, and a test's own
/// gate or a developer's shell must not configure them by accident.
pub fn command_in(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BRINDLE_") {
            c.env_remove(key);
        }
    }
    c
}

/// A namespace, deleted (with its veths) on drop.
pub struct Netns {
    /// Its name under /var/run/netns.
    pub name: String,
}

impl Netns {
    /// Creates `unique(prefix)` with its loopback up.
    pub fn new(prefix: &str) -> Result<Netns> {
        let name = unique(prefix);
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// `ip netns exec NAME ARGS...`.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Its path, as a runtime passes it in `CNI_NETNS`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `ip -n NAME -j ARGS...` parsed as JSON (`[]` when `ip` prints
    /// nothing, as it does for an empty list).
    pub fn ip_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut full = vec!["ip", "-n", &self.name, "-j"];
        full.extend_from_slice(args);
        let out = run(&full)?;
        if out.trim().is_empty() {
            return Ok(serde_json::Value::Array(Vec::new()));
        }
        serde_json::from_str(&out).with_context(|| format!("ip {args:?}: not JSON: {out}"))
    }

    /// Deletes it now, before the drop (e.g. a DEL after the runtime
    /// removed the netns); the drop then finds nothing to do.
    pub fn delete(&self) -> Result<()> {
        run(&["ip", "netns", "del", &self.name]).map(|_| ())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
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
    /// Starts the capture.
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

    /// Waits for the packet and returns tcpdump's output.
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
