//! An AF_XDP socket bound to one (interface, queue) on a [`Umem`], with its
//! own fill, completion, RX and TX rings.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::Desc;
use crate::error::{Context, Error, Result};
use crate::ring::{ConsumerRing, ProducerRing, ring_map_len};
use crate::sys::{self, Mmap, SockaddrXdp, XdpMmapOffsets, XdpStatistics, XdpUmemReg};
use crate::umem::{Umem, UmemHandle};

/// How the socket moves frames between the driver and the UMEM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindMode {
    /// Zero-copy where the driver supports it, copy mode otherwise.
    #[default]
    Auto,
    /// Copy mode (works on every driver, veth included).
    Copy,
    /// Zero-copy only; fails where the driver lacks it (veth does).
    ZeroCopy,
}

/// Preferred busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL,
/// SO_BUSY_POLL_BUDGET): the kernel's receive work for the queue runs in the
/// application's poll calls instead of waiting for a softirq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyPoll {
    /// Microseconds the kernel busy-polls per call.
    pub usecs: u32,
    /// Frames per busy-poll round.
    pub budget: u32,
}

/// Per-socket options, validated by [`XskConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// RX ring entries (power of two).
    pub rx_size: u32,
    /// TX ring entries (power of two).
    pub tx_size: u32,
    /// Fill ring entries (power of two).
    pub fill_size: u32,
    /// Completion ring entries (power of two).
    pub comp_size: u32,
    /// Copy, zero-copy or auto. Sockets sharing a UMEM inherit the mode of
    /// the first one (the kernel refuses the flags on shared binds).
    pub mode: BindMode,
    /// XDP_USE_NEED_WAKEUP: the kernel tells when it needs a syscall to make
    /// progress, so an idle socket costs no CPU. Inherited like `mode`.
    pub need_wakeup: bool,
    /// Preferred busy polling, off by default.
    pub busy_poll: Option<BusyPoll>,
    /// XDP_MAX_TX_SKB_BUDGET (kernel 6.17+): frames one TX wake-up sends in
    /// copy mode (kernel default 32). Ignored, with a log line, where the
    /// kernel lacks the option.
    pub max_tx_skb_budget: Option<u32>,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            rx_size: 2048,
            tx_size: 2048,
            fill_size: 2048,
            comp_size: 2048,
            mode: BindMode::Auto,
            need_wakeup: true,
            busy_poll: None,
            max_tx_skb_budget: None,
        }
    }
}

impl XskConfig {
    /// Checks the values the kernel would refuse, before any syscall.
    pub fn validate(&self) -> Result<()> {
        for size in [self.rx_size, self.tx_size, self.fill_size, self.comp_size] {
            if !size.is_power_of_two() || size > 1 << 20 {
                return Err(Error::Config("ring sizes must be powers of two up to 2^20"));
            }
        }
        if let Some(bp) = self.busy_poll
            && (bp.budget == 0 || bp.budget > 65535 || bp.usecs == 0)
        {
            return Err(Error::Config(
                "busy poll needs usecs > 0 and a budget of 1..=65535",
            ));
        }
        if self.max_tx_skb_budget == Some(0) {
            return Err(Error::Config("max TX skb budget must be positive"));
        }
        Ok(())
    }
}

/// Counters of XDP_STATISTICS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Frames dropped for reasons other than a full RX ring or empty fill ring.
    pub rx_dropped: u64,
    /// RX descriptors the kernel found invalid.
    pub rx_invalid_descs: u64,
    /// TX descriptors the kernel refused (outside the UMEM, too long).
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty.
    pub fill_ring_empty: u64,
    /// Times the kernel found the TX ring empty on a wake-up.
    pub tx_ring_empty: u64,
}

/// An AF_XDP socket. Dropping it unbinds it; the UMEM stays.
pub struct XskSocket {
    fd: Arc<OwnedFd>,
    rx: ConsumerRing,
    tx: ProducerRing,
    fill: ProducerRing,
    comp: ConsumerRing,
    ifindex: u32,
    queue: u32,
    zero_copy: bool,
    need_wakeup: bool,
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("fd", &self.fd.as_raw_fd())
            .field("ifindex", &self.ifindex)
            .field("queue", &self.queue)
            .field("zero_copy", &self.zero_copy)
            .finish_non_exhaustive()
    }
}

