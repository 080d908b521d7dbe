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
