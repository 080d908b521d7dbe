//! What forwards between the router's two ports in a scenario: the kernel,
//! the null AF_XDP forwarder (MAC + TTL rewrite only: the ceiling of the
//! copy-mode path on veth), or the brindle vrouter as a process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use brindle_wire::{EtherType, EthernetFrame, Ipv4Packet};
use brindle_xsk::{
    Desc, Role, Steering, SteeringConfig, Umem, UmemConfig, XdpMode, XdpStats, XskConfig, ifindex,
};
use serde::Serialize;

use crate::daemon::{self, DaemonDirs};
use crate::topo::{self, RouterPorts, TwoNodePorts};
use crate::traffic::{ThreadCpu, TrafficError, bind_with_retry, now_ns, pin};
use brindle_api::vrouter::{PolicyEndpoint, PolicyUpdate};

/// The forwarding between the router's ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarder {
    /// The kernel's IPv4 forwarding (whatever the router namespace is set up
    /// with: plain, iptables, VXLAN).
    Kernel,
    /// The null AF_XDP forwarder of this crate, pinned to `cpu`.
    NullXsk {
        /// The forwarder's CPU.
        cpu: usize,
    },
    /// The brindle vrouter, started as `<binary> run --port <in> --port
    /// <out> --route 10.201.2.0/24=<out> --neighbor 10.201.2.2=<sink mac>
    /// --cpu <cpus>` inside the router namespace, stopped with SIGTERM; its
    /// "stopped:" line gives its counters. Not available (not a failure)
    /// when the binary has no such mode, or does not take several cores
    /// when asked for several.
    Brindle {
        /// Path of the brindle-vrouter binary.
        binary: PathBuf,
        /// The workers' CPUs (`--cpu 0,1`), one worker each.
        cpus: Vec<usize>,
    },
    /// Two brindle vrouters, one per node of the two-node topology,
    /// carrying the probe over VXLAN (`run --node ... --port ul0=uplink
    /// --port pod0=pod:ADDR --route BLOCK=vxlan:PEER`), both pinned to
    /// `cpu` (the kernel's VXLAN path also does both nodes' work on one
    /// core).
    BrindleVxlan {
        /// Path of the brindle-vrouter binary.
        binary: PathBuf,
        /// The CPU of both workers.
        cpu: usize,
    },
    /// The brindle vrouter as the node daemon (`serve`), programmed over
    /// its socket as brindle-ctrl does ([`crate::daemon`]): both router
    /// ports pods with their workloads, and `policy` (when set) in one
    /// `ApplyPolicy`.
    BrindleDaemon {
        /// Path of the brindle-vrouter binary.
        binary: PathBuf,
        /// The workers' CPUs, one worker each.
        cpus: Vec<usize>,
        /// The workloads of the ingress (generator) and egress (sink) ports.
        workloads: (PolicyEndpoint, PolicyEndpoint),
        /// The policy, `None`: none (the flow table stays off).
        policy: Option<Box<PolicyUpdate>>,
    },
}

/// Whether a forwarder can run here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Availability {
    /// It can.
    Available,
    /// It cannot, and why.
    NotAvailable(String),
}

/// Counters of the null forwarder: where its core's time went.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NullForwarderStats {
    /// Frames put on the egress TX ring.
    pub forwarded: u64,
    /// Frames dropped (not IPv4, TTL expired, TX ring full).
    pub dropped: u64,
    /// The ingress socket's XDP_STATISTICS.
    #[serde(skip)]
    pub rx_xdp: XdpStats,
    /// Frames the kernel dropped on the ingress socket because the fill
    /// ring was empty or the RX ring full.
    pub rx_ring_drops: u64,
    /// The forwarder thread's CPU time: user (our loop) vs system (the
    /// kernel's copy-mode transmit inside sendto).
    pub cpu: ThreadCpu,
    /// Seconds it ran.
    pub elapsed_s: f64,
    /// Poll loops that found frames (brindle, when its "stopped:" line
    /// reports `busy_polls`).
    pub busy_polls: Option<u64>,
    /// Poll loops that found none.
    pub idle_polls: Option<u64>,
}

impl NullForwarderStats {
    /// Busy loops over all loops, when known.
    pub fn busy_share(&self) -> Option<f64> {
        let (b, i) = (self.busy_polls?, self.idle_polls?);
        (b + i > 0).then(|| b as f64 / (b + i) as f64)
    }

