//! From the API's objects (k8s-openapi types) to what the daemon uses:
//! `brindle_policy` resources (through their JSON, which both sides write
//! as the API does) and [`NodeInfo`].

use std::net::IpAddr;

use brindle_policy::resource::{Invalid, ObjectError, Resource};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::event::NodeInfo;

/// Why an object from the API was not taken (it is logged and counted,
/// and the previous version, if any, stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The object did not serialize (not expected from the API's types).
    #[error("object did not serialize: {0}")]
    Json(#[from] serde_json::Error),
    /// `brindle_policy` does not read it.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// `brindle_policy` refuses it.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// A Namespace, Pod or NetworkPolicy as a validated policy resource.
pub fn resource<T: Serialize>(object: &T) -> Result<Resource, ConvertError> {
    let r = Resource::from_value(serde_json::to_value(object)?)?;
    r.validate()?;
    Ok(r)
}

/// The parts of a node the daemon uses. Addresses that do not parse are
/// left out (the API validates them; a kubelet may still write a name).
pub fn node(n: &Node) -> NodeInfo {
    let mut info = NodeInfo {
        name: n.metadata.name.clone().unwrap_or_default(),
        labels: n.metadata.labels.clone().unwrap_or_default(),
        internal_ips: Vec::new(),
        external_ips: Vec::new(),
        pod_cidrs: n
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default(),
    };
    let addresses = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    for a in addresses {
        let Ok(ip) = a.address.parse::<IpAddr>() else {
            continue;
        };
        match a.type_.as_str() {
            "InternalIP" => info.internal_ips.push(ip),
            "ExternalIP" => info.external_ips.push(ip),
            _ => {}
        }
    }
    info
}
