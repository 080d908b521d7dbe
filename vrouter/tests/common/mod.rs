//! Helpers of the root-only daemon tests: Calico-shaped pods made by the
//! test and deleted on drop, and the vrouter process, stopped and reaped on
//! drop (also when an assertion fails), and counter parsing. Namespaces,
//! commands, TCP exchanges and captures are `brindle_testkit::netns`'s.
#![allow(dead_code)]

pub mod peer;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brindle_api::framing::Client;
use brindle_api::vrouter::{Stats, VrouterRequest};
#[allow(unused_imports)]
pub use brindle_testkit::netns::{Capture, Netns, in_netns, run, tcp_exchange, unique};

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

/// A TAP pod port: the pod's `eth0` in `ns`, one queue, address `addr`.
pub fn tap_port(name: &str, ns: &Netns, addr: &str) -> brindle_api::vrouter::PortSpec {
    use brindle_api::vrouter::{PortDevice, PortKind, PortSpec};
    PortSpec {
        name: name.to_owned(),
        kind: PortKind::Pod,
        addresses: vec![addr.parse().unwrap()],
        peer_mac: None,
        endpoint: None,
        device: PortDevice::Tap {
            netns: Some(ns.path()),
            ifname: "eth0".into(),
            queues: 1,
        },
        workload: None,
    }
}

/// The node kernel's route of a pods' `block` into the host port, as
/// ctrl makes it: via the pods' gateway 169.254.1.1, onlink on `brindle0`.
pub fn route_via_brindle0(node: &Netns, block: &str) -> Result<()> {
    node.ip(&[
        "route",
        "add",
        block,
        "via",
        "169.254.1.1",
        "dev",
        "brindle0",
        "onlink",
    ])?;
    Ok(())
}

/// `brindle-vrouter serve` in `node` with its socket in a new temporary
/// directory and `flags` after it, connected and greeted (its Hello's
/// version is ours). Keep the directory as long as the daemon runs.
pub fn serve(node: &Netns, flags: &[&str]) -> Result<(tempfile::TempDir, Vrouter, Client)> {
    use brindle_api::framing::PROTOCOL_VERSION;
    use brindle_api::vrouter::Hello;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let mut args = vec!["serve", "--socket", socket.to_str().context("path")?];
    args.extend_from_slice(flags);
    let vrouter = Vrouter::start(node, &args)?;
    let mut client = Client::connect(&socket, Duration::from_secs(10))?;
    let hello: Hello = client.call(&VrouterRequest::Hello {
        version: PROTOCOL_VERSION,
    })?;
    if hello.version != PROTOCOL_VERSION {
        bail!(
            "the vrouter speaks version {}, not {PROTOCOL_VERSION}",
            hello.version
        );
    }
    Ok((dir, vrouter, client))
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

    /// The process id (`ip netns exec` execs the vrouter in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL (no clean-up of its own).
    pub fn kill(mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, wait, and the line with the summed counters.
    pub fn stop(self) -> Result<String> {
        self.stop_lines()?
            .into_iter()
            .rev()
            .find(|l| l.starts_with("stopped"))
            .context("no counters printed")
    }

    /// SIGTERM, wait, and every line printed after the ready line (the
    /// summed counters, then one `worker N:` line per worker).
    pub fn stop_lines(mut self) -> Result<Vec<String>> {
        let mut child = self.child.take().context("already stopped")?;
        run(&["kill", "-TERM", &child.id().to_string()])?;
        let status = child.wait()?;
        if !status.success() {
            bail!("brindle-vrouter exited with {status}");
        }
        // The reader thread ends at EOF, which follows the exit; the
        // timeout only guards against a hang.
        let mut lines = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            lines.push(l);
        }
        Ok(lines)
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

/// A TAP pod as the CNI plugin makes it (interface kind tap): `eth0` a
/// persistent TAP with the virtio-net header made in the pod's namespace
/// (no queue of ours left open), its /32, the routes via 169.254.1.1.
pub fn tap_pod(addr: &str, mac: &str) -> Result<Netns> {
    use std::os::fd::AsFd;
    let ns = Netns::new("tp")?;
    let file = std::fs::File::open(ns.path())?;
    let mac: brindle_api::vrouter::Mac = mac.parse().map_err(anyhow::Error::msg)?;
    let tap = brindle_xsk::Tap::create(
        Some(file.as_fd()),
        &brindle_xsk::TapConfig::pod("eth0").mtu(1500).mac(mac.0),
    )?;
    drop(tap);
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
        "onlink",
    ])?;
    Ok(ns)
}

/// A TCP exchange to `addr` ("ping" one way, "pong" back): `Ok(true)` if
/// it completed, `Ok(false)` if the client could not connect within 2 s
/// (the listener gives up too, so no thread is left behind).
pub fn tcp_ok(server: &Netns, client: &Netns, addr: SocketAddr) -> Result<bool> {
    let srv = in_netns(server, move || -> Result<bool> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(4);
        loop {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(Duration::from_secs(3)))?;
                    let mut buf = [0u8; 4];
                    s.read_exact(&mut buf)?;
                    s.write_all(b"pong")?;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    });
    // Give the listener a moment to bind (a guard, not a timing assertion:
    // a missed bind shows as a refused connection, which fails the test).
    std::thread::sleep(Duration::from_millis(200));
    let cli = in_netns(client, move || -> Result<bool> {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            return Ok(false);
        };
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        anyhow::ensure!(&buf == b"pong", "client got {buf:?}");
        Ok(true)
    });
    let connected = cli
        .join()
        .map_err(|_| anyhow::anyhow!("client panicked"))??;
    let served = srv
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    anyhow::ensure!(
        connected == served,
        "client {connected}, server {served}: a half-open exchange"
    );
    Ok(connected)
}

/// Drops counted for `reason`, summed over the vrouter's workers.
pub fn drops(c: &mut Client, reason: &str) -> Result<u64> {
    let stats: Stats = c.call(&VrouterRequest::GetStats)?;
    Ok(stats
        .workers
        .iter()
        .map(|w| w.drops.get(reason).copied().unwrap_or(0))
        .sum())
}

/// A TCP exchange whose client dials `dial` and whose server listens on
/// `listen` (a DNAT between them); returns the peer address the server saw.
pub fn tcp_through(server: &Netns, listen: &str, client: &Netns, dial: &str) -> Result<SocketAddr> {
    let listen: SocketAddr = listen.parse()?;
    let dial: SocketAddr = dial.parse()?;
    let l = in_netns(server, move || Ok(TcpListener::bind(listen)?))
        .join()
        .map_err(|_| anyhow::anyhow!("bind panicked"))??;
    let srv = std::thread::spawn(move || -> Result<SocketAddr> {
        l.set_nonblocking(false)?;
        let (mut s, peer) = l.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        anyhow::ensure!(&buf == b"ping", "server got {buf:?}");
        s.write_all(b"pong")?;
        Ok(peer)
    });
    let cli = in_netns(client, move || {
        let mut s = TcpStream::connect_timeout(&dial, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        anyhow::ensure!(&buf == b"pong", "client got {buf:?}");
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client panicked"))?;
    if cli.is_err() {
        // Unblock the listener so its thread ends.
        let _ = in_netns(server, move || {
            Ok(TcpStream::connect_timeout(
                &listen,
                Duration::from_millis(200),
            )?)
        })
        .join();
    }
    cli.context("client through the DNAT")?;
    srv.join().map_err(|_| anyhow::anyhow!("server panicked"))?
}
