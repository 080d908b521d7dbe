//! A traffic generator on the kernel's XDP frame path: BPF_PROG_TEST_RUN
//! with `BPF_F_TEST_XDP_LIVE_FRAMES` (kernel 5.18 and later), what
//! xdp-trafficgen does.
//!
//! The kernel copies the frame into pages of a page pool of its own, runs
//! a small XDP program on it `repeat` times, `batch_size` runs per
//! softirq-disabled batch, and transmits every frame the program redirects
//! through the same path as a driver's XDP redirect (`ndo_xdp_xmit`). No
//! skb, no socket, no copy from userspace per frame: about 7 Mpps on this
//! kind of machine against about 1 Mpps for AF_XDP copy-mode TX.
//!
//! The program ("stamp and redirect") writes into each frame, at fixed
//! offsets given by the caller:
//! - a sequence number (big-endian `u64`) from a one-entry array map it
//!   increments per run, so the sink sees every frame with its own number
//!   even though the kernel re-sends the same page pool pages;
//! - a CLOCK_MONOTONIC timestamp (big-endian `u64`, `bpf_ktime_get_ns`),
//!   taken when the program runs for that frame.
//!
//! The page keeps the program's writes between runs (the kernel only copies
//! the frame in when it first fills a page), which is harmless: every run
//! writes both fields again. Nothing updates checksums, so the caller's
//! frame must not cover the stamped bytes with one: for UDP over IPv4, a
//! UDP checksum of 0 ("none", RFC 768).
//!
//! The sequence counter is a plain (not per-CPU, not atomic) array entry:
//! one generator calls [`LiveFrameGenerator::send`] from one thread at a
//! time (the type is `Send` but its methods that run the program take
//! `&mut self`), and the kernel runs one call's batches on one CPU.

use std::os::fd::{AsFd, OwnedFd};

use crate::error::{Context, Error, Result};
use crate::steer::{
    self,
    asm::{Asm, Cond, R0, R1, R2, R6, R7, R8, R10, Size},
};
use crate::sys::{self, MapCreateAttr, MapFd, XdpMd};

const BPF_MAP_TYPE_ARRAY: u32 = 2;
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_KTIME_GET_NS: i32 = 5;
const HELPER_REDIRECT: i32 = 23;
const XDP_DROP: i32 = 1;
/// The kernel's limit on `batch_size` (`TEST_XDP_MAX_BATCH`).
pub const MAX_BATCH: u32 = 256;
/// The largest frame live mode takes here: a 4 KiB page less the XDP
/// headroom (256) and the tail's `skb_shared_info` (320 on x86-64).
pub const MAX_FRAME: usize = 4096 - 256 - 320;
/// Ethernet header: the smallest frame the kernel accepts.
const MIN_FRAME: usize = 14;

/// What to send and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveFrameConfig {
    /// Interface every frame leaves by (`bpf_redirect(ifindex, 0)`). For a
    /// veth, its peer must be able to take XDP frames: an XDP program
    /// attached there, or GRO (or threaded NAPI) on, else the kernel drops
    /// them.
    pub egress_ifindex: u32,
    /// `xdp_md.ingress_ifindex` of the context: the device the frames
    /// seem to arrive on. 0 means the egress device. It must exist in the
    /// caller's network namespace.
    pub ingress_ifindex: u32,
    /// `xdp_md.rx_queue_index`; below the ingress device's queue count.
    pub rx_queue: u32,
    /// Frames per batch (bpf_attr.test.batch_size), 1 to [`MAX_BATCH`]; 0
    /// lets the kernel choose (64).
    pub batch_size: u32,
    /// Where the big-endian sequence number goes, if anywhere.
    pub seq_offset: Option<u16>,
    /// Where the big-endian CLOCK_MONOTONIC nanoseconds go, if anywhere.
    pub timestamp_offset: Option<u16>,
}

impl LiveFrameConfig {
    /// Frames of at least this many bytes can carry the stamps.
    pub fn min_frame_len(&self) -> usize {
        [self.seq_offset, self.timestamp_offset]
            .into_iter()
            .flatten()
            .map(|o| usize::from(o) + 8)
            .max()
            .unwrap_or(0)
            .max(MIN_FRAME)
    }

    /// Checks the configuration before any syscall.
    pub fn validate(&self) -> Result<()> {
        if self.egress_ifindex == 0 || self.egress_ifindex > i32::MAX as u32 {
            return Err(Error::Config("egress ifindex must be 1..=i32::MAX"));
        }
        if self.batch_size > MAX_BATCH {
            return Err(Error::Config("batch size above the kernel's 256"));
        }
        if self.min_frame_len() > MAX_FRAME {
            return Err(Error::Config("stamp offset beyond the largest live frame"));
        }
        if let (Some(s), Some(t)) = (self.seq_offset, self.timestamp_offset)
            && s.abs_diff(t) < 8
        {
            return Err(Error::Config("sequence and timestamp stamps overlap"));
        }
        Ok(())
    }
}

