//! The CNI specification's types, shared by the `brindle` plugin and the
//! `brindle-ipam` plugin.
//!
//! What lives here, after the CNI SPEC.md (containernetworking/cni, spec 1.1.0):
//!
//! - [`CniVersion`]: the versions we speak (0.3.1, 0.4.0, 1.0.0, 1.1.0) and
//!   what each allows (CHECK from 0.4.0, GC and STATUS from 1.1.0).
//! - [`NetConf`]: the network configuration a plugin receives on stdin, with
//!   `ipam`, `dns`, `runtimeConfig`, `prevResult` and the GC attachment lists.
//!   Unknown fields are ignored, not rejected (the spec requires it), and kept
//!   in [`NetConf::extra`] so the plugin-specific keys can be read from them.
//! - [`CniResult`]: the ADD result in one canonical (1.1.0) shape, parsed from
//!   any supported version and emitted for any supported version
//!   ([`CniResult::to_json`]).
//! - [`CniError`]: the error JSON (`code`, `msg`, `details`) with the spec's
//!   codes in [`ErrorCode`].
//! - [`CniEnv`] and [`CniArgs`]: the `CNI_*` environment, validated per verb.
//! - [`Plugin`] and [`run`]/[`dispatch`]: a generic exec driver. It reads the
//!   environment and stdin, validates them, dispatches the verb, writes JSON
//!   to stdout (result, VERSION output or error) and returns the exit code. It
//!   never logs: logs go to stderr, set up by the binary.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The newest spec version we implement; the `cniVersion` of our VERSION
/// output and of errors raised before the config could be read.
pub const SPEC_VERSION: &str = "1.1.0";

/// Every `cniVersion` the Brindle plugins accept, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The GC key listing the attachments that are still in use (spec 1.1.0).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The older name of [`VALID_ATTACHMENTS_KEY`], still sent by some runtimes.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

// ===== versions =====

/// A CNI spec version this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.3.1: `interfaces`/`ips`/`routes`, `ips[].version`.
    V0_3_1,
    /// 0.4.0: adds CHECK and `prevResult` on DEL/CHECK.
    V0_4_0,
    /// 1.0.0: drops `ips[].version`.
    V1_0_0,
    /// 1.1.0: adds GC, STATUS, interface `mtu`/`socketPath`/`pciID`, route
    /// `mtu`/`advmss`/`priority`/`table`/`scope`.
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first.
    pub const ALL: [CniVersion; 4] = [
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];

    /// The version string as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Whether a config of this version may be used with CHECK.
    pub fn supports_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// Whether a config of this version may be used with GC and STATUS.
    pub fn supports_gc_and_status(self) -> bool {
        self >= CniVersion::V1_1_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CniVersion {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, CniError> {
        CniVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                CniError::new(
                    ErrorCode::INCOMPATIBLE_VERSION,
                    format!("unsupported cniVersion {s:?}"),
                )
                .with_details(format!(
                    "supported versions: {}",
                    SUPPORTED_VERSIONS.join(", ")
                ))
            })
    }
}

/// The VERSION verb's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The version of this output's format.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// Every version the plugin accepts.
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

impl VersionInfo {
    /// The VERSION output of a Brindle plugin.
    pub fn brindle() -> Self {
        VersionInfo {
            cni_version: SPEC_VERSION.to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

// ===== errors =====

/// A CNI error code. A newtype rather than an enum so that codes a delegated
/// plugin returns (including plugin-specific ones, 100 and up) pass through
/// unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// 1: incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: ErrorCode = ErrorCode(1);
    /// 2: unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: ErrorCode = ErrorCode(2);
    /// 3: the container is unknown or does not exist.
    pub const UNKNOWN_CONTAINER: ErrorCode = ErrorCode(3);
    /// 4: invalid necessary environment variables.
    pub const INVALID_ENVIRONMENT: ErrorCode = ErrorCode(4);
    /// 5: I/O failure.
    pub const IO_FAILURE: ErrorCode = ErrorCode(5);
    /// 6: failed to decode content.
    pub const DECODE_FAILURE: ErrorCode = ErrorCode(6);
    /// 7: invalid network configuration.
    pub const INVALID_CONFIG: ErrorCode = ErrorCode(7);
    /// 11: try again later (a transient condition).
    pub const TRY_AGAIN_LATER: ErrorCode = ErrorCode(11);
    /// 50 (STATUS): the plugin is not available; no new ADDs.
    pub const PLUGIN_NOT_AVAILABLE: ErrorCode = ErrorCode(50);
    /// 51 (STATUS): not available, and existing containers' networking may
    /// be limited.
    pub const PLUGIN_NOT_AVAILABLE_LIMITED: ErrorCode = ErrorCode(51);
}

/// The spec's error JSON: `{"cniVersion", "code", "msg", "details"}`,
/// written to stdout with a non-zero exit code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {}: {msg}{}", code.0, if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    /// The version of the error's format: the config's `cniVersion` when it
    /// was readable, else [`SPEC_VERSION`].
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// The error code.
    pub code: ErrorCode,
    /// A short message.
    pub msg: String,
    /// A longer explanation; omitted when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with `code` and `msg`, in format [`SPEC_VERSION`].
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        CniError {
            cni_version: SPEC_VERSION.to_string(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds the longer explanation.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Sets the format version (the config's `cniVersion`).
    pub fn in_version(mut self, version: &str) -> Self {
        self.cni_version = version.to_string();
        self
    }

    /// Shorthand for code 5.
    pub fn io(msg: impl Into<String>, err: impl fmt::Display) -> Self {
        Self::new(ErrorCode::IO_FAILURE, msg).with_details(err.to_string())
    }

    /// Shorthand for code 7.
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_CONFIG, msg)
    }

    /// Shorthand for code 4.
    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_ENVIRONMENT, msg)
    }

    /// Shorthand for code 11.
    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::TRY_AGAIN_LATER, msg)
    }

    /// The error as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!(r#"{{"cniVersion":"{SPEC_VERSION}","code":5,"msg":"error encoding failed"}}"#)
        })
    }
}

mod conf;
mod env;
mod exec;
mod result;

pub use conf::*;
pub use env::*;
pub use exec::*;
pub use result::*;

#[cfg(test)]
mod tests;
