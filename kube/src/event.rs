//! What the source hands to the daemon: one [`KubeEvent`] per net change,
//! serializable (for recording and replay, like the daemon's other events).

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use brindle_policy::resource::{Resource, ResourceKey};
use serde::{Deserialize, Serialize};

/// The four things watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feed {
    /// `v1 Node`.
    Nodes,
    /// `v1 Namespace`.
    Namespaces,
    /// `v1 Pod`.
    Pods,
    /// `networking.k8s.io/v1 NetworkPolicy`.
    NetworkPolicies,
}

impl Feed {
    /// Every feed.
    pub const ALL: [Feed; 4] = [
        Feed::Nodes,
        Feed::Namespaces,
        Feed::Pods,
        Feed::NetworkPolicies,
    ];
}

impl fmt::Display for Feed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feed::Nodes => "nodes",
            Feed::Namespaces => "namespaces",
            Feed::Pods => "pods",
            Feed::NetworkPolicies => "networkpolicies",
        })
    }
}

/// A node as the API has it: what the daemon uses of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `status.addresses` of type `InternalIP`, in the API's order.
    #[serde(default)]
    pub internal_ips: Vec<IpAddr>,
    /// `status.addresses` of type `ExternalIP`, in the API's order.
    #[serde(default)]
    pub external_ips: Vec<IpAddr>,
    /// `spec.podCIDRs` (as the API writes them; Brindle's IPAM does not use
    /// them, they are for display).
    #[serde(default)]
    pub pod_cidrs: Vec<String>,
}

/// One net change of the cluster, in the order the API reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeEvent {
    /// A Namespace, Pod or NetworkPolicy is new or changed.
    Apply(#[serde(with = "resource_value")] Resource),
    /// A Namespace, Pod or NetworkPolicy is gone.
    Delete(ResourceKey),
    /// A node is new or changed.
    NodeApply(NodeInfo),
    /// A node is gone (its name).
    NodeDelete(String),
    /// A full list of the feed was taken: from now on what the source said
    /// of it is the API's state (absence means deleted).
    Synced(Feed),
}

/// A [`Resource`] as its JSON object (`apiVersion`, `kind`, ...).
mod resource_value {
    use brindle_policy::resource::Resource;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(r: &Resource, s: S) -> Result<S::Ok, S::Error> {
        r.to_value().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Resource, D::Error> {
        Resource::from_value(Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}
