//! The connection table, one per worker: a flow's first packet is
//! classified, an allowed flow is tracked under its normalized 5-tuple
//! (both directions find the same entry), and later packets of either
//! direction pass on the entry's verdict until it times out. The verdict
//! carries the policy generation it was computed under; a packet of a flow
//! whose endpoint has a newer generation reclassifies it (lazy
//! revalidation, no flush).
//!
//! TCP follows Linux conntrack's state machine
//! (`nf_conntrack_proto_tcp.c`: the `tcp_conntracks` table, loose pick-up
//! of established flows on an ACK, the default `nf_conntrack_tcp_timeout_*`
//! values); UDP and ICMP use Linux's timeouts (30 s, 120 s once replied;
//! ICMP 30 s; other protocols 600 s). An ICMP error whose quoted packet
//! belongs to a tracked flow is related and passes.
//!
//! The table is bounded: it is allocated at its capacity once and never
//! grows, so no packet allocates. A new flow that does not fit is
//! [`Outcome::Full`] (counted, to drop), never a silent allow. Denied flows
//! are not tracked (each of their packets is classified again, which costs
//! what one classification costs, and a flood of denied flows cannot fill
//! the table).
//!
//! Memory: [`ENTRY_BYTES`] (73) per slot (normalized key 38 B, entry 32 B,
//! padding, the map's control byte); the map keeps at most 7/8 of its slots
//! full and rounds slots up to a power of two, so a table of capacity
//! 917,504 takes 2^20 slots, 73 MiB, and 1,048,576 flows take 2^21 slots,
//! 146 MiB (whether in one table or spread over workers).
//! Time is passed in (`now`, nanoseconds on any monotonic clock).

use std::collections::HashMap;
use std::net::IpAddr;

use crate::classify::{Decision, Packet, Verdict};

/// TCP flag bits as on the wire.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

const SEC: u64 = 1_000_000_000;

/// Linux conntrack's TCP states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TcpState {
    /// SYN_SENT.
    SynSent,
    /// SYN_RECV.
    SynRecv,
    /// ESTABLISHED.
    Established,
    /// FIN_WAIT.
    FinWait,
    /// CLOSE_WAIT.
    CloseWait,
    /// LAST_ACK.
    LastAck,
    /// TIME_WAIT.
    TimeWait,
    /// CLOSE.
    Close,
    /// SYN_SENT2 (simultaneous open).
    SynSent2,
}

/// Timeouts, in nanoseconds (Linux's defaults by [`Timeouts::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Per TCP state, indexed by `TcpState as usize`.
    pub tcp: [u64; 9],
    /// UDP before a reply.
    pub udp: u64,
    /// UDP once replied.
    pub udp_stream: u64,
    /// ICMP.
    pub icmp: u64,
    /// Other protocols.
    pub generic: u64,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            tcp: [
                120 * SEC,     // SYN_SENT
                60 * SEC,      // SYN_RECV
                432_000 * SEC, // ESTABLISHED (5 days)
                120 * SEC,     // FIN_WAIT
                60 * SEC,      // CLOSE_WAIT
                30 * SEC,      // LAST_ACK
                120 * SEC,     // TIME_WAIT
                10 * SEC,      // CLOSE
                120 * SEC,     // SYN_SENT2
            ],
            udp: 30 * SEC,
            udp_stream: 120 * SEC,
            icmp: 30 * SEC,
            generic: 600 * SEC,
        }
    }
}

/// A packet's 5-tuple as it travels. For ICMP echo, both ports are the
/// echo identifier ([`Tuple::icmp_echo`]), so request and reply meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol.
    pub protocol: u8,
    /// Source port (0 if none).
    pub src_port: u16,
    /// Destination port (0 if none).
    pub dst_port: u16,
}

impl Tuple {
    /// An ICMP/ICMPv6 echo request or reply with identifier `id`.
    pub fn icmp_echo(src: IpAddr, dst: IpAddr, protocol: u8, id: u16) -> Tuple {
        Tuple {
            src,
            dst,
            protocol,
            src_port: id,
            dst_port: id,
        }
    }

    fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            protocol: self.protocol,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// What the table is told of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The 5-tuple.
    pub tuple: Tuple,
    /// TCP flags (TCP only).
    pub tcp_flags: u8,
    /// ICMP type and code (ICMP only).
    pub icmp: Option<(u8, u8)>,
    /// For an ICMP error: the quoted packet's tuple, as quoted.
    pub quoted: Option<Tuple>,
}

