//! The BGP speaker as tokio tasks: one owner task holds the Sans-IO
//! [`Core`] (every peer's FSM and the RIB) and carries out the [`Action`]s
//! it returns; the listener, connection attempts, each connection's reader
//! and writer, and every timer run in child tasks that talk to the owner
//! only through typed messages. Child tasks are aborted when their handle
//! is dropped.
//!
//! The daemon drives it through [`Speaker`] and consumes [`RouteChange`]s:
//! the speaker never touches the dataplane itself.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use super::config::{BGP_PORT, PeerConfig, PeerStatus, SpeakerConfig, SpeakerError};
use super::core::{Action, Core, TimerKind, canonical, decode_frame, initial_decode_cxt};
use super::fsm::ConnId;
use super::md5::set_md5_key;
use super::packet::{DecodeError, HEADER_LEN, Message, get_message_len};
use super::record::{Recorded, Recorder};
use super::rib::{RouteChange, RouteEntry};

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
            core: Core::new(config),
            links: HashMap::new(),
            up_since: HashMap::new(),
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
// ===== the owner task =====

struct Conn {
    writer_tx: mpsc::UnboundedSender<WriterCmd>,
    writer: JoinHandle<()>,
    _reader: TaskGuard,
}

/// A peer's connection attempt in flight.
#[derive(Default)]
struct Link {
    attempt: u64,
    connecting: Option<TaskGuard>,
}

struct Owner {
    /// The FSMs and the RIB; everything here around it is I/O.
    core: Core,
    links: HashMap<IpAddr, Link>,
    /// When each peer's session last came up.
    up_since: HashMap<IpAddr, Instant>,
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
        self.core.stop_all();
        self.act();
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
                let r = match self.core.remove_peer(addr) {
                    Some(cfg) => {
                        if cfg.password.is_some() {
                            self.set_listener_md5(addr, None).ok();
                        }
                        self.links.remove(&addr);
                        self.up_since.remove(&addr);
                        Ok(())
                    }
                    None => Err(SpeakerError::NoSuchPeer(addr)),
                };
                self.act();
                // After the FSM's own timer actions: none of the peer's
                // timers outlive it.
                self.timers.retain(|(a, _), _| *a != addr);
                let _ = reply.send(r);
            }
            Command::Announce(prefix, nh) => self.core.announce(prefix, nh),
            Command::Withdraw(prefix) => self.core.withdraw(prefix),
            Command::Peers(reply) => {
                let up = &self.up_since;
                let v = self
                    .core
                    .peers(|a| up.get(&a).map(|t| t.elapsed().as_secs()));
                let _ = reply.send(v);
            }
            Command::Routes(reply) => {
                let _ = reply.send(self.core.routes());
            }
            Command::Shutdown(_) => {}
        }
    }

    fn set_listener_md5(&self, peer: IpAddr, key: Option<&[u8]>) -> Result<(), SpeakerError> {
        if let Some(s) = &self.listener_socket {
            let v6 = self.core.config().listen.is_some_and(|l| l.is_ipv6());
            set_md5_key(s.as_fd(), peer, key, v6)
                .map_err(|source| SpeakerError::Md5 { peer, source })?;
        }
        Ok(())
    }

    fn add_peer(&mut self, cfg: PeerConfig) -> Result<(), SpeakerError> {
        if self.core.has_peer(cfg.address) {
            return Err(SpeakerError::PeerExists(cfg.address));
        }
        if let Some(pw) = &cfg.password {
            self.set_listener_md5(cfg.address, Some(pw.as_bytes()))?;
        }
        self.links.insert(cfg.address, Link::default());
        let r = self.core.add_peer(cfg);
        self.act();
        r
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Accepted(stream, from) => {
                let peer = canonical(from.ip());
                if !self.core.has_peer(peer) {
                    debug!(%from, "bgp connection from an unknown address refused");
                    return;
                }
                let (conn, local) = self.spawn_conn(stream);
                self.record(|| Recorded::Connection {
                    peer,
                    conn,
                    local,
                    inbound: true,
                });
                self.core.connection(peer, conn, local, true);
            }
            Event::Connected {
                peer,
                attempt,
                result,
            } => {
                let Some(link) = self.links.get_mut(&peer) else {
                    return;
                };
                if link.attempt != attempt {
                    return;
                }
                link.connecting = None;
                match result {
                    Ok(stream) => {
                        let (conn, local) = self.spawn_conn(stream);
                        self.record(|| Recorded::Connection {
                            peer,
                            conn,
                            local,
                            inbound: false,
                        });
                        self.core.connection(peer, conn, local, false);
                    }
                    Err(e) => {
                        debug!(%peer, error = %e, "bgp connect failed");
                        self.record(|| Recorded::ConnectFailed { peer });
                        self.core.connect_failed(peer);
                    }
                }
            }
            Event::Message(id, msg, frame) => self.received(id, Ok(msg), frame),
            Event::DecodeError(id, e, frame) => self.received(id, Err(e), frame),
            Event::Closed(id) => {
                if self.conns.contains_key(&id) {
                    self.record(|| Recorded::Closed { conn: id });
                    self.core.closed(id);
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
                self.core.timer(peer, kind);
            }
        }
        self.act();
    }

    fn received(&mut self, id: ConnId, msg: Result<Message, DecodeError>, frame: Option<Bytes>) {
        if !self.conns.contains_key(&id) {
            return;
        }
        if let Some(frame) = frame {
            self.record(|| Recorded::frame(id, &frame));
        }
        self.core.received(id, msg);
    }

    /// Carries out what the core asked for.
    fn act(&mut self) {
        for action in self.core.take_actions() {
            match action {
                Action::Connect(peer) => self.start_connect(peer),
                Action::Send(id, octets) => {
                    if let Some(c) = self.conns.get(&id) {
                        let _ = c.writer_tx.send(WriterCmd::Data(octets));
                    }
                }
                Action::Close(id) => {
                    if let Some(c) = self.conns.remove(&id) {
                        let _ = c.writer_tx.send(WriterCmd::Close);
                        self.closing.retain(|h| !h.is_finished());
                        self.closing.push(c.writer);
                    }
                }
                Action::SetTimer(peer, kind, secs) => self.set_timer(peer, kind, secs),
                Action::Established(peer) => {
                    self.up_since.insert(peer, Instant::now());
                }
            }
        }
    }

    fn spawn_conn(&mut self, stream: TcpStream) -> (ConnId, Option<SocketAddr>) {
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
                writer_tx,
                writer,
                _reader: reader,
            },
        );
        (id, local)
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
        let Some(cfg) = self.core.peer_config(peer).cloned() else {
            return;
        };
        let link = self.links.entry(peer).or_default();
        link.attempt += 1;
        let attempt = link.attempt;
        let tx = self.events_tx.clone();
        link.connecting = Some(TaskGuard(tokio::spawn(async move {
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

    /// Sends the UPDATEs and route changes that the last events caused.
    fn flush(&mut self) {
        let changes = self.core.flush();
        self.act();
        for c in changes {
            let _ = self.routes_tx.send(c);
        }
    }
}
