//! A tiny stand-in for the Kubernetes API server: a raw HTTP/1.1 responder
//! on 127.0.0.1 that answers each list or watch of a path from a script of
//! recorded responses, in the shapes a real API server sends (list bodies
//! whose items carry no `apiVersion`/`kind`; watches as chunked streams of
//! one JSON event per line: ADDED, MODIFIED, DELETED, BOOKMARK, ERROR with
//! a `Status`). A watch whose script is exhausted is held open and silent,
//! as an idle watch is. Every request line is recorded.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One recorded response.
#[derive(Debug, Clone)]
pub enum Response {
    /// `200` with this JSON body (a list).
    List(Value),
    /// `200`, chunked: these events, one per line, then the end of the
    /// stream (the server ended the watch, as at its timeout).
    Watch(Vec<Value>),
}

type Script = HashMap<(String, bool), VecDeque<Response>>;

/// The server.
#[derive(Clone, Default)]
pub struct ApiServer {
    script: Arc<Mutex<Script>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl ApiServer {
    /// Queues a response to the next list (`watch == false`) or watch of
    /// `path`.
    pub fn push(&self, path: &str, watch: bool, response: Response) {
        let mut script = self.script.lock().unwrap();
        script
            .entry((path.to_owned(), watch))
            .or_default()
            .push_back(response);
    }

    /// Every request target (path and query) so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Serves on an ephemeral port; its base URL.
    pub async fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move { me.serve(stream).await });
            }
        });
        format!("http://{addr}")
    }

    async fn serve(&self, stream: TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        loop {
            // Request line, then headers up to the empty line (GET: no body).
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            loop {
                let mut header = String::new();
                if read.read_line(&mut header).await.unwrap_or(0) == 0 {
                    return;
                }
                if header == "\r\n" {
                    break;
                }
            }
            self.requests.lock().unwrap().push(target.clone());
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let watch = query.split('&').any(|p| p == "watch=true");
            let next = self
                .script
                .lock()
                .unwrap()
                .get_mut(&(path.to_owned(), watch))
                .and_then(VecDeque::pop_front);
            let ok = match next {
                Some(Response::List(body)) => {
                    let body = body.to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    write.write_all(head.as_bytes()).await.is_ok()
                        && write.write_all(body.as_bytes()).await.is_ok()
                }
                Some(Response::Watch(events)) => {
                    let mut out = String::from(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                    );
                    for e in events {
                        let line = format!("{e}\n");
                        out.push_str(&format!("{:x}\r\n{line}\r\n", line.len()));
                    }
                    out.push_str("0\r\n\r\n");
                    write.write_all(out.as_bytes()).await.is_ok()
                }
                None if watch => {
                    // An idle watch: headers, then nothing.
                    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                    let _ = write.write_all(head.as_bytes()).await;
                    std::future::pending::<()>().await;
                    false
                }
                None => {
                    let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"not scripted","reason":"NotFound","code":404}"#;
                    let head = format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    write.write_all(head.as_bytes()).await.is_ok()
                        && write.write_all(body.as_bytes()).await.is_ok()
                }
            };
            if !ok {
                return;
            }
        }
    }
}
