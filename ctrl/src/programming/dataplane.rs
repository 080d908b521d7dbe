//! The seam between the executor and the vrouter: the real socket client and
//! a recording fake.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brindle_api::framing::{Client, FramingError, PROTOCOL_VERSION};
use brindle_api::vrouter::{Changed, Hello, VrouterRequest};

/// Why a dataplane call failed; every failure means "not reachable now".
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// Socket or protocol failure.
    #[error("vrouter: {0}")]
    Framing(#[from] FramingError),
    /// No connection (the last call failed and no `hello` reconnected).
    #[error("vrouter not connected")]
    NotConnected,
}

/// Something that takes vrouter programming.
pub trait Dataplane: Send {
    /// (Re)connects if needed and greets; the answer's `boot_id` tells a
    /// restarted vrouter apart.
    fn hello(&mut self) -> Result<Hello, DataplaneError>;
    /// Sends one change request on the current connection; never reconnects
    /// by itself, so a vrouter that restarted is noticed by `hello` and
    /// resynced rather than half-programmed.
    fn call(&mut self, req: &VrouterRequest) -> Result<Changed, DataplaneError>;
}

/// The real client of `/run/brindle/vrouter.sock`.
pub struct SocketDataplane {
    path: PathBuf,
    timeout: Duration,
    client: Option<Client>,
}

impl SocketDataplane {
    /// A client of the socket at `path` (connects on the first `hello`).
    pub fn new(path: impl Into<PathBuf>, timeout: Duration) -> Self {
        SocketDataplane {
            path: path.into(),
            timeout,
            client: None,
        }
    }
}

impl Dataplane for SocketDataplane {
    fn hello(&mut self) -> Result<Hello, DataplaneError> {
        let req = VrouterRequest::Hello {
            version: PROTOCOL_VERSION,
        };
        if let Some(c) = self.client.as_mut()
            && let Ok(h) = c.call(&req)
        {
            return Ok(h);
        }
        self.client = None;
        let mut c = Client::connect(&self.path, self.timeout)?;
        let h = c.call(&req)?;
        self.client = Some(c);
        Ok(h)
    }

    fn call(&mut self, req: &VrouterRequest) -> Result<Changed, DataplaneError> {
        let c = self.client.as_mut().ok_or(DataplaneError::NotConnected)?;
        match c.call(req) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.client = None;
                Err(e.into())
            }
        }
    }
}

/// The shared state of a [`RecordingDataplane`], which tests keep a handle to.
#[derive(Debug, Default)]
pub struct Recording {
    /// Every request that reached the "vrouter", in order (Hellos included).
    pub requests: Vec<VrouterRequest>,
    /// The current boot ID; change it to simulate a restart.
    pub boot_id: String,
    /// When false, every call fails as if the socket were gone.
    pub down: bool,
}

/// A fake vrouter that records what it is sent.
#[derive(Debug, Clone, Default)]
pub struct RecordingDataplane {
    /// Shared with the test.
    pub state: Arc<Mutex<Recording>>,
    connected_boot: Option<String>,
}

impl RecordingDataplane {
    /// A fake that is up with boot ID `boot`.
    pub fn new(boot: &str) -> Self {
        let d = RecordingDataplane::default();
        d.lock().boot_id = boot.into();
        d
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recording> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the recorded requests, leaving the log empty.
    pub fn take(&self) -> Vec<VrouterRequest> {
        std::mem::take(&mut self.lock().requests)
    }

    /// Simulates the vrouter going away (`true`) or coming back.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Simulates a vrouter restart: a new boot ID, and the old connection
    /// is gone.
    pub fn restart(&self, boot: &str) {
        self.lock().boot_id = boot.into();
    }
}

impl Dataplane for RecordingDataplane {
    fn hello(&mut self) -> Result<Hello, DataplaneError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.down {
            self.connected_boot = None;
            return Err(DataplaneError::NotConnected);
        }
        s.requests.push(VrouterRequest::Hello {
            version: PROTOCOL_VERSION,
        });
        self.connected_boot = Some(s.boot_id.clone());
        Ok(Hello {
            version: PROTOCOL_VERSION,
            boot_id: s.boot_id.clone(),
        })
    }