    /// Counters from what `brindle-vrouter run` prints when it stops: the
    /// `stopped: key=value ...` line (`forwarded`, every `drop_*` summed)
    /// and its `worker N: ... busy_polls=B idle_polls=I` lines (summed over
    /// the workers). `None` without a "stopped:" line.
    pub fn from_vrouter_output(lines: &[String]) -> Option<NullForwarderStats> {
        let stopped = lines
            .iter()
            .rev()
            .find_map(|l| l.trim().strip_prefix("stopped:"))?;
        let workers = lines
            .iter()
            .filter_map(|l| l.trim().strip_prefix("worker "))
            .filter_map(|l| l.split_once(':').map(|(_, rest)| rest));
        let mut stats = NullForwarderStats::default();
        let pairs = |text: &'_ str| {
            text.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_owned(), v.parse::<u64>().ok()?)))
                .collect::<Vec<_>>()
        };
        for (key, value) in pairs(stopped) {
            match key.as_str() {
                "forwarded" => stats.forwarded += value,
                k if k.starts_with("drop_") => stats.dropped += value,
                _ => {}
            }
        }
        for (key, value) in workers.flat_map(pairs) {
            match key.as_str() {
                "busy_polls" => *stats.busy_polls.get_or_insert(0) += value,
                "idle_polls" => *stats.idle_polls.get_or_insert(0) += value,
                _ => {}
            }
        }
        Some(stats)
    }
}

