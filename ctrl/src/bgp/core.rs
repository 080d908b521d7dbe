//! The speaker's Sans-IO core: every peer's [`Fsm`], the [`Rib`] and what
//! each FSM output does to them, in one place. It owns no socket, task or
//! clock: inputs come in as method calls (a connection came up, a message
//! or a decode error arrived, a timer fired, a command), and the I/O the
//! core wants done comes back as [`Action`]s (connect, send these octets,
//! close, arm a timer). The live speaker ([`super::speaker`]) carries the
//! actions out with tokio tasks; the replay ([`super::record::Replay`])
//! drops them, since their consequences are in the recording.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use ipnet::IpNet;
use tracing::{debug, info, warn};

use super::config::{PeerConfig, PeerStatus, SpeakerConfig, SpeakerError};
use super::fsm::{ConnId, DownReason, Fsm, FsmConfig, Input, Negotiated, Output};
use super::packet::{
    Capability, DecodeCxt, DecodeError, EncodeCxt, MAX_MESSAGE_LEN, Message, UpdateMsg,
};
use super::rib::{PeerInfo, Rib, RouteChange, RouteEntry};

/// A timer of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TimerKind {
    ConnectRetry,
    Hold(ConnId),
    Keepalive(ConnId),
    /// RFC 4724 Restart Time of a peer whose session went down.
    Restart,
}

/// I/O the core asks its driver to do, in order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Start a connection attempt to the peer (its [`Core::peer_config`]).
    Connect(IpAddr),
    /// Write these octets (one or more whole messages) on the connection.
    Send(ConnId, Bytes),
    /// Close the connection after what was sent.
    Close(ConnId),
    /// Arm (`Some(seconds)`) or stop (`None`) a timer of the peer.
    SetTimer(IpAddr, TimerKind, Option<u16>),
    /// The peer's session came up (the driver notes when, for the uptime).
    Established(IpAddr),
}

/// The decode context of a new connection: until the peer's OPEN arrives
/// nothing depends on the AS width.
pub(crate) fn initial_decode_cxt() -> DecodeCxt {
    DecodeCxt {
        four_octet_as: false,
        revised_error_handling: true,
    }
}

/// Decodes one frame of a connection; after the peer's OPEN, AS numbers are
/// four octets if it announced the capability (we always do). Shared by
/// the live reader and the replay so both decode the same octets the same
/// way.
pub(crate) fn decode_frame(frame: &[u8], cxt: &mut DecodeCxt) -> Result<Message, DecodeError> {
    let msg = Message::decode(frame, cxt)?;
    if let Message::Open(open) = &msg {
        cxt.four_octet_as = open.has_capability(|c| matches!(c, Capability::FourOctetAs(_)));
    }
    Ok(msg)
}

/// The IP of an address as the peer table keys it (v4-mapped IPv6 from a
/// dual-stack listener becomes IPv4).
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

struct Peer {
    config: PeerConfig,
    fsm: Fsm,
    /// The established connection and what it negotiated.
    established: Option<(ConnId, Negotiated)>,
    updates_in: u64,
    updates_out: u64,
    last_error: Option<String>,
}

struct Conn {
    peer: IpAddr,
    local: Option<SocketAddr>,
}

/// The FSMs and the RIB of one speaker.
pub(crate) struct Core {
    config: SpeakerConfig,
    rib: Rib,
    peers: HashMap<IpAddr, Peer>,
    conns: HashMap<ConnId, Conn>,
    actions: Vec<Action>,
}

impl Core {
    pub(crate) fn new(config: SpeakerConfig) -> Core {
        Core {
            rib: Rib::new(config.local_as, config.router_id, config.cluster_id),
            config,
            peers: HashMap::new(),
            conns: HashMap::new(),
            actions: Vec::new(),
        }
    }

    pub(crate) fn config(&self) -> &SpeakerConfig {
        &self.config
    }

    /// The I/O asked for since the last call, in order.
    pub(crate) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    pub(crate) fn has_peer(&self, addr: IpAddr) -> bool {
        self.peers.contains_key(&addr)
    }

    pub(crate) fn peer_config(&self, addr: IpAddr) -> Option<&PeerConfig> {
        self.peers.get(&addr).map(|p| &p.config)
    }

