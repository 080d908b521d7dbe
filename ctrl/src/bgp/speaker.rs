//! The BGP speaker as tokio tasks: one owner task holds every peer's
//! [`Fsm`], the [`Rib`] and the timers; the listener, connection attempts,
//! each connection's reader and writer, and every timer run in child tasks
//! that talk to the owner only through typed messages. Child tasks are
//! aborted when their handle is dropped.
//!
//! The daemon drives it through [`Speaker`] and consumes [`RouteChange`]s:
//! the speaker never touches the dataplane itself.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipnet::IpNet;
use serde::Serialize;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::fsm::{ConnId, DownReason, Fsm, FsmConfig, Input, Negotiated, Output, State};
use super::md5::set_md5_key;
use super::packet::{
    AFI_IPV4, AFI_IPV6, Capability, DecodeCxt, DecodeError, EncodeCxt, MAX_MESSAGE_LEN, Message,
    SAFI_UNICAST, UpdateMsg, get_message_len,
};
use super::record::{Recorded, Recorder};

const HEADER_LEN: usize = 19;
use super::rib::{PeerInfo, Rib, RouteChange, RouteEntry};

/// The standard BGP port.
pub const BGP_PORT: u16 = 179;

// ===== configuration =====

/// The speaker as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeakerConfig {
    pub local_as: u32,
    pub router_id: Ipv4Addr,
    /// Where to accept connections (`0.0.0.0:179` usually; port 0 picks a
    /// free port, see [`Speaker::listen_addr`]); `None` for no listener.
    pub listen: Option<SocketAddr>,
    /// Route-reflector cluster ID (RFC 4456); the router ID by default.
    pub cluster_id: Option<Ipv4Addr>,
    /// Restart time we announce for graceful restart (RFC 4724); `None`
    /// leaves the capability out.
    pub graceful_restart_time: Option<u16>,
    /// Next hop for IPv6 routes we announce over IPv4 sessions.
    pub ipv6_next_hop: Option<Ipv6Addr>,
    /// Record every input of the speaker (commands, connections, received
    /// messages, timer events) as JSON lines to this file, for
    /// [`super::record::Replay`].
    pub record: Option<std::path::PathBuf>,
}

impl SpeakerConfig {
    pub fn new(local_as: u32, router_id: Ipv4Addr) -> Self {
        Self {
            local_as,
            router_id,
            listen: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), BGP_PORT)),
            cluster_id: None,
            graceful_restart_time: Some(120),
            ipv6_next_hop: None,
            record: None,
        }
    }
}

/// One neighbour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    pub address: IpAddr,
    /// The peer's port for our outgoing connections.
    pub port: u16,
    pub remote_as: u32,
    /// TCP-MD5 password (RFC 2385).
    pub password: Option<String>,
    /// Close the session (Cease/1) when the peer sends more prefixes.
    pub max_prefixes: Option<u32>,
    /// The peer is our route-reflector client.
    pub rr_client: bool,
    pub hold_time: u16,
    pub keepalive: Option<u16>,
    pub connect_retry: u16,
    /// Only accept connections, never open one.
    pub passive: bool,
    /// Source address of our connections.
    pub local_address: Option<IpAddr>,
    pub families: Vec<(u16, u8)>,
}

impl PeerConfig {
    pub fn new(address: IpAddr, remote_as: u32) -> Self {
        Self {
            address,
            port: BGP_PORT,
            remote_as,
            password: None,
            max_prefixes: None,
            rr_client: false,
            hold_time: 90,
            keepalive: None,
            connect_retry: 5,
            passive: false,
            local_address: None,
            families: vec![(AFI_IPV4, SAFI_UNICAST), (AFI_IPV6, SAFI_UNICAST)],
        }
    }

    fn validate(&self) -> Result<(), SpeakerError> {
        let bad = |reason| SpeakerError::InvalidPeer {
            address: self.address,
            reason,
        };
        if self.hold_time == 1 || self.hold_time == 2 {
            return Err(bad("hold time must be 0 or at least 3 seconds"));
        }
        if self.keepalive == Some(0) {
            return Err(bad("keepalive must be at least 1 second"));
        }
        if self.connect_retry == 0 {
            return Err(bad("connect retry must be at least 1 second"));
        }
        if self
            .password
            .as_ref()
            .is_some_and(|p| p.len() > super::md5::MAX_KEY_LEN)
        {
            return Err(bad("password longer than 80 bytes"));
        }
        if self.families.is_empty() {
            return Err(bad("no address family"));
        }
        Ok(())
    }
}

