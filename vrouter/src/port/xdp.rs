//! The AF_XDP port: one [`XskSocket`] on queue 0 of an interface, bound on
//! the UMEM that backs the worker's [`FrameArena`], with the steering
//! program attached to the interface.
//!
//! Every socket of a worker shares the worker's UMEM (XDP_SHARED_UMEM), so a
//! frame received on one port leaves on another by handing over its
//! descriptor: no copy. The arena is built over the [`Umem`] itself
//! ([`umem_arena`]); sockets are bound later through a [`UmemHandle`], which
//! can also be done from a control thread.
//!
//! Frame accounting: each port keeps at most its fill budget of frames on its
//! fill ring, so an idle direction cannot park the whole UMEM there (the
//! xsk forward bench saw exactly that). Completed transmissions go straight
//! back to the arena's free list in [`Port::poll`].
//!
//! Many ports draw on one worker's part of the UMEM, so a port starts with a
//! small fill target ([`XdpPortConfig::pod_fill_start`], 16 frames for a
//! pod: a first burst such as a TCP initial window) and doubles it up to its
//! budget only when the kernel drains its ring (three quarters taken from
//! the fill ring between two refills, read from the ring's consumer index:
//! the worker reads at most a burst per poll, so counting its reads never
//! grew a 256-frame uplink target) and the arena has frames to spare.
//! A fixed 128 per pod parked the whole arena on the fill rings of the
//! first ~8 pods of a worker, and every later pod lost its first packets
//! (`fill_ring_empty`, issue 17); now an idle pod holds 16 frames (32 KiB).

use std::time::Instant;

use brindle_xsk::{
    Desc, Role, Steering, Umem, UmemHandle, XdpAttachment, XdpMode, XskConfig, XskSocket,
};

use crate::frame::{ArenaMemory, FrameArena, FrameDesc, Port, PortPoll, RingStats};
use crate::pipeline::BURST;
use crate::port::handoff::FrameHome;

impl ArenaMemory for Umem {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// Moves `umem` into a new arena; returns the arena and the handle to bind
/// sockets on it.
pub fn umem_arena(umem: Umem) -> (FrameArena, UmemHandle) {
    let handle = umem.handle();
    let frame_size = umem.frame_size();
    (FrameArena::from_memory(Box::new(umem), frame_size), handle)
}

/// One arena per worker over one shared `umem`: every arena sees the whole
/// region, and [`FrameHome::claim_range`] (through `Worker::set_home`)
/// leaves each worker only its own range of chunks.
pub fn umem_arenas(umem: Umem, workers: usize) -> (Vec<FrameArena>, UmemHandle) {
    let handle = umem.handle();
    let frame_size = umem.frame_size();
    let arenas = umem
        .split(workers)
        .into_iter()
        .map(|part| FrameArena::from_memory(Box::new(part), frame_size))
        .collect();
    (arenas, handle)
}

/// Counters of one AF_XDP port, beyond the pipeline's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpPortStats {
    /// `sendto` kicks made.
    pub tx_kicks: u64,
    /// Kicks that failed with an error other than "busy".
    pub tx_kick_errors: u64,
    /// RX wake-ups made because the fill ring asked for one (or, with
    /// preferred busy polling, every receive: that recvfrom runs the
    /// queue's NAPI in the worker's context).
    pub rx_wakeups: u64,
}

/// One receive queue of the interface and its socket.
struct Queue {
    socket: XskSocket,
    on_fill_ring: u32,
    /// Frames to keep on the fill ring now: starts small, doubles up to
    /// the port's budget while the queue drains it (see the module doc).
    target: u32,
    /// Frames on the fill ring right after the last refill: what the
    /// kernel took of them since is the queue's demand (the worker reads
    /// at most a burst per poll, so its own reads cannot show it).
    after_refill: u32,
}