    /// The peer a connection belongs to, while the core knows it.
    pub(crate) fn conn_peer(&self, conn: ConnId) -> Option<IpAddr> {
        self.conns.get(&conn).map(|c| c.peer)
    }

    // ===== commands =====

    /// Adds a neighbour and starts its session (ManualStart).
    pub(crate) fn add_peer(&mut self, cfg: PeerConfig) -> Result<(), SpeakerError> {
        if self.peers.contains_key(&cfg.address) {
            return Err(SpeakerError::PeerExists(cfg.address));
        }
        let fsm = Fsm::new(fsm_config(&self.config, &cfg));
        let addr = cfg.address;
        info!(peer = %addr, remote_as = cfg.remote_as, "bgp peer added");
        self.peers.insert(
            addr,
            Peer {
                config: cfg,
                fsm,
                established: None,
                updates_in: 0,
                updates_out: 0,
                last_error: None,
            },
        );
        self.run_fsm(addr, Input::ManualStart);
        Ok(())
    }

    /// Stops the session (ManualStop), forgets the peer and its routes;
    /// its configuration, or `None` for an unknown peer.
    pub(crate) fn remove_peer(&mut self, addr: IpAddr) -> Option<PeerConfig> {
        if !self.peers.contains_key(&addr) {
            return None;
        }
        self.run_fsm(addr, Input::ManualStop);
        let p = self.peers.remove(&addr)?;
        self.rib.peer_down(addr, false);
        Some(p.config)
    }

    pub(crate) fn announce(&mut self, prefix: IpNet, next_hop: IpAddr) {
        self.rib.announce_local(prefix, next_hop);
    }

    pub(crate) fn withdraw(&mut self, prefix: IpNet) {
        self.rib.withdraw_local(prefix);
    }

    /// ManualStop for every peer (the speaker's shutdown).
    pub(crate) fn stop_all(&mut self) {
        let addrs: Vec<IpAddr> = self.peers.keys().copied().collect();
        for a in addrs {
            self.run_fsm(a, Input::ManualStop);
        }
    }

    /// State and counters of every peer, sorted by address; `uptime` gives
    /// the seconds an established peer has been up.
    pub(crate) fn peers(&self, uptime: impl Fn(IpAddr) -> Option<u64>) -> Vec<PeerStatus> {
        let mut v: Vec<PeerStatus> = self
            .peers
            .iter()
            .map(|(a, p)| PeerStatus {
                address: *a,
                remote_as: p.config.remote_as,
                state: p.fsm.state(),
                rr_client: p.config.rr_client,
                uptime_secs: p.established.as_ref().and_then(|_| uptime(*a)),
                prefixes_in: self.rib.prefixes_in(*a),
                prefixes_out: self.rib.prefixes_out(*a),
                updates_in: p.updates_in,
                updates_out: p.updates_out,
                last_error: p.last_error.clone(),
            })
            .collect();
        v.sort_by_key(|s| s.address);
        v
    }

    /// Every path in the Loc-RIB.
    pub(crate) fn routes(&self) -> Vec<RouteEntry> {
        self.rib.routes()
    }

    // ===== what happened to connections and timers =====

    /// A connection with a known peer came up (`inbound`: it connected to
    /// us): TcpConnectionConfirmed or TcpCrAcked.
    pub(crate) fn connection(
        &mut self,
        peer: IpAddr,
        conn: ConnId,
        local: Option<SocketAddr>,
        inbound: bool,
    ) {
        self.conns.insert(conn, Conn { peer, local });
        let input = if inbound {
            Input::TcpConnectionConfirmed(conn)
        } else {
            Input::TcpCrAcked(conn)
        };
        self.run_fsm(peer, input);
    }

    /// Our connection attempt failed: TcpConnectFailed.
    pub(crate) fn connect_failed(&mut self, peer: IpAddr) {
        self.run_fsm(peer, Input::TcpConnectFailed);
    }

    /// A message, or the error decoding it, on a connection.
    pub(crate) fn received(&mut self, conn: ConnId, msg: Result<Message, DecodeError>) {
        let Some(peer) = self.conn_peer(conn) else {
            return;
        };
        let input = match msg {
            Ok(m) => Input::Message(conn, m),
            Err(e) => {
                warn!(%peer, error = %e, "bgp message error");
                Input::DecodeError(conn, e)
            }
        };
        self.run_fsm(peer, input);
    }

