//! The generators and the sink, each on a thread of its own inside its
//! namespace:
//! - [`GeneratorKind::Live`] (the default): the kernel's XDP frame path,
//!   BPF_PROG_TEST_RUN in live-frames mode (`brindle_xsk::LiveFrameGenerator`):
//!   an XDP program stamps seq and time into each copy of a pre-built frame
//!   and redirects it to the generator's veth. No skb, no socket copy.
//! - [`GeneratorKind::Afxdp`]: AF_XDP TX of frames pre-built in the UMEM,
//!   re-sent from the same chunks, only the probe and UDP checksum patched.
//! - The sink: AF_XDP RX behind an XDP program that takes every frame.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use brindle_xsk::{
    Desc, FlowRotation, LiveFrameConfig, LiveFrameGenerator, Role, Steering, SteeringConfig, Umem,
    UmemConfig, XdpMode, XdpStats, XskConfig, XskSocket, ifindex,
};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::resource::{UsageWho, getrusage};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;
use serde::Serialize;

use crate::frame::{self, BuildError, FlowSpec, FrameSize, PROBE_OFFSET, read_probe, stamp};
use crate::stats::{STREAM_SHIFT, SeqCounter};
use crate::topo::{self, Endpoint, TopoError};

/// Errors of the generator and the sink.
#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    /// AF_XDP or XDP setup or I/O.
    #[error("AF_XDP: {0}")]
    Xsk(#[from] brindle_xsk::Error),
    /// Namespace entry.
    #[error(transparent)]
    Topo(#[from] TopoError),
    /// Frame building.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A system call (affinity, clock, rusage).
    #[error("system call: {0}")]
    Sys(#[from] nix::Error),
    /// A thread died.
    #[error("{0} thread panicked or hung up")]
    Thread(&'static str),
    /// The vrouter daemon refused or did not answer its programming.
    #[error("brindle-vrouter serve: {0}")]
    Vrouter(String),
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of every timestamp.
#[inline]
pub fn now_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only make one batch's
    // latency look large, never panic.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> Result<(), TrafficError> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// User and kernel CPU time a thread used, seconds (getrusage RUSAGE_THREAD).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ThreadCpu {
    /// In userspace.
    pub user_s: f64,
    /// In the kernel on the thread's behalf (system calls: for copy-mode
    /// AF_XDP, the skb allocation, copy and veth transmit inside sendto).
    pub system_s: f64,
}

impl ThreadCpu {
    /// This thread's times so far.
    pub fn now() -> ThreadCpu {
        match getrusage(UsageWho::RUSAGE_THREAD) {
            Ok(u) => {
                let secs =
                    |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
                ThreadCpu {
                    user_s: secs(u.user_time()),
                    system_s: secs(u.system_time()),
                }
            }
            Err(_) => ThreadCpu::default(),
        }
    }

    /// Time used between `earlier` and `self`.
    pub fn since(&self, earlier: &ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            user_s: self.user_s - earlier.user_s,
            system_s: self.system_s - earlier.system_s,
        }
    }
}

/// Offered rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Rate {
    /// As fast as the TX ring takes frames.
    Max,
    /// This many frames per second.
    Pps(f64),
}

/// How frames are put on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GeneratorKind {
    /// BPF_PROG_TEST_RUN live frames: an XDP program stamps and redirects
    /// each frame in the kernel (about 5 to 7 Mpps of 64-byte frames here).
    #[default]
    Live,
    /// AF_XDP TX in copy mode (about 1 Mpps on veth: an skb per frame).
    Afxdp,
}

impl GeneratorKind {
    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            GeneratorKind::Live => "live",
            GeneratorKind::Afxdp => "afxdp",
        }
    }
}

