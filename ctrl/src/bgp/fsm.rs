//! The BGP finite-state machine of RFC 4271 §8 for one peer, as Sans-IO
//! logic: [`Fsm::process`] takes an [`Input`] (an RFC 4271 event: a timer
//! that fired, a TCP event, a decoded message) and returns the [`Output`]s
//! to carry out (send, close, connect, arm a timer, hand an UPDATE to the
//! RIB). It owns no socket and reads no clock.
//!
//! Up to two TCP connections can exist for a peer at once (one we opened,
//! one the peer opened); connection collisions are resolved as in RFC 4271
//! §6.8 by comparing BGP identifiers.

use std::net::Ipv4Addr;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::packet::{
    Capability, DecodeCxt, DecodeError, EncodeCxt, GracefulRestartCap, Message, NotificationMsg,
    OpenError, OpenMsg, RouteRefreshMsg, UpdateMsg, cease, error_code,
};

/// Identifies one TCP connection; allocated by the I/O side.
pub type ConnId = u64;

/// RFC 4271 §8.2.2 states, for the peer as a whole (the most advanced of
/// its connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

/// Who opened a connection (for collision resolution).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Direction {
    Outgoing,
    Incoming,
}

/// What the FSM is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsmConfig {
    pub local_as: u32,
    pub remote_as: u32,
    pub router_id: Ipv4Addr,
    /// Hold time we propose (0, or at least 3 seconds).
    pub hold_time: u16,
    /// Keepalive interval; `None` means a third of the negotiated hold time.
    pub keepalive: Option<u16>,
    /// Smallest non-zero hold time we accept from the peer.
    pub min_hold_time: u16,
    pub connect_retry: u16,
    /// Never open connections, only accept them.
    pub passive: bool,
    /// (AFI, SAFI) we announce in multiprotocol capabilities.
    pub families: Vec<(u16, u8)>,
    /// Restart time we announce in the graceful-restart capability.
    pub graceful_restart: Option<u16>,
}

/// What both OPENs agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub remote_as: u32,
    pub remote_id: Ipv4Addr,
    pub hold_time: u16,
    pub keepalive: u16,
    pub four_octet_as: bool,
    pub route_refresh: bool,
    pub families: Vec<(u16, u8)>,
    /// The peer's graceful-restart capability, if it sent one.
    pub peer_graceful_restart: Option<GracefulRestartCap>,
}

impl Negotiated {
    pub fn decode_cxt(&self) -> DecodeCxt {
        DecodeCxt {
            four_octet_as: self.four_octet_as,
            revised_error_handling: true,
        }
    }
    pub fn encode_cxt(&self) -> EncodeCxt {
        EncodeCxt {
            four_octet_as: self.four_octet_as,
        }
    }
}

/// RFC 4271 §8.1 events, by their RFC names.
// Messages, mostly UPDATEs, are the common input; boxing them would cost an
// allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Event 1: ManualStart.
    ManualStart,
    /// Event 2: ManualStop.
    ManualStop,
    /// Event 3: AutomaticStart.
    AutomaticStart,
    /// Event 9: ConnectRetryTimer_Expires.
    ConnectRetryTimerExpired,
    /// Event 10: HoldTimer_Expires.
    HoldTimerExpired(ConnId),
    /// Event 11: KeepaliveTimer_Expires.
    KeepaliveTimerExpired(ConnId),
    /// Event 16: Tcp_CR_Acked (our connection attempt succeeded).
    TcpCrAcked(ConnId),
    /// Event 17: TcpConnectionConfirmed (the peer connected to us).
    TcpConnectionConfirmed(ConnId),
    /// Event 18: TcpConnectionFails, for our pending connection attempt.
    TcpConnectFailed,
    /// Event 18: TcpConnectionFails, for an open connection.
    TcpConnectionFails(ConnId),
    /// Events 19 (BGPOpen), 25 (NotifMsg), 26 (KeepAliveMsg), 27
    /// (UpdateMsg) and ROUTE-REFRESH.
    Message(ConnId, Message),
    /// Events 21 (BGPHeaderErr), 22 (BGPOpenMsgErr), 28 (UpdateMsgErr).
    DecodeError(ConnId, DecodeError),
    /// RFC 4486: the RIB counted more prefixes from this peer than allowed.
    MaxPrefixExceeded { afi: u16, safi: u8, limit: u32 },
}

