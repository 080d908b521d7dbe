//! Parked receive queues (issue 17): a worker's loop reads only the ports
//! that have something, however many ports it holds.
//!
//! A TAP queue's read is a syscall even when the queue is empty
//! (`EAGAIN`), so a worker that read every TAP queue each loop paid one
//! syscall per pod per loop: with 110 idle pods, 110 reads per loop, and
//! ~1,000 such loops after every frame before the worker sleeps (a pod's
//! IPv6 router solicitation was enough). Here a port that offers a
//! descriptor ([`Port::rx_ready_fd`]) is registered once, edge-triggered,
//! in the worker's epoll set, and is *parked* (not read) from the moment a
//! burst found its queue empty ([`Port::rx_drained`]) until the set says a
//! frame arrived. The loop then costs one `epoll_wait(0)` for all parked
//! ports, and an idle worker blocks on the epoll descriptor alone.
//!
//! No frame is missed: the registration is permanent and every frame
//! queued after the read that found the queue empty is a wake-up, so the
//! port is on the ready list when the worker next asks (epoll checks the
//! queue again before it reports: a port read empty meanwhile is not).
//! A port whose descriptor epoll refuses is simply never parked.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::frame::{Port, PortId};

/// Events taken per `epoll_wait`: more ready ports wait for the next loop.
const EVENTS: usize = 64;

/// The parked ports of one worker and the epoll set that wakes them.
pub struct Parking {
    /// Made with the first port that has a descriptor.
    epoll: Option<Epoll>,
    /// Per slot: registered in the set.
    registered: Vec<bool>,
    /// Per slot: not read until the set reports it.
    parked: Vec<bool>,
    count: usize,
    events: Vec<EpollEvent>,
    /// Ports unparked by the set since the start (each a wake-up).
    unparked: u64,
}

impl Default for Parking {
    fn default() -> Self {
        Parking {
            epoll: None,
            registered: Vec::new(),
            parked: Vec::new(),
            count: 0,
            events: vec![EpollEvent::empty(); EVENTS],
            unparked: 0,
        }
    }
}

