//! The speaker's inputs as values: what the owner task was told
//! (commands), what happened to its connections, the octets it received
//! and the timers that fired, recorded as JSON lines
//! ([`SpeakerConfig::record`], the daemon's `bgp.record_file` /
//! `--record-bgp FILE`) and fed again through the same FSM and RIB by
//! [`Replay`], which rebuilds the RIB the speaker had, without sockets or
//! clocks. A session seen in the field can so be replayed in a test.
//!
//! One line per input: `{"t_ms": 12, "event": "frame", "conn": 3,
//! "octets": "ffff…"}`. Received messages are kept as octets and decoded
//! again on replay (by the reader's own function), so a decoding bug shows
//! up in the replay too. Passwords are not recorded.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Instant;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::config::{PeerConfig, SpeakerConfig};
use super::core::{Core, TimerKind, decode_frame, initial_decode_cxt};
use super::fsm::ConnId;
use super::packet::{DecodeCxt, get_message_len};
use super::rib::{RouteChange, RouteEntry};

/// A timer that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerName {
    /// The ConnectRetry timer.
    ConnectRetry,
    /// A connection's hold timer.
    Hold,
    /// A connection's keepalive timer.
    Keepalive,
    /// The graceful-restart time of a peer whose session went down.
    Restart,
}

/// One input of the speaker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Recorded {
    /// The first line: the speaker's configuration.
    Start {
        local_as: u32,
        router_id: Ipv4Addr,
        cluster_id: Option<Ipv4Addr>,
        graceful_restart_time: Option<u16>,
        ipv6_next_hop: Option<Ipv6Addr>,
    },
    /// A peer was added (its password left out).
    AddPeer {
        address: IpAddr,
        port: u16,
        remote_as: u32,
        rr_client: bool,
        max_prefixes: Option<u32>,
        hold_time: u16,
        keepalive: Option<u16>,
        connect_retry: u16,
        passive: bool,
        local_address: Option<IpAddr>,
        families: Vec<(u16, u8)>,
    },
    /// A peer was removed.
    RemovePeer { address: IpAddr },
    /// A local route was announced.
    Announce { prefix: IpNet, next_hop: IpAddr },
    /// A local route was withdrawn.
    Withdraw { prefix: IpNet },
    /// A connection with a peer came up (`inbound`: it connected to us).
    Connection {
        peer: IpAddr,
        conn: ConnId,
        local: Option<SocketAddr>,
        inbound: bool,
    },
    /// Our connection attempt to a peer failed.
    ConnectFailed { peer: IpAddr },
    /// Octets received on a connection: one message, or the header that
    /// failed to frame.
    Frame { conn: ConnId, octets: String },
    /// A connection closed.
    Closed { conn: ConnId },
    /// A timer fired.
    Timer {
        peer: IpAddr,
        timer: TimerName,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        conn: Option<ConnId>,
    },
}

/// A recorded line: the input and when it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// Milliseconds since the speaker started.
    pub t_ms: u64,
    /// The input.
    #[serde(flatten)]
    pub input: Recorded,
}

impl Recorded {
    pub(crate) fn add_peer(c: &PeerConfig) -> Recorded {
        Recorded::AddPeer {
            address: c.address,
            port: c.port,
            remote_as: c.remote_as,
            rr_client: c.rr_client,
            max_prefixes: c.max_prefixes,
            hold_time: c.hold_time,
            keepalive: c.keepalive,
            connect_retry: c.connect_retry,
            passive: c.passive,
            local_address: c.local_address,
            families: c.families.clone(),
        }
    }

    pub(crate) fn frame(conn: ConnId, octets: &[u8]) -> Recorded {
        Recorded::Frame {
            conn,
            octets: to_hex(octets),
        }
    }

    pub(crate) fn timer(peer: IpAddr, kind: TimerKind) -> Recorded {
        let (timer, conn) = match kind {
            TimerKind::ConnectRetry => (TimerName::ConnectRetry, None),
            TimerKind::Hold(c) => (TimerName::Hold, Some(c)),
            TimerKind::Keepalive(c) => (TimerName::Keepalive, Some(c)),
            TimerKind::Restart => (TimerName::Restart, None),
        };
        Recorded::Timer { peer, timer, conn }
    }
}