    /// The connection closed: TcpConnectionFails.
    pub(crate) fn closed(&mut self, conn: ConnId) {
        if let Some(peer) = self.conn_peer(conn) {
            self.run_fsm(peer, Input::TcpConnectionFails(conn));
        }
    }

    /// A timer fired (the driver checks it was still armed).
    pub(crate) fn timer(&mut self, peer: IpAddr, kind: TimerKind) {
        let input = match kind {
            TimerKind::ConnectRetry => Input::ConnectRetryTimerExpired,
            TimerKind::Hold(id) => Input::HoldTimerExpired(id),
            TimerKind::Keepalive(id) => Input::KeepaliveTimerExpired(id),
            TimerKind::Restart => {
                info!(%peer, "graceful restart time over: stale routes removed");
                self.rib.remove_stale(peer, None);
                return;
            }
        };
        self.run_fsm(peer, input);
    }

    /// After a batch of inputs: the UPDATEs the RIB's changes call for
    /// (as `Send` actions) and the best-route changes for the daemon.
    pub(crate) fn flush(&mut self) -> Vec<RouteChange> {
        let dirty = self.rib.take_dirty();
        if !dirty.is_empty() {
            let up: Vec<IpAddr> = self
                .peers
                .iter()
                .filter(|(_, p)| p.established.is_some())
                .map(|(a, _)| *a)
                .collect();
            for a in up {
                let msgs = self.rib.updates_for(a, &dirty);
                self.send_updates(a, msgs);
            }
        }
        self.rib.take_changes()
    }

    // ===== FSM outputs: the one place each is handled =====