/// Errors of the speaker API.
#[derive(Debug, Error)]
pub enum SpeakerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot set the TCP-MD5 key for {peer}: {source}")]
    Md5 {
        peer: IpAddr,
        source: std::io::Error,
    },
    #[error("peer {address}: {reason}")]
    InvalidPeer {
        address: IpAddr,
        reason: &'static str,
    },
    #[error("peer {0} already exists")]
    PeerExists(IpAddr),
    #[error("no peer {0}")]
    NoSuchPeer(IpAddr),
    #[error("the speaker has stopped")]
    Stopped,
    #[error("cannot record to {path}: {source}")]
    Record {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// A row of `brindlectl bgp peers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerStatus {
    pub address: IpAddr,
    pub remote_as: u32,
    pub state: State,
    pub rr_client: bool,
    /// Seconds since the session came up.
    pub uptime_secs: Option<u64>,
    pub prefixes_in: usize,
    pub prefixes_out: usize,
    pub updates_in: u64,
    pub updates_out: u64,
    pub last_error: Option<String>,
}

// ===== the handle =====

enum Command {
    AddPeer(PeerConfig, oneshot::Sender<Result<(), SpeakerError>>),
    RemovePeer(IpAddr, oneshot::Sender<Result<(), SpeakerError>>),
    Announce(IpNet, IpAddr),
    Withdraw(IpNet),
    Peers(oneshot::Sender<Vec<PeerStatus>>),
    Routes(oneshot::Sender<Vec<RouteEntry>>),
    Shutdown(oneshot::Sender<()>),
}

/// Aborts the task when dropped.
#[derive(Debug)]
struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running speaker. Dropping it aborts every task without a goodbye;
/// [`Speaker::shutdown`] sends Cease NOTIFICATIONs first.
pub struct Speaker {
    commands: mpsc::UnboundedSender<Command>,
    listen_addr: Option<SocketAddr>,
    owner: Option<TaskGuard>,
}

impl Speaker {
    /// Binds the listener and starts the owner task. Returns the handle and
    /// the stream of best-route changes.
    pub async fn start(
        config: SpeakerConfig,
    ) -> Result<(Speaker, mpsc::UnboundedReceiver<RouteChange>), SpeakerError> {
        let (events_tx, events_rx) = mpsc::channel(1024);
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (routes_tx, routes_rx) = mpsc::unbounded_channel();
        let mut listen_addr = None;
        let mut listener_guard = None;
        let mut listener_socket = None;
        if let Some(addr) = config.listen {
            let (listener, clone) =
                bind_listener(addr).map_err(|source| SpeakerError::Listen { addr, source })?;
            listen_addr = listener.local_addr().ok();
            let tx = events_tx.clone();
            listener_guard = Some(TaskGuard(tokio::spawn(accept_task(listener, tx))));
            listener_socket = Some(clone);
        }
        let recorder =
            match &config.record {
                Some(path) => Some(Recorder::create(path, &config).map_err(|source| {
                    SpeakerError::Record {
                        path: path.clone(),
                        source,
                    }
                })?),
                None => None,
            };
        let owner = Owner {
            recorder,
            rib: Rib::new(config.local_as, config.router_id, config.cluster_id),
            config,
            peers: HashMap::new(),
            conns: HashMap::new(),
            timers: HashMap::new(),
            timer_gen: 0,
            next_conn: 1,
            events_tx,
            routes_tx,
            listener_socket,
            _listener: listener_guard,
            closing: Vec::new(),
        };
        let task = tokio::spawn(owner.run(commands_rx, events_rx));
        Ok((
            Speaker {
                commands: commands_tx,
                listen_addr,
                owner: Some(TaskGuard(task)),
            },
            routes_rx,
        ))
    }