impl Forwarder {
    /// A short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            Forwarder::Kernel => "kernel",
            Forwarder::NullXsk { .. } => "null-afxdp",
            Forwarder::Brindle { .. } => "brindle",
            Forwarder::BrindleVxlan { .. } => "brindle-vxlan",
            Forwarder::BrindleDaemon { policy: None, .. } => "brindle-daemon",
            Forwarder::BrindleDaemon { .. } => "brindle-policy",
        }
    }

    /// Whether it can run on this machine now.
    pub fn availability(&self) -> Availability {
        match self {
            Forwarder::Kernel | Forwarder::NullXsk { .. } => Availability::Available,
            Forwarder::BrindleVxlan { binary, cpu } => Forwarder::Brindle {
                binary: binary.clone(),
                cpus: vec![*cpu],
            }
            .availability(),
            Forwarder::BrindleDaemon { binary, cpus, .. } => {
                let help = Command::new(binary)
                    .args(["serve", "--help"])
                    .stdin(Stdio::null())
                    .output();
                match help {
                    Ok(out) if out.status.success() => Forwarder::Brindle {
                        binary: binary.clone(),
                        cpus: cpus.clone(),
                    }
                    .availability(),
                    Ok(_) => Availability::NotAvailable(format!(
                        "{} has no `serve` mode",
                        binary.display()
                    )),
                    Err(e) => Availability::NotAvailable(format!("{}: {e}", binary.display())),
                }
            }
            Forwarder::Brindle { binary, cpus } => {
                let help = Command::new(binary)
                    .args(["run", "--help"])
                    .stdin(Stdio::null())
                    .output();
                match help {
                    Ok(out)
                        if out.status.success()
                            && String::from_utf8_lossy(&out.stdout).contains("--port") =>
                    {
                        if cpus.len() > 1 && !takes_cpu_list(binary, cpus) {
                            return Availability::NotAvailable(format!(
                                "{} run does not take several worker cores yet (`--cpu {}` refused)",
                                binary.display(),
                                cpu_list(cpus)
                            ));
                        }
                        Availability::Available
                    }
                    Ok(_) => Availability::NotAvailable(format!(
                        "{} has no static `run --port IF --route CIDR=IF` mode yet",
                        binary.display()
                    )),
                    Err(e) => Availability::NotAvailable(format!("{}: {e}", binary.display())),
                }
            }
        }
    }

    /// Starts it between the router's ports (brindle: returns once it
    /// prints "running").
    pub fn start(&self, router: &RouterPorts) -> Result<RunningForwarder, TrafficError> {
        match self {
            Forwarder::Kernel => Ok(RunningForwarder::default()),
            Forwarder::NullXsk { cpu } => {
                let stop = Arc::new(AtomicBool::new(false));
                let (ready_tx, ready_rx) = std::sync::mpsc::channel();
                let thread_stop = stop.clone();
                let router = router.clone();
                let cpu = *cpu;
                let handle = std::thread::spawn(move || {
                    topo::enter(&router.ns)?;
                    pin(cpu)?;
                    null_forward(&router, &thread_stop, ready_tx)
                });
                if ready_rx.recv().is_err() {
                    return Err(handle
                        .join()
                        .map_err(|_| TrafficError::Thread("forwarder"))?
                        .err()
                        .unwrap_or(TrafficError::Thread("forwarder")));
                }
                Ok(RunningForwarder {
                    stop,
                    thread: Some(handle),
                    children: Vec::new(),
                    daemon: None,
                })
            }
            Forwarder::Brindle { binary, cpus } => {
                let route = format!("10.201.2.0/24={}", router.egress);
                let neighbor = format!("10.201.2.2={}", router.sink_mac);
                let args: Vec<String> = [
                    "run",
                    "--port",
                    &router.ingress,
                    "--port",
                    &router.egress,
                    "--route",
                    &route,
                    "--neighbor",
                    &neighbor,
                    "--cpu",
                    &cpu_list(cpus),
                ]
                .map(str::to_owned)
                .to_vec();
                let mut running = RunningForwarder::default();
                running.start_vrouter(binary, &router.ns, &args, "running")?;
                Ok(running)
            }
            Forwarder::BrindleDaemon {
                binary,
                cpus,
                workloads,
                policy,
            } => {
                let dirs = DaemonDirs::new(&cpu_list(cpus))?;
                let args: Vec<String> = vec![
                    "serve".into(),
                    "--config".into(),
                    dirs.config().display().to_string(),
                ];
                let mut running = RunningForwarder::default();
                running.start_vrouter(binary, &router.ns, &args, "serving")?;
                let socket = dirs.socket();
                running.daemon = Some(dirs);
                daemon::wait_ready(&socket)?;
                daemon::program(&socket, router, workloads, policy.as_deref())?;
                Ok(running)
            }
            Forwarder::BrindleVxlan { .. } => Err(TrafficError::Thread(
                "brindle-vxlan needs the two-node topology (start_pair)",
            )),
        }
    }

    /// Starts brindle-vxlan on both nodes of a two-node topology: node A
    /// encapsulates the generator's frames towards B's block in VXLAN over
    /// the underlay, node B decapsulates and delivers them to the sink.
    pub fn start_pair(&self, nodes: &TwoNodePorts) -> Result<RunningForwarder, TrafficError> {
        let Forwarder::BrindleVxlan { binary, cpu } = self else {
            return Err(TrafficError::Thread("start_pair is for brindle-vxlan"));
        };
        let mut running = RunningForwarder::default();
        for (ns, me, peer, peer_mac, pod, pod_mac, remote_block) in [
            (
                &nodes.a_ns,
                "192.168.201.1",
                "192.168.201.2",
                nodes.b_ul_mac,
                "10.201.1.2",
                nodes.gen_mac,
                "10.201.2.0/24",
            ),
            (
                &nodes.b_ns,
                "192.168.201.2",
                "192.168.201.1",
                nodes.a_ul_mac,
                "10.201.2.2",
                nodes.sink_mac,
                "10.201.1.0/24",
            ),
        ] {
            let args: Vec<String> = vec![
                "run".into(),
                "--node".into(),
                me.into(),
                "--port".into(),
                "ul0=uplink".into(),
                "--port".into(),
                format!("pod0=pod:{pod}"),
                "--route".into(),
                format!("{remote_block}=vxlan:{peer}"),
                "--neighbor".into(),
                format!("{peer}={peer_mac}@ul0"),
                "--neighbor".into(),
                format!("{pod}={pod_mac}@pod0"),
                "--cpu".into(),
                cpu.to_string(),
            ];
            running.start_vrouter(binary, ns, &args, "running")?;
        }
        Ok(running)
    }
}

/// Spawns `command` from a short-lived thread that has SIGINT and SIGTERM
/// unblocked. Every thread of this process blocks them (the Ctrl-C
/// watcher waits for them), and a child inherits its parent thread's
/// signal mask through exec: the vrouter would never see the SIGTERM that
/// asks it to stop and print its counters. (A Ctrl-C landing in this
/// thread's few microseconds ends the process without cleanup; the
/// watcher's fallback is the same.)
fn spawn_with_signals(mut command: Command) -> Result<Child, TrafficError> {
    std::thread::spawn(move || {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGINT);
        set.add(nix::sys::signal::Signal::SIGTERM);
        set.thread_unblock()?;
        let child = command
            .spawn()
            .map_err(|_| TrafficError::Thread("brindle-vrouter"));
        // Block them again before this thread ends, in case it lingers.
        let _ = set.thread_block();
        child
    })
    .join()
    .map_err(|_| TrafficError::Thread("brindle-vrouter spawner"))?
}