/// A port on AF_XDP sockets: one per receive queue of the interface (RSS
/// spreads flows over them), all on the worker's UMEM. The first one also
/// transmits.
pub struct XdpPort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    queues: Vec<Queue>,
    next_rx: usize,
    /// Which chunks (by index) this port holds on its fill, RX, TX or
    /// completion ring: one byte written per frame, so that a port detached
    /// at run time gives every one of them back ([`Port::release`]).
    held: Vec<bool>,
    frame_shift: u32,
    /// Dropping it detaches the program (graceful stop leaves the interface
    /// as it was). The kernel also drops a socket's XSKMAP entry when the
    /// socket closes, and the program then passes.
    attachment: Option<XdpAttachment>,
    fill_budget: u32,
    descs: Vec<Desc>,
    addrs: Vec<u64>,
    stats: XdpPortStats,
    /// Where chunks of other workers go back (shared UMEM); `None`: the
    /// arena owns every chunk.
    home: Option<FrameHome>,
    /// Preferred busy polling is on: every receive starts with a
    /// recvfrom (the kernel's AF_XDP busy-poll protocol).
    busy_poll: bool,
    /// The interface's NAPI settings before busy polling changed them
    /// (restored when the port closes).
    napi_restore: Option<NapiSettings>,
}

/// `napi_defer_hard_irqs` and `gro_flush_timeout` of an interface: with
/// both zero the kernel keeps running the queue from its softirq and
/// preferred busy polling has nothing to take over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NapiSettings {
    ifname: String,
    defer_hard_irqs: String,
    gro_flush_timeout: String,
}

/// What busy-poll mode writes when the interface has neither set: defer two
/// hard interrupts and flush after 200 µs (the values of the kernel's
/// AF_XDP documentation).
pub const BUSY_POLL_NAPI: (&str, &str) = ("2", "200000");

impl NapiSettings {
    fn path(ifname: &str, knob: &str) -> std::path::PathBuf {
        std::path::Path::new("/sys/class/net")
            .join(ifname)
            .join(knob)
    }

    /// Reads the interface's settings.
    pub fn read(ifname: &str) -> std::io::Result<NapiSettings> {
        let read = |k| std::fs::read_to_string(Self::path(ifname, k)).map(|s| s.trim().to_owned());
        Ok(NapiSettings {
            ifname: ifname.to_owned(),
            defer_hard_irqs: read("napi_defer_hard_irqs")?,
            gro_flush_timeout: read("gro_flush_timeout")?,
        })
    }

    fn write(&self, defer: &str, timeout: &str) -> std::io::Result<()> {
        std::fs::write(Self::path(&self.ifname, "napi_defer_hard_irqs"), defer)?;
        std::fs::write(Self::path(&self.ifname, "gro_flush_timeout"), timeout)
    }

    /// Whether the kernel will let a busy-polling socket own the queue.
    pub fn defers(&self) -> bool {
        self.defer_hard_irqs != "0" && self.gro_flush_timeout != "0"
    }

    /// Puts the interface's values back.
    pub fn restore(&self) -> std::io::Result<()> {
        self.write(&self.defer_hard_irqs, &self.gro_flush_timeout)
    }
}

/// Makes `ifname` ready for preferred busy polling; returns the values to
/// restore, if it changed them. Logs why busy polling will not take over
/// when it cannot.
fn prepare_busy_poll(ifname: &str) -> Option<NapiSettings> {
    let before = match NapiSettings::read(ifname) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(port = ifname, error = %e, "cannot read napi_defer_hard_irqs/gro_flush_timeout: preferred busy polling may not take over the queue");
            return None;
        }
    };
    if before.defers() {
        return None;
    }
    match before.write(BUSY_POLL_NAPI.0, BUSY_POLL_NAPI.1) {
        Ok(()) => {
            tracing::info!(
                port = ifname,
                napi_defer_hard_irqs = BUSY_POLL_NAPI.0,
                gro_flush_timeout = BUSY_POLL_NAPI.1,
                "preferred busy polling: set the interface's NAPI deferral (restored on close)"
            );
            Some(before)
        }
        Err(e) => {
            tracing::warn!(port = ifname, error = %e, "preferred busy polling needs napi_defer_hard_irqs and gro_flush_timeout on the device and they cannot be set: the kernel's softirq keeps running the queue");
            // Put back whichever half was written.
            let _ = before.restore();
            None
        }
    }
}

