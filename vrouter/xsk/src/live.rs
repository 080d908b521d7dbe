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
//! Optionally it also writes a UDP source port from the sequence number
//! (`base + seq % count`), so one call sends every flow in turn, and paces
//! itself: a run whose frame is not due yet returns XDP_DROP before
//! stamping (the kernel recycles the page at once), so a fixed rate comes
//! out evenly spaced instead of in bursts.
//!
//! Why one long call rather than many short ones with sleeps in between:
//! each BPF_PROG_TEST_RUN call here costs about 25 ms of wall time beyond
//! its frames (the kernel tears down the call's page pool, which waits for
//! an RCU grace period), so short calls cap out near 40 calls a second,
//! and the debt they leave comes out as line-rate bursts the receiving
//! veth's 256-slot ring overflows on. [`LiveFrameGenerator::send_for`]
//! makes one call with a huge repeat count and ends it with a signal to the
//! calling thread at the deadline (the kernel checks for pending signals
//! between batches and returns EINTR).
//!
//! The sequence counter is a plain (not per-CPU, not atomic) array entry:
//! one generator calls [`LiveFrameGenerator::send`] from one thread at a
//! time (the type is `Send` but its methods that run the program take
//! `&mut self`), and the kernel runs one call's batches on one CPU.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Context, Error, LIVE_FRAMES_OP, Result};
use crate::steer::{
    self,
    asm::{Asm, Cond, R0, R1, R2, R3, R4, R6, R7, R8, R9, R10, Size},
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
    /// Rotate a big-endian 16-bit field (a UDP source port) over flows.
    pub flows: Option<FlowRotation>,
}

/// `frame[offset..offset + 2] = base + seq % count`, big-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRotation {
    /// Byte offset of the field (34 for the UDP source port of an
    /// untagged IPv4 frame without options).
    pub offset: u16,
    /// Value of flow 0.
    pub base: u16,
    /// Number of flows, 1 or more; `base + count - 1` must fit in 16 bits.
    pub count: u16,
}

impl FlowRotation {
    /// How many of the sequence numbers `start..end` are flow `flow`'s.
    pub fn frames_of(&self, flow: u16, start: u64, end: u64) -> u64 {
        let count = u64::from(self.count.max(1));
        let flow = u64::from(flow);
        if flow >= count || end <= start {
            return 0;
        }
        // Numbers below n that are ≡ flow (mod count).
        let below = |n: u64| n / count + u64::from(n % count > flow);
        below(end) - below(start)
    }
}