/// Sends copies of a frame through the kernel's XDP redirect path, each
/// stamped with its own sequence number and timestamp.
pub struct LiveFrameGenerator {
    prog: OwnedFd,
    seq: MapFd,
    frame: Vec<u8>,
    ctx: XdpMd,
    config: LiveFrameConfig,
}

impl std::fmt::Debug for LiveFrameGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveFrameGenerator")
            .field("config", &self.config)
            .field("frame_len", &self.frame.len())
            .finish_non_exhaustive()
    }
}

impl LiveFrameGenerator {
    /// Creates the sequence counter (starting at 0) and loads the program.
    pub fn new(frame: &[u8], config: LiveFrameConfig) -> Result<LiveFrameGenerator> {
        config.validate()?;
        check_frame(&config, frame)?;
        let seq = sys::bpf_map_create(&mut MapCreateAttr {
            map_type: BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
            map_name: *b"brindle_gen_seq\0",
            ..Default::default()
        })
        .ctx("create sequence counter")?;
        let insns = program(&config, seq.raw())
            .map_err(|_| Error::Config("generator program does not assemble"))?;
        let prog = steer::load(&insns, "brindle_gen")?;
        let ingress = match config.ingress_ifindex {
            0 => config.egress_ifindex,
            i => i,
        };
        Ok(LiveFrameGenerator {
            prog,
            seq,
            frame: frame.to_vec(),
            ctx: XdpMd {
                data: 0,
                data_end: frame.len() as u32,
                ingress_ifindex: ingress,
                rx_queue_index: config.rx_queue,
                ..Default::default()
            },
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LiveFrameConfig {
        &self.config
    }

    /// Runs the program `repeat` times on the frame given to `new`: that
    /// many frames offered to the egress device. Returns when the kernel
    /// has run them all (or a signal interrupted it: EINTR).
    pub fn send(&mut self, repeat: u32) -> Result<()> {
        if repeat == 0 {
            return Ok(());
        }
        sys::bpf_prog_test_run_live(
            self.prog.as_fd(),
            &self.frame,
            &self.ctx,
            repeat,
            self.config.batch_size,
        )
        .ctx("BPF_PROG_TEST_RUN (live frames)")
    }

    /// The same for another frame (another flow), stamped at the same
    /// offsets. It must be long enough for them.
    pub fn send_frame(&mut self, frame: &[u8], repeat: u32) -> Result<()> {
        check_frame(&self.config, frame)?;
        if repeat == 0 {
            return Ok(());
        }
        let ctx = XdpMd {
            data_end: frame.len() as u32,
            ..self.ctx
        };
        sys::bpf_prog_test_run_live(
            self.prog.as_fd(),
            frame,
            &ctx,
            repeat,
            self.config.batch_size,
        )
        .ctx("BPF_PROG_TEST_RUN (live frames)")
    }

    /// The sequence number the next frame gets: the number of program runs
    /// so far plus the start set by [`Self::set_next_seq`]. Frames the
    /// egress device refused still took a number.
    pub fn next_seq(&self) -> Result<u64> {
        let mut value = [0u8; 8];
        sys::bpf_map_lookup(&self.seq, &0u32.to_ne_bytes(), &mut value)
            .ctx("read sequence counter")?;
        Ok(u64::from_ne_bytes(value))
    }

    /// Sets the next sequence number.
    pub fn set_next_seq(&self, seq: u64) -> Result<()> {
        sys::bpf_map_update(&self.seq, &0u32.to_ne_bytes(), &seq.to_ne_bytes(), 0)
            .ctx("set sequence counter")
    }
}

fn check_frame(config: &LiveFrameConfig, frame: &[u8]) -> Result<()> {
    if frame.len() < config.min_frame_len() {
        return Err(Error::Config("frame too short for its stamps"));
    }
    if frame.len() > MAX_FRAME {
        return Err(Error::Config("frame longer than a live-mode page holds"));
    }
    Ok(())
}

/// Offsets in `struct xdp_md`.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;

/// The stamp-and-redirect program. Registers: r6 = ctx, r7 = data,
/// r8 = data_end (callee-saved, so they survive the helper calls).
pub(crate) fn program(
    config: &LiveFrameConfig,
    seq_map: i32,
) -> Result<Vec<u64>, steer::asm::AsmError> {
    let mut a = Asm::default();
    let drop = a.label();
    let need = config.min_frame_len() as i32;
    a.mov_reg(R6, R1)
        .load(Size::W, R7, R6, MD_DATA)
        .load(Size::W, R8, R6, MD_DATA_END)
        .mov_reg(R2, R7)
        .add_imm(R2, need)
        .jump_reg(Cond::Gt, R2, R8, drop);
    if let Some(off) = config.seq_offset {
        // seq = counter++, written big-endian.
        a.store_imm(Size::W, R10, -4, 0)
            .load_map_fd(R1, seq_map)
            .mov_reg(R2, R10)
            .add_imm(R2, -4)
            .call(HELPER_MAP_LOOKUP_ELEM)
            .jump_imm(Cond::Eq, R0, 0, drop)
            .load(Size::Dw, R1, R0, 0)
            .mov_reg(R2, R1)
            .add_imm(R2, 1)
            .store_reg(Size::Dw, R0, 0, R2)
            .swap_to_be(R1, 64)
            .store_reg(Size::Dw, R7, off as i16, R1);
    }
    if let Some(off) = config.timestamp_offset {
        a.call(HELPER_KTIME_GET_NS)
            .swap_to_be(R0, 64)
            .store_reg(Size::Dw, R7, off as i16, R0);
    }
    a.mov_imm(R1, config.egress_ifindex as i32)
        .mov_imm(R2, 0)
        .call(HELPER_REDIRECT)
        .exit();
    a.bind(drop);
    a.mov_imm(R0, XDP_DROP).exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LiveFrameConfig {
        LiveFrameConfig {
            egress_ifindex: 7,
            ingress_ifindex: 0,
            rx_queue: 0,
            batch_size: 64,
            seq_offset: Some(42),
            timestamp_offset: Some(50),
        }
    }

    #[test]
    fn config_is_checked_before_any_syscall() {
        config().validate().unwrap();
        assert_eq!(config().min_frame_len(), 58);
        let bad = [
            LiveFrameConfig {
                egress_ifindex: 0,
                ..config()
            },
            LiveFrameConfig {
                batch_size: 257,
                ..config()
            },
            LiveFrameConfig {
                timestamp_offset: Some(46),
                ..config()
            },
            LiveFrameConfig {
                seq_offset: Some(4000),
                ..config()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let plain = LiveFrameConfig {
            seq_offset: None,
            timestamp_offset: None,
            ..config()
        };
        assert_eq!(plain.min_frame_len(), 14);
        assert!(check_frame(&config(), &[0u8; 57]).is_err());
        assert!(check_frame(&config(), &[0u8; 58]).is_ok());
        assert!(check_frame(&config(), &vec![0u8; MAX_FRAME + 1]).is_err());
    }

    #[test]
    fn program_stamps_big_endian_then_redirects_to_the_egress_ifindex() {
        let insns = program(&config(), 3).unwrap();
        let op = |i: u64| (i & 0xff) as u8;
        let imm = |i: u64| (i >> 32) as i32;
        let off = |i: u64| ((i >> 16) & 0xffff) as i16;
        // Two byte swaps to big-endian 64, each followed by a DW store into
        // the packet (r7) at the configured offsets.
        let stores: Vec<i16> = insns
            .windows(2)
            .filter(|w| op(w[0]) == 0xdc && imm(w[0]) == 64 && op(w[1]) == 0x7b)
            .map(|w| {
                assert_eq!((w[1] >> 8) & 0x0f, 7, "stored relative to r7 = data");
                off(w[1])
            })
            .collect();
        assert_eq!(stores, [42, 50]);
        // r1 = ifindex, r2 = 0, call bpf_redirect, exit.
        let call = insns
            .iter()
            .position(|&i| op(i) == 0x85 && imm(i) == HELPER_REDIRECT)
            .unwrap();
        assert_eq!(op(insns[call - 2]), 0xb7);
        assert_eq!(imm(insns[call - 2]), 7);
        assert_eq!(imm(insns[call - 1]), 0);
        assert_eq!(op(insns[call + 1]), 0x95);
        assert!(
            insns
                .iter()
                .any(|&i| op(i) == 0x85 && imm(i) == HELPER_KTIME_GET_NS)
        );
    }

    #[test]
    fn without_stamps_the_program_only_redirects() {
        let c = LiveFrameConfig {
            seq_offset: None,
            timestamp_offset: None,
            ..config()
        };
        let insns = program(&c, 3).unwrap();
        assert!(!insns.iter().any(|&i| (i & 0xff) == 0xdc));
        assert!(!insns.iter().any(|&i| (i & 0xff) == 0x18), "no map load");
    }
}
