//! Framing for Brindle's Unix sockets: one JSON document per line.
//!
//! Both the node daemon's socket and the vrouter's socket speak the same
//! framing: the client writes one request as a single line of JSON, the server
//! answers with one [`Reply`] line, and the connection may carry any number of
//! such exchanges. JSON lines keep the protocol inspectable with `socat` and
//! versionable with serde defaults; the rates are control-plane rates, so the
//! cost of JSON does not matter.
//!
//! A line longer than [`MAX_MESSAGE_BYTES`] is refused rather than buffered,
//! so a confused or hostile peer cannot make a daemon grow without bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Version of the socket protocols; bumped on an incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest line either side accepts (a full route dump of a large node fits).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What went wrong while moving a message over a socket.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    /// The socket failed (connect, read, write, timeout).
    #[error("socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not the expected JSON.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The peer sent a line longer than [`MAX_MESSAGE_BYTES`].
    #[error("message longer than {MAX_MESSAGE_BYTES} bytes")]
    TooLong,
    /// The peer closed the connection before answering.
    #[error("connection closed by peer")]
    Closed,
    /// The server answered with an error.
    #[error("{0}")]
    Remote(RemoteError),
}

/// An error reported by the server side of a socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct RemoteError {
    /// Machine-readable class of the error.
    pub kind: RemoteErrorKind,
    /// Human-readable explanation.
    pub message: String,
}

/// Classes of server-side errors, so clients can map them to their own codes
/// (the CNI plugin maps them to the spec's error codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteErrorKind {
    /// The request was well-formed JSON but not a valid request.
    InvalidRequest,
    /// The thing asked about does not exist.
    NotFound,
    /// No addresses are left to allocate.
    Exhausted,
    /// The request conflicts with existing state.
    Conflict,
    /// The server could not reach its datastore or dataplane; try again.
    TryAgainLater,
    /// Anything else.
    Internal,
}

/// The response envelope: every request gets exactly one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Reply<T> {
    /// The request succeeded.
    Ok {
        /// The request's result.
        result: T,
    },
    /// The request failed.
    Error(RemoteError),
}

impl<T> Reply<T> {
    /// Turns the envelope into a `Result`.
    pub fn into_result(self) -> Result<T, RemoteError> {
        match self {
            Reply::Ok { result } => Ok(result),
            Reply::Error(e) => Err(e),
        }
    }
}

impl<T> From<Result<T, RemoteError>> for Reply<T> {
    fn from(r: Result<T, RemoteError>) -> Self {
        match r {
            Ok(result) => Reply::Ok { result },
            Err(e) => Reply::Error(e),
        }
    }
}

/// Writes `message` as one line of JSON and flushes.
pub fn write_message<W: Write, T: Serialize>(w: &mut W, message: &T) -> Result<(), FramingError> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Reads one line of JSON. Returns `Ok(None)` when the peer closed the
/// connection cleanly between messages.
pub fn read_message<R: BufRead, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, FramingError> {
    let mut line = Vec::new();
    let n = r
        .take(MAX_MESSAGE_BYTES as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(FramingError::TooLong);
    }
    if line.last() != Some(&b'\n') {
        return Err(FramingError::Closed);
    }
    Ok(Some(serde_json::from_slice(&line)?))
}

/// A blocking client for one of Brindle's sockets, for short-lived callers
/// such as the CNI plugins and `brindlectl`.
pub struct Client {
    stream: BufReader<UnixStream>,
}

impl Client {
    /// Connects to the socket at `path`; the connect itself and every later
    /// read and write time out after `timeout`. A plain blocking connect to a
    /// stuck daemon whose listen backlog is full would wait forever, so the
    /// connect is non-blocking and retried until the deadline (a Unix stream
    /// socket answers a full backlog with EAGAIN, not EINPROGRESS, so a poll
    /// for writability, as for TCP, does not apply).
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, FramingError> {
        let address = socket2::SockAddr::unix(path)?;
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match socket.connect(&address) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline {
                        return Err(FramingError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "connect: the daemon's listen backlog stayed full",
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        }
        socket.set_nonblocking(false)?;
        let stream: UnixStream = socket.into();
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Client {
            stream: BufReader::new(stream),
        })
    }