    /// The address the listener is bound to.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen_addr
    }

    async fn ask<T>(
        &self,
        f: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SpeakerError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(f(tx))
            .map_err(|_| SpeakerError::Stopped)?;
        rx.await.map_err(|_| SpeakerError::Stopped)
    }

    /// Adds a neighbour and starts its session.
    pub async fn add_peer(&self, peer: PeerConfig) -> Result<(), SpeakerError> {
        peer.validate()?;
        self.ask(|tx| Command::AddPeer(peer, tx)).await?
    }

    /// Ends the session (Cease/Administrative Shutdown) and forgets the peer and
    /// its routes.
    pub async fn remove_peer(&self, address: IpAddr) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::RemovePeer(address, tx)).await?
    }

    /// Announces a prefix of this node with the given next hop (used
    /// towards iBGP peers; eBGP peers get the session address).
    pub fn announce(&self, prefix: IpNet, next_hop: IpAddr) -> Result<(), SpeakerError> {
        self.commands
            .send(Command::Announce(prefix, next_hop))
            .map_err(|_| SpeakerError::Stopped)
    }

    pub fn withdraw(&self, prefix: IpNet) -> Result<(), SpeakerError> {
        self.commands
            .send(Command::Withdraw(prefix))
            .map_err(|_| SpeakerError::Stopped)
    }

    /// State and counters of every peer.
    pub async fn peers(&self) -> Result<Vec<PeerStatus>, SpeakerError> {
        self.ask(Command::Peers).await
    }

    /// Every path in the Loc-RIB.
    pub async fn routes(&self) -> Result<Vec<RouteEntry>, SpeakerError> {
        self.ask(Command::Routes).await
    }

    /// Sends Cease/Administrative Shutdown to every peer, waits (up to two
    /// seconds) for the NOTIFICATIONs to leave, and stops.
    pub async fn shutdown(mut self) {
        let _ = self.ask(Command::Shutdown).await;
        if let Some(owner) = self.owner.as_mut() {
            let _ = tokio::time::timeout(Duration::from_secs(3), &mut owner.0).await;
        }
    }
}

// ===== child tasks =====

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TimerKind {
    ConnectRetry,
    Hold(ConnId),
    Keepalive(ConnId),
    /// RFC 4724 Restart Time of a peer whose session went down.
    Restart,
}

// Messages (mostly UPDATEs) are the bulk of events; boxing would cost an
// allocation each.
#[allow(clippy::large_enum_variant)]
enum Event {
    Accepted(TcpStream, SocketAddr),
    Connected {
        peer: IpAddr,
        attempt: u64,
        result: std::io::Result<TcpStream>,
    },
    /// A message and, when recording, its octets.
    Message(ConnId, Message, Option<Bytes>),
    /// A decode error and, when recording, the octets that caused it.
    DecodeError(ConnId, DecodeError, Option<Bytes>),
    Closed(ConnId),
    Timer {
        peer: IpAddr,
        kind: TimerKind,
        generation: u64,
    },
}

fn bind_listener(addr: SocketAddr) -> std::io::Result<(TcpListener, socket2::Socket)> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    let clone = socket.try_clone()?;
    let listener = TcpListener::from_std(std::net::TcpListener::from(socket))?;
    Ok((listener, clone))
}

