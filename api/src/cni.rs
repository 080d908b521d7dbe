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

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

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

// ===== network configuration =====

/// One attachment named in a GC request's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attachment {
    /// The container ID of the attachment.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name in the container.
    pub ifname: String,
}

/// The `ipam` section: `type` names the IPAM plugin binary; the rest belongs
/// to that plugin and is kept as is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpamConf {
    /// The IPAM plugin's binary name, looked up in `CNI_PATH`.
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// Every other key, for the IPAM plugin.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// DNS settings, in the config and in results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set (then it is left out of results).
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// The network configuration one plugin receives on stdin.
///
/// Parse with [`NetConf::parse`], which validates what the spec requires.
/// Keys not named here stay in [`NetConf::extra`]; plugin-specific settings
/// are read from there with [`NetConf::plugin_config`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConf {
    /// The version of the config (and of the expected result).
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// The network's name, unique on the host.
    #[serde(default)]
    pub name: String,
    /// The plugin's binary name.
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// Extra arguments from the runtime (`args`), uninterpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// Whether to masquerade traffic leaving the network.
    #[serde(rename = "ipMasq", default, skip_serializing_if = "Option::is_none")]
    pub ip_masq: Option<bool>,
    /// The IPAM section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConf>,
    /// DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// Capabilities the runtime filled in (`portMappings`, `bandwidth`, ...).
    #[serde(
        rename = "runtimeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_config: Option<Map<String, Value>>,
    /// The previous plugin's result (chains; DEL and CHECK from 0.4.0), in
    /// its own version's shape. Read it with [`CniResult::from_json`].
    #[serde(
        rename = "prevResult",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_result: Option<Value>,
    /// GC: attachments still in use (spec 1.1.0).
    #[serde(
        rename = "cni.dev/valid-attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// GC: the older name of `cni.dev/valid-attachments`.
    #[serde(
        rename = "cni.dev/attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub legacy_attachments: Option<Vec<Attachment>>,
    /// Every key not named above, kept (plugin-specific settings, and
    /// anything a newer runtime adds).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetConf {
    /// Parses and validates the config: JSON that does not decode is code 6,
    /// an unsupported `cniVersion` code 1, a missing or malformed `name` or
    /// `type` code 7. Unknown keys are accepted.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                ErrorCode::DECODE_FAILURE,
                "cannot decode the network configuration",
            )
            .with_details(e.to_string())
        })?;
        let version = conf.version()?;
        let in_version = |e: CniError| e.in_version(version.as_str());
        if !valid_network_name(&conf.name) {
            return Err(in_version(CniError::invalid_config(format!(
                "invalid network name {:?}: needs letters, digits, '_', '.' or '-', starting with a letter or digit",
                conf.name
            ))));
        }
        if conf.plugin_type.is_empty() {
            return Err(in_version(CniError::invalid_config(
                "the network configuration has no \"type\"",
            )));
        }
        if let Some(ipam) = &conf.ipam
            && !valid_plugin_name(&ipam.plugin_type)
        {
            return Err(in_version(CniError::invalid_config(format!(
                "invalid ipam type {:?}",
                ipam.plugin_type
            ))));
        }
        Ok(conf)
    }

    /// The config's `cniVersion`, checked.
    pub fn version(&self) -> Result<CniVersion, CniError> {
        self.cni_version.parse()
    }

    /// Reads the plugin-specific keys (those in [`NetConf::extra`]) into `T`.
    /// `T` should use `#[serde(default)]` and no `deny_unknown_fields`, so
    /// that a config written for a newer plugin still loads. Failure is code 7.
    pub fn plugin_config<T: serde::de::DeserializeOwned>(&self) -> Result<T, CniError> {
        serde_json::from_value(Value::Object(self.extra.clone())).map_err(|e| {
            CniError::invalid_config("invalid plugin settings")
                .with_details(e.to_string())
                .in_version(&self.cni_version)
        })
    }

    /// GC: the attachments still in use, from both the current and the
    /// older key. `None` when neither is present (then GC must not release
    /// anything: the runtime did not say what is valid).
    pub fn gc_valid_attachments(&self) -> Option<Vec<Attachment>> {
        match (&self.valid_attachments, &self.legacy_attachments) {
            (None, None) => None,
            (a, b) => {
                let mut all: Vec<Attachment> =
                    a.iter().chain(b.iter()).flatten().cloned().collect();
                all.sort();
                all.dedup();
                Some(all)
            }
        }
    }
}

