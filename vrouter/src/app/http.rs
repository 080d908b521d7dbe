//! The metrics and health server: `/metrics`, `/healthz`, `/readyz` over a
//! small HTTP/1.1 GET responder (three endpoints scraped a few times a
//! minute need no HTTP stack and no async runtime beside the poll loop).
//!
//! One slow or hostile client must never stall the kubelet's probes: each
//! client gets its own thread, at most [`MAX_CLIENTS`] at once (beyond
//! that: 503 and close), [`CLIENT_TIMEOUT`] to send its request head and
//! to take the answer, and a head of at most [`MAX_HEAD`] bytes (431
//! beyond). The control lock is held only to take the snapshot, never
//! while a client reads or writes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::metrics::render;
use crate::control::{Control, Effects};
use crate::engine::WorkerSnapshot;

/// Clients served at once.
pub const MAX_CLIENTS: usize = 64;
/// How long a client may take to send its request head, and to take the
/// answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head (request line and headers).
pub const MAX_HEAD: usize = 4096;

/// What a client asked.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// `GET <path>`.
    Get(String),
    /// Not a GET, or not HTTP.
    Bad,
    /// No end of head within [`MAX_HEAD`] bytes.
    TooLarge,
    /// Closed or timed out before a full head.
    Gone,
}

fn read_head(stream: &mut impl Read) -> Head {
    let mut buf = [0u8; MAX_HEAD];
    let mut len = 0;
    loop {
        if len == buf.len() {
            return Head::TooLarge;
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return Head::Gone,
            Ok(n) => len += n,
        }
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let Ok(head) = std::str::from_utf8(&buf[..len]) else {
        return Head::Bad;
    };
    let mut parts = head.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(path)) => Head::Get(path.to_owned()),
        _ => Head::Bad,
    }
}

fn reply(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}

/// Takes one client's slot back when its thread ends (panics included).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves until `stop` is set (checked between clients).
pub fn serve_http<E: Effects + Send + 'static>(
    listener: TcpListener,
    control: Arc<Mutex<Control<E>>>,
    stop: &AtomicBool,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
        let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
        if active.fetch_add(1, Ordering::Relaxed) >= MAX_CLIENTS {
            let _slot = Slot(active.clone());
            reply(
                &mut stream,
                "503 Service Unavailable",
                "text/plain",
                "too many clients\n",
            );
            continue;
        }
        let slot = Slot(active.clone());
        let c = control.clone();
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                let _slot = slot;
                answer(&mut stream, &c);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "metrics: cannot start a client thread");
        }
    }
}

fn answer<E: Effects>(stream: &mut TcpStream, control: &Mutex<Control<E>>) {
    let path = match read_head(stream) {
        Head::Get(p) => p,
        Head::Gone => return,
        Head::TooLarge => {
            return reply(
                stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head over 4 KiB\n",
            );
        }
        Head::Bad => return reply(stream, "400 Bad Request", "text/plain", "bad request\n"),
    };
    let path = path.split('?').next().unwrap_or_default();
    match path {
        "/metrics" => {
            let body = {
                let c = control.lock().unwrap_or_else(|e| e.into_inner());
                let snaps: Vec<WorkerSnapshot> = c
                    .snapshots()
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect();
                render(&snaps, &c.port_owners(), &c.tap_stats(), c.routes())
            };
            reply(
                stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
            );
        }
        "/healthz" | "/readyz" => {
            let h = control.lock().unwrap_or_else(|e| e.into_inner()).health();
            let ok = if path == "/healthz" { h.live } else { h.ready };
            let body = if ok {
                "ok\n".to_owned()
            } else {
                format!("{}\n", h.problems.join("; "))
            };
            let status = if ok {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            reply(stream, status, "text/plain", &body);
        }
        _ => reply(stream, "404 Not Found", "text/plain", "not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpStream};

    use super::*;
    use crate::control::Recording;
    use crate::pipeline::PipelineConfig;

    fn server() -> (std::net::SocketAddr, Arc<AtomicBool>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let control = Arc::new(Mutex::new(Control::new(
            Recording::new(1),
            PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24),
        )));
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || serve_http(listener, control, &s));
        (addr, stop)
    }

    fn get(addr: std::net::SocketAddr, head: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(head).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn healthz_answers_while_silent_clients_hold_connections() {
        let (addr, _stop) = server();
        // Silent clients: connected, nothing sent.
        // Silent clients: connected, nothing sent; each holds its thread up
        // to 5 s. A server taking clients one at a time would answer after
        // 40 s, past the reader's 10 s timeout.
        let silent: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
        for _ in 0..3 {
            let r = get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
            assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
            assert!(r.ends_with("ok\n"), "{r}");
        }
        let r = get(addr, b"GET /readyz HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("no uplink port attached"), "{r}");
        let r = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(r.contains("brindle_vrouter_routes 0"), "{r}");
        drop(silent);
    }

    #[test]
    fn an_oversized_head_gets_431_and_garbage_gets_400() {
        let (addr, _stop) = server();
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        let r = get(addr, &big);
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
        let r = get(addr, b"POST /healthz HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let r = get(addr, b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    }

    #[test]
    fn a_silent_client_is_closed_after_the_timeout() {
        let (addr, _stop) = server();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(CLIENT_TIMEOUT * 3)).unwrap();
        let mut buf = [0u8; 16];
        // The server closes without an answer: read returns 0.
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
    }

    #[test]
    fn head_parsing() {
        assert_eq!(
            read_head(&mut &b"GET /metrics HTTP/1.1\r\n\r\n"[..]),
            Head::Get("/metrics".into())
        );
        assert_eq!(read_head(&mut &b"GET /x"[..]), Head::Gone);
        assert_eq!(read_head(&mut &b"\xff\xfe\r\n\r\n"[..]), Head::Bad);
    }
}
