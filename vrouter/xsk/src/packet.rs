//! The AF_PACKET fallback: a PACKET_MMAP socket (TPACKET_V2 RX and TX rings)
//! on one interface, with the batch shape of [`crate::XskSocket`].
//!
//! Unlike AF_XDP, the rings are the kernel's own memory, not the caller's
//! UMEM: [`PacketSocket::rx_burst`] copies each frame into a caller chunk and
//! [`PacketSocket::tx_burst`] copies it out, one copy per frame each way.
//! And AF_PACKET taps rather than steals: the kernel stack still sees every
//! received frame. TPACKET_V2 rather than V3: one frame per slot makes the
//! ownership hand-over per frame, simple to get right; V3's block batching
//! matters at rates this fallback is not for.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::Desc;
use crate::error::{Context, Error, Result};
use crate::sys::{self, Mmap, TpacketReq, TpacketStats};

const TP_STATUS_USER: u32 = 1;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 4;
/// `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`: where TX data starts.
const TX_DATA_OFFSET: usize = 32;
const BLOCK_SIZE: u32 = 4096;

/// Ring sizes and the layout of the caller's frame memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketConfig {
    /// Bytes per ring slot (a power of two from 2048 to 4096, holds the
    /// TPACKET_V2 header and one frame).
    pub ring_frame_size: u32,
    /// RX ring slots (a multiple of the slots per 4 KiB block).
    pub rx_frames: u32,
    /// TX ring slots.
    pub tx_frames: u32,
    /// Chunk size of the caller's memory that `rx_burst` copies into.
    pub chunk_size: u32,
    /// Bytes left free at the start of each chunk, as AF_XDP does.
    pub headroom: u32,
}

impl Default for PacketConfig {
    fn default() -> Self {
        PacketConfig {
            ring_frame_size: 2048,
            rx_frames: 1024,
            tx_frames: 1024,
            chunk_size: 2048,
            headroom: crate::XDP_PACKET_HEADROOM,
        }
    }
}

impl PacketConfig {
    /// Checks the values before any syscall.
    pub fn validate(&self) -> Result<()> {
        if !self.ring_frame_size.is_power_of_two()
            || !(2048..=BLOCK_SIZE).contains(&self.ring_frame_size)
        {
            return Err(Error::Config(
                "ring frame size must be a power of two from 2048 to 4096",
            ));
        }
        let per_block = BLOCK_SIZE / self.ring_frame_size;
        for n in [self.rx_frames, self.tx_frames] {
            if n == 0 || !n.is_multiple_of(per_block) || n > 1 << 16 {
                return Err(Error::Config(
                    "ring slots must be a positive multiple of the slots per 4 KiB block",
                ));
            }
        }
        if self.headroom >= self.chunk_size {
            return Err(Error::Config("headroom must be smaller than the chunk"));
        }
        Ok(())
    }
}

/// Counters of the fallback socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketStats {
    /// Frames the kernel put on the RX ring (PACKET_STATISTICS).
    pub rx_packets: u64,
    /// Frames the kernel dropped because the RX ring was full.
    pub rx_dropped: u64,
    /// Frames longer than a caller chunk, dropped by `rx_burst`.
    pub rx_too_long: u64,
    /// Frames the kernel refused to send (TP_STATUS_WRONG_FORMAT).
    pub tx_wrong_format: u64,
}

/// A PACKET_MMAP socket bound to one interface.
pub struct PacketSocket {
    fd: OwnedFd,
    map: Mmap,
    config: PacketConfig,
    rx_head: u32,
    tx_head: u32,
    tx_queued: bool,
    stats: PacketStats,
}

