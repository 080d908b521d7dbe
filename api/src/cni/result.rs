//! The ADD result, in one canonical (1.1.0) shape read from and written for
//! every supported version.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::*;

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