/// The spec's rule for network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn valid_network_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A plugin binary name: non-empty, no path separators, not `.` or `..`
/// (the name is looked up in `CNI_PATH`, never used as a path).
pub fn valid_plugin_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// A network configuration list (`.conflist`), as runtimes read it. Used to
/// generate and check the conflist Brindle installs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConfList {
    /// The list's version; each plugin gets it as its config's `cniVersion`.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// 1.1.0: versions the list works with, for runtimes that pick one.
    #[serde(rename = "cniVersions", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_versions: Vec<String>,
    /// The network's name.
    pub name: String,
    /// Whether runtimes should skip CHECK.
    #[serde(rename = "disableCheck", default, skip_serializing_if = "is_false")]
    pub disable_check: bool,
    /// 1.1.0: whether runtimes should skip GC.
    #[serde(rename = "disableGC", default, skip_serializing_if = "is_false")]
    pub disable_gc: bool,
    /// The plugins, in ADD order; each is a plugin config without
    /// `cniVersion` and `name` (the runtime inserts them).
    pub plugins: Vec<Map<String, Value>>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl NetConfList {
    /// The config plugin `index` receives, as a runtime builds it: the
    /// plugin's own keys plus `cniVersion` and `name` from the list, the
    /// runtime's `runtimeConfig` for the capabilities the plugin declares,
    /// and `prevResult` when there is one.
    pub fn plugin_conf(
        &self,
        index: usize,
        runtime_config: &Map<String, Value>,
        prev_result: Option<&Value>,
    ) -> Option<Value> {
        let plugin = self.plugins.get(index)?;
        let mut conf = plugin.clone();
        conf.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        conf.insert("name".into(), Value::String(self.name.clone()));
        if let Some(Value::Object(caps)) = plugin.get("capabilities") {
            let mut rc = Map::new();
            for (cap, enabled) in caps {
                if enabled == &Value::Bool(true)
                    && let Some(v) = runtime_config.get(cap)
                {
                    rc.insert(cap.clone(), v.clone());
                }
            }
            if !rc.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(rc));
            }
        }
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        Some(Value::Object(conf))
    }
}

// ===== results =====

/// An interface in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// The interface's name.
    pub name: String,
    /// Its MAC address, as `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// 1.1.0: its MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path for a pod interface; empty/absent for a host one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// 1.1.0: a socket path for userspace interfaces.
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// 1.1.0: the PCI ID of a device interface.
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// An IP configuration in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address and prefix length.
    pub address: IpNet,
    /// The default gateway for this address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into the result's `interfaces` of the interface holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination.
    pub dst: IpNet,
    /// Next hop; absent means the interface's gateway or on-link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// 1.1.0: route MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// 1.1.0: advertised MSS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// 1.1.0: route priority (metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// 1.1.0: routing table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// 1.1.0: route scope (RT_SCOPE_* number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// An ADD result in its canonical (1.1.0) shape; [`CniResult::to_json`]
/// writes it for any supported version and [`CniResult::from_json`] reads
/// any supported version's shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// Interfaces created or used.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes installed.
    pub routes: Vec<Route>,
    /// DNS settings.
    pub dns: Dns,
}

/// Wire shape of a result of any supported version, for decoding.
#[derive(Deserialize)]
struct WireResult {
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<IpConfig>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Option<Dns>,
}