impl XskSocket {
    /// Opens a socket on `umem` bound to queue `queue` of `ifindex`.
    ///
    /// The first socket on a UMEM registers it (XDP_UMEM_REG), which is
    /// where RLIMIT_MEMLOCK applies; later sockets, on other interfaces or
    /// queues, bind with XDP_SHARED_UMEM and receive into and transmit from
    /// the same frames. Every socket has its own fill and completion ring.
    pub fn bind(umem: &Umem, ifindex: u32, queue: u32, config: &XskConfig) -> Result<XskSocket> {
        Self::bind_handle(umem.handle_ref(), ifindex, queue, config)
    }

    /// [`XskSocket::bind`] through a [`UmemHandle`], from a thread that does
    /// not own the [`Umem`] (a control thread adding a pod port).
    pub fn bind_handle(
        umem: &UmemHandle,
        ifindex: u32,
        queue: u32,
        config: &XskConfig,
    ) -> Result<XskSocket> {
        config.validate()?;
        let mut reg = umem.registration.lock().unwrap_or_else(|e| e.into_inner());
        if reg.is_taken(ifindex, queue) {
            return Err(Error::QueueTaken { ifindex, queue });
        }
        let socket = match reg.live_owner() {
            Some(owner) => Self::open(umem, ifindex, queue, config, Shared::With(owner.as_fd()))?,
            None => match config.mode {
                BindMode::Copy => Self::open(
                    umem,
                    ifindex,
                    queue,
                    config,
                    Shared::First { zero_copy: false },
                )?,
                BindMode::ZeroCopy => Self::open(
                    umem,
                    ifindex,
                    queue,
                    config,
                    Shared::First { zero_copy: true },
                )
                .map_err(|e| match e {
                    Error::Sys {
                        what: "bind AF_XDP",
                        source,
                    } => Error::ZeroCopyUnsupported { ifindex, source },
                    e => e,
                })?,
                BindMode::Auto => {
                    match Self::open(
                        umem,
                        ifindex,
                        queue,
                        config,
                        Shared::First { zero_copy: true },
                    ) {
                        Ok(s) => s,
                        Err(Error::Sys {
                            what: "bind AF_XDP",
                            source,
                        }) => {
                            tracing::info!(ifindex, queue, error = %source, "zero-copy AF_XDP refused, using copy mode");
                            Self::open(
                                umem,
                                ifindex,
                                queue,
                                config,
                                Shared::First { zero_copy: false },
                            )?
                        }
                        Err(e) => return Err(e),
                    }
                }
            },
        };
        reg.sockets
            .push((ifindex, queue, Arc::downgrade(&socket.fd)));
        Ok(socket)
    }