/// What to send.
#[derive(Clone, Debug)]
pub struct GeneratorConfig {
    /// How frames are sent.
    pub kind: GeneratorKind,
    /// Interface (and namespace) to send from.
    pub endpoint: Endpoint,
    /// Addresses.
    pub flow: FlowSpec,
    /// Number of flows (UDP source ports).
    pub flows: u16,
    /// Frame size(s).
    pub size: FrameSize,
    /// Offered rate.
    pub rate: Rate,
    /// How long to send.
    pub duration: Duration,
    /// The trial's tag.
    pub tag: u16,
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// UMEM chunks (each holds one pre-built frame).
    pub frames: u32,
    /// The AF_XDP generator's TX queue (a veth delivers to the peer's RX
    /// queue of the same number); the live generator's frames land on the
    /// queue of its CPU instead.
    pub queue: u32,
    /// Its sequence numbers start at `stream << STREAM_SHIFT`, so several
    /// generator threads in one trial never share a number.
    pub stream: u64,
}

/// What the generator did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GeneratorResult {
    /// Frames the TX ring took.
    pub sent: u64,
    /// Their bytes (no FCS).
    pub bytes: u64,
    /// Frames per flow.
    pub per_flow: Vec<u64>,
    /// Seconds between the first and the last frame queued.
    pub elapsed_s: f64,
    /// The generator thread's CPU time.
    pub cpu: ThreadCpu,
}

/// Binds an AF_XDP socket to queue 0, retrying while the kernel still
/// holds the queue for a socket closed a moment ago (EBUSY: the buffer
/// pool of a closed socket is released asynchronously, so back-to-back
/// trials on the same interface race with it).
pub fn bind_with_retry(
    umem: &Umem,
    ifindex: u32,
    config: &XskConfig,
) -> Result<XskSocket, TrafficError> {
    bind_queue_with_retry(umem, ifindex, 0, config)
}

/// The same for queue `queue`.
pub fn bind_queue_with_retry(
    umem: &Umem,
    ifindex: u32,
    queue: u32,
    config: &XskConfig,
) -> Result<XskSocket, TrafficError> {
    let mut tries = 0;
    loop {
        match XskSocket::bind(umem, ifindex, queue, config) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return Ok(other?),
        }
    }
}

fn xsk_config() -> XskConfig {
    XskConfig {
        // Copy-mode TX sends at most this many frames per sendto(); above
        // the batch size so one kick empties what one batch queued.
        max_tx_skb_budget: Some(256),
        ..XskConfig::default()
    }
}