impl LiveFrameConfig {
    /// Frames of at least this many bytes can carry the stamps.
    pub fn min_frame_len(&self) -> usize {
        [self.seq_offset, self.timestamp_offset]
            .into_iter()
            .flatten()
            .map(|o| usize::from(o) + 8)
            .chain(self.flows.map(|f| usize::from(f.offset) + 2))
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
        if let Some(f) = self.flows {
            if f.count == 0 || u32::from(f.base) + u32::from(f.count) - 1 > u32::from(u16::MAX) {
                return Err(Error::Config("flow count 0 or flow values beyond 16 bits"));
            }
            let overlaps = |o: Option<u16>| o.is_some_and(|o| f.offset + 2 > o && f.offset < o + 8);
            if overlaps(self.seq_offset) || overlaps(self.timestamp_offset) {
                return Err(Error::Config("flow field overlaps a stamp"));
            }
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
            value_size: STATE_SIZE as u32,
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
        .ctx(LIVE_FRAMES_OP)
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
        .ctx(LIVE_FRAMES_OP)
    }

    /// Sends the frame given to `new` until `duration` has passed or
    /// `stop()` says so (checked every few milliseconds), as fast as the
    /// kernel can or at the rate set by [`Self::set_rate`]. Returns the
    /// number of frames sent (stamped and redirected), which is also how
    /// far the sequence counter moved.
    ///
    /// One BPF_PROG_TEST_RUN call with a huge repeat count, ended by
    /// `SIGUSR2` to the calling thread: this installs a handler for that
    /// signal that does nothing (and unblocks it in this thread), so the
    /// process must not use `SIGUSR2` for anything else.
    pub fn send_for(
        &mut self,
        duration: Duration,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<u64> {
        let start_seq = self.next_seq()?;
        let deadline = Instant::now() + duration;
        let over = || Instant::now() >= deadline || stop();
        let (prog, frame, ctx, batch) = (
            self.prog.as_fd(),
            &self.frame,
            &self.ctx,
            self.config.batch_size,
        );
        sys::with_interrupts(&over, || {
            while !over() {
                match sys::bpf_prog_test_run_live(prog, frame, ctx, u32::MAX, batch) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(source) => {
                        return Err(Error::Sys {
                            what: LIVE_FRAMES_OP,
                            source,
                        });
                    }
                }
            }
            Ok(())
        })
        .ctx("install the SIGUSR2 handler")??;
        Ok(self.next_seq()? - start_seq)
    }

    /// Paces the program at `pps` frames a second (`None`: as fast as it
    /// runs). A run whose frame is not due returns XDP_DROP unstamped.
    /// When the program falls behind by more than `burst` frames (the
    /// thread was preempted, or between calls), it forgives the debt
    /// instead of sending it at line rate: the offered rate then comes out
    /// below `pps`, which the caller sees in the count `send_for` returns.
    pub fn set_rate(&self, pps: Option<f64>, burst: u32) -> Result<()> {
        let mut state = self.state()?;
        match pps {
            Some(pps) if pps > 0.0 => {
                let interval = (1e9 * 256.0 / pps).clamp(1.0, u64::MAX as f64 / 4.0) as u64;
                state.interval256 = interval;
                state.slack256 = interval.saturating_mul(u64::from(burst.max(1)));
            }
            _ => {
                state.interval256 = 0;
                state.slack256 = 0;
            }
        }
        // The first due frame is the next run's.
        state.due256 = 0;
        self.set_state(&state)
    }

    /// The sequence number the next frame gets: the number of frames
    /// stamped so far plus the start set by [`Self::set_next_seq`]. Frames
    /// the egress device refused still took a number.
    pub fn next_seq(&self) -> Result<u64> {
        Ok(self.state()?.seq)
    }

    /// Sets the next sequence number.
    pub fn set_next_seq(&self, seq: u64) -> Result<()> {
        let mut state = self.state()?;
        state.seq = seq;
        self.set_state(&state)
    }

    fn state(&self) -> Result<State> {
        let mut value = [0u8; STATE_SIZE];
        sys::bpf_map_lookup(&self.seq, &0u32.to_ne_bytes(), &mut value)
            .ctx("read generator state")?;
        Ok(State::from_bytes(&value))
    }

    fn set_state(&self, state: &State) -> Result<()> {
        sys::bpf_map_update(&self.seq, &0u32.to_ne_bytes(), &state.to_bytes(), 0)
            .ctx("write generator state")
    }
}

/// The program's state: one array entry of four native-endian `u64`s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct State {
    /// The next sequence number.
    seq: u64,
    /// When the next frame is due, CLOCK_MONOTONIC ns × 256.
    due256: u64,
    /// Nanoseconds × 256 between frames; 0 = no pacing.
    interval256: u64,
    /// How far behind (ns × 256) the program may fall before it forgives.
    slack256: u64,
}

const STATE_SIZE: usize = 32;
const STATE_SEQ: i16 = 0;
const STATE_DUE: i16 = 8;
const STATE_INTERVAL: i16 = 16;
const STATE_SLACK: i16 = 24;