    fn open(
        umem: &UmemHandle,
        ifindex: u32,
        queue: u32,
        config: &XskConfig,
        shared: Shared<'_>,
    ) -> Result<XskSocket> {
        let fd = sys::socket(sys::AF_XDP, libc::SOCK_RAW, 0).ctx("socket(AF_XDP)")?;
        let bfd = fd.as_fd();
        if let Shared::First { .. } = shared {
            let reg = XdpUmemReg {
                addr: umem.mem.addr(),
                len: umem.config.len(),
                chunk_size: umem.config.frame_size,
                headroom: umem.config.headroom,
                ..Default::default()
            };
            sys::setsockopt(bfd, sys::SOL_XDP, sys::XDP_UMEM_REG, &reg).map_err(|source| {
                memlock_error(source, "register UMEM (XDP_UMEM_REG)", umem.config.len())
            })?;
        }
        let ring_opt =
            |name, size: u32, what| sys::setsockopt(bfd, sys::SOL_XDP, name, &size).ctx(what);
        ring_opt(
            sys::XDP_UMEM_FILL_RING,
            config.fill_size,
            "set fill ring size",
        )?;
        ring_opt(
            sys::XDP_UMEM_COMPLETION_RING,
            config.comp_size,
            "set completion ring size",
        )?;
        ring_opt(sys::XDP_RX_RING, config.rx_size, "set RX ring size")?;
        ring_opt(sys::XDP_TX_RING, config.tx_size, "set TX ring size")?;
        let off: XdpMmapOffsets = sys::getsockopt(bfd, sys::SOL_XDP, sys::XDP_MMAP_OFFSETS)
            .ctx("get XDP_MMAP_OFFSETS")?;
        let map = |o, size, entry, pgoff, what| {
            Mmap::socket_ring(bfd, ring_map_len(o, size, entry), pgoff)
                .map_err(|source| memlock_error(source, what, ring_map_len(o, size, entry) as u64))
        };
        let rx = ConsumerRing::new(
            map(
                &off.rx,
                config.rx_size,
                16,
                sys::XDP_PGOFF_RX_RING,
                "mmap RX ring",
            )?,
            &off.rx,
            config.rx_size,
        );
        let tx = ProducerRing::new(
            map(
                &off.tx,
                config.tx_size,
                16,
                sys::XDP_PGOFF_TX_RING,
                "mmap TX ring",
            )?,
            &off.tx,
            config.tx_size,
        );
        let fill = ProducerRing::new(
            map(
                &off.fr,
                config.fill_size,
                8,
                sys::XDP_UMEM_PGOFF_FILL_RING,
                "mmap fill ring",
            )?,
            &off.fr,
            config.fill_size,
        );
        let comp = ConsumerRing::new(
            map(
                &off.cr,
                config.comp_size,
                8,
                sys::XDP_UMEM_PGOFF_COMPLETION_RING,
                "mmap completion ring",
            )?,
            &off.cr,
            config.comp_size,
        );
        if let Some(bp) = config.busy_poll {
            let one: i32 = 1;
            sys::setsockopt(bfd, libc::SOL_SOCKET, sys::SO_PREFER_BUSY_POLL, &one)
                .ctx("set SO_PREFER_BUSY_POLL")?;
            sys::setsockopt(bfd, libc::SOL_SOCKET, sys::SO_BUSY_POLL, &(bp.usecs as i32))
                .ctx("set SO_BUSY_POLL")?;
            sys::setsockopt(
                bfd,
                libc::SOL_SOCKET,
                sys::SO_BUSY_POLL_BUDGET,
                &(bp.budget as i32),
            )
            .ctx("set SO_BUSY_POLL_BUDGET")?;
        }
        if let Some(budget) = config.max_tx_skb_budget {
            match sys::setsockopt(bfd, sys::SOL_XDP, sys::XDP_MAX_TX_SKB_BUDGET, &budget) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
                    tracing::info!(
                        "kernel lacks XDP_MAX_TX_SKB_BUDGET (6.17+), keeping its default"
                    );
                }
                Err(source) => {
                    return Err(Error::Sys {
                        what: "set XDP_MAX_TX_SKB_BUDGET",
                        source,
                    });
                }
            }
        }
        let (flags, shared_fd, zero_copy, need_wakeup) = match shared {
            Shared::First { zero_copy } => {
                let mut flags = if zero_copy {
                    sys::XDP_ZEROCOPY
                } else {
                    sys::XDP_COPY
                };
                if config.need_wakeup {
                    flags |= sys::XDP_USE_NEED_WAKEUP;
                }
                (flags, 0, zero_copy, config.need_wakeup)
            }
            // The kernel refuses any other flag with XDP_SHARED_UMEM: the mode
            // and need_wakeup come from the socket that registered the UMEM.
            Shared::With(owner) => (
                sys::XDP_SHARED_UMEM,
                owner.as_raw_fd() as u32,
                false,
                config.need_wakeup,
            ),
        };
        let addr = SockaddrXdp {
            family: sys::AF_XDP as u16,
            flags,
            ifindex,
            queue_id: queue,
            shared_umem_fd: shared_fd,
        };
        sys::bind_xdp(bfd, &addr).ctx("bind AF_XDP")?;
        Ok(XskSocket {
            fd: Arc::new(fd),
            rx,
            tx,
            fill,
            comp,
            ifindex,
            queue,
            zero_copy,
            need_wakeup,
        })
    }

    /// The descriptor, for poll(2) and for the XSKMAP.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Interface index it is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Queue it is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Whether it runs zero-copy (known only for the socket that registered
    /// the UMEM; shared sockets report `false`).
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Moves up to `out.len()` received frames into `out`; returns how many.
    /// Their addresses point past the headroom; the chunk is the caller's
    /// until it transmits it or gives it back with [`XskSocket::fill`].
    pub fn rx_burst(&mut self, out: &mut [Desc]) -> usize {
        self.rx.consume_descs(out)
    }

    /// Puts frames on the TX ring; returns how many, from the front, fit.
    /// Call [`XskSocket::kick_tx`] once per batch after it.
    pub fn tx_burst(&mut self, descs: &[Desc]) -> usize {
        self.tx.produce_descs(descs)
    }

    /// Gives chunks to the kernel to receive into; returns how many fit.
    pub fn fill(&mut self, addrs: &[u64]) -> usize {
        self.fill.produce_addrs(addrs)
    }

    /// Takes back frames whose transmission completed (the addresses given
    /// to [`XskSocket::tx_burst`], not masked to the chunk); returns how many.
    pub fn reap_completions(&mut self, out: &mut [u64]) -> usize {
        self.comp.consume_addrs(out)
    }

    /// Frames on the fill ring that the kernel has not taken yet (to
    /// receive into); refreshes the kernel's consumer index.
    pub fn fill_pending(&mut self) -> u32 {
        self.fill.outstanding()
    }

    /// Frames on the TX ring that the kernel has not taken yet.
    pub fn tx_pending(&mut self) -> u32 {
        self.tx.outstanding()
    }

    /// Wakes the kernel's transmit path if the TX ring holds frames it has
    /// not taken and it may need a wake-up: always in copy mode (copy-mode
    /// TX only progresses inside sendto), when the ring's need_wakeup flag is
    /// set otherwise. Call once per batch, not per frame. Returns whether a
    /// sendto was made; a busy or full kernel queue is not an error.
    pub fn kick_tx(&mut self) -> Result<bool> {
        if self.tx.outstanding() == 0 {
            return Ok(false);
        }
        if self.zero_copy && self.need_wakeup && !self.tx.needs_wakeup() {
            return Ok(false);
        }
        match sys::send_kick(self.fd.as_fd()) {
            Ok(()) => Ok(true),
            Err(e) if is_transient(&e) => Ok(true),
            Err(source) => Err(Error::Sys {
                what: "sendto (TX kick)",
                source,
            }),
        }
    }

    /// Whether the kernel asks for a syscall before it takes more from the
    /// fill ring (need_wakeup mode). Then call [`XskSocket::wake_rx`] or
    /// [`XskSocket::poll_rx`].
    pub fn fill_needs_wakeup(&self) -> bool {
        self.need_wakeup && self.fill.needs_wakeup()
    }

    /// A non-blocking recvfrom that lets the kernel process the fill ring.
    pub fn wake_rx(&self) -> Result<()> {
        match sys::recv_kick(self.fd.as_fd()) {
            Ok(()) => Ok(()),
            Err(e) if is_transient(&e) => Ok(()),
            Err(source) => Err(Error::Sys {
                what: "recvfrom (RX wake-up)",
                source,
            }),
        }
    }

    /// Waits up to `timeout_ms` for received frames; returns whether any are
    /// ready. With preferred busy polling this is also where the kernel runs
    /// the queue's receive work.
    pub fn poll_rx(&self, timeout_ms: i32) -> Result<bool> {
        sys::poll_one(self.fd.as_fd(), libc::POLLIN, timeout_ms).ctx("poll AF_XDP")
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> Result<XdpStats> {
        let s: XdpStatistics = sys::getsockopt(self.fd.as_fd(), sys::SOL_XDP, sys::XDP_STATISTICS)
            .ctx("get XDP_STATISTICS")?;
        Ok(XdpStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            fill_ring_empty: s.rx_fill_ring_empty_descs,
            tx_ring_empty: s.tx_ring_empty_descs,
        })
    }
}

