//! The network configuration a plugin receives on stdin (a single config or a
//! conflist), and the names the spec allows.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::*;

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