impl Seen {
    /// A packet that is not an ICMP error.
    pub fn new(tuple: Tuple, tcp_flags: u8, icmp: Option<(u8, u8)>) -> Seen {
        Seen {
            tuple,
            tcp_flags,
            icmp,
            quoted: None,
        }
    }
}

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A tracked, allowed flow (in its original direction, or a reply).
    Tracked {
        /// The packet goes the reply way.
        reply: bool,
    },
    /// A new flow: classified, allowed, now tracked.
    New(Verdict),
    /// A tracked flow reclassified under a newer generation: still allowed.
    Revalidated(Verdict),
    /// Denied by policy (a new flow, or a tracked one revalidated, whose
    /// entry is gone): drop.
    Denied(Verdict),
    /// An ICMP error about a tracked flow: pass.
    Related,
    /// A packet no tracked state accepts (a TCP segment out of state, an
    /// ICMP error about no flow): drop.
    Invalid,
    /// A new allowed flow that the full table cannot hold: drop.
    Full,
}

impl Outcome {
    /// Whether the packet passes.
    pub fn passes(&self) -> bool {
        matches!(
            self,
            Outcome::Tracked { .. } | Outcome::New(_) | Outcome::Revalidated(_) | Outcome::Related
        )
    }
}

/// Counters, one per outcome, plus expiries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets of tracked flows.
    pub tracked: u64,
    /// New flows tracked.
    pub new: u64,
    /// Flows revalidated and kept.
    pub revalidated: u64,
    /// Packets denied.
    pub denied: u64,
    /// Related ICMP errors passed.
    pub related: u64,
    /// Invalid packets.
    pub invalid: u64,
    /// New flows refused because the table was full.
    pub full: u64,
    /// Entries expired.
    pub expired: u64,
}

/// The normalized key: the lower (address, port) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    lo: [u8; 16],
    hi: [u8; 16],
    lo_port: u16,
    hi_port: u16,
    protocol: u8,
}