fn to_hex(octets: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(octets.len() * 2);
    for b in octets {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Writes the lines (buffered; flushed after every batch of events).
pub(crate) struct Recorder {
    out: std::io::BufWriter<std::fs::File>,
    start: Instant,
    failed: bool,
}

impl Recorder {
    /// Creates (truncates) `path` and writes the `Start` line.
    pub(crate) fn create(path: &Path, config: &SpeakerConfig) -> std::io::Result<Recorder> {
        let file = std::fs::File::create(path)?;
        let mut r = Recorder {
            out: std::io::BufWriter::with_capacity(256 * 1024, file),
            start: Instant::now(),
            failed: false,
        };
        r.write(&Recorded::Start {
            local_as: config.local_as,
            router_id: config.router_id,
            cluster_id: config.cluster_id,
            graceful_restart_time: config.graceful_restart_time,
            ipv6_next_hop: config.ipv6_next_hop,
        });
        r.flush();
        Ok(r)
    }

    pub(crate) fn write(&mut self, input: &Recorded) {
        if self.failed {
            return;
        }
        let line = Line {
            t_ms: self.start.elapsed().as_millis() as u64,
            input: input.clone(),
        };
        let r = serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::other)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = r {
            warn!(error = %e, "bgp recording failed: recording stops");
            self.failed = true;
        }
    }

    pub(crate) fn flush(&mut self) {
        if !self.failed
            && let Err(e) = self.out.flush()
        {
            warn!(error = %e, "bgp recording failed: recording stops");
            self.failed = true;
        }
    }
}

/// Why a recording cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A line is not a recorded input.
    #[error("line {line}: {message}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// Why.
        message: String,
    },
    /// The first line is not `start`.
    #[error("the recording does not begin with a start line")]
    NoStart,
}

/// The speaker's core fed from a recording: the same FSMs, RIB and
/// handling of every FSM output as the live speaker ([`Core`]), minus the
/// I/O (its actions, sends, connects and timers, are dropped: their
/// consequences are in the recording).
pub struct Replay {
    core: Core,
    /// Each connection's decode context, as its reader task keeps it.
    cxts: HashMap<ConnId, DecodeCxt>,
    changes: Vec<RouteChange>,
}

impl Replay {
    /// Parses a whole recording (a last line cut short by a recorder still
    /// writing is ignored) and replays it.
    pub fn from_text(text: &str) -> Result<Replay, ReplayError> {
        let mut lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .collect();
        if !text.ends_with('\n') {
            lines.pop();
        }
        let mut replay: Option<Replay> = None;
        for (i, l) in lines {
            let line: Line = serde_json::from_str(l).map_err(|e| ReplayError::BadLine {
                line: i + 1,
                message: e.to_string(),
            })?;
            match replay.as_mut() {
                None => replay = Some(Replay::new(&line.input).ok_or(ReplayError::NoStart)?),
                Some(r) => r
                    .input(line.input)
                    .map_err(|message| ReplayError::BadLine {
                        line: i + 1,
                        message,
                    })?,
            }
        }
        replay.ok_or(ReplayError::NoStart)
    }

    /// A replay from the `Start` line.
    pub fn new(start: &Recorded) -> Option<Replay> {
        let Recorded::Start {
            local_as,
            router_id,
            cluster_id,
            graceful_restart_time,
            ipv6_next_hop,
        } = start
        else {
            return None;
        };
        let mut config = SpeakerConfig::new(*local_as, *router_id);
        config.cluster_id = *cluster_id;
        config.graceful_restart_time = *graceful_restart_time;
        config.ipv6_next_hop = *ipv6_next_hop;
        config.listen = None;
        Some(Replay {
            core: Core::new(config),
            cxts: HashMap::new(),
            changes: Vec::new(),
        })
    }

    /// Every path in the Loc-RIB, as [`super::speaker::Speaker::routes`].
    pub fn routes(&self) -> Vec<RouteEntry> {
        self.core.routes()
    }