impl CniResult {
    /// Reads a result of any supported version (e.g. an IPAM plugin's
    /// output or a `prevResult`). The `ips[].version` of versions before
    /// 1.0.0 is implied by the address and ignored. A result of a version we
    /// do not speak is code 1; one that does not decode is code 6.
    pub fn from_json(value: &Value) -> Result<(CniVersion, CniResult), CniError> {
        let wire: WireResult = serde_json::from_value(value.clone()).map_err(|e| {
            CniError::new(ErrorCode::DECODE_FAILURE, "cannot decode the CNI result")
                .with_details(e.to_string())
        })?;
        let version: CniVersion = wire.cni_version.parse()?;
        let result = CniResult {
            interfaces: wire.interfaces,
            ips: wire.ips,
            routes: wire.routes,
            dns: wire.dns.unwrap_or_default(),
        };
        result.check_interface_indexes()?;
        Ok((version, result))
    }

    /// Reads a result from bytes (see [`CniResult::from_json`]).
    pub fn from_slice(bytes: &[u8]) -> Result<(CniVersion, CniResult), CniError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            CniError::new(ErrorCode::DECODE_FAILURE, "cannot decode the CNI result")
                .with_details(e.to_string())
        })?;
        Self::from_json(&value)
    }

    fn check_interface_indexes(&self) -> Result<(), CniError> {
        for ip in &self.ips {
            if let Some(i) = ip.interface
                && i >= self.interfaces.len()
            {
                return Err(CniError::new(
                    ErrorCode::DECODE_FAILURE,
                    format!(
                        "ip {} names interface {i}, which the result does not have",
                        ip.address
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Writes the result in `version`'s shape: `ips[].version` ("4"/"6")
    /// before 1.0.0, the 1.1.0 interface and route fields only from 1.1.0.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let new_fields = version >= CniVersion::V1_1_0;
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut i = i.clone();
                if !new_fields {
                    i.mtu = None;
                    i.socket_path = None;
                    i.pci_id = None;
                }
                serde_json::to_value(i).unwrap_or(Value::Null)
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = serde_json::to_value(ip).unwrap_or(Value::Null);
                if version < CniVersion::V1_0_0
                    && let Value::Object(m) = &mut v
                {
                    let family = if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    };
                    m.insert("version".into(), Value::String(family.into()));
                }
                v
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if !new_fields {
                    r.mtu = None;
                    r.advmss = None;
                    r.priority = None;
                    r.table = None;
                    r.scope = None;
                }
                serde_json::to_value(r).unwrap_or(Value::Null)
            })
            .collect();
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if !interfaces.is_empty() {
            out.insert("interfaces".into(), Value::Array(interfaces));
        }
        if !ips.is_empty() {
            out.insert("ips".into(), Value::Array(ips));
        }
        if !routes.is_empty() {
            out.insert("routes".into(), Value::Array(routes));
        }
        if !self.dns.is_empty() {
            out.insert(
                "dns".into(),
                serde_json::to_value(&self.dns).unwrap_or(Value::Null),
            );
        }
        Value::Object(out)
    }
}

// ===== environment =====

/// The verb in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach the container to the network.
    Add,
    /// Detach it (idempotent).
    Del,
    /// Verify the attachment (0.4.0+).
    Check,
    /// Release everything not in the valid attachments (1.1.0).
    Gc,
    /// Is the plugin ready for ADDs? (1.1.0)
    Status,
    /// Report supported versions.
    Version,
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::invalid_env(format!(
                    "unknown CNI_COMMAND {other:?}"
                )));
            }
        })
    }
}

impl Command {
    /// The verb as it appears in `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }
}

/// `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// Every pair, in order.
    pub pairs: BTreeMap<String, String>,
}

