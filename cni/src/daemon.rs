//! The node daemon's endpoint API, from the plugin's side.

use std::path::PathBuf;
use std::time::Duration;

use brindle_api::cni::{CniError, ErrorCode};
use brindle_api::endpoint::EndpointRequest;
use brindle_api::framing::{Client, FramingError, RemoteError, RemoteErrorKind};
use serde::de::DeserializeOwned;

/// Why a call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No daemon: the socket is missing, refuses connections or times out.
    #[error("node daemon unreachable at {path}: {source}")]
    Unreachable {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        source: FramingError,
    },
    /// The daemon answered with an error.
    #[error("node daemon: {0}")]
    Remote(RemoteError),
}

impl DaemonError {
    /// Whether the daemon said the thing does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, DaemonError::Remote(e) if e.kind == RemoteErrorKind::NotFound)
    }

    /// The CNI error for it: unreachable or "try again" is code 11, a bad
    /// request 7, anything else 5.
    pub fn to_cni(&self) -> CniError {
        let code = match self {
            DaemonError::Unreachable { .. } => ErrorCode::TRY_AGAIN_LATER,
            DaemonError::Remote(e) => match e.kind {
                RemoteErrorKind::TryAgainLater | RemoteErrorKind::Exhausted => {
                    ErrorCode::TRY_AGAIN_LATER
                }
                RemoteErrorKind::InvalidRequest => ErrorCode::INVALID_CONFIG,
                _ => ErrorCode::IO_FAILURE,
            },
        };
        CniError::new(code, "node daemon call failed").with_details(self.to_string())
    }
}

/// A connection-per-call client of the daemon's socket.
pub struct Daemon {
    path: PathBuf,
    timeout: Duration,
}

impl Daemon {
    /// A client for the socket at `path`.
    pub fn new(path: PathBuf, timeout: Duration) -> Self {
        Daemon { path, timeout }
    }

    /// One request, one answer.
    pub fn call<T: DeserializeOwned>(&self, req: &EndpointRequest) -> Result<T, DaemonError> {
        let unreachable = |source| DaemonError::Unreachable {
            path: self.path.clone(),
            source,
        };
        let mut client = Client::connect(&self.path, self.timeout).map_err(unreachable)?;
        match client.call(req) {
            Ok(v) => Ok(v),
            Err(FramingError::Remote(e)) => Err(DaemonError::Remote(e)),
            Err(e) => Err(unreachable(e)),
        }
    }
}
