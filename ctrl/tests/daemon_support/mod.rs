//! Helpers for the tests that run the real `brindle-ctrl` binary: a fake
//! vrouter socket server that records requests, a daemon child process
//! killed on drop, and polling with a deadline.

#![allow(dead_code)]

use std::io::BufReader;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brindle_api::framing::{self, PROTOCOL_VERSION, Reply};
use brindle_api::vrouter::{Changed, Hello, VrouterRequest};
use brindle_ctrl::programming::desired::Desired;
use serde_json::Value;

/// A fake vrouter on a Unix socket: answers Hello with its boot ID and
/// every change with `changed: 1`, and records every request.
pub struct FakeVrouter {
    pub path: PathBuf,
    pub requests: Arc<Mutex<Vec<VrouterRequest>>>,
    stop: Arc<AtomicBool>,
}

impl FakeVrouter {
    /// A fake whose `DumpRoutes` is always empty.
    pub fn start(path: &Path, boot_id: &str) -> FakeVrouter {
        Self::start_with(path, boot_id, false)
    }

    /// A fake that applies the changes it receives (as the desired state)
    /// and answers `DumpRoutes` with the routes they leave.
    pub fn start_stateful(path: &Path, boot_id: &str) -> FakeVrouter {
        Self::start_with(path, boot_id, true)
    }

    fn start_with(path: &Path, boot_id: &str, stateful: bool) -> FakeVrouter {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let requests: Arc<Mutex<Vec<VrouterRequest>>> = Arc::default();
        let state: Arc<Mutex<Desired>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (rec, st, boot) = (requests.clone(), stop.clone(), boot_id.to_owned());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let (rec, boot, state) = (rec.clone(), boot.clone(), state.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(stream.try_clone().unwrap());
                    let mut w = stream;
                    while let Ok(Some(req)) = framing::read_message::<_, VrouterRequest>(&mut r) {
                        let reply: Reply<Value> = Reply::Ok {
                            result: match &req {
                                VrouterRequest::Hello { .. } => serde_json::to_value(Hello {
                                    version: PROTOCOL_VERSION,
                                    boot_id: boot.clone(),
                                })
                                .unwrap(),
                                VrouterRequest::DumpRoutes if stateful => {
                                    serde_json::to_value(state.lock().unwrap().to_sync().routes)
                                        .unwrap()
                                }
                                VrouterRequest::DumpRoutes => Value::Array(vec![]),
                                _ => serde_json::to_value(Changed { changed: 1 }).unwrap(),
                            },
                        };
                        state.lock().unwrap().apply(&req);
                        rec.lock().unwrap().push(req);
                        if framing::write_message(&mut w, &reply).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        FakeVrouter {
            path: path.to_owned(),
            requests,
            stop,
        }
    }

    pub fn requests(&self) -> Vec<VrouterRequest> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeVrouter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A real etcd on loopback, killed on drop.
pub struct Etcd {
    child: Child,
    pub url: String,
}

impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .arg(format!("--initial-cluster=t={peer_url}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
            .spawn()
            .expect("etcd (Debian package etcd-server) must be installed");
        let addr = format!("127.0.0.1:{client}");
        wait_for("etcd", Duration::from_secs(20), || {
            std::net::TcpStream::connect(&addr).is_ok()
        })
        .unwrap();
        Etcd { child, url }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `brindle-ctrl`, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `env` (BRINDLE_* variables) and waits until
    /// its API socket answers.
    pub fn start(env: &[(String, String)], socket: &Path, log: &Path) -> Daemon {
        Self::start_in(None, env, &[], socket, log)
    }

    /// [`Daemon::start`] inside the network namespace `netns` (`ip netns
    /// exec` execs the daemon, so the child is the daemon itself and
    /// signals reach it). A `BRINDLE_CONFIG` in `env` replaces /dev/null.
    pub fn start_in(
        netns: Option<&str>,
        env: &[(String, String)],
        args: &[&str],
        socket: &Path,
        log: &Path,
    ) -> Daemon {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_brindle-ctrl")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_brindle-ctrl")),
        };
        cmd.args(args);
        cmd.env("BRINDLE_CONFIG", "/dev/null")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let d = Daemon {
            child: Some(child),
            socket: socket.to_owned(),
            log: log.to_owned(),
        };
        let log = log.to_owned();
        wait_for("the daemon's socket", Duration::from_secs(30), || {
            brindle_api::framing::Client::connect(socket, Duration::from_secs(2)).is_ok()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
        d
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (SIGHUP: reload).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), signal).unwrap();
        }
    }

    /// SIGKILL: no Cease, no cleanup, like a crashed node.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `f` every 100 ms until it holds or `limit` passes.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A TCP port free right now on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