impl std::fmt::Debug for PacketSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketSocket")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PacketSocket {
    /// Opens the socket, maps its rings and binds it to `ifindex`.
    pub fn bind(ifindex: u32, config: &PacketConfig) -> Result<PacketSocket> {
        config.validate()?;
        let fd = sys::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            i32::from(sys::ETH_P_ALL.to_be()),
        )
        .ctx("socket(AF_PACKET)")?;
        let bfd = fd.as_fd();
        sys::setsockopt(bfd, sys::SOL_PACKET, sys::PACKET_VERSION, &sys::TPACKET_V2)
            .ctx("set TPACKET_V2")?;
        // Our own transmissions would otherwise come back on the RX ring.
        sys::setsockopt(bfd, sys::SOL_PACKET, sys::PACKET_IGNORE_OUTGOING, &1i32)
            .ctx("set PACKET_IGNORE_OUTGOING")?;
        let req = |frames: u32| TpacketReq {
            block_size: BLOCK_SIZE,
            block_nr: frames * config.ring_frame_size / BLOCK_SIZE,
            frame_size: config.ring_frame_size,
            frame_nr: frames,
        };
        sys::setsockopt(
            bfd,
            sys::SOL_PACKET,
            sys::PACKET_RX_RING,
            &req(config.rx_frames),
        )
        .ctx("set PACKET_RX_RING")?;
        sys::setsockopt(
            bfd,
            sys::SOL_PACKET,
            sys::PACKET_TX_RING,
            &req(config.tx_frames),
        )
        .ctx("set PACKET_TX_RING")?;
        let len = (config.rx_frames + config.tx_frames) as usize * config.ring_frame_size as usize;
        let map = Mmap::socket_ring(bfd, len, 0).ctx("mmap PACKET_MMAP rings")?;
        sys::bind_packet(bfd, ifindex).ctx("bind AF_PACKET")?;
        Ok(PacketSocket {
            fd,
            map,
            config: *config,
            rx_head: 0,
            tx_head: 0,
            tx_queued: false,
            stats: PacketStats::default(),
        })
    }

    /// The descriptor, for poll(2).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn rx_slot(&self, i: u32) -> usize {
        i as usize * self.config.ring_frame_size as usize
    }

    fn tx_slot(&self, i: u32) -> usize {
        (self.config.rx_frames + i) as usize * self.config.ring_frame_size as usize
    }

    /// Copies up to `min(chunks.len(), out.len())` received frames into the
    /// chunks at `chunks` of `mem` (after the headroom); `out[i]` describes
    /// the frame in `chunks[i]`. Returns how many chunks were used.
    pub fn rx_burst(&mut self, mem: &mut [u8], chunks: &[u64], out: &mut [Desc]) -> usize {
        let room = (self.config.chunk_size - self.config.headroom) as usize;
        let mut used = 0;
        while used < chunks.len().min(out.len()) {
            let slot = self.rx_slot(self.rx_head);
            let status = self.map.atomic_u32(slot);
            // Acquire: the frame's bytes are read after the kernel's status
            // store that published them.
            if status.load(Ordering::Acquire) & TP_STATUS_USER == 0 {
                break;
            }
            let snaplen = self.map.read_u32(slot + 8) as usize;
            let mac = usize::from(self.map.read_u16(slot + 12));
            let start = chunks[used] as usize + self.config.headroom as usize;
            let dst = start
                .checked_add(snaplen)
                .filter(|_| {
                    snaplen <= room && mac + snaplen <= self.config.ring_frame_size as usize
                })
                .and_then(|end| mem.get_mut(start..end));
            match dst {
                Some(dst) => {
                    self.map.read_bytes(slot + mac, dst);
                    out[used] = Desc {
                        addr: start as u64,
                        len: snaplen as u32,
                    };
                    used += 1;
                }
                None => self.stats.rx_too_long += 1,
            }
            // Release: our copy is done before the kernel may reuse the slot.
            status.store(0, Ordering::Release);
            self.rx_head = (self.rx_head + 1) % self.config.rx_frames;
        }
        used
    }

    /// Copies frames onto the TX ring; returns how many, from the front,
    /// fit. The caller's chunks are free again as soon as this returns.
    /// Call [`PacketSocket::kick_tx`] once per batch after it.
    pub fn tx_burst(&mut self, mem: &[u8], descs: &[Desc]) -> usize {
        let room = self.config.ring_frame_size as usize - TX_DATA_OFFSET;
        let mut sent = 0;
        for d in descs {
            let slot = self.tx_slot(self.tx_head);
            let status = self.map.atomic_u32(slot);
            match status.load(Ordering::Acquire) {
                TP_STATUS_AVAILABLE => {}
                TP_STATUS_WRONG_FORMAT => self.stats.tx_wrong_format += 1,
                _ => break,
            }
            let Some(src) = usize::try_from(d.addr)
                .ok()
                .and_then(|a| mem.get(a..a.checked_add(d.len as usize)?))
                .filter(|s| s.len() <= room)
            else {
                // Not a frame of `mem`, or too long for a slot: taken and
                // dropped, as the kernel does with an invalid AF_XDP descriptor.
                self.stats.tx_wrong_format += 1;
                sent += 1;
                continue;
            };
            self.map.write_bytes(slot + TX_DATA_OFFSET, src);
            self.map.write_u32(slot + 4, d.len);
            self.map.write_u32(slot + 8, d.len);
            // Release: the frame is written before the kernel sees the request.
            status.store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.tx_head = (self.tx_head + 1) % self.config.tx_frames;
            self.tx_queued = true;
            sent += 1;
        }
        sent
    }

    /// Asks the kernel to send what `tx_burst` queued; once per batch.
    pub fn kick_tx(&mut self) -> Result<bool> {
        if !self.tx_queued {
            return Ok(false);
        }
        match sys::send_kick(self.fd.as_fd()) {
            Ok(()) => {
                self.tx_queued = false;
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR)
                ) =>
            {
                Ok(true)
            }
            Err(source) => Err(Error::Sys {
                what: "send (PACKET_MMAP TX)",
                source,
            }),
        }
    }

    /// Waits up to `timeout_ms` for a received frame.
    pub fn poll_rx(&self, timeout_ms: i32) -> Result<bool> {
        sys::poll_one(self.fd.as_fd(), libc::POLLIN, timeout_ms).ctx("poll AF_PACKET")
    }

    /// Counters; the kernel's part accumulates across calls.
    pub fn stats(&mut self) -> Result<PacketStats> {
        let k: TpacketStats =
            sys::getsockopt(self.fd.as_fd(), sys::SOL_PACKET, sys::PACKET_STATISTICS)
                .ctx("get PACKET_STATISTICS")?;
        self.stats.rx_packets += u64::from(k.packets);
        self.stats.rx_dropped += u64::from(k.drops);
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        PacketConfig::default().validate().unwrap();
    }

    #[test]
    fn slots_must_fill_whole_blocks() {
        let c = PacketConfig {
            rx_frames: 3,
            ..PacketConfig::default()
        };
        assert!(c.validate().is_err());
        let c = PacketConfig {
            ring_frame_size: 4096,
            rx_frames: 3,
            tx_frames: 1,
            ..PacketConfig::default()
        };
        c.validate().unwrap();
        let c = PacketConfig {
            ring_frame_size: 1000,
            ..PacketConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