/// `0,1`.
fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `<binary> run --cpu 0,1 --help` is accepted: clap rejects the
/// value before it prints the help when `--cpu` takes one core only.
fn takes_cpu_list(binary: &std::path::Path, cpus: &[usize]) -> bool {
    Command::new(binary)
        .args(["run", "--cpu", &cpu_list(cpus), "--help"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A forwarder running; stopped on drop.
#[derive(Default)]
pub struct RunningForwarder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<NullForwarderStats, TrafficError>>>,
    /// brindle-vrouter processes and the threads that read their stdout.
    children: Vec<(Child, JoinHandle<Vec<String>>)>,
    /// The daemon's directories (its socket gives the counters).
    daemon: Option<DaemonDirs>,
}

impl RunningForwarder {
    /// User and system CPU time of the forwarder processes so far
    /// (brindle: every worker of every process).
    pub fn process_cpu(&self) -> Option<ThreadCpu> {
        let mut total: Option<ThreadCpu> = None;
        for (c, _) in &self.children {
            let t = crate::report::process_cpu(i32::try_from(c.id()).ok()?)?;
            let sum = total.get_or_insert_with(ThreadCpu::default);
            sum.user_s += t.user_s;
            sum.system_s += t.system_s;
        }
        total
    }

    /// Starts `<binary> <args>` in namespace `ns` and returns once it
    /// prints a line starting with `ready` ("running": its sockets and
    /// programs are in place), or after 5 s in any case.
    fn start_vrouter(
        &mut self,
        binary: &std::path::Path,
        ns: &str,
        args: &[String],
        ready: &str,
    ) -> Result<(), TrafficError> {
        // `ip netns exec` execs the binary: the child's pid is the
        // vrouter's, whose /proc/<pid>/stat covers every worker.
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", ns])
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = spawn_with_signals(command)?;
        let stdout = child
            .stdout
            .take()
            .ok_or(TrafficError::Thread("brindle-vrouter stdout"))?;
        let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut lines = Vec::new();
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = line_tx.send(line.clone());
                lines.push(line);
            }
            lines
        });
        self.children.push((child, reader));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match line_rx.recv_timeout(left) {
                Ok(l) if l.starts_with(ready) => return Ok(()),
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(()),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(TrafficError::Thread("brindle-vrouter (exited at start)"));
                }
            }
        }
    }

    /// Stops every forwarder process; what each printed.
    fn stop_children(&mut self) -> Vec<Vec<String>> {
        let children = std::mem::take(&mut self.children);
        // Signal them all first, so they stop together.
        for (c, _) in &children {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        children
            .into_iter()
            .map(|(c, reader)| {
                stop_child(c);
                reader.join().unwrap_or_default()
            })
            .collect()
    }
}

/// Waits for a process sent SIGTERM; SIGKILL after 5 s.
fn stop_child(mut c: Child) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl RunningForwarder {
    /// Stops it; the forwarder's counters (null forwarder: its own; brindle:
    /// from its "stopped:" line, CPU filled in by the caller).
    pub fn finish(mut self) -> Result<Option<NullForwarderStats>, TrafficError> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(dirs) = &self.daemon {
            // `serve` prints no counters: ask before stopping it.
            let (stats, _denied) = daemon::counters(&dirs.socket())?;
            self.stop_children();
            return Ok(Some(stats));
        }
        if !self.children.is_empty() {
            // Several processes (one per node): their counters summed.
            let mut total = NullForwarderStats::default();
            for lines in self.stop_children() {
                let s = NullForwarderStats::from_vrouter_output(&lines).unwrap_or_default();
                total.forwarded += s.forwarded;
                total.dropped += s.dropped;
                for (sum, part) in [
                    (&mut total.busy_polls, s.busy_polls),
                    (&mut total.idle_polls, s.idle_polls),
                ] {
                    if let Some(p) = part {
                        *sum.get_or_insert(0) += p;
                    }
                }
            }
            return Ok(Some(total));
        }
        match self.thread.take() {
            Some(h) => Ok(Some(
                h.join().map_err(|_| TrafficError::Thread("forwarder"))??,
            )),
            None => Ok(None),
        }
    }
}