/// How an [`XdpPort`]'s fill ring is sized: a pod's starts small and stays
/// within a pod's budget (a worker's UMEM is shared by up to a hundred
/// pods), an uplink's (or appliance's) starts large. This follows the
/// port's kind, not its steering [`Role`]: with a host port a veth pod's
/// program sends the vrouter every frame (`Role::All`, as an appliance),
/// and that pod is still one of many. Sized as an uplink, 16 such pods
/// took a worker's 4,096 frames and every later pod lost its frames
/// (`fill_ring_empty`; the lab's 110 veth pods: 97 of 110 lossy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillSizing {
    /// [`XdpPortConfig::pod_fill_start`] and `pod_fill_budget`.
    Pod,
    /// [`XdpPortConfig::fill_start`] and `fill_budget`.
    Uplink,
}

/// How to open an [`XdpPort`].
#[derive(Clone, Copy, Debug)]
pub struct XdpPortConfig {
    /// Socket options (ring sizes, bind mode, need_wakeup, busy polling).
    pub socket: XskConfig,
    /// Native, generic or auto XDP attach.
    pub xdp_mode: XdpMode,
    /// Frames an uplink (or appliance) port keeps on its fill rings at most
    /// (split between its queues).
    pub fill_budget: u32,
    /// The same for a pod port. Pods are many and each receives little, and
    /// every frame on a fill ring is unavailable to the others.
    pub pod_fill_budget: u32,
    /// The fill target a port starts with (per queue), grown up to its
    /// budget while it drains its ring and the arena has more than an
    /// eighth of the UMEM free. 110 idle pods at 16 plus an uplink at 256
    /// hold 2,016 frames of a 4,096-frame (8 MiB) UMEM.
    pub fill_start: u32,
    /// The same for a pod port.
    pub pod_fill_start: u32,
    /// Receive queues to bind at most (the interface's count, up to this).
    pub max_queues: u32,
    /// Chunks in the UMEM (the arena's `frames()`).
    pub umem_frames: u32,
    /// Chunk size of the UMEM (the arena's `frame_size()`).
    pub frame_size: u32,
}

impl Default for XdpPortConfig {
    fn default() -> Self {
        XdpPortConfig {
            socket: XskConfig::default(),
            xdp_mode: XdpMode::Auto,
            fill_budget: 1024,
            pod_fill_budget: 128,
            fill_start: 256,
            pod_fill_start: 16,
            max_queues: 16,
            umem_frames: 4096,
            frame_size: 2048,
        }
    }
}

/// The fill budget of an uplink (split between its queues): half of a
/// worker's share of a UMEM of `umem_frames` chunks split over `workers`,
/// not below the default 1,024 and not above the fill ring (`fill_ring`).
/// One worker on the default 4,096-frame UMEM: 2,048. The receiving
/// uplink's fill ring running dry is where other-node pod TCP is lost when
/// its worker waits for a CPU (issue 13): a frame on the fill ring is a
/// segment not lost then.
pub fn uplink_fill_budget(umem_frames: u32, workers: usize, fill_ring: u32) -> u32 {
    let share = umem_frames / (workers.max(1) as u32);
    (share / 2)
        .max(XdpPortConfig::default().fill_budget)
        .min(fill_ring)
}

/// Receive queues of `ifname` (`/sys/class/net/IF/queues/rx-*`); 1 when
/// unreadable.
pub fn rx_queue_count(ifname: &str) -> u32 {
    std::fs::read_dir(
        std::path::Path::new("/sys/class/net")
            .join(ifname)
            .join("queues"),
    )
    .map(|dir| {
        dir.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count() as u32
    })
    .unwrap_or(1)
    .max(1)
}