fn addr16(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The key and whether the tuple's source is the key's `lo` side.
fn key_of(t: &Tuple) -> (Key, bool) {
    let s = (addr16(t.src), t.src_port);
    let d = (addr16(t.dst), t.dst_port);
    let src_lo = s <= d;
    let (lo, hi) = if src_lo { (s, d) } else { (d, s) };
    (
        Key {
            lo: lo.0,
            hi: hi.0,
            lo_port: lo.1,
            hi_port: hi.1,
            protocol: t.protocol,
        },
        src_lo,
    )
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// What allowed the flow (for `brindlectl`; entries are allowed flows).
    decision: Decision,
    generation: u64,
    expires: u64,
    /// The original direction's source is the key's `lo` side.
    orig_src_lo: bool,
    /// A packet went the reply way.
    replied: bool,
    tcp: Option<TcpState>,
    /// The original packet's ICMP type and code (for reclassification).
    icmp: Option<(u8, u8)>,
    /// The dataplane's mark, set by the flow's first packet
    /// ([`ConnTable::process_marked`]; e.g. "entered from the host port").
    mark: u8,
}

/// Bytes per slot: key, entry, one control byte.
pub const ENTRY_BYTES: usize = std::mem::size_of::<(Key, Entry)>() + 1;

/// TCP: the transition of Linux's `tcp_conntracks[dir][flag][state]`.
/// `None` is sIV (invalid), `Some(None)` sIG (ignore: pass, no change).
fn tcp_next(reply: bool, flags: u8, state: Option<TcpState>) -> Option<Option<TcpState>> {
    use TcpState::*;
    // Index: 0 syn, 1 synack, 2 fin, 3 ack, 4 rst, 5 none.
    let f = if flags & tcp_flags::RST != 0 {
        4
    } else if flags & tcp_flags::SYN != 0 {
        if flags & tcp_flags::ACK != 0 { 1 } else { 0 }
    } else if flags & tcp_flags::FIN != 0 {
        2
    } else if flags & tcp_flags::ACK != 0 {
        3
    } else {
        5
    };
    // Columns: sNO sSS sSR sES sFW sCW sLA sTW sCL sS2.
    let col = match state {
        None => 0,
        Some(s) => s as usize + 1,
    };
    #[derive(Clone, Copy)]
    enum T {
        S(TcpState),
        Iv,
        Ig,
    }
    use T::{Ig, Iv, S};
    const ORIG: [[T; 10]; 6] = [
        // syn
        [
            S(SynSent),
            S(SynSent),
            Ig,
            Ig,
            Ig,
            Ig,
            Ig,
            S(SynSent),
            S(SynSent),
            S(SynSent2),
        ],
        // synack
        [Iv, Iv, S(SynRecv), Iv, Iv, Iv, Iv, Iv, Iv, S(SynRecv)],
        // fin
        [
            Iv,
            Iv,
            S(FinWait),
            S(FinWait),
            S(LastAck),
            S(LastAck),
            S(LastAck),
            S(TimeWait),
            S(Close),
            Iv,
        ],
        // ack
        [
            S(Established),
            Iv,
            S(Established),
            S(Established),
            S(CloseWait),
            S(CloseWait),
            S(TimeWait),
            S(TimeWait),
            S(Close),
            Iv,
        ],
        // rst
        [
            Iv,
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
        ],
        // none
        [Iv; 10],
    ];
    const REPLY: [[T; 10]; 6] = [
        // syn
        [
            Iv,
            S(SynSent2),
            Iv,
            Iv,
            Iv,
            Iv,
            Iv,
            S(SynSent),
            Iv,
            S(SynSent2),
        ],
        // synack
        [Iv, S(SynRecv), Ig, Ig, Ig, Ig, Ig, Ig, Ig, S(SynRecv)],
        // fin
        [
            Iv,
            Iv,
            S(FinWait),
            S(FinWait),
            S(LastAck),
            S(LastAck),
            S(LastAck),
            S(TimeWait),
            S(Close),
            Iv,
        ],
        // ack
        [
            Iv,
            Ig,
            S(SynRecv),
            S(Established),
            S(CloseWait),
            S(CloseWait),
            S(TimeWait),
            S(TimeWait),
            S(Close),
            Ig,
        ],
        // rst
        [
            Iv,
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
            S(Close),
        ],
        // none
        [Iv; 10],
    ];
    let t = if reply { REPLY[f][col] } else { ORIG[f][col] };
    match t {
        S(s) => Some(Some(s)),
        Ig => Some(None),
        Iv => None,
    }
}

/// Whether an ICMP type is an error (which quotes a packet).
pub fn icmp_is_error(protocol: u8, icmp_type: u8) -> bool {
    match protocol {
        1 => matches!(icmp_type, 3 | 4 | 5 | 11 | 12),
        58 => matches!(icmp_type, 1..=4),
        _ => false,
    }
}

/// One worker's connection table.
#[derive(Debug)]
pub struct ConnTable {
    map: HashMap<Key, Entry>,
    capacity: usize,
    timeouts: Timeouts,
    stats: Stats,
    last_sweep: u64,
}

impl ConnTable {
    /// A table for at most `capacity` flows, allocated now.
    pub fn new(capacity: usize, timeouts: Timeouts) -> ConnTable {
        ConnTable {
            map: HashMap::with_capacity(capacity),
            capacity,
            timeouts,
            stats: Stats::default(),
            last_sweep: 0,
        }
    }

    /// Tracked flows (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no flow is tracked.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Removes expired entries (a full pass: call it about once a second
    /// from the worker's idle time); returns how many went.
    pub fn sweep(&mut self, now: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| e.expires > now);
        let gone = before - self.map.len();
        self.stats.expired += gone as u64;
        self.last_sweep = now;
        gone
    }

    /// Handles one packet. `generation` is the newest policy generation of
    /// the endpoints the flow crosses; `classify` gives the verdict for a
    /// packet in the flow's original direction (both endpoints' programs,
    /// as the caller combines them), called only for a new flow or a
    /// revalidation.
    pub fn process(
        &mut self,
        seen: &Seen,
        now: u64,
        generation: u64,
        classify: impl FnOnce(&Packet) -> Verdict,
    ) -> Outcome {
        self.process_marked(seen, now, generation, 0, classify).0
    }

    /// [`ConnTable::process`], and the flow's mark: a new flow keeps
    /// `mark` (what the dataplane knows of its first packet, e.g. the port
    /// it entered by); a tracked flow, and an ICMP error related to one,
    /// give back the mark its first packet set. Denied, invalid and
    /// refused packets give 0.
    pub fn process_marked(
        &mut self,
        seen: &Seen,
        now: u64,
        generation: u64,
        mark: u8,
        classify: impl FnOnce(&Packet) -> Verdict,
    ) -> (Outcome, u8) {
        if let Some(q) = &seen.quoted
            && seen
                .icmp
                .is_some_and(|(t, _)| icmp_is_error(seen.tuple.protocol, t))
        {
            let (key, _) = key_of(q);
            return match self.map.get(&key) {
                Some(e) if e.expires > now => {
                    self.stats.related += 1;
                    (Outcome::Related, e.mark)
                }
                _ => {
                    self.stats.invalid += 1;
                    (Outcome::Invalid, 0)
                }
            };
        }
        let t = &seen.tuple;
        let (key, src_lo) = key_of(t);
        let protocol = t.protocol;
        let timeouts = self.timeouts;
        let mut classify = Some(classify);
        let mut verdict_of = |p: &Packet| match classify.take() {
            Some(f) => f(p),
            // Called once per packet by construction; a second call
            // (impossible) denies rather than allows.
            None => Verdict {
                allow: false,
                decision: Decision::NoPolicy,
                logged: None,
            },
        };
        // One lookup: the entry is updated in place.
        let mut kept = 0;
        let tracked = match self.map.get_mut(&key) {
            Some(e) if e.expires > now => {
                kept = e.mark;
                let reply = src_lo != e.orig_src_lo;
                let mut outcome = Outcome::Tracked { reply };
                if e.generation < generation {
                    let orig = if reply { t.reversed() } else { *t };
                    let v = verdict_of(&packet(&orig, e.icmp));
                    if !v.allow {
                        Some(Outcome::Denied(v))
                    } else {
                        e.decision = v.decision;
                        e.generation = generation;
                        outcome = Outcome::Revalidated(v);
                        Some(step(e, seen, reply, now, &timeouts, outcome))
                    }
                } else {
                    Some(step(e, seen, reply, now, &timeouts, outcome))
                }
            }
            _ => None,
        };
        if let Some(outcome) = tracked {
            match outcome {
                Outcome::Denied(_) => {
                    self.map.remove(&key);
                    self.stats.denied += 1;
                    kept = 0;
                }
                Outcome::Invalid => {
                    self.stats.invalid += 1;
                    kept = 0;
                }
                Outcome::Revalidated(_) => self.stats.revalidated += 1,
                _ => self.stats.tracked += 1,
            }
            return (outcome, kept);
        }
        // A new flow (or one whose entry expired).
        let tcp = if protocol == 6 {
            match tcp_next(false, seen.tcp_flags, None) {
                Some(Some(s)) => Some(s),
                _ => {
                    self.stats.invalid += 1;
                    return (Outcome::Invalid, 0);
                }
            }
        } else {
            None
        };
        let v = verdict_of(&packet(t, seen.icmp));
        if !v.allow {
            self.stats.denied += 1;
            return (Outcome::Denied(v), 0);
        }
        if !self.map.contains_key(&key) && self.map.len() >= self.capacity {
            // Expired entries make room; a full pass at most once a second.
            if now.saturating_sub(self.last_sweep) >= SEC {
                self.sweep(now);
            }
            if self.map.len() >= self.capacity {
                self.stats.full += 1;
                return (Outcome::Full, 0);
            }
        }
        let entry = Entry {
            decision: v.decision,
            generation,
            expires: now.saturating_add(timeout(&self.timeouts, protocol, tcp, false)),
            orig_src_lo: src_lo,
            replied: false,
            tcp,
            icmp: seen.icmp,
            mark,
        };
        self.map.insert(key, entry);
        self.stats.new += 1;
        (Outcome::New(v), mark)
    }

    /// Whether the flow of `t` (either direction) is tracked and not
    /// expired at `now`.
    pub fn contains(&self, t: &Tuple, now: u64) -> bool {
        self.map.get(&key_of(t).0).is_some_and(|e| e.expires > now)
    }

    /// What allowed a tracked flow.
    pub fn decision(&self, t: &Tuple) -> Option<Decision> {
        self.map.get(&key_of(t).0).map(|e| e.decision)
    }

    /// The TCP state of a tracked flow (for tests and `brindlectl`).
    pub fn tcp_state(&self, t: &Tuple) -> Option<TcpState> {
        self.map.get(&key_of(t).0).and_then(|e| e.tcp)
    }
}

