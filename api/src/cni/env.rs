//! The `CNI_*` environment and `CNI_ARGS`, validated per verb.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

use super::*;

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