impl XdpPort {
    /// Binds one socket per receive queue of `ifname` (up to
    /// `max_queues`) over `umem`, attaches the steering program for `role`
    /// and puts each socket in its map; its fill rings sized by `fill`.
    pub fn open(
        umem: &UmemHandle,
        steering: &Steering,
        ifname: &str,
        role: Role,
        fill: FillSizing,
        link: LinkInfo,
        config: &XdpPortConfig,
    ) -> brindle_xsk::Result<XdpPort> {
        let ifindex = brindle_xsk::ifindex(ifname)?;
        let count = rx_queue_count(ifname).min(config.max_queues.max(1));
        let mut socket_config = config.socket;
        let napi_restore = if socket_config.busy_poll.is_some() {
            prepare_busy_poll(ifname)
        } else {
            None
        };
        let mut queues = Vec::with_capacity(count as usize);
        for q in 0..count {
            let socket = match XskSocket::bind_handle(umem, ifindex, q, &socket_config) {
                Err(e) if socket_config.busy_poll.is_some() => {
                    tracing::warn!(port = ifname, queue = q, error = %e, "the kernel refused preferred busy polling (SO_PREFER_BUSY_POLL/SO_BUSY_POLL/SO_BUSY_POLL_BUDGET): this port polls without it");
                    socket_config.busy_poll = None;
                    XskSocket::bind_handle(umem, ifindex, q, &socket_config)
                }
                other => other,
            };
            let socket = match socket {
                Ok(s) => s,
                Err(e) => {
                    if let Some(n) = &napi_restore {
                        let _ = n.restore();
                    }
                    return Err(e);
                }
            };
            queues.push(Queue {
                socket,
                on_fill_ring: 0,
                target: 0,
                after_refill: 0,
            });
        }
        let attachment = steering.attach(ifindex, role, config.xdp_mode)?;
        for q in &queues {
            attachment.set_socket(&q.socket)?;
        }
        tracing::info!(
            port = ifname,
            ?role,
            queues = count,
            xdp_mode = ?attachment.mode(),
            zero_copy = queues[0].socket.is_zero_copy(),
            busy_poll = socket_config.busy_poll.is_some(),
            "AF_XDP port open"
        );
        let (budget, start) = match fill {
            FillSizing::Pod => (config.pod_fill_budget, config.pod_fill_start),
            FillSizing::Uplink => (config.fill_budget, config.fill_start),
        };
        let per_queue = (budget.min(config.socket.fill_size) / count).max(32);
        let start = (start / count).clamp(8, per_queue);
        for q in &mut queues {
            q.target = start;
        }
        Ok(XdpPort {
            name: ifname.to_owned(),
            mac: link.mac,
            mtu: link.mtu,
            queues,
            next_rx: 0,
            held: vec![false; config.umem_frames as usize],
            frame_shift: config.frame_size.max(1).trailing_zeros(),
            attachment: Some(attachment),
            fill_budget: per_queue,
            descs: vec![Desc::default(); BURST],
            addrs: vec![0; BURST.max(256)],
            stats: XdpPortStats::default(),
            home: None,
            busy_poll: socket_config.busy_poll.is_some(),
            napi_restore,
        })
    }

    /// Chunks of other workers (shared UMEM) go back to them through
    /// `home` instead of into this worker's arena.
    pub fn set_home(&mut self, home: FrameHome) {
        self.home = Some(home);
    }

    /// Whether preferred busy polling is on for the port's sockets.
    pub fn busy_polling(&self) -> bool {
        self.busy_poll
    }