/// Why an established session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownReason {
    AdminStop,
    HoldTimerExpired,
    TcpFailed,
    /// We sent this NOTIFICATION.
    Sent(NotificationMsg),
    /// The peer sent this NOTIFICATION.
    Received(NotificationMsg),
}

/// Actions for the I/O side.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Open a TCP connection to the peer; answer with `TcpCrAcked` or
    /// `TcpConnectFailed`.
    Connect,
    /// Send a message on a connection.
    Send(ConnId, Message),
    /// Close a connection (after the sends before it).
    Close(ConnId),
    /// (Re)arm the ConnectRetry timer in seconds, or stop it.
    SetConnectRetryTimer(Option<u16>),
    /// (Re)arm a connection's hold timer, or stop it.
    SetHoldTimer(ConnId, Option<u16>),
    /// (Re)arm a connection's keepalive timer, or stop it.
    SetKeepaliveTimer(ConnId, Option<u16>),
    /// The session is up on this connection.
    Established(ConnId, Negotiated),
    /// An UPDATE for the RIB.
    Update(UpdateMsg),
    /// The peer asks us to send our routes again.
    RouteRefresh(RouteRefreshMsg),
    /// The established session is gone. `graceful`: the peer supports
    /// graceful restart and the session did not end by NOTIFICATION or
    /// by us, so its routes are kept as stale (RFC 4724 §4.2).
    Down { reason: DownReason, graceful: bool },
}

/// Hold time used while waiting for the peer's OPEN (RFC 4271 §8.2.2:
/// "a large value", 4 minutes suggested).
pub const LARGE_HOLD_TIME: u16 = 240;

#[derive(Clone, Debug)]
struct Conn {
    id: ConnId,
    direction: Direction,
    state: State,
    negotiated: Option<Negotiated>,
}

/// One peer's state machine.
#[derive(Debug)]
pub struct Fsm {
    config: FsmConfig,
    /// Idle, Connect or Active when no connection is open.
    base: State,
    connecting: bool,
    conns: Vec<Conn>,
    /// Set by ManualStop and by max-prefix: no automatic restart.
    stopped: bool,
}

impl Fsm {
    pub fn new(config: FsmConfig) -> Self {
        Self {
            config,
            base: State::Idle,
            connecting: false,
            conns: Vec::new(),
            stopped: true,
        }
    }

    pub fn config(&self) -> &FsmConfig {
        &self.config
    }

    /// The peer's state: that of its most advanced connection.
    pub fn state(&self) -> State {
        self.conns
            .iter()
            .map(|c| c.state)
            .max()
            .unwrap_or(self.base)
    }

    /// The established connection and what it negotiated.
    pub fn established(&self) -> Option<(ConnId, &Negotiated)> {
        self.conns
            .iter()
            .find(|c| c.state == State::Established)
            .and_then(|c| c.negotiated.as_ref().map(|n| (c.id, n)))
    }

    /// Our OPEN message.
    pub fn open_message(&self) -> OpenMsg {
        let c = &self.config;
        let mut caps: Vec<Capability> = c
            .families
            .iter()
            .map(|&(afi, safi)| Capability::MultiProtocol { afi, safi })
            .collect();
        caps.push(Capability::RouteRefresh);
        caps.push(Capability::FourOctetAs(c.local_as));
        if let Some(t) = c.graceful_restart {
            caps.push(Capability::GracefulRestart(GracefulRestartCap {
                restarting: false,
                restart_time: t,
                families: c.families.iter().map(|&(a, s)| (a, s, false)).collect(),
            }));
        }
        OpenMsg::new(c.local_as, c.hold_time, c.router_id, caps)
    }