impl CniArgs {
    /// Parses `CNI_ARGS`; a pair without `=` is code 4.
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut pairs = BTreeMap::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                CniError::invalid_env(format!("CNI_ARGS: {pair:?} is not KEY=VALUE"))
            })?;
            if k.is_empty() {
                return Err(CniError::invalid_env(format!(
                    "CNI_ARGS: {pair:?} has no key"
                )));
            }
            pairs.insert(k.to_string(), v.to_string());
        }
        Ok(CniArgs { pairs })
    }

    /// A value by key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.get(key).map(String::as_str)
    }

    /// `K8S_POD_NAMESPACE`.
    pub fn pod_namespace(&self) -> Option<&str> {
        self.get("K8S_POD_NAMESPACE")
    }

    /// `K8S_POD_NAME`.
    pub fn pod_name(&self) -> Option<&str> {
        self.get("K8S_POD_NAME")
    }

    /// `K8S_POD_UID`.
    pub fn pod_uid(&self) -> Option<&str> {
        self.get("K8S_POD_UID")
    }

    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub fn pod_infra_container_id(&self) -> Option<&str> {
        self.get("K8S_POD_INFRA_CONTAINER_ID")
    }
}

/// The `CNI_*` environment, validated for its verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (empty when the verb does not need it).
    pub container_id: String,
    /// `CNI_NETNS` (`None` when absent, allowed for DEL/GC/STATUS/VERSION).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (empty when the verb does not need it).
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: CniArgs,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    /// Reads the process environment.
    pub fn from_process() -> Result<CniEnv, CniError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads and validates the variables through `var` (so tests need not
    /// touch the process environment). Missing or malformed required
    /// variables are code 4.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        let command: Command = nonempty("CNI_COMMAND")
            .ok_or_else(|| CniError::invalid_env("CNI_COMMAND is not set"))?
            .parse()?;
        let (needs_id, needs_netns, needs_ifname, needs_path) = match command {
            Command::Add | Command::Check => (true, true, true, true),
            Command::Del => (true, false, true, true),
            Command::Gc | Command::Status => (false, false, false, true),
            Command::Version => (false, false, false, false),
        };
        let container_id = nonempty("CNI_CONTAINERID").unwrap_or_default();
        if needs_id && container_id.is_empty() {
            return Err(CniError::invalid_env("CNI_CONTAINERID is not set"));
        }
        if !container_id.is_empty() && !valid_container_id(&container_id) {
            return Err(CniError::invalid_env(format!(
                "CNI_CONTAINERID {container_id:?} must be letters, digits, '_', '.' and '-'"
            )));
        }
        let netns = nonempty("CNI_NETNS").map(PathBuf::from);
        if needs_netns && netns.is_none() {
            return Err(CniError::invalid_env("CNI_NETNS is not set"));
        }
        let ifname = nonempty("CNI_IFNAME").unwrap_or_default();
        if needs_ifname && ifname.is_empty() {
            return Err(CniError::invalid_env("CNI_IFNAME is not set"));
        }
        if !ifname.is_empty() && !valid_ifname(&ifname) {
            return Err(CniError::invalid_env(format!(
                "CNI_IFNAME {ifname:?} is not a valid interface name"
            )));
        }
        let path: Vec<PathBuf> = nonempty("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        if needs_path && path.is_empty() {
            return Err(CniError::invalid_env("CNI_PATH is not set"));
        }
        let args = CniArgs::parse(&var("CNI_ARGS").unwrap_or_default())?;
        Ok(CniEnv {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }

    /// Finds plugin `name` in `CNI_PATH` (first match wins), as runtimes and
    /// delegating plugins must.
    pub fn find_plugin(&self, name: &str) -> Option<PathBuf> {
        if !valid_plugin_name(name) {
            return None;
        }
        self.path
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    }

    /// The variables to pass to a delegated plugin (the same environment).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let args: Vec<String> = self
            .args
            .pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let path: Vec<String> = self.path.iter().map(|p| p.display().to_string()).collect();
        vec![
            ("CNI_COMMAND", self.command.as_str().to_string()),
            ("CNI_CONTAINERID", self.container_id.clone()),
            (
                "CNI_NETNS",
                self.netns
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            ("CNI_IFNAME", self.ifname.clone()),
            ("CNI_ARGS", args.join(";")),
            ("CNI_PATH", path.join(":")),
        ]
    }
}

/// The spec's container ID rule: letters, digits, `_`, `.`, `-`, at least one.
pub fn valid_container_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The spec's interface name rule: 1..=15 bytes, not `.` or `..`, no `/`,
/// `:` or whitespace.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

// ===== exec driver =====

/// One invocation, as the driver hands it to a [`Plugin`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The validated environment.
    pub env: CniEnv,
    /// The validated config.
    pub conf: NetConf,
    /// The config's version.
    pub version: CniVersion,
    /// The config exactly as received, for delegation (the spec passes the
    /// same config to the delegated plugin).
    pub stdin: Vec<u8>,
}