    /// Splits the port's queues over `workers` workers, queue `q` to worker
    /// `(first + q) % workers`; returns `(worker, port)` for each worker
    /// that got a queue. Each part receives on its queues and transmits on
    /// its first one (a socket's TX ring has one producer: its worker). The
    /// part with queue 0 keeps the program attachment, so closing it
    /// detaches the interface; every socket is already in the program's map.
    pub fn split(self, workers: usize, first: usize) -> Vec<(usize, XdpPort)> {
        let workers = workers.max(1);
        if workers == 1 {
            return vec![(first % workers, self)];
        }
        let XdpPort {
            name,
            mac,
            mtu,
            queues,
            held,
            frame_shift,
            attachment,
            fill_budget,
            home,
            busy_poll,
            napi_restore,
            ..
        } = self;
        let mut per_worker: Vec<Vec<Queue>> = (0..workers).map(|_| Vec::new()).collect();
        for (q, queue) in queues.into_iter().enumerate() {
            per_worker[(first + q) % workers].push(queue);
        }
        let owner_of_queue0 = first % workers;
        let mut attachment = attachment;
        let mut napi_restore = napi_restore;
        per_worker
            .into_iter()
            .enumerate()
            .filter(|(_, qs)| !qs.is_empty())
            .map(|(w, qs)| {
                let keeps = w == owner_of_queue0;
                (
                    w,
                    XdpPort {
                        name: name.clone(),
                        mac,
                        mtu,
                        queues: qs,
                        next_rx: 0,
                        held: held.clone(),
                        frame_shift,
                        attachment: if keeps { attachment.take() } else { None },
                        fill_budget,
                        descs: vec![Desc::default(); BURST],
                        addrs: vec![0; BURST.max(256)],
                        stats: XdpPortStats::default(),
                        home: home.clone(),
                        busy_poll,
                        napi_restore: if keeps { napi_restore.take() } else { None },
                    },
                )
            })
            .collect()
    }

    /// The receive queues this port's sockets are bound to.
    pub fn queue_ids(&self) -> Vec<u32> {
        self.queues.iter().map(|q| q.socket.queue()).collect()
    }

    /// The port's own counters.
    pub fn stats(&self) -> XdpPortStats {
        self.stats
    }

    /// Sockets (receive queues) of the port.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// The attached program, if any (for its verdict counters).
    pub fn attachment(&self) -> Option<&XdpAttachment> {
        self.attachment.as_ref()
    }

    fn kick(&mut self) {
        match self.queues[0].socket.kick_tx() {
            Ok(true) => self.stats.tx_kicks += 1,
            Ok(false) => {}
            Err(e) => {
                self.stats.tx_kick_errors += 1;
                tracing::debug!(port = %self.name, error = %e, "TX kick failed");
            }
        }
    }
}