    fn run_fsm(&mut self, peer: IpAddr, input: Input) {
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            for o in p.fsm.process(input) {
                self.apply(peer, o, &mut queue);
            }
        }
    }

    fn apply(&mut self, peer: IpAddr, output: Output, queue: &mut VecDeque<Input>) {
        match output {
            Output::Connect => self.actions.push(Action::Connect(peer)),
            Output::Send(id, msg) => self.send(peer, id, msg),
            Output::Close(id) => {
                if self.conns.remove(&id).is_some() {
                    self.actions.push(Action::Close(id));
                }
            }
            Output::SetConnectRetryTimer(s) => self.set_timer(peer, TimerKind::ConnectRetry, s),
            Output::SetHoldTimer(id, s) => self.set_timer(peer, TimerKind::Hold(id), s),
            Output::SetKeepaliveTimer(id, s) => self.set_timer(peer, TimerKind::Keepalive(id), s),
            Output::Established(id, neg) => self.established(peer, id, neg),
            Output::Update(u) => {
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                p.updates_in += 1;
                let max = p.config.max_prefixes;
                if let Some(input) = self.rib_update(peer, &u, max) {
                    queue.push_back(input);
                }
            }
            Output::RouteRefresh(_) => {
                if let Some(info) = self.peer_info(peer) {
                    self.rib.peer_up(info);
                    let all = self.rib.all_prefixes();
                    let msgs = self.rib.updates_for(peer, &all);
                    self.send_updates(peer, msgs);
                }
            }
            Output::Down { reason, graceful } => {
                let text = down_text(&reason);
                info!(%peer, reason = %text, graceful, "bgp session down");
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                p.last_error = Some(text);
                let restart = p
                    .established
                    .take()
                    .and_then(|e| e.1.peer_graceful_restart)
                    .map(|g| g.restart_time)
                    .filter(|t| *t > 0);
                // Held stale when the end was graceful and the peer
                // announced a restart time, else withdrawn.
                let graceful = graceful && restart.is_some();
                self.rib.peer_down(peer, graceful);
                if graceful {
                    self.set_timer(peer, TimerKind::Restart, restart);
                }
            }
        }
    }

    fn set_timer(&mut self, peer: IpAddr, kind: TimerKind, secs: Option<u16>) {
        self.actions.push(Action::SetTimer(peer, kind, secs));
    }

    /// An UPDATE from an established peer into the RIB; the input to feed
    /// back to the FSM when it breaks the peer's max-prefix limit.
    fn rib_update(&mut self, peer: IpAddr, u: &UpdateMsg, max: Option<u32>) -> Option<Input> {
        if let Some(family) = u.end_of_rib_family() {
            debug!(%peer, ?family, "bgp End-of-RIB");
            self.rib.end_of_rib(peer, family);
            return None;
        }
        if let Some(e) = &u.treat_as_withdraw {
            warn!(%peer, error = %e, "bgp UPDATE treated as withdraw (RFC 7606)");
        }
        match self.rib.update_from_peer(peer, u, max) {
            Ok(_) => None,
            Err(e) => {
                warn!(%peer, limit = e.limit, "bgp max prefixes exceeded");
                Some(Input::MaxPrefixExceeded {
                    afi: e.afi,
                    safi: e.safi,
                    limit: e.limit,
                })
            }
        }
    }

    fn send(&mut self, peer: IpAddr, id: ConnId, msg: Message) {
        if !self.conns.contains_key(&id) {
            return;
        }
        let cxt = self
            .peers
            .get(&peer)
            .and_then(|p| p.established.as_ref())
            .filter(|e| e.0 == id)
            .map(|e| e.1.encode_cxt())
            .unwrap_or_default();
        self.actions.push(Action::Send(id, msg.encode(&cxt)));
    }

    fn send_updates(&mut self, peer: IpAddr, msgs: Vec<UpdateMsg>) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some((id, neg)) = &p.established else {
            return;
        };
        if !self.conns.contains_key(id) {
            return;
        }
        let cxt = neg.encode_cxt();
        let mut out = Vec::with_capacity(msgs.len());
        for mut u in msgs {
            if !cxt.four_octet_as
                && let Some(a) = u.attrs.as_mut()
                && a.as_path.as_ref().is_some_and(|p| p.needs_four_octets())
            {
                // RFC 6793 §4.2.2: the real path travels in AS4_PATH.
                a.as4_path = a.as_path.clone();
            }
            encode_update(u, &cxt, &mut out);
        }
        p.updates_out += out.len() as u64;
        let id = *id;
        self.actions
            .extend(out.into_iter().map(|b| Action::Send(id, b)));
    }

    /// The RIB's view of an established peer.
    fn peer_info(&self, peer: IpAddr) -> Option<PeerInfo> {
        let p = self.peers.get(&peer)?;
        let (id, neg) = p.established.as_ref()?;
        let local = self.conns.get(id).and_then(|c| c.local);
        Some(peer_info_of(
            peer,
            neg,
            local,
            p.config.rr_client,
            self.config.ipv6_next_hop,
        ))
    }

    fn established(&mut self, peer: IpAddr, id: ConnId, neg: Negotiated) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        info!(%peer, remote_as = neg.remote_as, hold = neg.hold_time, "bgp session established");
        let families = neg.families.clone();
        p.established = Some((id, neg));
        p.last_error = None;
        self.actions.push(Action::Established(peer));
        let Some(info) = self.peer_info(peer) else {
            return;
        };
        self.rib.peer_up(info);
        let all = self.rib.all_prefixes();
        let mut msgs = self.rib.updates_for(peer, &all);
        // RFC 4724 §2: End-of-RIB after the initial table, per family.
        msgs.extend(
            families
                .iter()
                .map(|&(afi, safi)| UpdateMsg::end_of_rib(afi, safi)),
        );
        self.send_updates(peer, msgs);
    }
}

/// The FSM configuration of a peer.
fn fsm_config(speaker: &SpeakerConfig, cfg: &PeerConfig) -> FsmConfig {
    FsmConfig {
        local_as: speaker.local_as,
        remote_as: cfg.remote_as,
        router_id: speaker.router_id,
        hold_time: cfg.hold_time,
        keepalive: cfg.keepalive,
        min_hold_time: 3,
        connect_retry: cfg.connect_retry,
        passive: cfg.passive,
        families: cfg.families.clone(),
        graceful_restart: speaker.graceful_restart_time,
    }
}