/// What a CNI plugin implements; [`run`] does the rest.
pub trait Plugin {
    /// ADD: attach and return the result (the driver writes it in the
    /// config's version).
    fn add(&self, req: &Request) -> Result<CniResult, CniError>;
    /// DEL: detach, best-effort and idempotent.
    fn del(&self, req: &Request) -> Result<(), CniError>;
    /// CHECK: verify the attachment against `prevResult`.
    fn check(&self, req: &Request) -> Result<(), CniError>;
    /// GC: release what is not in the valid attachments.
    fn gc(&self, req: &Request) -> Result<(), CniError>;
    /// STATUS: `Ok` when ready for ADDs, else code 50 or 51.
    fn status(&self, req: &Request) -> Result<(), CniError>;
}

/// What one invocation produced: the bytes for stdout and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Everything to write to stdout.
    pub stdout: Vec<u8>,
    /// The process exit code (0 on success, 1 on error).
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: Vec<u8>) -> Self {
        Outcome {
            stdout,
            exit_code: 0,
        }
    }

    fn error(e: &CniError) -> Self {
        let mut stdout = e.to_json().into_bytes();
        stdout.push(b'\n');
        Outcome {
            stdout,
            exit_code: 1,
        }
    }
}

/// Runs one invocation from explicit inputs: validates the environment and
/// the config, checks that the config's version allows the verb, calls the
/// plugin and encodes its answer. Errors carry the config's `cniVersion`
/// when it was readable.
pub fn dispatch<P: Plugin>(
    plugin: &P,
    var: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Outcome {
    // The error's version: the config's when it names one we speak.
    let conf_version = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()));
    let fail = |e: CniError| {
        let e = match &conf_version {
            Some(v) => e.in_version(v),
            None => e,
        };
        Outcome::error(&e)
    };
    let env = match CniEnv::from_vars(&var) {
        Ok(env) => env,
        Err(e) => return fail(e),
    };
    if env.command == Command::Version {
        let mut out = serde_json::to_vec(&VersionInfo::brindle()).unwrap_or_default();
        out.push(b'\n');
        return Outcome::ok(out);
    }
    let conf = match NetConf::parse(stdin) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let version = match conf.version() {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let refuse = |what: &str| {
        fail(CniError::new(
            ErrorCode::INCOMPATIBLE_VERSION,
            format!("cniVersion {version} does not support {what}"),
        ))
    };
    match env.command {
        Command::Check if !version.supports_check() => return refuse("CHECK"),
        Command::Gc | Command::Status if !version.supports_gc_and_status() => {
            return refuse(env.command.as_str());
        }
        _ => {}
    }
    let req = Request {
        env,
        conf,
        version,
        stdin: stdin.to_vec(),
    };
    let answer = match req.env.command {
        Command::Add => plugin.add(&req).map(|r| {
            let mut out = serde_json::to_vec(&r.to_json(version)).unwrap_or_default();
            out.push(b'\n');
            out
        }),
        Command::Del => plugin.del(&req).map(|()| Vec::new()),
        Command::Check => plugin.check(&req).map(|()| Vec::new()),
        Command::Gc => plugin.gc(&req).map(|()| Vec::new()),
        Command::Status => plugin.status(&req).map(|()| Vec::new()),
        Command::Version => unreachable_version(),
    };
    match answer {
        Ok(out) => Outcome::ok(out),
        Err(e) => fail(e),
    }
}