impl Port for XdpPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, _arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        let max = descs.len().min(self.descs.len());
        let mut total = 0;
        // Round robin over the queues, starting one further each burst, so
        // a busy queue cannot starve the others.
        let count = self.queues.len();
        for i in 0..count {
            if total == max {
                break;
            }
            let q = &mut self.queues[(self.next_rx + i) % count];
            if self.busy_poll {
                // Preferred busy polling: the recvfrom runs the queue's
                // NAPI here, in the worker's context (the kernel's
                // AF_XDP documentation, "preferred busy polling").
                self.stats.rx_wakeups += 1;
                if let Err(e) = q.socket.wake_rx() {
                    tracing::debug!(port = %self.name, error = %e, "busy-poll recvfrom failed");
                }
            }
            let n = q.socket.rx_burst(&mut self.descs[..max - total]);
            q.on_fill_ring = q.on_fill_ring.saturating_sub(n as u32);
            for (out, d) in descs[total..].iter_mut().zip(&self.descs[..n]) {
                *out = FrameDesc {
                    addr: d.addr,
                    len: d.len,
                };
                hold(&mut self.held, self.frame_shift, d.addr, false);
            }
            total += n;
        }
        self.next_rx = (self.next_rx + 1) % count;
        total
    }

    fn tx_burst(&mut self, _arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let mut taken = 0;
        // Same arena, so the descriptors are valid for this socket as they
        // are: only the type changes.
        for chunk in descs.chunks(self.descs.len()) {
            for (d, f) in self.descs.iter_mut().zip(chunk) {
                *d = Desc {
                    addr: f.addr,
                    len: f.len,
                };
            }
            let n = self.queues[0].socket.tx_burst(&self.descs[..chunk.len()]);
            for f in &chunk[..n] {
                hold(&mut self.held, self.frame_shift, f.addr, true);
            }
            taken += n;
            if n < chunk.len() {
                break;
            }
        }
        // Once per batch: per-frame kicks halve the rate (AFXDP-NOTES).
        self.kick();
        taken
    }

    fn poll(&mut self, arena: &mut FrameArena, _now: Instant) -> PortPoll {
        let mut result = PortPoll::default();
        loop {
            let n = self.queues[0].socket.reap_completions(&mut self.addrs);
            for &a in &self.addrs[..n] {
                hold(&mut self.held, self.frame_shift, a, false);
                match &self.home {
                    Some(h) => h.free(arena, a),
                    None => arena.free(a),
                }
            }
            result.tx_completed += n as u32;
            if n < self.addrs.len() {
                break;
            }
        }
        // Copy-mode TX only progresses inside sendto.
        if self.queues[0].socket.tx_pending() > 0 {
            self.kick();
        }
        let spare = arena.free_count() > (arena.frames() / 8) as usize;
        for q in &mut self.queues {
            let pending = q.socket.fill_pending();
            let taken = q.after_refill.saturating_sub(pending);
            q.target = grown_target(q.target, taken, self.fill_budget, spare);
            let want = (q.target.saturating_sub(q.on_fill_ring) as usize).min(self.addrs.len());
            q.after_refill = pending;
            let mut got = 0;
            while got < want {
                match arena.alloc() {
                    Some(a) => {
                        self.addrs[got] = a;
                        got += 1;
                    }
                    None => break,
                }
            }
            if got > 0 {
                let filled = q.socket.fill(&self.addrs[..got]);
                for &a in &self.addrs[..filled] {
                    hold(&mut self.held, self.frame_shift, a, true);
                }
                for &a in &self.addrs[filled..got] {
                    arena.free(a);
                }
                q.on_fill_ring += filled as u32;
                q.after_refill += filled as u32;
                result.rx_refilled += filled as u32;
            }
            if !self.busy_poll && q.socket.fill_needs_wakeup() {
                self.stats.rx_wakeups += 1;
                if let Err(e) = q.socket.wake_rx() {
                    tracing::debug!(port = %self.name, error = %e, "RX wake-up failed");
                }
            }
        }
        result
    }

    fn wait_fds<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        out.extend(self.queues.iter().map(|q| q.socket.fd()));
    }

    fn ring_stats(&self) -> Option<RingStats> {
        let mut r = RingStats::default();
        for q in &self.queues {
            r.fill_target += u64::from(q.target);
            if let Ok(st) = q.socket.stats() {
                r.fill_ring_empty += st.fill_ring_empty;
                r.rx_ring_full += st.rx_ring_full;
                r.rx_dropped += st.rx_dropped;
            }
        }
        Some(r)
    }

    fn release(self: Box<Self>, arena: &mut FrameArena) {
        let XdpPort {
            queues,
            attachment,
            held,
            frame_shift,
            name,
            home,
            napi_restore,
            ..
        } = *self;
        // The kernel's own drops, which the pipeline's counters cannot see.
        for q in &queues {
            if let Ok(st) = q.socket.stats()
                && (st.rx_dropped | st.rx_invalid_descs | st.tx_invalid_descs | st.rx_ring_full)
                    != 0
            {
                tracing::warn!(port = %name, queue = q.socket.queue(), ?st, "kernel AF_XDP drops");
            }
        }
        // Detach first so the kernel passes the interface's traffic, then
        // close: after that the kernel holds none of the sockets' frames.
        if let Some(a) = attachment
            && let Err(e) = a.detach()
        {
            tracing::warn!(port = %name, error = %e, "detaching the XDP program failed");
        }
        drop(queues);
        if let Some(n) = napi_restore
            && let Err(e) = n.restore()
        {
            tracing::warn!(port = %name, error = %e, "restoring napi_defer_hard_irqs/gro_flush_timeout failed");
        }
        let mut returned = 0u32;
        for (i, _) in held.iter().enumerate().filter(|(_, h)| **h) {
            let addr = (i as u64) << frame_shift;
            match &home {
                Some(h) => h.free(arena, addr),
                None => arena.free(addr),
            }
            returned += 1;
        }
        tracing::info!(port = %name, frames = returned, "AF_XDP port closed");
    }
}