    /// Feeds one event; returns what to do.
    pub fn process(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::ManualStart | Input::AutomaticStart => {
                if matches!(input, Input::ManualStart) {
                    self.stopped = false;
                }
                if self.state() == State::Idle && !self.stopped {
                    self.start(&mut out);
                }
            }
            Input::ManualStop => {
                self.stopped = true;
                let n = NotificationMsg::new(error_code::CEASE, cease::ADMIN_SHUTDOWN);
                for id in self.conn_ids() {
                    self.drop_conn(id, Some(n.clone()), DownReason::AdminStop, &mut out);
                }
                self.connecting = false;
                self.base = State::Idle;
                out.push(Output::SetConnectRetryTimer(None));
            }
            Input::ConnectRetryTimerExpired => match self.state() {
                State::Idle if !self.stopped => self.start(&mut out),
                State::Connect | State::Active if !self.config.passive => {
                    self.base = State::Connect;
                    self.connecting = true;
                    out.push(Output::Connect);
                    out.push(Output::SetConnectRetryTimer(Some(
                        self.config.connect_retry,
                    )));
                }
                _ => {}
            },
            Input::HoldTimerExpired(id) => {
                if self.conn(id).is_some() {
                    let n = NotificationMsg::new(error_code::HOLD_TIMER_EXPIRED, 0);
                    self.drop_conn(id, Some(n), DownReason::HoldTimerExpired, &mut out);
                    self.after_drop(&mut out);
                }
            }
            Input::KeepaliveTimerExpired(id) => {
                if let Some(c) = self.conn(id)
                    && matches!(c.state, State::OpenConfirm | State::Established)
                {
                    let ka = c.negotiated.as_ref().map(|n| n.keepalive).unwrap_or(0);
                    out.push(Output::Send(id, Message::Keepalive));
                    if ka > 0 {
                        out.push(Output::SetKeepaliveTimer(id, Some(ka)));
                    }
                }
            }
            Input::TcpCrAcked(id) => {
                self.connecting = false;
                self.accept_conn(id, Direction::Outgoing, &mut out);
            }
            Input::TcpConnectionConfirmed(id) => {
                self.accept_conn(id, Direction::Incoming, &mut out);
            }
            Input::TcpConnectFailed => {
                // Event 18 in Connect: wait in Active for the ConnectRetry
                // timer or for the peer to connect.
                self.connecting = false;
                if self.base == State::Connect {
                    self.base = State::Active;
                }
            }
            Input::TcpConnectionFails(id) => {
                if self.conn(id).is_some() {
                    self.drop_conn(id, None, DownReason::TcpFailed, &mut out);
                    self.after_drop(&mut out);
                }
            }
            Input::Message(id, msg) => self.on_message(id, msg, &mut out),
            Input::DecodeError(id, e) => {
                if self.conn(id).is_some() {
                    // RFC 4271 §6.4: a bad NOTIFICATION is not answered.
                    let n = match e {
                        DecodeError::NotificationLength => None,
                        ref e => Some(NotificationMsg::from(e)),
                    };
                    let reason = n
                        .clone()
                        .map(DownReason::Sent)
                        .unwrap_or(DownReason::TcpFailed);
                    self.drop_conn(id, n, reason, &mut out);
                    self.after_drop(&mut out);
                }
            }
            Input::MaxPrefixExceeded { afi, safi, limit } => {
                if let Some((id, _)) = self.established() {
                    // RFC 4486 §4: AFI, SAFI and the upper bound as data.
                    let mut data = BytesMut::with_capacity(7);
                    data.put_u16(afi);
                    data.put_u8(safi);
                    data.put_u32(limit);
                    let n = NotificationMsg {
                        code: error_code::CEASE,
                        subcode: cease::MAX_PREFIXES,
                        data: data.freeze(),
                    };
                    self.stopped = true;
                    self.drop_conn(id, Some(n.clone()), DownReason::Sent(n), &mut out);
                    self.after_drop(&mut out);
                }
            }
        }
        out
    }

    fn start(&mut self, out: &mut Vec<Output>) {
        if self.config.passive {
            // Passive TCP establishment: wait in Active.
            self.base = State::Active;
        } else {
            self.base = State::Connect;
            self.connecting = true;
            out.push(Output::Connect);
            out.push(Output::SetConnectRetryTimer(Some(
                self.config.connect_retry,
            )));
        }
    }

    fn conn_ids(&self) -> Vec<ConnId> {
        self.conns.iter().map(|c| c.id).collect()
    }

    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns.iter().find(|c| c.id == id)
    }

    fn accept_conn(&mut self, id: ConnId, direction: Direction, out: &mut Vec<Output>) {
        // Idle refuses connections; a session that is up keeps its
        // connection (RFC 4271 §6.8 collision with Established); and at most
        // one connection per direction.
        if self.state() == State::Idle
            || self.state() == State::Established
            || self.conns.iter().any(|c| c.direction == direction)
        {
            out.push(Output::Close(id));
            return;
        }
        self.conns.push(Conn {
            id,
            direction,
            state: State::OpenSent,
            negotiated: None,
        });
        out.push(Output::SetConnectRetryTimer(None));
        out.push(Output::Send(id, Message::Open(self.open_message())));
        out.push(Output::SetHoldTimer(id, Some(LARGE_HOLD_TIME)));
    }

    /// Sends `notification` (if any) and closes the connection; reports the
    /// session down if it was established.
    fn drop_conn(
        &mut self,
        id: ConnId,
        notification: Option<NotificationMsg>,
        reason: DownReason,
        out: &mut Vec<Output>,
    ) {
        let Some(pos) = self.conns.iter().position(|c| c.id == id) else {
            return;
        };
        let conn = self.conns.remove(pos);
        if let Some(n) = notification
            && conn.state >= State::OpenSent
        {
            out.push(Output::Send(id, Message::Notification(n)));
        }
        out.push(Output::SetHoldTimer(id, None));
        out.push(Output::SetKeepaliveTimer(id, None));
        out.push(Output::Close(id));
        if conn.state == State::Established {
            // RFC 4724 §4.2: routes are kept only when the session ended
            // without a NOTIFICATION and not by our own choice.
            let graceful = conn
                .negotiated
                .as_ref()
                .is_some_and(|n| n.peer_graceful_restart.is_some())
                && matches!(reason, DownReason::HoldTimerExpired | DownReason::TcpFailed);
            out.push(Output::Down { reason, graceful });
        }
    }

    /// With no connection left the FSM falls back to Active (automatic
    /// restart) or Idle (stopped).
    fn after_drop(&mut self, out: &mut Vec<Output>) {
        if !self.conns.is_empty() {
            return;
        }
        if self.stopped {
            self.base = State::Idle;
            self.connecting = false;
            out.push(Output::SetConnectRetryTimer(None));
        } else {
            // Event 3 AutomaticStart with passive TCP establishment: accept
            // the peer's connection at once, try our own when the
            // ConnectRetry timer fires.
            if !self.connecting {
                self.base = State::Active;
            }
            out.push(Output::SetConnectRetryTimer(Some(
                self.config.connect_retry,
            )));
        }
    }

    fn fsm_error(&mut self, id: ConnId, state: State, out: &mut Vec<Output>) {
        // RFC 6608 subcodes: unexpected message in OpenSent (1),
        // OpenConfirm (2), Established (3).
        let sub = match state {
            State::OpenSent => 1,
            State::OpenConfirm => 2,
            _ => 3,
        };
        let n = NotificationMsg::new(error_code::FSM, sub);
        self.drop_conn(id, Some(n.clone()), DownReason::Sent(n), out);
        self.after_drop(out);
    }

    fn on_message(&mut self, id: ConnId, msg: Message, out: &mut Vec<Output>) {
        let Some(conn) = self.conn(id) else { return };
        let state = conn.state;
        match (msg, state) {
            // Event 25 NotifMsg, any state: close without answering.
            (Message::Notification(n), _) => {
                self.drop_conn(id, None, DownReason::Received(n), out);
                self.after_drop(out);
            }
            // Event 19 BGPOpen in OpenSent.
            (Message::Open(open), State::OpenSent) => match self.check_open(&open) {
                Err(e) => {
                    let n = NotificationMsg::from(&e);
                    self.drop_conn(id, Some(n.clone()), DownReason::Sent(n), out);
                    self.after_drop(out);
                }
                Ok(neg) => {
                    let remote_id = neg.remote_id;
                    let (hold, ka) = (neg.hold_time, neg.keepalive);
                    if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
                        c.state = State::OpenConfirm;
                        c.negotiated = Some(neg);
                    }
                    out.push(Output::Send(id, Message::Keepalive));
                    out.push(Output::SetHoldTimer(id, (hold > 0).then_some(hold)));
                    out.push(Output::SetKeepaliveTimer(id, (ka > 0).then_some(ka)));
                    self.resolve_collision(id, remote_id, out);
                }
            },
            // Event 26 KeepAliveMsg in OpenConfirm: the session is up.
            (Message::Keepalive, State::OpenConfirm) => {
                let Some(c) = self.conns.iter_mut().find(|c| c.id == id) else {
                    return;
                };
                let Some(neg) = c.negotiated.clone() else {
                    return;
                };
                c.state = State::Established;
                out.push(Output::SetHoldTimer(
                    id,
                    (neg.hold_time > 0).then_some(neg.hold_time),
                ));
                out.push(Output::Established(id, neg));
                // The other connection, if any, has lost (RFC 4271 §6.8).
                for other in self.conn_ids().into_iter().filter(|o| *o != id) {
                    let n = NotificationMsg::new(error_code::CEASE, cease::CONNECTION_COLLISION);
                    self.drop_conn(other, Some(n.clone()), DownReason::Sent(n), out);
                }
            }
            // Event 26 KeepAliveMsg in Established: restart the hold timer.
            (Message::Keepalive, State::Established) => {
                self.restart_hold_timer(id, out);
            }
            // Event 27 UpdateMsg in Established.
            (Message::Update(u), State::Established) => {
                self.restart_hold_timer(id, out);
                out.push(Output::Update(u));
            }
            (Message::RouteRefresh(r), State::Established) => {
                self.restart_hold_timer(id, out);
                out.push(Output::RouteRefresh(r));
            }
            // Anything else is an FSM error (Events 19, 26, 27 out of place).
            (_, state) => self.fsm_error(id, state, out),
        }
    }

    fn restart_hold_timer(&self, id: ConnId, out: &mut Vec<Output>) {
        if let Some(n) = self.conn(id).and_then(|c| c.negotiated.as_ref())
            && n.hold_time > 0
        {
            out.push(Output::SetHoldTimer(id, Some(n.hold_time)));
        }
    }

    /// RFC 4271 §6.2 checks of the peer's OPEN against our configuration,
    /// and capability negotiation.
    fn check_open(&self, open: &OpenMsg) -> Result<Negotiated, DecodeError> {
        let c = &self.config;
        let remote_as = open.real_as();
        if remote_as != c.remote_as {
            return Err(OpenError::BadPeerAs(remote_as).into());
        }
        // RFC 6286 §2.2: identical identifiers only matter within an AS.
        if open.identifier == c.router_id && remote_as == c.local_as {
            return Err(OpenError::BadBgpIdentifier(open.identifier).into());
        }
        if open.hold_time != 0 && open.hold_time < c.min_hold_time.max(3) {
            return Err(OpenError::UnacceptableHoldTime(open.hold_time).into());
        }
        let peer_families: Vec<(u16, u8)> = open
            .capabilities
            .iter()
            .filter_map(|cap| match cap {
                Capability::MultiProtocol { afi, safi } => Some((*afi, *safi)),
                _ => None,
            })
            .collect();
        // RFC 4760 §8: without multiprotocol capabilities the peer speaks
        // IPv4 unicast only.
        let peer_families = if peer_families.is_empty() {
            vec![(super::packet::AFI_IPV4, super::packet::SAFI_UNICAST)]
        } else {
            peer_families
        };
        let families: Vec<(u16, u8)> = c
            .families
            .iter()
            .copied()
            .filter(|f| peer_families.contains(f))
            .collect();
        if families.is_empty() {
            // RFC 5492 §3: no address family in common, so the capability
            // we need is unsupported; the data lists what we wanted.
            let mut data = BytesMut::new();
            for &(afi, safi) in &c.families {
                data.put_slice(&Capability::MultiProtocol { afi, safi }.to_bytes());
            }
            return Err(OpenError::UnsupportedCapability(data.freeze()).into());
        }
        let hold_time = if c.hold_time == 0 || open.hold_time == 0 {
            0
        } else {
            c.hold_time.min(open.hold_time)
        };
        let keepalive = match c.keepalive {
            _ if hold_time == 0 => 0,
            Some(k) => k.min(hold_time / 3).max(1),
            None => (hold_time / 3).max(1),
        };
        Ok(Negotiated {
            remote_as,
            remote_id: open.identifier,
            hold_time,
            keepalive,
            four_octet_as: open.has_capability(|c| matches!(c, Capability::FourOctetAs(_))),
            route_refresh: open.has_capability(|c| matches!(c, Capability::RouteRefresh)),
            families,
            peer_graceful_restart: open.capabilities.iter().find_map(|c| match c {
                Capability::GracefulRestart(g) => Some(g.clone()),
                _ => None,
            }),
        })
    }

    /// RFC 4271 §6.8, run when connection `id` has just received the OPEN
    /// from `remote_id`.
    fn resolve_collision(&mut self, id: ConnId, remote_id: Ipv4Addr, out: &mut Vec<Output>) {
        let Some(other) = self.conns.iter().find(|c| c.id != id).cloned() else {
            return;
        };
        let Some(me) = self.conn(id).cloned() else {
            return;
        };
        let loser = match other.state {
            // The session is already up: the newcomer goes.
            State::Established => me.id,
            // Both know the peer's identifier: the lower identifier's own
            // connection is closed.
            State::OpenConfirm => {
                let close_local = u32::from(self.config.router_id) < u32::from(remote_id);
                let local_initiated = [&me, &other]
                    .into_iter()
                    .find(|c| c.direction == Direction::Outgoing)
                    .map(|c| c.id);
                let remote_initiated = [&me, &other]
                    .into_iter()
                    .find(|c| c.direction == Direction::Incoming)
                    .map(|c| c.id);
                match if close_local {
                    local_initiated
                } else {
                    remote_initiated
                } {
                    Some(l) => l,
                    None => return,
                }
            }
            // The other one has not seen an OPEN yet: decide later.
            _ => return,
        };
        let n = NotificationMsg::new(error_code::CEASE, cease::CONNECTION_COLLISION);
        self.drop_conn(loser, Some(n.clone()), DownReason::Sent(n), out);
    }
}

/// Data of a Cease NOTIFICATION with a shutdown communication (RFC 9003).
pub fn shutdown_communication(text: &str) -> Bytes {
    let t = &text.as_bytes()[..text.len().min(255)];
    let mut b = BytesMut::with_capacity(t.len() + 1);
    b.put_u8(t.len() as u8);
    b.put_slice(t);
    b.freeze()
}