fn timeout(timeouts: &Timeouts, protocol: u8, tcp: Option<TcpState>, replied: bool) -> u64 {
    match (protocol, tcp) {
        (6, Some(s)) => timeouts.tcp[s as usize],
        (17 | 136, _) if replied => timeouts.udp_stream,
        (17 | 136, _) => timeouts.udp,
        (1 | 58, _) => timeouts.icmp,
        _ => timeouts.generic,
    }
}

/// A tracked flow's packet: TCP state, reply flag and expiry updated;
/// `Invalid` (entry left as it was but for a revalidation) when TCP says so.
fn step(
    e: &mut Entry,
    seen: &Seen,
    reply: bool,
    now: u64,
    timeouts: &Timeouts,
    outcome: Outcome,
) -> Outcome {
    let protocol = seen.tuple.protocol;
    if protocol == 6 {
        match tcp_next(reply, seen.tcp_flags, e.tcp) {
            None => return Outcome::Invalid,
            Some(Some(s)) => e.tcp = Some(s),
            Some(None) => {}
        }
    }
    e.replied |= reply;
    e.expires = now.saturating_add(timeout(timeouts, protocol, e.tcp, e.replied));
    outcome
}

fn packet(t: &Tuple, icmp: Option<(u8, u8)>) -> Packet {
    let is_icmp = matches!(t.protocol, 1 | 58);
    Packet {
        src: t.src,
        dst: t.dst,
        protocol: t.protocol,
        src_port: if is_icmp { 0 } else { t.src_port },
        dst_port: if is_icmp { 0 } else { t.dst_port },
        icmp,
    }
}

#[cfg(test)]
mod tests;