impl State {
    fn from_bytes(b: &[u8; STATE_SIZE]) -> State {
        let at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_ne_bytes(w)
        };
        State {
            seq: at(0),
            due256: at(8),
            interval256: at(16),
            slack256: at(24),
        }
    }

    fn to_bytes(self) -> [u8; STATE_SIZE] {
        let mut b = [0u8; STATE_SIZE];
        for (i, v) in [self.seq, self.due256, self.interval256, self.slack256]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        b
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
/// r8 = data_end, r9 = the state entry (callee-saved, so they survive the
/// helper calls).
pub(crate) fn program(
    config: &LiveFrameConfig,
    state_map: i32,
) -> Result<Vec<u64>, steer::asm::AsmError> {
    let mut a = Asm::default();
    let drop = a.label();
    let stamp = a.label();
    let keep_due = a.label();
    let need = config.min_frame_len() as i32;
    a.mov_reg(R6, R1)
        .load(Size::W, R7, R6, MD_DATA)
        .load(Size::W, R8, R6, MD_DATA_END)
        .mov_reg(R2, R7)
        .add_imm(R2, need)
        .jump_reg(Cond::Gt, R2, R8, drop)
        .store_imm(Size::W, R10, -4, 0)
        .load_map_fd(R1, state_map)
        .mov_reg(R2, R10)
        .add_imm(R2, -4)
        .call(HELPER_MAP_LOOKUP_ELEM)
        .jump_imm(Cond::Eq, R0, 0, drop)
        .mov_reg(R9, R0);

    // Pacing: not due yet -> drop unstamped. Due: the next one is an
    // interval later, or an interval from now when far behind.
    a.load(Size::Dw, R1, R9, STATE_INTERVAL)
        .jump_imm(Cond::Eq, R1, 0, stamp)
        .call(HELPER_KTIME_GET_NS)
        .lsh_imm(R0, 8)
        .load(Size::Dw, R2, R9, STATE_DUE)
        .jump_reg(Cond::Lt, R0, R2, drop)
        .load(Size::Dw, R4, R9, STATE_SLACK)
        .add_reg(R4, R2)
        .jump_reg(Cond::Gt, R4, R0, keep_due)
        .mov_reg(R2, R0);
    a.bind(keep_due);
    a.load(Size::Dw, R1, R9, STATE_INTERVAL)
        .add_reg(R2, R1)
        .store_reg(Size::Dw, R9, STATE_DUE, R2);

    // seq = state.seq++, and the flow from it.
    a.bind(stamp);
    a.load(Size::Dw, R1, R9, STATE_SEQ)
        .mov_reg(R2, R1)
        .add_imm(R2, 1)
        .store_reg(Size::Dw, R9, STATE_SEQ, R2);
    if let Some(f) = config.flows {
        a.mov_reg(R3, R1)
            .mod_imm(R3, i32::from(f.count.max(1)))
            .add_imm(R3, i32::from(f.base))
            .swap_to_be(R3, 16)
            .store_reg(Size::H, R7, f.offset as i16, R3);
    }
    if let Some(off) = config.seq_offset {
        a.swap_to_be(R1, 64).store_reg(Size::Dw, R7, off as i16, R1);
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
            flows: Some(FlowRotation {
                offset: 34,
                base: 10_000,
                count: 16,
            }),
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
            LiveFrameConfig {
                flows: Some(FlowRotation {
                    offset: 49,
                    base: 1,
                    count: 2,
                }),
                ..config()
            },
            LiveFrameConfig {
                flows: Some(FlowRotation {
                    offset: 34,
                    base: 65_535,
                    count: 2,
                }),
                ..config()
            },
            LiveFrameConfig {
                flows: Some(FlowRotation {
                    offset: 34,
                    base: 1,
                    count: 0,
                }),
                ..config()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let plain = LiveFrameConfig {
            seq_offset: None,
            timestamp_offset: None,
            flows: None,
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
    fn without_stamps_the_program_writes_nothing_into_the_frame() {
        let c = LiveFrameConfig {
            seq_offset: None,
            timestamp_offset: None,
            flows: None,
            ..config()
        };
        let insns = program(&c, 3).unwrap();
        assert!(!insns.iter().any(|&i| (i & 0xff) == 0xdc), "no byte swap");
        // Stores into r7 (the packet): none.
        assert!(
            !insns
                .iter()
                .any(|&i| matches!(i & 0xff, 0x6b | 0x7b) && (i >> 8) & 0x0f == 7)
        );
    }

    #[test]
    fn the_flow_field_is_base_plus_seq_mod_count_big_endian() {
        let insns = program(&config(), 3).unwrap();
        let op = |i: u64| (i & 0xff) as u8;
        let imm = |i: u64| (i >> 32) as i32;
        let m = insns.iter().position(|&i| op(i) == 0x97).unwrap();
        assert_eq!(imm(insns[m]), 16);
        assert_eq!(op(insns[m + 1]), 0x07);
        assert_eq!(imm(insns[m + 1]), 10_000);
        assert_eq!(op(insns[m + 2]), 0xdc);
        assert_eq!(imm(insns[m + 2]), 16);
        // *(u16 *)(r7 + 34) = r3
        assert_eq!(op(insns[m + 3]), 0x6b);
        assert_eq!((insns[m + 3] >> 16) & 0xffff, 34);
    }

    #[test]
    fn frames_of_a_flow_count_the_sequence_numbers_of_that_residue() {
        let f = FlowRotation {
            offset: 34,
            base: 0,
            count: 4,
        };
        // 0..10: flows 0,1 get 3 (0,4,8 / 1,5,9); 2,3 get 2.
        let counts: Vec<u64> = (0..4).map(|k| f.frames_of(k, 0, 10)).collect();
        assert_eq!(counts, [3, 3, 2, 2]);
        // 5..7 is seq 5 (flow 1) and 6 (flow 2).
        let counts: Vec<u64> = (0..4).map(|k| f.frames_of(k, 5, 7)).collect();
        assert_eq!(counts, [0, 1, 1, 0]);
        for (start, end) in [(0, 0), (3, 1000), (1_000_001, 1_000_007)] {
            let total: u64 = (0..4).map(|k| f.frames_of(k, start, end)).sum();
            assert_eq!(total, end.saturating_sub(start));
        }
        assert_eq!(f.frames_of(4, 0, 100), 0);
    }

    #[test]
    fn state_round_trips_through_its_bytes() {
        let s = State {
            seq: 1,
            due256: 2,
            interval256: 3,
            slack256: u64::MAX,
        };
        assert_eq!(State::from_bytes(&s.to_bytes()), s);
    }
}