/// Starts the generator on its own thread in the endpoint's namespace.
pub fn spawn_generator(
    config: GeneratorConfig,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<GeneratorResult, TrafficError>> {
    std::thread::spawn(move || {
        topo::enter(&config.endpoint.ns)?;
        if let Some(cpu) = config.cpu {
            pin(cpu)?;
        }
        generate(&config, &stop)
    })
}

/// The generator loop of `config.kind`; call on a thread inside the
/// namespace.
pub fn generate(
    config: &GeneratorConfig,
    stop: &AtomicBool,
) -> Result<GeneratorResult, TrafficError> {
    match config.kind {
        GeneratorKind::Live => generate_live(config, stop),
        GeneratorKind::Afxdp => generate_afxdp(config, stop),
    }
}

/// How far behind its schedule (in frames) the paced program may fall
/// before it forgives the debt rather than catch up at line rate: a
/// preempted generator then offers a little less, evenly, instead of a
/// burst that overflows the first hop's 256-slot veth ring.
const LIVE_BURST: u32 = 32;

/// The live-frames generator: one BPF_PROG_TEST_RUN call per frame size,
/// ended by a signal at the deadline; the program takes the flows in turn
/// (UDP source port from the sequence number) and, at a fixed rate, paces
/// itself in the kernel. IMIX sends its sizes in turns, each for its share
/// of the duration.
fn generate_live(
    config: &GeneratorConfig,
    stop: &AtomicBool,
) -> Result<GeneratorResult, TrafficError> {
    let cpu_start = ThreadCpu::now();
    let flows = config.flows.max(1);
    let pattern = config.size.pattern();
    let rotation = FlowRotation {
        offset: frame::UDP_OFFSET as u16,
        base: config.flow.base_src_port,
        count: flows,
    };
    let egress = ifindex(&config.endpoint.ifname)?;
    let live_config = LiveFrameConfig {
        egress_ifindex: egress,
        ingress_ifindex: 0,
        rx_queue: 0,
        batch_size: 0,
        seq_offset: Some(PROBE_OFFSET as u16),
        timestamp_offset: Some(PROBE_OFFSET as u16 + 8),
        flows: Some(rotation),
    };
    let mut result = GeneratorResult {
        per_flow: vec![0; usize::from(flows)],
        ..GeneratorResult::default()
    };
    let should_stop = || stop.load(Ordering::Relaxed) || topo::STOP.load(Ordering::Relaxed);
    // One call per distinct size, for its share of the pattern: every call
    // costs about 25 ms of wall time, so IMIX takes 3 calls, not 12.
    let mut sizes: Vec<(u16, u32)> = Vec::new();
    for &size in pattern {
        match sizes.iter_mut().find(|(s, _)| *s == size) {
            Some((_, n)) => *n += 1,
            None => sizes.push((size, 1)),
        }
    }
    let start = now_ns();
    let first_seq = config.stream << STREAM_SHIFT;
    let mut next_seq = first_seq;
    for (size, share) in sizes {
        let slice = config.duration * share / pattern.len() as u32;
        if should_stop() {
            break;
        }
        // Flow 0's frame: the program writes the source port of each copy.
        let bytes = frame::build_unchecksummed(&config.flow, 0, size, config.tag)?;
        let mut generator = LiveFrameGenerator::new(&bytes, live_config)?;
        generator.set_next_seq(next_seq)?;
        generator.set_rate(
            match config.rate {
                Rate::Max => None,
                Rate::Pps(pps) => Some(pps),
            },
            LIVE_BURST,
        )?;
        let sent = generator.send_for(slice, &should_stop)?;
        for (flow, count) in result.per_flow.iter_mut().enumerate() {
            *count += rotation.frames_of(flow as u16, next_seq, next_seq + sent);
        }
        result.bytes += sent * bytes.len() as u64;
        next_seq += sent;
    }
    result.sent = next_seq - first_seq;
    result.elapsed_s = (now_ns().max(start + 1) - start) as f64 / 1e9;
    result.cpu = ThreadCpu::now().since(&cpu_start);
    Ok(result)
}

/// The AF_XDP TX generator loop.
fn generate_afxdp(
    config: &GeneratorConfig,
    stop: &AtomicBool,
) -> Result<GeneratorResult, TrafficError> {
    let cpu_start = ThreadCpu::now();
    let mut umem = Umem::new(UmemConfig {
        frame_count: config.frames,
        ..UmemConfig::default()
    })?;
    let mut sock = bind_queue_with_retry(
        &umem,
        ifindex(&config.endpoint.ifname)?,
        config.queue,
        &xsk_config(),
    )?;
    let chunks = umem.frame_count() as usize;
    let chunk_size = u64::from(umem.frame_size());
    let pattern = config.size.pattern();
    let flows = config.flows.max(1);
    // Per chunk: its frame's base checksum sum, length and flow. Built once.
    let mut base_sum = vec![0u16; chunks];
    let mut len = vec![0u32; chunks];
    let mut flow_of = vec![0u16; chunks];
    for i in 0..chunks {
        let flow = ((i / pattern.len()) % usize::from(flows)) as u16;
        let t = frame::build(&config.flow, flow, pattern[i % pattern.len()], config.tag)?;
        let d = Desc {
            addr: umem.frame_addr(i as u32),
            len: t.bytes.len() as u32,
        };
        if let Some(buf) = umem.data_mut(d) {
            buf.copy_from_slice(&t.bytes);
        }
        base_sum[i] = t.base_sum;
        len[i] = d.len;
        flow_of[i] = flow;
    }
    // A FIFO of free chunks: frames leave in chunk order, so the flows
    // (baked into the chunks) take turns at any rate.
    let mut free: VecDeque<u32> = (0..chunks as u32).collect();
    let mut batch = [Desc::default(); 64];
    let mut batch_chunk = [0u32; 64];
    let mut done = [0u64; 256];
    let mut result = GeneratorResult {
        per_flow: vec![0; usize::from(flows)],
        ..GeneratorResult::default()
    };
    let mut seq = config.stream << STREAM_SHIFT;
    let start = now_ns();
    let deadline = start + config.duration.as_nanos() as u64;
    let mut last = start;
    loop {
        let now = now_ns();
        if now >= deadline || stop.load(Ordering::Relaxed) || topo::STOP.load(Ordering::Relaxed) {
            break;
        }
        let n = sock.reap_completions(&mut done);
        free.extend(done[..n].iter().map(|&a| (a / chunk_size) as u32));
        let mut want = free.len().min(batch.len());
        if let Rate::Pps(rate) = config.rate {
            let due = ((now - start) as f64 * rate / 1e9) as u64;
            want = want.min(due.saturating_sub(result.sent) as usize);
            if want == 0 {
                sock.kick_tx()?;
                if rate < 200_000.0 {
                    std::thread::sleep(Duration::from_micros(20));
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
        }
        for (j, &c) in free.iter().take(want).enumerate() {
            let d = Desc {
                addr: u64::from(c) * chunk_size,
                len: len[c as usize],
            };
            if let Some(buf) = umem.data_mut(d) {
                stamp(buf, base_sum[c as usize], seq + j as u64, now);
            }
            batch[j] = d;
            batch_chunk[j] = c;
        }
        let taken = sock.tx_burst(&batch[..want]);
        for &c in &batch_chunk[..taken] {
            result.per_flow[usize::from(flow_of[c as usize])] += 1;
            result.bytes += u64::from(len[c as usize]);
        }
        free.drain(..taken);
        seq += taken as u64;
        result.sent += taken as u64;
        if taken > 0 {
            last = now;
        }
        sock.kick_tx()?;
    }
    // Let the kernel take what is still on the TX ring.
    let until = now_ns() + 200_000_000;
    while sock.tx_pending() > 0 && now_ns() < until {
        sock.kick_tx()?;
        sock.reap_completions(&mut done);
        std::thread::sleep(Duration::from_micros(50));
    }
    result.elapsed_s = (last.max(start + 1) - start) as f64 / 1e9;
    result.cpu = ThreadCpu::now().since(&cpu_start);
    Ok(result)
}

/// Where and what to count.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Interface (and namespace) to receive on.
    pub endpoint: Endpoint,
    /// The trial's tag: other frames count as foreign.
    pub tag: u16,
    /// UDP source port of flow 0, and the number of flows, for per-flow counts.
    pub base_src_port: u16,
    /// Number of flows.
    pub flows: u16,
    /// UMEM chunks, over all queues.
    pub frames: u32,
    /// RX queues of the sink's interface: one socket (and UMEM) each.
    pub queues: u32,
}

/// What the sink saw.
#[derive(Clone, Debug)]
pub struct SinkResult {
    /// Frames of the trial, reordering, latency.
    pub counter: SeqCounter,
    /// Frames per flow.
    pub per_flow: Vec<u64>,
    /// Frames that were not the trial's probes.
    pub foreign: u64,
    /// The socket's XDP_STATISTICS (drops on the sink side itself).
    pub xdp: XdpStats,
}

/// A running sink.
pub struct Sink {
    stop: Arc<AtomicBool>,
    /// Frames read so far, of the trial or not: [`Sink::drain`] watches it.
    seen: Arc<AtomicU64>,
    handle: Option<JoinHandle<Result<SinkResult, TrafficError>>>,
}

impl Sink {
    /// Starts the sink and returns once its socket and program are in place.
    pub fn start(config: SinkConfig) -> Result<Sink, TrafficError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let seen = Arc::new(AtomicU64::new(0));
        let (thread_stop, thread_seen) = (stop.clone(), seen.clone());
        let handle = std::thread::spawn(move || {
            topo::enter(&config.endpoint.ns)?;
            sink(&config, &thread_stop, &thread_seen, ready_tx)
        });
        if ready_rx.recv().is_err() {
            // The thread ended before it was ready: return its error.
            return Err(handle
                .join()
                .map_err(|_| TrafficError::Thread("sink"))?
                .err()
                .unwrap_or(TrafficError::Thread("sink")));
        }
        Ok(Sink {
            stop,
            seen,
            handle: Some(handle),
        })
    }

    /// Waits until no frame has arrived for `quiet` (frames still in
    /// flight when the generator stops: a veth's ring, a starved softirq
    /// on a shared core), at most `max`.
    pub fn drain(&self, quiet: Duration, max: Duration) {
        let start = Instant::now();
        let mut last = self.seen.load(Ordering::Relaxed);
        let mut since = Instant::now();
        while start.elapsed() < max && since.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(10));
            let now = self.seen.load(Ordering::Relaxed);
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
    }

    /// Stops the sink once nothing more arrives, and returns its counts.
    pub fn finish(mut self) -> Result<SinkResult, TrafficError> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .ok_or(TrafficError::Thread("sink"))?
            .join()
            .map_err(|_| TrafficError::Thread("sink"))?
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn sink(
    config: &SinkConfig,
    stop: &AtomicBool,
    seen: &AtomicU64,
    ready: mpsc::Sender<()>,
) -> Result<SinkResult, TrafficError> {
    let queues = config.queues.max(1);
    let index = ifindex(&config.endpoint.ifname)?;
    // One UMEM and socket per queue: a veth delivers on the queue its
    // sender chose, and a queue without a socket would pass its frames on
    // to the kernel, uncounted.
    let mut rx = Vec::new();
    for queue in 0..queues {
        let umem = Umem::new(UmemConfig {
            frame_count: (config.frames / queues).max(64),
            ..UmemConfig::default()
        })?;
        let sock = bind_queue_with_retry(&umem, index, queue, &XskConfig::default())?;
        rx.push((umem, sock));
    }
    let steering = Steering::new(SteeringConfig::default())?;
    let attachment = steering.attach(index, Role::All, XdpMode::Auto)?;
    for (umem, sock) in &mut rx {
        attachment.set_socket(sock)?;
        let addrs: Vec<u64> = (0..umem.frame_count())
            .map(|i| umem.frame_addr(i))
            .collect();
        sock.fill(&addrs);
    }
    let _ = ready.send(());
    let mut result = SinkResult {
        counter: SeqCounter::with_flows(usize::from(config.flows.max(1))),
        per_flow: vec![0; usize::from(config.flows.max(1))],
        foreign: 0,
        xdp: XdpStats::default(),
    };
    let mut descs = [Desc::default(); 64];
    let mut refill = [0u64; 64];
    loop {
        let mut got = 0;
        for (umem, sock) in &mut rx {
            let n = sock.rx_burst(&mut descs);
            if n == 0 {
                continue;
            }
            got += n;
            let now = now_ns();
            for (d, r) in descs[..n].iter().zip(refill.iter_mut()) {
                match umem
                    .data(*d)
                    .and_then(|f| read_probe(f).map(|p| (p, f.len())))
                {
                    Some((p, len)) if p.tag == config.tag => {
                        let flow = usize::from(p.src_port.wrapping_sub(config.base_src_port));
                        result
                            .counter
                            .record_in_flow(p.seq, flow, len, p.timestamp_ns, now);
                        if let Some(c) = result.per_flow.get_mut(flow) {
                            *c += 1;
                        }
                    }
                    _ => result.foreign += 1,
                }
                *r = umem.chunk_of(d.addr);
            }
            sock.fill(&refill[..n]);
            if sock.fill_needs_wakeup() {
                sock.wake_rx()?;
            }
        }
        if got > 0 {
            seen.fetch_add(got as u64, Ordering::Relaxed);
        } else {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match rx.as_mut_slice() {
                [(_, only)] => {
                    only.poll_rx(5)?;
                }
                // Several sockets: a short sleep instead of poll(2) on one.
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }
    for (_, sock) in &rx {
        let s = sock.stats()?;
        result.xdp.rx_dropped += s.rx_dropped;
        result.xdp.rx_ring_full += s.rx_ring_full;
        result.xdp.rx_invalid_descs += s.rx_invalid_descs;
    }
    drop(attachment);
    Ok(result)
}