    fn call(&mut self, req: &VrouterRequest) -> Result<Changed, DataplaneError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // A restart breaks the connection the way a real socket would.
        if s.down || self.connected_boot.as_deref() != Some(s.boot_id.as_str()) {
            self.connected_boot = None;
            return Err(DataplaneError::NotConnected);
        }
        s.requests.push(req.clone());
        Ok(Changed { changed: 1 })
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};

    use brindle_api::framing::{self, Reply};
    use brindle_api::vrouter::DesiredState;
    use serde_json::Value;

    use super::*;
    use crate::programming::desired::endpoint_added;
    use crate::programming::desired::tests::endpoint;
    use crate::programming::executor::Executor;

    /// A vrouter socket server that can be stopped (every connection cut)
    /// and started again with another boot ID.
    struct FakeServer {
        stop: Arc<AtomicBool>,
        log: Arc<Mutex<Vec<VrouterRequest>>>,
        conns: Arc<Mutex<Vec<UnixStream>>>,
    }

    impl FakeServer {
        fn start(path: &Path, boot: &str) -> FakeServer {
            let _ = std::fs::remove_file(path);
            let listener = UnixListener::bind(path).unwrap();
            listener.set_nonblocking(true).unwrap();
            let s = FakeServer {
                stop: Arc::default(),
                log: Arc::default(),
                conns: Arc::default(),
            };
            let (stop, log, conns, boot) = (
                s.stop.clone(),
                s.log.clone(),
                s.conns.clone(),
                boot.to_owned(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    stream.set_nonblocking(false).unwrap();
                    conns.lock().unwrap().push(stream.try_clone().unwrap());
                    let (log, boot) = (log.clone(), boot.clone());
                    std::thread::spawn(move || {
                        let mut r = BufReader::new(stream.try_clone().unwrap());
                        let mut w = stream;
                        while let Ok(Some(req)) = framing::read_message::<_, VrouterRequest>(&mut r)
                        {
                            let result = match &req {
                                VrouterRequest::Hello { .. } => serde_json::to_value(Hello {
                                    version: PROTOCOL_VERSION,
                                    boot_id: boot.clone(),
                                }),
                                _ => serde_json::to_value(Changed { changed: 1 }),
                            }
                            .unwrap();
                            log.lock().unwrap().push(req);
                            let reply: Reply<Value> = Reply::Ok { result };
                            if framing::write_message(&mut w, &reply).is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            s
        }

        fn take(&self) -> Vec<VrouterRequest> {
            std::mem::take(&mut self.log.lock().unwrap())
        }

        fn stop(&self, path: &Path) {
            self.stop.store(true, Ordering::Relaxed);
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
            let _ = std::fs::remove_file(path);
        }
    }

    fn hello() -> VrouterRequest {
        VrouterRequest::Hello {
            version: PROTOCOL_VERSION,
        }
    }

    #[test]
    fn the_socket_client_resyncs_a_restarted_vrouter_with_the_whole_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vrouter.sock");
        let first = FakeServer::start(&path, "b1");
        let mut ex = Executor::new(SocketDataplane::new(&path, Duration::from_secs(5)), None);
        ex.reconcile();
        assert_eq!(
            first.take(),
            vec![
                hello(),
                VrouterRequest::Sync {
                    state: DesiredState::default()
                }
            ]
        );
        let a = endpoint("c1", "bri1", "10.244.0.5/32");
        ex.submit(endpoint_added(&a).unwrap());
        assert_eq!(first.take(), endpoint_added(&a).unwrap());

        // The vrouter goes away: the next change fails, is kept, and the
        // executor reports the vrouter unreachable.
        first.stop(&path);
        let b = endpoint("c2", "bri2", "10.244.0.6/32");
        ex.submit(endpoint_added(&b).unwrap());
        assert!(!ex.reachable());
        assert!(first.take().is_empty());

        // It comes back with a new boot ID: one Hello, one Sync with both.
        let second = FakeServer::start(&path, "b2");
        ex.reconcile();
        let reqs = second.take();
        assert_eq!(reqs.len(), 2, "{reqs:?}");
        assert_eq!(reqs[0], hello());
        let VrouterRequest::Sync { state } = &reqs[1] else {
            panic!("{reqs:?}")
        };
        let names: Vec<&str> = state.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["bri1", "bri2"]);
        assert_eq!(state.routes.len(), 2);
        assert!(ex.reachable());
        assert_eq!(ex.boot_id(), Some("b2"));
        second.stop(&path);
    }
}