impl Drop for RunningForwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.stop_children();
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// Rewrites a frame for the egress port: MACs, TTL with an incremental
/// checksum update. `false` means drop (not IPv4, malformed, TTL expired).
#[inline]
pub fn rewrite(frame: &mut [u8], router: &RouterPorts) -> bool {
    let Ok(mut eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    if eth.ethertype() != EtherType::Ipv4 {
        return false;
    }
    eth.rewrite_addrs(router.egress_mac, router.sink_mac);
    let Ok(mut ip) = Ipv4Packet::new_checked(eth.payload_mut()) else {
        return false;
    };
    if ip.ttl() <= 1 {
        return false;
    }
    ip.decrement_ttl();
    true
}

/// The null forwarder: ingress socket → rewrite → egress socket by
/// descriptor (shared UMEM, no copy in userspace).
fn null_forward(
    router: &RouterPorts,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<NullForwarderStats, TrafficError> {
    let cpu_start = ThreadCpu::now();
    let mut umem = Umem::new(UmemConfig {
        frame_count: 2048,
        ..UmemConfig::default()
    })?;
    let config = XskConfig {
        max_tx_skb_budget: Some(256),
        ..XskConfig::default()
    };
    let (i_in, i_out) = (ifindex(&router.ingress)?, ifindex(&router.egress)?);
    let mut rx = bind_with_retry(&umem, i_in, &config)?;
    let mut tx = bind_with_retry(&umem, i_out, &config)?;
    let steering = Steering::new(SteeringConfig::default())?;
    let attachment = steering.attach(i_in, Role::All, XdpMode::Auto)?;
    attachment.set_socket(&rx)?;
    let mut free: Vec<u64> = (0..umem.frame_count())
        .map(|i| umem.frame_addr(i))
        .collect();
    let half = free.len() / 2;
    let n = rx.fill(&free[half..]);
    free.truncate(free.len() - n);
    let _ = ready.send(());
    let start = now_ns();
    let mut stats = NullForwarderStats::default();
    let mut descs = [Desc::default(); 64];
    let mut out = [Desc::default(); 64];
    let mut done = [0u64; 256];
    while !stop.load(Ordering::Relaxed) && !topo::STOP.load(Ordering::Relaxed) {
        let n = tx.reap_completions(&mut done);
        free.extend(done[..n].iter().map(|&a| umem.chunk_of(a)));
        let want = free.len().min(256);
        let filled = rx.fill(&free[free.len() - want..]);
        free.truncate(free.len() - filled);
        if rx.fill_needs_wakeup() {
            rx.wake_rx()?;
        }
        let n = rx.rx_burst(&mut descs);
        let mut m = 0;
        for d in &descs[..n] {
            let keep = umem.data_mut(*d).is_some_and(|f| rewrite(f, router));
            if keep {
                out[m] = *d;
                m += 1;
            } else {
                stats.dropped += 1;
                free.push(umem.chunk_of(d.addr));
            }
        }
        let taken = tx.tx_burst(&out[..m]);
        stats.forwarded += taken as u64;
        stats.dropped += (m - taken) as u64;
        free.extend(out[taken..m].iter().map(|d| umem.chunk_of(d.addr)));
        tx.kick_tx()?;
        if n == 0 && tx.tx_pending() == 0 {
            rx.poll_rx(1)?;
        }
    }
    stats.rx_xdp = rx.stats()?;
    stats.rx_ring_drops = stats.rx_xdp.rx_dropped + stats.rx_xdp.rx_ring_full;
    stats.cpu = ThreadCpu::now().since(&cpu_start);
    stats.elapsed_s = (now_ns() - start) as f64 / 1e9;
    drop(attachment);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vrouter_output_gives_forwarded_drops_and_busy_idle_polls_over_workers() {
        let lines: Vec<String> = [
            "running: 2 port(s) [a, b], 1 route(s), polling Adaptive",
            "stopped: rx_packets=10 forwarded=7 arp_replies=0 drop_no_route=2 drop_ttl=1",
            "worker 0: rx_packets=6 busy_polls=30 idle_polls=70 handoff_out=1",
            "worker 1: rx_packets=4 busy_polls=10 idle_polls=90 handoff_out=0",
        ]
        .map(String::from)
        .to_vec();
        let s = NullForwarderStats::from_vrouter_output(&lines).unwrap();
        assert_eq!((s.forwarded, s.dropped), (7, 3));
        assert_eq!((s.busy_polls, s.idle_polls), (Some(40), Some(160)));
        assert_eq!(s.busy_share(), Some(0.2));
        assert!(NullForwarderStats::from_vrouter_output(&lines[..1]).is_none());
        let old = ["stopped: forwarded=5".to_owned()];
        let s = NullForwarderStats::from_vrouter_output(&old).unwrap();
        assert_eq!((s.forwarded, s.busy_polls, s.busy_share()), (5, None, None));
    }
}
