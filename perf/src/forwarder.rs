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

use crate::topo::{self, RouterPorts};
use crate::traffic::{ThreadCpu, TrafficError, bind_with_retry, now_ns, pin};

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
    /// HOOK: the brindle vrouter, started as
    /// `<binary> run --port <in> --port <out> --route 10.201.2.0/24=<out>
    /// --neighbor 10.201.2.2=<sink mac> --cpu <cpu>` inside the router
    /// namespace, once `brindle-vrouter` has that static mode. Until then it
    /// is reported as not available, not as a failure.
    Brindle {
        /// Path of the brindle-vrouter binary.
        binary: PathBuf,
        /// The worker's CPU.
        cpu: usize,
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
}

impl Forwarder {
    /// A short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            Forwarder::Kernel => "kernel",
            Forwarder::NullXsk { .. } => "null-afxdp",
            Forwarder::Brindle { .. } => "brindle",
        }
    }

    /// Whether it can run on this machine now.
    pub fn availability(&self) -> Availability {
        match self {
            Forwarder::Kernel | Forwarder::NullXsk { .. } => Availability::Available,
            Forwarder::Brindle { binary, .. } => {
                let help = Command::new(binary)
                    .args(["run", "--help"])
                    .stdin(Stdio::null())
                    .output();
                match help {
                    Ok(out)
                        if out.status.success()
                            && String::from_utf8_lossy(&out.stdout).contains("--port") =>
                    {
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

    /// Starts it between the router's ports.
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
                    child: None,
                })
            }
            Forwarder::Brindle { binary, cpu } => {
                let route = format!("10.201.2.0/24={}", router.egress);
                let neighbor = format!("10.201.2.2={}", router.sink_mac);
                let child = Command::new("ip")
                    .args(["netns", "exec", &router.ns])
                    .arg(binary)
                    .args(["run", "--port", &router.ingress, "--port", &router.egress])
                    .args(["--route", &route, "--neighbor", &neighbor])
                    .args(["--cpu", &cpu.to_string()])
                    .stdin(Stdio::null())
                    .spawn()
                    .map_err(|_| TrafficError::Thread("brindle-vrouter"))?;
                // Give it time to attach its programs before traffic starts.
                std::thread::sleep(std::time::Duration::from_millis(500));
                Ok(RunningForwarder {
                    stop: Arc::new(AtomicBool::new(false)),
                    thread: None,
                    child: Some(child),
                })
            }
        }
    }
}

/// A forwarder running; stopped on drop.
#[derive(Default)]
pub struct RunningForwarder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<NullForwarderStats, TrafficError>>>,
    child: Option<Child>,
}

impl RunningForwarder {
    /// Stops it; the null forwarder's counters.
    pub fn finish(mut self) -> Result<Option<NullForwarderStats>, TrafficError> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
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
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
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