async fn accept_task(listener: TcpListener, events: mpsc::Sender<Event>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                if events.send(Event::Accepted(stream, from)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(error = %e, "bgp accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connect(peer: &PeerConfig) -> std::io::Result<TcpStream> {
    let socket = match peer.address {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(pw) = &peer.password {
        set_md5_key(
            socket.as_fd(),
            peer.address,
            Some(pw.as_bytes()),
            peer.address.is_ipv6(),
        )?;
    }
    if let Some(local) = peer.local_address {
        socket.bind(SocketAddr::new(local, 0))?;
    }
    let timeout = Duration::from_secs(u64::from(peer.connect_retry));
    match tokio::time::timeout(
        timeout,
        socket.connect(SocketAddr::new(peer.address, peer.port)),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
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
/// the reader and the replay so both decode the same octets the same way.
pub(crate) fn decode_frame(frame: &[u8], cxt: &mut DecodeCxt) -> Result<Message, DecodeError> {
    let msg = Message::decode(frame, cxt)?;
    if let Message::Open(open) = &msg {
        cxt.four_octet_as = open.has_capability(|c| matches!(c, Capability::FourOctetAs(_)));
    }
    Ok(msg)
}

async fn reader_task(
    id: ConnId,
    mut rd: OwnedReadHalf,
    events: mpsc::Sender<Event>,
    keep_frames: bool,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut cxt = initial_decode_cxt();
    loop {
        loop {
            let len = match get_message_len(&buf) {
                Ok(Some(len)) if buf.len() >= len => len,
                Ok(_) => break,
                Err(e) => {
                    let head = keep_frames
                        .then(|| Bytes::copy_from_slice(&buf[..buf.len().min(HEADER_LEN)]));
                    let _ = events.send(Event::DecodeError(id, e, head)).await;
                    return;
                }
            };
            let frame = buf.split_to(len).freeze();
            let kept = keep_frames.then(|| frame.clone());
            match decode_frame(&frame, &mut cxt) {
                Ok(msg) => {
                    if events.send(Event::Message(id, msg, kept)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = events.send(Event::DecodeError(id, e, kept)).await;
                    return;
                }
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => {
                let _ = events.send(Event::Closed(id)).await;
                return;
            }
        }
    }
}

enum WriterCmd {
    Data(Bytes),
    Close,
}

async fn writer_task(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<WriterCmd>) {
    let mut batch = BytesMut::new();
    while let Some(cmd) = rx.recv().await {
        let mut close = false;
        let mut next = Some(cmd);
        // Coalesce whatever is queued into one write.
        while let Some(c) = next {
            match c {
                WriterCmd::Data(b) => batch.extend_from_slice(&b),
                WriterCmd::Close => {
                    close = true;
                    break;
                }
            }
            if batch.len() > 256 * 1024 {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() && wr.write_all(&batch).await.is_err() {
            return;
        }
        batch.clear();
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

// ===== what FSM outputs do to the RIB (shared with the replay) =====

/// An UPDATE from an established peer into the RIB; the input to feed back
/// to the FSM when it breaks the peer's max-prefix limit.
pub(crate) fn rib_update(
    rib: &mut Rib,
    peer: IpAddr,
    u: &UpdateMsg,
    max: Option<u32>,
) -> Option<Input> {
    if let Some(family) = u.end_of_rib_family() {
        debug!(%peer, ?family, "bgp End-of-RIB");
        rib.end_of_rib(peer, family);
        return None;
    }
    if let Some(e) = &u.treat_as_withdraw {
        warn!(%peer, error = %e, "bgp UPDATE treated as withdraw (RFC 7606)");
    }
    match rib.update_from_peer(peer, u, max) {
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

/// A session ended: the peer's routes are withdrawn, or held stale when the
/// end was graceful and the peer announced a restart time, which is then
/// returned (the Restart timer to arm).
pub(crate) fn rib_down(
    rib: &mut Rib,
    peer: IpAddr,
    graceful: bool,
    restart: Option<u16>,
) -> Option<u16> {
    let graceful = graceful && restart.is_some_and(|t| t > 0);
    rib.peer_down(peer, graceful);
    if graceful { restart } else { None }
}

/// The RIB's view of an established peer.
pub(crate) fn peer_info_of(
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

/// The FSM configuration of a peer.
pub(crate) fn fsm_config(speaker: &SpeakerConfig, cfg: &PeerConfig) -> FsmConfig {
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

// ===== the owner task =====

struct Conn {
    peer: IpAddr,
    local: Option<SocketAddr>,
    writer_tx: mpsc::UnboundedSender<WriterCmd>,
    writer: JoinHandle<()>,
    _reader: TaskGuard,
}

struct Peer {
    config: PeerConfig,
    fsm: Fsm,
    connect_attempt: u64,
    connecting: Option<TaskGuard>,
    /// The established connection, what it negotiated and since when.
    established: Option<(ConnId, Negotiated, Instant)>,
    updates_in: u64,
    updates_out: u64,
    last_error: Option<String>,
}

struct Owner {
    config: SpeakerConfig,
    rib: Rib,
    peers: HashMap<IpAddr, Peer>,
    conns: HashMap<ConnId, Conn>,
    timers: HashMap<(IpAddr, TimerKind), (u64, TaskGuard)>,
    timer_gen: u64,
    next_conn: ConnId,
    events_tx: mpsc::Sender<Event>,
    routes_tx: mpsc::UnboundedSender<RouteChange>,
    /// A second handle on the listening socket, for its MD5 keys.
    listener_socket: Option<socket2::Socket>,
    _listener: Option<TaskGuard>,
    /// Writers flushing their last messages.
    closing: Vec<JoinHandle<()>>,
    /// Where inputs are recorded, if anywhere.
    recorder: Option<Recorder>,
}

/// The IP of an address as the peer table keys it (v4-mapped IPv6 from a
/// dual-stack listener becomes IPv4).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
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

impl Owner {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: mpsc::Receiver<Event>,
    ) {
        loop {
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(Command::Shutdown(done)) => {
                        self.shutdown().await;
                        let _ = done.send(());
                        return;
                    }
                    Some(cmd) => self.command(cmd),
                    None => return,
                },
                Some(ev) = events.recv() => {
                    self.event(ev);
                    // Take what is queued before sending anything out, so
                    // UPDATEs leave in batches.
                    for _ in 0..256 {
                        match events.try_recv() {
                            Ok(ev) => self.event(ev),
                            Err(_) => break,
                        }
                    }
                }
            }
            self.flush();
            if let Some(rec) = self.recorder.as_mut() {
                rec.flush();
            }
        }
    }

    async fn shutdown(&mut self) {
        let addrs: Vec<IpAddr> = self.peers.keys().copied().collect();
        for a in addrs {
            self.run_fsm(a, Input::ManualStop);
        }
        self.conns.clear();
        for h in self.closing.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
        }
    }

    fn record(&mut self, r: impl FnOnce() -> Recorded) {
        if let Some(rec) = self.recorder.as_mut() {
            rec.write(&r());
        }
    }

    fn command(&mut self, cmd: Command) {
        match &cmd {
            Command::AddPeer(cfg, _) => {
                let r = Recorded::add_peer(cfg);
                self.record(|| r);
            }
            Command::RemovePeer(addr, _) => {
                let address = *addr;
                self.record(|| Recorded::RemovePeer { address });
            }
            Command::Announce(prefix, next_hop) => {
                let (prefix, next_hop) = (*prefix, *next_hop);
                self.record(|| Recorded::Announce { prefix, next_hop });
            }
            Command::Withdraw(prefix) => {
                let prefix = *prefix;
                self.record(|| Recorded::Withdraw { prefix });
            }
            _ => {}
        }
        match cmd {
            Command::AddPeer(cfg, reply) => {
                let _ = reply.send(self.add_peer(cfg));
            }
            Command::RemovePeer(addr, reply) => {
                let r = if self.peers.contains_key(&addr) {
                    self.run_fsm(addr, Input::ManualStop);
                    if let Some(p) = self.peers.remove(&addr)
                        && p.config.password.is_some()
                    {
                        self.set_listener_md5(addr, None).ok();
                    }
                    self.timers.retain(|(a, _), _| *a != addr);
                    self.rib.peer_down(addr, false);
                    Ok(())
                } else {
                    Err(SpeakerError::NoSuchPeer(addr))
                };
                let _ = reply.send(r);
            }
            Command::Announce(prefix, nh) => self.rib.announce_local(prefix, nh),
            Command::Withdraw(prefix) => self.rib.withdraw_local(prefix),
            Command::Peers(reply) => {
                let mut v: Vec<PeerStatus> = self
                    .peers
                    .iter()
                    .map(|(a, p)| PeerStatus {
                        address: *a,
                        remote_as: p.config.remote_as,
                        state: p.fsm.state(),
                        rr_client: p.config.rr_client,
                        uptime_secs: p.established.as_ref().map(|e| e.2.elapsed().as_secs()),
                        prefixes_in: self.rib.prefixes_in(*a),
                        prefixes_out: self.rib.prefixes_out(*a),
                        updates_in: p.updates_in,
                        updates_out: p.updates_out,
                        last_error: p.last_error.clone(),
                    })
                    .collect();
                v.sort_by_key(|s| s.address);
                let _ = reply.send(v);
            }
            Command::Routes(reply) => {
                let _ = reply.send(self.rib.routes());
            }
            Command::Shutdown(_) => {}
        }
    }

    fn set_listener_md5(&self, peer: IpAddr, key: Option<&[u8]>) -> Result<(), SpeakerError> {
        if let Some(s) = &self.listener_socket {
            let v6 = self.config.listen.is_some_and(|l| l.is_ipv6());
            set_md5_key(s.as_fd(), peer, key, v6)
                .map_err(|source| SpeakerError::Md5 { peer, source })?;
        }
        Ok(())
    }

    fn add_peer(&mut self, cfg: PeerConfig) -> Result<(), SpeakerError> {
        if self.peers.contains_key(&cfg.address) {
            return Err(SpeakerError::PeerExists(cfg.address));
        }
        if let Some(pw) = &cfg.password {
            self.set_listener_md5(cfg.address, Some(pw.as_bytes()))?;
        }
        let fsm = Fsm::new(fsm_config(&self.config, &cfg));
        let addr = cfg.address;
        info!(peer = %addr, remote_as = cfg.remote_as, "bgp peer added");
        self.peers.insert(
            addr,
            Peer {
                config: cfg,
                fsm,
                connect_attempt: 0,
                connecting: None,
                established: None,
                updates_in: 0,
                updates_out: 0,
                last_error: None,
            },
        );
        self.run_fsm(addr, Input::ManualStart);
        Ok(())
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Accepted(stream, from) => {
                let peer = canonical(from.ip());
                if !self.peers.contains_key(&peer) {
                    debug!(%from, "bgp connection from an unknown address refused");
                    return;
                }
                let id = self.spawn_conn(peer, stream);
                let local = self.conns.get(&id).and_then(|c| c.local);
                self.record(|| Recorded::Connection {
                    peer,
                    conn: id,
                    local,
                    inbound: true,
                });
                self.run_fsm(peer, Input::TcpConnectionConfirmed(id));
            }
            Event::Connected {
                peer,
                attempt,
                result,
            } => {
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                if p.connect_attempt != attempt {
                    return;
                }
                p.connecting = None;
                match result {
                    Ok(stream) => {
                        let id = self.spawn_conn(peer, stream);
                        let local = self.conns.get(&id).and_then(|c| c.local);
                        self.record(|| Recorded::Connection {
                            peer,
                            conn: id,
                            local,
                            inbound: false,
                        });
                        self.run_fsm(peer, Input::TcpCrAcked(id));
                    }
                    Err(e) => {
                        debug!(%peer, error = %e, "bgp connect failed");
                        self.record(|| Recorded::ConnectFailed { peer });
                        self.run_fsm(peer, Input::TcpConnectFailed);
                    }
                }
            }
            Event::Message(id, msg, frame) => {
                if let Some(c) = self.conns.get(&id) {
                    let peer = c.peer;
                    if let Some(frame) = frame {
                        self.record(|| Recorded::frame(id, &frame));
                    }
                    self.run_fsm(peer, Input::Message(id, msg));
                }
            }
            Event::DecodeError(id, e, frame) => {
                if let Some(c) = self.conns.get(&id) {
                    let peer = c.peer;
                    if let Some(frame) = frame {
                        self.record(|| Recorded::frame(id, &frame));
                    }
                    warn!(%peer, error = %e, "bgp message error");
                    self.run_fsm(peer, Input::DecodeError(id, e));
                }
            }
            Event::Closed(id) => {
                if let Some(c) = self.conns.get(&id) {
                    let peer = c.peer;
                    self.record(|| Recorded::Closed { conn: id });
                    self.run_fsm(peer, Input::TcpConnectionFails(id));
                }
            }
            Event::Timer {
                peer,
                kind,
                generation,
            } => {
                match self.timers.get(&(peer, kind)) {
                    Some((g, _)) if *g == generation => {}
                    _ => return,
                }
                self.timers.remove(&(peer, kind));
                self.record(|| Recorded::timer(peer, kind));
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
        }
    }

    fn spawn_conn(&mut self, peer: IpAddr, stream: TcpStream) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().ok();
        let (rd, wr) = stream.into_split();
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(writer_task(wr, writer_rx));
        let reader = TaskGuard(tokio::spawn(reader_task(
            id,
            rd,
            self.events_tx.clone(),
            self.recorder.is_some(),
        )));
        self.conns.insert(
            id,
            Conn {
                peer,
                local,
                writer_tx,
                writer,
                _reader: reader,
            },
        );
        id
    }

    fn set_timer(&mut self, peer: IpAddr, kind: TimerKind, secs: Option<u16>) {
        self.timers.remove(&(peer, kind));
        let Some(secs) = secs else { return };
        self.timer_gen += 1;
        let generation = self.timer_gen;
        let tx = self.events_tx.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(u64::from(secs))).await;
            let _ = tx
                .send(Event::Timer {
                    peer,
                    kind,
                    generation,
                })
                .await;
        });
        self.timers
            .insert((peer, kind), (generation, TaskGuard(task)));
    }

    fn start_connect(&mut self, peer: IpAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.connect_attempt += 1;
        let attempt = p.connect_attempt;
        let cfg = p.config.clone();
        let tx = self.events_tx.clone();
        p.connecting = Some(TaskGuard(tokio::spawn(async move {
            let result = connect(&cfg).await;
            let _ = tx
                .send(Event::Connected {
                    peer,
                    attempt,
                    result,
                })
                .await;
        })));
    }

    fn send(&mut self, peer: IpAddr, id: ConnId, msg: Message) {
        let cxt = self
            .peers
            .get(&peer)
            .and_then(|p| p.established.as_ref())
            .filter(|e| e.0 == id)
            .map(|e| e.1.encode_cxt())
            .unwrap_or_default();
        if let Some(c) = self.conns.get(&id) {
            let _ = c.writer_tx.send(WriterCmd::Data(msg.encode(&cxt)));
        }
    }

    fn send_updates(&mut self, peer: IpAddr, msgs: Vec<UpdateMsg>) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some((id, neg, _)) = &p.established else {
            return;
        };
        let Some(c) = self.conns.get(id) else { return };
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
        for b in out {
            let _ = c.writer_tx.send(WriterCmd::Data(b));
        }
    }

    /// Sends the UPDATEs and route changes that the last events caused.
    fn flush(&mut self) {
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
        for c in self.rib.take_changes() {
            let _ = self.routes_tx.send(c);
        }
    }

    fn run_fsm(&mut self, peer: IpAddr, input: Input) {
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            let outputs = p.fsm.process(input);
            for o in outputs {
                self.apply(peer, o, &mut queue);
            }
        }
    }

    fn apply(&mut self, peer: IpAddr, output: Output, queue: &mut VecDeque<Input>) {
        match output {
            Output::Connect => self.start_connect(peer),
            Output::Send(id, msg) => self.send(peer, id, msg),
            Output::Close(id) => {
                if let Some(c) = self.conns.remove(&id) {
                    let _ = c.writer_tx.send(WriterCmd::Close);
                    self.closing.retain(|h| !h.is_finished());
                    self.closing.push(c.writer);
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
                if let Some(input) = rib_update(&mut self.rib, peer, &u, max) {
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
                    .map(|g| g.restart_time);
                if let Some(secs) = rib_down(&mut self.rib, peer, graceful, restart) {
                    self.set_timer(peer, TimerKind::Restart, Some(secs));
                }
            }
        }
    }

    fn peer_info(&self, peer: IpAddr) -> Option<PeerInfo> {
        let p = self.peers.get(&peer)?;
        let (id, neg, _) = p.established.as_ref()?;
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
        p.established = Some((id, neg, Instant::now()));
        p.last_error = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_update_is_split_into_messages_that_fit() {
        let nlri: Vec<ipnet::Ipv4Net> = (0..2000u32)
            .map(|i| ipnet::Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap())
            .collect();
        let u = UpdateMsg {
            attrs: Some(super::super::packet::Attrs {
                origin: Some(super::super::packet::Origin::Igp),
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
}