/// Marks the chunk of `addr` as held by the port or not.
#[inline]
/// A queue's next fill target: doubled (up to `budget`) when the kernel
/// took three quarters of its target from the fill ring since the last
/// refill and the arena has frames to `spare`, else unchanged.
fn grown_target(target: u32, taken: u32, budget: u32, spare: bool) -> u32 {
    if spare && taken >= target - target / 4 && target < budget {
        (target * 2).min(budget)
    } else {
        target
    }
}

fn hold(held: &mut [bool], frame_shift: u32, addr: u64, is_held: bool) {
    if let Some(h) = held.get_mut((addr >> frame_shift) as usize) {
        *h = is_held;
    }
}

/// What the port layer needs to know about an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// The interface's MAC address.
    pub mac: [u8; 6],
    /// The interface's MTU.
    pub mtu: u32,
}

impl LinkInfo {
    /// Reads the MAC and MTU of `ifname` from sysfs (the caller's network
    /// namespace, as sysfs is mounted by it).
    pub fn read(ifname: &str) -> std::io::Result<LinkInfo> {
        if ifname.is_empty() || ifname.contains('/') || ifname.len() > 15 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid interface name {ifname:?}"),
            ));
        }
        let base = std::path::Path::new("/sys/class/net").join(ifname);
        let mac_text = std::fs::read_to_string(base.join("address"))?;
        let mtu_text = std::fs::read_to_string(base.join("mtu"))?;
        // The api's `Mac`: exactly two hex digits per byte, as sysfs and
        // `ip link` print it.
        let mac = mac_text
            .trim()
            .parse::<brindle_api::vrouter::Mac>()
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{ifname}: unreadable MAC in sysfs: {e}"),
                )
            })?
            .0;
        let mtu = mtu_text.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{ifname}: unreadable MTU {mtu_text:?}"),
            )
        })?;
        Ok(LinkInfo { mac, mtu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_target_grows_only_for_a_queue_that_drains_it_while_frames_are_spare() {
        // An idle pod stays at its start.
        assert_eq!(grown_target(16, 0, 128, true), 16);
        assert_eq!(grown_target(16, 11, 128, true), 16);
        // A burst of three quarters doubles it, up to the budget.
        assert_eq!(grown_target(16, 12, 128, true), 32);
        assert_eq!(grown_target(64, 64, 128, true), 128);
        assert_eq!(grown_target(128, 128, 128, true), 128);
        assert_eq!(grown_target(96, 96, 128, true), 128);
        // Not while the arena is short: the other ports' first packets
        // need their frames more.
        assert_eq!(grown_target(16, 16, 128, false), 16);
    }

    #[test]
    fn an_uplink_may_keep_half_of_its_workers_share_on_its_fill_rings() {
        // One worker, the default UMEM: half of it (was 1,024).
        assert_eq!(uplink_fill_budget(4096, 1, 2048), 2048);
        // Two workers: 2,048 chunks each, the default stays.
        assert_eq!(uplink_fill_budget(4096, 2, 2048), 1024);
        // A larger UMEM: no more than the ring holds.
        assert_eq!(uplink_fill_budget(16384, 2, 2048), 2048);
        assert_eq!(uplink_fill_budget(16384, 2, 8192), 4096);
        // A small ring or UMEM.
        assert_eq!(uplink_fill_budget(4096, 1, 512), 512);
        assert_eq!(uplink_fill_budget(1024, 4, 2048), 1024);
    }

    #[test]
    fn link_info_refuses_names_that_are_paths() {
        assert!(LinkInfo::read("../lo").is_err());
        assert!(LinkInfo::read("").is_err());
        assert_eq!(LinkInfo::read("lo").map(|l| l.mac).ok(), Some([0; 6]));
    }
}