    /// The best-route changes so far, as the speaker's channel carried them.
    pub fn take_changes(&mut self) -> Vec<RouteChange> {
        std::mem::take(&mut self.changes)
    }

    /// Applies one input.
    pub fn input(&mut self, input: Recorded) -> Result<(), String> {
        match input {
            Recorded::Start { .. } => return Err("a second start line".into()),
            Recorded::AddPeer {
                address,
                port,
                remote_as,
                rr_client,
                max_prefixes,
                hold_time,
                keepalive,
                connect_retry,
                passive,
                local_address,
                families,
            } => {
                let mut c = PeerConfig::new(address, remote_as);
                c.port = port;
                c.rr_client = rr_client;
                c.max_prefixes = max_prefixes;
                c.hold_time = hold_time;
                c.keepalive = keepalive;
                c.connect_retry = connect_retry;
                c.passive = passive;
                c.local_address = local_address;
                c.families = families;
                // A second one was refused by the speaker too.
                let _ = self.core.add_peer(c);
            }
            Recorded::RemovePeer { address } => {
                self.core.remove_peer(address);
            }
            Recorded::Announce { prefix, next_hop } => self.core.announce(prefix, next_hop),
            Recorded::Withdraw { prefix } => self.core.withdraw(prefix),
            Recorded::Connection {
                peer,
                conn,
                local,
                inbound,
            } => {
                self.cxts.insert(conn, initial_decode_cxt());
                self.core.connection(peer, conn, local, inbound);
            }
            Recorded::ConnectFailed { peer } => self.core.connect_failed(peer),
            Recorded::Frame { conn, octets } => {
                let octets = from_hex(&octets).ok_or("octets: not hex")?;
                if self.core.conn_peer(conn).is_none() {
                    return Ok(());
                }
                let cxt = self.cxts.entry(conn).or_insert_with(initial_decode_cxt);
                let msg = match get_message_len(&octets) {
                    Err(e) => Err(e),
                    Ok(Some(len)) if len <= octets.len() => decode_frame(&octets[..len], cxt),
                    Ok(_) => return Err("a frame shorter than its header says".into()),
                };
                self.core.received(conn, msg);
            }
            Recorded::Closed { conn } => self.core.closed(conn),
            Recorded::Timer { peer, timer, conn } => {
                let need_conn = || conn.ok_or_else(|| format!("{timer:?} timer without conn"));
                let kind = match timer {
                    TimerName::ConnectRetry => TimerKind::ConnectRetry,
                    TimerName::Hold => TimerKind::Hold(need_conn()?),
                    TimerName::Keepalive => TimerKind::Keepalive(need_conn()?),
                    TimerName::Restart => TimerKind::Restart,
                };
                self.core.timer(peer, kind);
            }
        }
        // What would be sent does not matter here; the RIB's dirty set is
        // cleared as the speaker's flush clears it.
        self.changes.extend(self.core.flush());
        drop(self.core.take_actions());
        self.cxts.retain(|c, _| self.core.conn_peer(*c).is_some());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_as_json_with_the_event_name() {
        let line = Line {
            t_ms: 12,
            input: Recorded::frame(3, &[0xff, 0x00, 0x1d]),
        };
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(
            text,
            r#"{"t_ms":12,"event":"frame","conn":3,"octets":"ff001d"}"#
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line);
        let t = Line {
            t_ms: 5,
            input: Recorded::timer("10.0.0.1".parse().unwrap(), TimerKind::Hold(4)),
        };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(
            text,
            r#"{"t_ms":5,"event":"timer","peer":"10.0.0.1","timer":"hold","conn":4}"#
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), t);
        assert_eq!(from_hex("ff001d"), Some(vec![0xff, 0, 0x1d]));
        assert_eq!(from_hex("f"), None);
    }

    #[test]
    fn a_recording_must_start_with_the_configuration() {
        let e = Replay::from_text("{\"t_ms\":0,\"event\":\"closed\",\"conn\":1}\n")
            .err()
            .unwrap();
        assert!(matches!(e, ReplayError::NoStart), "{e}");
        let e = Replay::from_text("not json\n").err().unwrap();
        assert!(e.to_string().starts_with("line 1:"), "{e}");
    }
}
