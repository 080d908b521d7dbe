//! The AF_PACKET fallback port (PACKET_MMAP, TPACKET_V2 rings from
//! `brindle-xsk`).
//!
//! One copy per frame each way: received frames are copied from the
//! kernel's ring into arena chunks (after the same 256-byte headroom as
//! AF_XDP, so encapsulation still prepends in place), and transmitted frames
//! are copied from the arena onto the kernel's TX ring, which frees the
//! chunk at once. It works over any arena (heap or UMEM), so a worker whose
//! UMEM is fine but one of whose interfaces refuses AF_XDP mixes both kinds.
//!
//! AF_PACKET taps, it does not steal: the kernel also sees every received
//! frame. Pod-facing veths carry no address and the node does not forward
//! between them, so the kernel drops what the vrouter handles.

use std::time::Instant;

use brindle_xsk::{Desc, PacketConfig, PacketSocket, PacketStats};

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll};
use crate::pipeline::BURST;
use crate::port::xdp::LinkInfo;

/// A port on an AF_PACKET socket.
pub struct PacketPort {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    socket: PacketSocket,
    chunks: Vec<u64>,
    descs: Vec<Desc>,
    pending_kick: bool,
    /// Where chunks of other workers go back (shared UMEM).
    home: Option<crate::port::handoff::FrameHome>,
}

impl PacketPort {
    /// Opens an AF_PACKET socket on `ifname`.
    pub fn open(ifname: &str, link: LinkInfo) -> brindle_xsk::Result<PacketPort> {
        let ifindex = brindle_xsk::ifindex(ifname)?;
        let socket = PacketSocket::bind(ifindex, &PacketConfig::default())?;
        tracing::info!(port = ifname, "AF_PACKET port open (one copy per frame)");
        Ok(PacketPort {
            name: ifname.to_owned(),
            mac: link.mac,
            mtu: link.mtu,
            socket,
            chunks: vec![0; BURST],
            descs: vec![Desc::default(); BURST],
            pending_kick: false,
            home: None,
        })
    }

    /// Chunks of other workers (frames they handed over) go back to them
    /// through `home` once copied out.
    pub fn set_home(&mut self, home: crate::port::handoff::FrameHome) {
        self.home = Some(home);
    }

    /// The socket's counters.
    pub fn stats(&mut self) -> Option<PacketStats> {
        self.socket.stats().ok()
    }
}

impl Port for PacketPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        let want = descs.len().min(self.chunks.len());
        let mut have = 0;
        while have < want {
            match arena.alloc() {
                Some(a) => {
                    self.chunks[have] = a;
                    have += 1;
                }
                None => break,
            }
        }
        let n = self
            .socket
            .rx_burst(arena.bytes_mut(), &self.chunks[..have], &mut self.descs);
        for &a in &self.chunks[n..have] {
            arena.free(a);
        }
        for (out, d) in descs.iter_mut().zip(&self.descs[..n]) {
            *out = FrameDesc {
                addr: d.addr,
                len: d.len,
            };
        }
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        let mut taken = 0;
        for chunk in descs.chunks(self.descs.len()) {
            for (d, f) in self.descs.iter_mut().zip(chunk) {
                *d = Desc {
                    addr: f.addr,
                    len: f.len,
                };
            }
            let n = self
                .socket
                .tx_burst(arena.memory().bytes(), &self.descs[..chunk.len()]);
            taken += n;
            if n < chunk.len() {
                break;
            }
        }
        // The bytes are on the kernel's ring now: the chunks are free.
        for d in &descs[..taken] {
            match &self.home {
                Some(h) => h.free(arena, d.addr),
                None => arena.free(d.addr),
            }
        }
        self.pending_kick = !self.socket.kick_tx().unwrap_or(false) && taken > 0;
        taken
    }

    fn wait_fds<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        out.push(self.socket.fd());
    }

    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        if self.pending_kick {
            self.pending_kick = !self.socket.kick_tx().unwrap_or(false);
        }
        PortPoll::default()
    }
}