enum Shared<'a> {
    First { zero_copy: bool },
    With(BorrowedFd<'a>),
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN | libc::EINTR)
    )
}

fn memlock_error(source: io::Error, what: &'static str, bytes: u64) -> Error {
    if matches!(
        source.raw_os_error(),
        Some(libc::ENOBUFS | libc::ENOMEM | libc::EPERM)
    ) {
        let (soft, hard) = sys::memlock_limit();
        Error::Memlock {
            what,
            bytes,
            soft,
            hard,
            source,
        }
    } else {
        Error::Sys { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        XskConfig::default().validate().unwrap();
    }

    #[test]
    fn ring_sizes_must_be_powers_of_two() {
        let c = XskConfig {
            rx_size: 1000,
            ..XskConfig::default()
        };
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        let c = XskConfig {
            comp_size: 0,
            ..XskConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn busy_poll_and_tx_budget_are_range_checked() {
        let c = XskConfig {
            busy_poll: Some(BusyPoll {
                usecs: 20,
                budget: 0,
            }),
            ..XskConfig::default()
        };
        assert!(c.validate().is_err());
        let c = XskConfig {
            max_tx_skb_budget: Some(0),
            ..XskConfig::default()
        };
        assert!(c.validate().is_err());
        let c = XskConfig {
            busy_poll: Some(BusyPoll {
                usecs: 20,
                budget: 64,
            }),
            max_tx_skb_budget: Some(256),
            ..XskConfig::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn memlock_errors_name_the_limit_and_keep_the_errno() {
        let e = memlock_error(
            io::Error::from_raw_os_error(libc::ENOBUFS),
            "register UMEM",
            32 << 20,
        );
        let text = e.to_string();
        assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
        assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS));
        let other = memlock_error(io::Error::from_raw_os_error(libc::EOPNOTSUPP), "bind", 0);
        assert!(!other.to_string().contains("RLIMIT_MEMLOCK"));
        assert!(other.to_string().contains("not supported"), "{other}");
    }
}