/// The RIB's view of an established peer.
fn peer_info_of(
    peer: IpAddr,
    neg: &Negotiated,
    local: Option<SocketAddr>,
    rr_client: bool,
    ipv6_next_hop: Option<Ipv6Addr>,
) -> PeerInfo {
    let local = local.map(|l| canonical(l.ip()));
    PeerInfo {
        addr: peer,
        remote_as: neg.remote_as,
        router_id: neg.remote_id,
        rr_client,
        local_v4: match local {
            Some(IpAddr::V4(a)) => Some(a),
            _ => None,
        },
        local_v6: match local {
            Some(IpAddr::V6(a)) => Some(a),
            _ => ipv6_next_hop,
        },
        families: neg.families.clone(),
    }
}

fn down_text(reason: &DownReason) -> String {
    match reason {
        DownReason::AdminStop => "administratively stopped".into(),
        DownReason::HoldTimerExpired => "hold timer expired".into(),
        DownReason::TcpFailed => "connection closed".into(),
        DownReason::Sent(n) => format!("sent NOTIFICATION {}/{}", n.code, n.subcode),
        DownReason::Received(n) => format!("received NOTIFICATION {}/{}", n.code, n.subcode),
    }
}

/// Encodes an UPDATE, splitting it if it would exceed 4096 octets.
fn encode_update(u: UpdateMsg, cxt: &EncodeCxt, out: &mut Vec<Bytes>) {
    let bytes = Message::Update(u.clone()).encode(cxt);
    if bytes.len() <= MAX_MESSAGE_LEN {
        out.push(bytes);
        return;
    }
    let mut a = u.clone();
    let mut b = u;
    if a.nlri.len() > 1 {
        b.nlri = a.nlri.split_off(a.nlri.len() / 2);
        b.withdrawn.clear();
        b.mp_unreach = None;
        b.mp_reach = None;
        a.mp_reach = None;
        a.mp_unreach = None;
        if b.attrs.is_some() {
            encode_update(a, cxt, out);
            encode_update(b, cxt, out);
        }
    } else if let Some(r) = a.mp_reach.as_mut().filter(|r| r.nlri.len() > 1) {
        let rest = r.nlri.split_off(r.nlri.len() / 2);
        if let Some(rb) = b.mp_reach.as_mut() {
            rb.nlri = rest;
        }
        encode_update(a, cxt, out);
        encode_update(b, cxt, out);
    } else {
        warn!("dropping an UPDATE that does not fit in 4096 octets");
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::bgp::packet::{Attrs, Origin};

    #[test]
    fn oversized_update_is_split_into_messages_that_fit() {
        let nlri: Vec<ipnet::Ipv4Net> = (0..2000u32)
            .map(|i| ipnet::Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap())
            .collect();
        let u = UpdateMsg {
            attrs: Some(Attrs {
                origin: Some(Origin::Igp),
                as_path: Some(Default::default()),
                next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
                ..Default::default()
            }),
            nlri: nlri.clone(),
            ..Default::default()
        };
        let mut out = Vec::new();
        encode_update(u, &EncodeCxt::default(), &mut out);
        assert!(out.len() >= 2);
        let mut seen = Vec::new();
        for b in &out {
            assert!(b.len() <= MAX_MESSAGE_LEN);
            let Message::Update(u) = Message::decode(b, &DecodeCxt::default()).unwrap() else {
                panic!()
            };
            seen.extend(u.nlri);
        }
        assert_eq!(seen, nlri);
    }

    #[test]
    fn a_new_peer_asks_for_a_connection_and_a_removed_one_is_forgotten() {
        let mut core = Core::new(SpeakerConfig::new(65001, Ipv4Addr::new(10, 0, 0, 1)));
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        core.add_peer(PeerConfig::new(peer, 65002)).unwrap();
        let actions = core.take_actions();
        assert!(actions.contains(&Action::Connect(peer)), "{actions:?}");
        assert!(matches!(
            core.add_peer(PeerConfig::new(peer, 65002)),
            Err(SpeakerError::PeerExists(_))
        ));
        core.connection(peer, 7, None, false);
        let actions = core.take_actions();
        assert!(
            actions.iter().any(|a| matches!(a, Action::Send(7, _))),
            "an OPEN goes out: {actions:?}"
        );
        assert_eq!(core.conn_peer(7), Some(peer));
        assert!(core.remove_peer(peer).is_some());
        assert!(core.take_actions().contains(&Action::Close(7)));
        assert!(!core.has_peer(peer));
        assert_eq!(core.conn_peer(7), None);
        assert!(core.remove_peer(peer).is_none());
    }
}
