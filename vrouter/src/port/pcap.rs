//! Pcap-writer middleware: wraps any [`Port`] and records every frame it
//! receives and is offered for transmission to a classic pcap stream (Ethernet link type), as
//! smoltcp's `PcapWriter` does. Timestamps come from the `now` passed to
//! [`Port::poll`], relative to the first poll, so recordings are
//! deterministic in tests.
//!
//! A write error stops recording (and is kept for [`PcapPort::error`]); it
//! never disturbs forwarding.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll};

/// Bytes of each frame recorded (the pcap snap length).
pub const SNAPLEN: u32 = 65535;

/// A port whose traffic is also written to a pcap stream.
pub struct PcapPort<P, W> {
    inner: P,
    out: W,
    start: Option<Instant>,
    elapsed: Duration,
    error: Option<io::Error>,
}

impl<P: Port, W: Write + Send> PcapPort<P, W> {
    /// Wraps `inner`, writing the pcap file header to `out` now.
    pub fn new(inner: P, mut out: W) -> Self {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        let error = out.write_all(&header).err();
        PcapPort {
            inner,
            out,
            start: None,
            elapsed: Duration::ZERO,
            error,
        }
    }

    /// The first write error, if any (recording stopped there).
    pub fn error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Unwraps into the port and the stream.
    pub fn into_parts(self) -> (P, W) {
        (self.inner, self.out)
    }

    fn record(&mut self, frame: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let caplen = frame.len().min(SNAPLEN as usize);
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&(self.elapsed.as_secs() as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&self.elapsed.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&(caplen as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        let r = self
            .out
            .write_all(&rec)
            .and_then(|()| self.out.write_all(&frame[..caplen]));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }
}

impl<P: Port, W: Write + Send> Port for PcapPort<P, W> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }

    fn mtu(&self) -> u32 {
        self.inner.mtu()
    }

    fn rx_burst(&mut self, arena: &mut FrameArena, descs: &mut [FrameDesc]) -> usize {
        let n = self.inner.rx_burst(arena, descs);
        for d in &descs[..n] {
            self.record(arena.data(*d));
        }
        n
    }

    fn tx_burst(&mut self, arena: &mut FrameArena, descs: &[FrameDesc]) -> usize {
        // Recorded before handing over: once the port owns a frame (and, for
        // the in-memory port, frees it) its chunk may be reused. So the
        // capture shows every frame offered, including any a full ring then
        // refuses (the worker counts those as `tx_ring_full`).
        let n = descs.len();
        for d in descs {
            self.record(arena.data(*d));
        }
        let taken = self.inner.tx_burst(arena, descs);
        debug_assert!(taken <= n);
        taken
    }

    fn poll(&mut self, arena: &mut FrameArena, now: Instant) -> PortPoll {
        let start = *self.start.get_or_insert(now);
        self.elapsed = now.saturating_duration_since(start);
        if self.error.is_none() {
            self.error = self.out.flush().err();
        }
        self.inner.poll(arena, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::MemoryPort;

    #[test]
    fn records_received_and_transmitted_frames_in_pcap_format() {
        let mut arena = FrameArena::new_heap(2, 2048);
        let (port, h) = MemoryPort::new("p0", [2; 6], 1500);
        let mut p = PcapPort::new(port, Vec::new());
        h.inject(&[0xaa; 20]);
        let mut descs = [FrameDesc::default(); 2];
        p.poll(&mut arena, Instant::now());
        assert_eq!(p.rx_burst(&mut arena, &mut descs), 1);
        assert_eq!(p.tx_burst(&mut arena, &descs[..1]), 1);
        let (_, out) = p.into_parts();
        assert_eq!(out.len(), 24 + 2 * (16 + 20));
        assert_eq!(&out[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&out[20..24], &[1, 0, 0, 0]);
        assert_eq!(&out[24 + 8..24 + 12], &[20, 0, 0, 0]);
        assert_eq!(&out[24 + 16..24 + 36], &[0xaa; 20]);
    }
}