impl Parking {
    /// Registers slot `id`'s new `port` if it has a descriptor, parked
    /// (frames already queued make it ready at once). A slot's previous
    /// port must have been [`Parking::forget`]-ten.
    pub fn attach(&mut self, id: PortId, port: &dyn Port) {
        let i = id as usize;
        if self.registered.len() <= i {
            self.registered.resize(i + 1, false);
            self.parked.resize(i + 1, false);
        }
        let Some(fd) = port.rx_ready_fd() else {
            return;
        };
        if self.epoll.is_none() {
            match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
                Ok(e) => self.epoll = Some(e),
                Err(error) => {
                    tracing::warn!(%error, "no epoll set: ports are read every loop");
                    return;
                }
            }
        }
        let Some(epoll) = &self.epoll else { return };
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLET;
        match epoll.add(fd, EpollEvent::new(flags, u64::from(id))) {
            Ok(()) => {
                self.registered[i] = true;
                self.park(id);
            }
            Err(error) => {
                tracing::warn!(port = port.name(), %error, "not parkable: read every loop");
            }
        }
    }

    /// Takes slot `id`'s `port` out of the set, before it is released.
    pub fn forget(&mut self, id: PortId, port: &dyn Port) {
        let i = id as usize;
        if !self.registered.get(i).copied().unwrap_or(false) {
            return;
        }
        if let (Some(epoll), Some(fd)) = (&self.epoll, port.rx_ready_fd()) {
            let _ = epoll.delete(fd);
        }
        self.registered[i] = false;
        self.unpark(i);
    }

    /// Whether slot `id` is parked (not to be read).
    #[inline]
    pub fn is_parked(&self, id: usize) -> bool {
        self.parked.get(id).copied().unwrap_or(false)
    }

    /// Parks slot `id` if it is registered: its burst found it empty.
    #[inline]
    pub fn park(&mut self, id: PortId) {
        let i = id as usize;
        if self.registered.get(i).copied().unwrap_or(false) && !self.parked[i] {
            self.parked[i] = true;
            self.count += 1;
        }
    }

    fn unpark(&mut self, i: usize) {
        if self.parked.get(i).copied().unwrap_or(false) {
            self.parked[i] = false;
            self.count -= 1;
        }
    }

    /// How many ports are parked.
    pub fn parked_count(&self) -> usize {
        self.count
    }

    /// Ports the set has unparked since the worker started.
    pub fn unparked_total(&self) -> u64 {
        self.unparked
    }

    /// Unparks the ports whose frames arrived (one `epoll_wait` that does
    /// not block; nothing when no port is parked); returns how many.
    pub fn take_ready(&mut self) -> usize {
        if self.count == 0 {
            return 0;
        }
        let Some(epoll) = &self.epoll else { return 0 };
        let n = epoll.wait(&mut self.events, 0u8).unwrap_or(0);
        let mut woken = 0;
        for k in 0..n {
            let i = self.events[k].data() as usize;
            if self.is_parked(i) {
                self.unpark(i);
                woken += 1;
            }
        }
        self.unparked += woken as u64;
        woken
    }

    /// The set's descriptor (readable when a parked port has frames), for
    /// a worker that blocks; `None` when nothing is parked.
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        (self.count > 0)
            .then_some(self.epoll.as_ref())
            .flatten()
            .map(|e| e.0.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::net::Ipv4Addr;
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::endpoint::Endpoint;
    use crate::frame::{FrameArena, FrameDesc, PortPoll, RX_HEADROOM};
    use crate::pipeline::PipelineConfig;
    use crate::worker::Worker;

    /// A port whose every receive is a syscall, like a TAP queue: one
    /// end of a datagram socket pair, its reads counted.
    struct SockPort {
        sock: UnixDatagram,
        reads: Arc<AtomicU64>,
        drained: bool,
    }

    impl Port for SockPort {
        fn name(&self) -> &str {
            "sock"
        }
        fn mac(&self) -> [u8; 6] {
            [2, 0, 0, 0, 0, 1]
        }
        fn mtu(&self) -> u32 {
            1500
        }
        fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
            self.drained = false;
            let mut n = 0;
            while n < descs.len() {
                let Some(chunk) = arena.alloc() else { break };
                self.reads.fetch_add(1, Ordering::Relaxed);
                let buf = &mut arena.chunk_mut(chunk)[RX_HEADROOM as usize..];
                match self.sock.recv(buf) {
                    Ok(len) => {
                        descs[n] = FrameDesc {
                            addr: chunk + u64::from(RX_HEADROOM),
                            len: len as u32,
                        };
                        n += 1;
                    }
                    Err(e) => {
                        arena.free(chunk);
                        self.drained = e.kind() == ErrorKind::WouldBlock;
                        break;
                    }
                }
            }
            n
        }
        fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
            for d in descs {
                arena.free(d.addr);
            }
            descs.len()
        }
        fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
            PortPoll::default()
        }
        fn rx_ready_fd(&self) -> Option<BorrowedFd<'_>> {
            Some(self.sock.as_fd())
        }
        fn rx_drained(&self) -> bool {
            self.drained
        }
    }

    /// A worker with `n` such ports; the pods' ends and read counters.
    fn worker(n: usize) -> (Worker, Vec<UnixDatagram>, Vec<Arc<AtomicU64>>) {
        let (_fib, reader) = crate::fib::Fib::new();
        let mut w = Worker::new(
            FrameArena::new_heap(256, 2048),
            PipelineConfig::new(Ipv4Addr::new(10, 0, 0, 1), 24),
            reader,
        );
        let (mut pods, mut reads) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (ours, pod) = UnixDatagram::pair().unwrap();
            ours.set_nonblocking(true).unwrap();
            let r = Arc::new(AtomicU64::new(0));
            let port = SockPort {
                sock: ours,
                reads: r.clone(),
                drained: false,
            };
            let addr = Ipv4Addr::new(10, 65, 0, 2 + i as u8);
            w.add_port(Box::new(port), Endpoint::pod(vec![addr.into()], None, 1500));
            pods.push(pod);
            reads.push(r);
        }
        (w, pods, reads)
    }

    fn reads(r: &[Arc<AtomicU64>]) -> Vec<u64> {
        r.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn idle_ports_are_not_read_and_a_frame_wakes_only_its_port() {
        let (mut w, pods, r) = worker(16);
        assert_eq!(w.parking().parked_count(), 16, "parked from the start");
        for _ in 0..100 {
            assert_eq!(w.poll_once(Instant::now()), 0);
        }
        // Was: 100 reads of every port, one per loop.
        assert_eq!(reads(&r), vec![0; 16]);

        // Two frames for port 3: read (and the read that finds it empty),
        // then parked again; no other port read.
        pods[3].send(&[0u8; 60]).unwrap();
        pods[3].send(&[0u8; 60]).unwrap();
        // The set's descriptor, which an idle worker blocks on, is
        // readable.
        let fd = w.parking().wait_fd().expect("parked ports");
        let mut pfd = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        assert_eq!(nix::poll::poll(&mut pfd, 0u8).unwrap(), 1);
        assert_eq!(w.poll_once(Instant::now()), 2);
        for _ in 0..100 {
            w.poll_once(Instant::now());
        }
        let mut want = vec![0; 16];
        want[3] = 3;
        assert_eq!(reads(&r), want);
        assert_eq!(w.parking().parked_count(), 16);
        assert_eq!(w.parking().unparked_total(), 1);

        // A frame for every port: each read once more than its frames.
        for p in &pods {
            p.send(&[0u8; 60]).unwrap();
        }
        assert_eq!(w.poll_once(Instant::now()), 16);
        for _ in 0..10 {
            w.poll_once(Instant::now());
        }
        want = vec![2; 16];
        want[3] = 5;
        assert_eq!(reads(&r), want);
    }

    #[test]
    fn a_replaced_port_is_parked_on_its_own_descriptor() {
        let (mut w, pods, r) = worker(2);
        let (ours, pod) = UnixDatagram::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let fresh = Arc::new(AtomicU64::new(0));
        let port = SockPort {
            sock: ours,
            reads: fresh.clone(),
            drained: false,
        };
        let addr = Ipv4Addr::new(10, 65, 0, 9);
        assert!(w.set_port(
            1,
            Box::new(port),
            Endpoint::pod(vec![addr.into()], None, 1500)
        ));
        assert_eq!(w.parking().parked_count(), 2);
        // The old port's end is gone; the new one's frame is read.
        assert!(pods[1].send(&[0u8; 60]).is_err());
        pod.send(&[0u8; 60]).unwrap();
        assert_eq!(w.poll_once(Instant::now()), 1);
        assert_eq!(fresh.load(Ordering::Relaxed), 2);
        assert_eq!(reads(&r), vec![0, 0]);
        drop(pods);
        // Detached: out of the set.
        assert!(w.detach_port(1));
        assert_eq!(w.parking().parked_count(), 1);
    }
}