// VERSION returned above; kept as a function so the match stays exhaustive
// without a panic path.
fn unreachable_version() -> Result<Vec<u8>, CniError> {
    Ok(Vec::new())
}

/// Runs one invocation against the real process: environment, stdin,
/// stdout. Returns the exit code for `std::process::exit`.
pub fn run<P: Plugin>(plugin: &P) -> i32 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = CniError::io("cannot read stdin", e);
        let _ = std::io::stdout().write_all(e.to_json().as_bytes());
        return 1;
    }
    let outcome = dispatch(plugin, |k| std::env::var(k).ok(), &stdin);
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&outcome.stdout)
        .and_then(|()| out.flush())
        .is_err()
    {
        return 1;
    }
    outcome.exit_code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    const ADD_ENV: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1",
        ),
    ];

    #[test]
    fn config_keeps_unknown_fields_and_reads_the_known_ones() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"brindle","mtu":1400,
                "futureKey":{"a":1},
                "ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/24"}]]},
                "runtimeConfig":{"portMappings":[]},
                "prevResult":{"cniVersion":"1.0.0"}}"#,
        )
        .unwrap();
        assert_eq!(conf.version().unwrap(), CniVersion::V1_0_0);
        assert_eq!(conf.plugin_type, "brindle");
        assert_eq!(conf.extra["mtu"], json!(1400));
        assert_eq!(conf.extra["futureKey"], json!({"a":1}));
        let ipam = conf.ipam.as_ref().unwrap();
        assert_eq!(ipam.plugin_type, "host-local");
        assert!(ipam.extra.contains_key("ranges"));
        assert!(conf.runtime_config.unwrap().contains_key("portMappings"));
        assert!(conf.prev_result.is_some());
    }

    #[test]
    fn config_errors_carry_the_spec_codes() {
        let code = |s: &[u8]| NetConf::parse(s).unwrap_err().code;
        assert_eq!(code(b"{not json"), ErrorCode::DECODE_FAILURE);
        assert_eq!(
            code(br#"{"cniVersion":"0.2.0","name":"n","type":"t"}"#),
            ErrorCode::INCOMPATIBLE_VERSION
        );
        assert_eq!(
            code(br#"{"cniVersion":"1.0.0","name":"","type":"t"}"#),
            ErrorCode::INVALID_CONFIG
        );
        assert_eq!(
            code(br#"{"cniVersion":"1.0.0","name":"-bad","type":"t"}"#),
            ErrorCode::INVALID_CONFIG
        );
        assert_eq!(
            code(br#"{"cniVersion":"1.0.0","name":"n"}"#),
            ErrorCode::INVALID_CONFIG
        );
        assert_eq!(
            code(br#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{"type":"../x"}}"#),
            ErrorCode::INVALID_CONFIG
        );
    }

    #[test]
    fn gc_attachments_merge_the_current_and_the_older_key() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"t",
                "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"b","ifname":"eth0"},{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        let all = conf.gc_valid_attachments().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].container_id, "b");
        let none = NetConf::parse(br#"{"cniVersion":"1.1.0","name":"n","type":"t"}"#).unwrap();
        assert_eq!(none.gc_valid_attachments(), None);
    }

    fn sample_result() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "bri0123456789a".into(),
                    mac: "ee:ee:ee:ee:ee:ee".into(),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:01".into(),
                    mtu: Some(1450),
                    sandbox: "/var/run/netns/x".into(),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.1.0.5/32".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/128".parse().unwrap(),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("169.254.1.1".parse().unwrap()),
                mtu: None,
                advmss: None,
                priority: None,
                table: None,
                scope: Some(0),
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn results_before_1_0_0_carry_ip_versions_and_no_new_fields() {
        let v = sample_result().to_json(CniVersion::V0_3_1);
        assert_eq!(v["cniVersion"], "0.3.1");
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
        assert_eq!(v["ips"][0]["interface"], 1);
        assert!(v["interfaces"][1].get("mtu").is_none());
        assert!(v["routes"][0].get("scope").is_none());
        assert_eq!(v["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn results_from_1_0_0_drop_ip_versions_and_1_1_0_adds_mtu_and_scope() {
        let v100 = sample_result().to_json(CniVersion::V1_0_0);
        assert!(v100["ips"][0].get("version").is_none());
        assert!(v100["interfaces"][1].get("mtu").is_none());
        let v110 = sample_result().to_json(CniVersion::V1_1_0);
        assert_eq!(v110["interfaces"][1]["mtu"], 1450);
        assert_eq!(v110["routes"][0]["scope"], 0);
        assert_eq!(v110["interfaces"][0]["name"], "bri0123456789a");
        assert!(v110["interfaces"][0].get("sandbox").is_none());
    }

    #[test]
    fn results_round_trip_through_every_version() {
        for from in CniVersion::ALL {
            let wire = sample_result().to_json(from);
            let (v, parsed) = CniResult::from_json(&wire).unwrap();
            assert_eq!(v, from);
            for to in CniVersion::ALL {
                let again = CniResult::from_json(&parsed.to_json(to)).unwrap().1;
                if from >= CniVersion::V1_1_0 && to >= CniVersion::V1_1_0 {
                    assert_eq!(again, sample_result());
                } else {
                    assert_eq!(again.ips, sample_result().ips);
                    assert_eq!(again.interfaces.len(), 2);
                }
            }
        }
    }

    #[test]
    fn results_of_unknown_versions_or_bad_indexes_are_refused() {
        let old = json!({"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.1/24"}});
        assert_eq!(
            CniResult::from_json(&old).unwrap_err().code,
            ErrorCode::INCOMPATIBLE_VERSION
        );
        let bad = json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/24","interface":3}]});
        assert_eq!(
            CniResult::from_json(&bad).unwrap_err().code,
            ErrorCode::DECODE_FAILURE
        );
    }

    #[test]
    fn error_json_has_code_msg_and_details() {
        let e = CniError::try_again_later("node daemon not ready")
            .with_details("connect: No such file")
            .in_version("1.0.0");
        let v: Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            json!({"cniVersion":"1.0.0","code":11,"msg":"node daemon not ready","details":"connect: No such file"})
        );
        let bare: Value =
            serde_json::from_str(&CniError::new(ErrorCode::IO_FAILURE, "x").to_json()).unwrap();
        assert!(bare.get("details").is_none());
        assert_eq!(bare["cniVersion"], SPEC_VERSION);
    }

    #[test]
    fn environment_is_validated_per_verb() {
        let env = CniEnv::from_vars(vars(ADD_ENV)).unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.path.len(), 2);
        assert_eq!(env.args.pod_namespace(), Some("default"));
        assert_eq!(env.args.pod_name(), Some("web-0"));
        assert_eq!(env.args.pod_uid(), Some("u-1"));
        assert_eq!(env.args.pod_infra_container_id(), None);

        let no_netns: Vec<_> = ADD_ENV
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect();
        let e = CniEnv::from_vars(vars(&no_netns)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT);
        let mut del = no_netns.clone();
        del[0] = ("CNI_COMMAND", "DEL");
        assert!(CniEnv::from_vars(vars(&del)).unwrap().netns.is_none());

        let gc = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")];
        assert!(CniEnv::from_vars(vars(&gc)).is_ok());
        for (k, bad) in [
            ("CNI_IFNAME", "a-very-long-name0"),
            ("CNI_IFNAME", "eth/0"),
            ("CNI_CONTAINERID", "a b"),
            ("CNI_ARGS", "novalue"),
            ("CNI_COMMAND", "ATTACH"),
        ] {
            let mut bent: Vec<_> = ADD_ENV.to_vec();
            bent.iter_mut().find(|(n, _)| *n == k).unwrap().1 = bad;
            let e = CniEnv::from_vars(vars(&bent)).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT, "{k}={bad}");
        }
    }

    #[test]
    fn environment_round_trips_for_delegation() {
        let env = CniEnv::from_vars(vars(ADD_ENV)).unwrap();
        let passed = env.to_vars();
        let again =
            CniEnv::from_vars(|k| passed.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
                .unwrap();
        assert_eq!(again, env);
    }

    struct Fake;
    impl Plugin for Fake {
        fn add(&self, req: &Request) -> Result<CniResult, CniError> {
            if req.env.container_id == "fail" {
                return Err(CniError::try_again_later("not ready"));
            }
            Ok(sample_result())
        }
        fn del(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn check(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn gc(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn status(&self, _: &Request) -> Result<(), CniError> {
            Err(CniError::new(ErrorCode::PLUGIN_NOT_AVAILABLE, "down"))
        }
    }

    fn with_command<'a>(cmd: &'a str, id: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut v = ADD_ENV.to_vec();
        v[0].1 = cmd;
        v[1].1 = id;
        v
    }

    #[test]
    fn driver_writes_the_result_in_the_configs_version() {
        let env = with_command("ADD", "c1");
        let out = dispatch(
            &Fake,
            vars(&env),
            br#"{"cniVersion":"0.4.0","name":"n","type":"brindle"}"#,
        );
        assert_eq!(out.exit_code, 0);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["ips"][0]["version"], "4");
    }

    #[test]
    fn driver_reports_errors_as_json_with_the_configs_version() {
        let env = with_command("ADD", "fail");
        let out = dispatch(
            &Fake,
            vars(&env),
            br#"{"cniVersion":"1.0.0","name":"n","type":"brindle"}"#,
        );
        assert_eq!(out.exit_code, 1);
        let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (e.code, e.cni_version.as_str()),
            (ErrorCode::TRY_AGAIN_LATER, "1.0.0")
        );
    }

    #[test]
    fn driver_refuses_verbs_the_version_does_not_have() {
        for (cmd, version) in [("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "0.4.0")] {
            let env = with_command(cmd, "c1");
            let conf = format!(r#"{{"cniVersion":"{version}","name":"n","type":"brindle"}}"#);
            let out = dispatch(&Fake, vars(&env), conf.as_bytes());
            let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(e.code, ErrorCode::INCOMPATIBLE_VERSION, "{cmd} {version}");
        }
        let env = with_command("STATUS", "c1");
        let out = dispatch(
            &Fake,
            vars(&env),
            br#"{"cniVersion":"1.1.0","name":"n","type":"brindle"}"#,
        );
        let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(e.code, ErrorCode::PLUGIN_NOT_AVAILABLE);
    }

    #[test]
    fn driver_answers_version_without_a_config() {
        let env = [("CNI_COMMAND", "VERSION")];
        let out = dispatch(&Fake, vars(&env), b"");
        assert_eq!(out.exit_code, 0);
        let v: VersionInfo = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v, VersionInfo::brindle());
        assert_eq!(v.supported_versions, ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    }

    #[test]
    fn driver_maps_a_missing_command_to_code_4() {
        let out = dispatch(&Fake, vars(&[]), b"{}");
        let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT);
        assert_eq!(out.exit_code, 1);
    }

    #[test]
    fn conflist_builds_each_plugins_config_like_a_runtime() {
        let list: NetConfList = serde_json::from_value(json!({
            "cniVersion":"1.0.0","name":"k8s",
            "plugins":[{"type":"brindle"},{"type":"portmap","capabilities":{"portMappings":true}}]
        }))
        .unwrap();
        let rc: Map<String, Value> =
            serde_json::from_value(json!({"portMappings":[{"hostPort":8080}],"bandwidth":{}}))
                .unwrap();
        let first = list.plugin_conf(0, &rc, None).unwrap();
        assert_eq!(
            first,
            json!({"type":"brindle","cniVersion":"1.0.0","name":"k8s"})
        );
        let prev = json!({"cniVersion":"1.0.0"});
        let second = list.plugin_conf(1, &rc, Some(&prev)).unwrap();
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings":[{"hostPort":8080}]})
        );
        assert_eq!(second["prevResult"], prev);
        assert!(list.plugin_conf(2, &rc, None).is_none());
    }
}