    /// Sends `request` and waits for its reply.
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        request: &Req,
    ) -> Result<Resp, FramingError> {
        write_message(self.stream.get_mut(), request)?;
        match read_message::<_, Reply<Resp>>(&mut self.stream)? {
            None => Err(FramingError::Closed),
            Some(reply) => reply.into_result().map_err(FramingError::Remote),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Ping {
        n: u32,
    }

    #[test]
    fn messages_round_trip_one_per_line() {
        let mut buf = Vec::new();
        write_message(&mut buf, &Ping { n: 1 }).unwrap();
        write_message(&mut buf, &Ping { n: 2 }).unwrap();
        assert_eq!(buf, b"{\"n\":1}\n{\"n\":2}\n");
        let mut r = Cursor::new(buf);
        assert_eq!(
            read_message::<_, Ping>(&mut r).unwrap(),
            Some(Ping { n: 1 })
        );
        assert_eq!(
            read_message::<_, Ping>(&mut r).unwrap(),
            Some(Ping { n: 2 })
        );
        assert_eq!(read_message::<_, Ping>(&mut r).unwrap(), None);
    }

    #[test]
    fn a_line_cut_short_is_reported_as_closed() {
        let mut r = Cursor::new(b"{\"n\":1".to_vec());
        assert!(matches!(
            read_message::<_, Ping>(&mut r),
            Err(FramingError::Closed)
        ));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let mut r = Cursor::new(b"not json\n".to_vec());
        assert!(matches!(
            read_message::<_, Ping>(&mut r),
            Err(FramingError::Malformed(_))
        ));
    }

    #[test]
    fn reply_envelope_is_tagged_by_status() {
        let ok: Reply<Ping> = Reply::Ok {
            result: Ping { n: 7 },
        };
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"status":"ok","result":{"n":7}}"#
        );
        let err: Reply<Ping> = Reply::Error(RemoteError {
            kind: RemoteErrorKind::Exhausted,
            message: "pool 10.0.0.0/24 is full".into(),
        });
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"status":"error","kind":"exhausted","message":"pool 10.0.0.0/24 is full"}"#
        );
    }

    #[test]
    fn client_talks_to_a_server_over_a_real_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut r = BufReader::new(stream.try_clone().unwrap());
            let mut w = stream;
            while let Some(p) = read_message::<_, Ping>(&mut r).unwrap() {
                let reply: Reply<Ping> = if p.n == 0 {
                    Reply::Error(RemoteError {
                        kind: RemoteErrorKind::InvalidRequest,
                        message: "zero".into(),
                    })
                } else {
                    Reply::Ok {
                        result: Ping { n: p.n * 2 },
                    }
                };
                write_message(&mut w, &reply).unwrap();
            }
        });
        let mut c = Client::connect(&path, Duration::from_secs(5)).unwrap();
        let r: Ping = c.call(&Ping { n: 21 }).unwrap();
        assert_eq!(r, Ping { n: 42 });
        match c.call::<_, Ping>(&Ping { n: 0 }) {
            Err(FramingError::Remote(e)) => assert_eq!(e.kind, RemoteErrorKind::InvalidRequest),
            other => panic!("expected a remote error, got {other:?}"),
        }
        drop(c);
        server.join().unwrap();
    }

    /// A daemon that never accepts and whose backlog is full: connect must
    /// give up with an error instead of blocking the caller forever.
    #[test]
    fn connect_to_a_stuck_daemon_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stuck.sock");
        let listener =
            socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        listener
            .bind(&socket2::SockAddr::unix(&path).unwrap())
            .unwrap();
        // Backlog 0: the kernel queues one connection, a second one waits.
        listener.listen(0).unwrap();
        let mut queued = Vec::new();
        let timeout = Duration::from_millis(200);
        let failed = (0..4).find_map(|_| match Client::connect(&path, timeout) {
            Ok(c) => {
                queued.push(c);
                None
            }
            Err(e) => Some(e),
        });
        match failed {
            Some(FramingError::Io(e)) => assert!(
                e.kind() == std::io::ErrorKind::TimedOut,
                "unexpected error kind: {e}"
            ),
            other => panic!("a full backlog must fail the connect, got {other:?}"),
        }
        assert!(!queued.is_empty(), "the first connection fits the backlog");
    }
}
