//! The IPAM protocol between `brindle-ipam` (the CNI IPAM plugin, and the
//! admin views) and the node daemon, over `/run/brindle/ctrl.sock`.
//!
//! Each request is one [`IpamRequest`] line (see [`crate::framing`]); the
//! daemon answers with one `Reply<T>` line whose `result` type is named on
//! each request variant. Requests carry `v` = [`PROTOCOL_VERSION`]; a daemon
//! refuses a version it does not speak with `invalid_request`, so a plugin
//! newer than its daemon fails loudly rather than half-working.
//!
//! Requests are tagged by `"op"`:
//!
//! ```json
//! {"v":1,"op":"ipam_allocate","handle":{"network":"k8s-pod-network","container_id":"abc","ifname":"eth0"},
//!  "node":"node-1","attrs":{"namespace":"default","pod":"web-0"},"ipv4":true,"ipv6":false}
//! ```
//!
//! Error kinds (in `RemoteError.kind`) mean: `exhausted` — no pool has a free
//! address for this node; `invalid_request` — bad handle, unknown pool, wrong
//! version; `not_found` — a query for something absent; `try_again_later` —
//! the datastore is unreachable or too contended right now; `internal` —
//! anything else.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::framing::PROTOCOL_VERSION;

/// Identifies one allocation: one interface of one container on one network.
/// Allocating twice with the same handle returns the same addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HandleId {
    /// The CNI network name (`name` in the network config).
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl HandleId {
    /// Checks the parts are non-empty and free of the characters that would
    /// break the datastore key (`/`), whitespace and control characters.
    pub fn validate(&self) -> Result<(), String> {
        for (what, part) in [
            ("network", &self.network),
            ("container_id", &self.container_id),
            ("ifname", &self.ifname),
        ] {
            if part.is_empty() {
                return Err(format!("handle {what} is empty"));
            }
            if part.len() > 253 {
                return Err(format!("handle {what} is longer than 253 bytes"));
            }
            if part
                .chars()
                .any(|c| c == '/' || c.is_whitespace() || c.is_control())
            {
                return Err(format!(
                    "handle {what} {part:?} contains '/', whitespace or a control character"
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for HandleId {
    /// `network/container_id/ifname`: the form shown in tables and used in
    /// datastore keys (the parts cannot contain `/`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Who an allocation belongs to, kept with it for views and GC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Attributes {
    /// Pod namespace (`K8S_POD_NAMESPACE` from `CNI_ARGS`), if known.
    pub namespace: Option<String>,
    /// Pod name (`K8S_POD_NAME`), if known.
    pub pod: Option<String>,
    /// Node the allocation was made for.
    pub node: String,
}

/// One CNI GC attachment (`cni.dev/valid-attachments`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attachment {
    /// `containerID`.
    pub container_id: String,
    /// `ifname`.
    pub ifname: String,
}

/// Requests to the node daemon's IPAM service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpamRequest {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// What to do.
    #[serde(flatten)]
    pub op: IpamOp,
}

impl IpamRequest {
    /// Wraps `op` with the current protocol version.
    pub fn new(op: IpamOp) -> Self {
        IpamRequest {
            v: PROTOCOL_VERSION,
            op,
        }
    }
}

/// The operations; the reply's `result` type is given on each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum IpamOp {
    /// Allocate one address per requested family for `handle` on `node`.
    /// Idempotent: a handle that already holds addresses gets them back.
    /// Result: [`AllocateResult`].
    IpamAllocate {
        /// The allocation's key.
        handle: HandleId,
        /// The node the pod runs on (block affinity).
        node: String,
        /// The node's labels, matched against pools' node selectors.
        #[serde(default)]
        node_labels: BTreeMap<String, String>,
        /// Pod namespace/name for views and GC.
        #[serde(default)]
        attrs: Attributes,
        /// Restrict to these pools (by name); empty means every pool.
        #[serde(default)]
        pools: Vec<String>,
        /// Want an IPv4 address.
        #[serde(default = "yes")]
        ipv4: bool,
        /// Want an IPv6 address.
        #[serde(default)]
        ipv6: bool,
    },
    /// Release everything `handle` holds. Releasing an unknown handle is not
    /// an error (CNI DEL is idempotent). Result: [`ReleaseResult`].
    IpamReleaseHandle {
        /// The allocation's key.
        handle: HandleId,
    },
    /// Release one address whoever holds it. Result: [`ReleaseResult`].
    IpamReleaseAddress {
        /// The address.
        address: IpAddr,
    },
    /// What `handle` holds. Result: [`HandleView`]; `not_found` if nothing.
    IpamQueryHandle {
        /// The allocation's key.
        handle: HandleId,
    },
    /// Every pool. Result: `Vec<PoolView>`.
    IpamListPools,
    /// Every block with affinity and usage. Result: `Vec<BlockView>`.
    IpamListBlocks,
    /// Every allocation by handle. Result: `Vec<HandleView>`.
    IpamListHandles,
    /// CNI GC for one network on one node: release every handle of `network`
    /// on `node` that is not in `valid`. Result: [`GcReport`].
    IpamGcAttachments {
        /// The CNI network name.
        network: String,
        /// The node whose handles are considered.
        node: String,
        /// The attachments the runtime still uses.
        valid: Vec<Attachment>,
    },
    /// Cluster GC: release every handle of a node not in `live_nodes`, and
    /// the blocks of those nodes once empty. Result: [`GcReport`].
    IpamGcNodes {
        /// The nodes that still exist.
        live_nodes: Vec<String>,
    },
    /// Is the datastore reachable and is there free space? Result:
    /// [`IpamStatus`].
    IpamStatus,
}

fn yes() -> bool {
    true
}

/// One assigned address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedAddress {
    /// The address as a host prefix (/32 or /128), as Calico hands them out:
    /// a pod reaches everything through its routed veth (CNI `ips[].address`).
    pub address: IpNet,
    /// The pool it came from.
    pub pool: String,
    /// The block it came from.
    pub block: IpNet,
}

/// Result of [`IpamOp::IpamAllocate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocateResult {
    /// One address per requested family, IPv4 first.
    pub addresses: Vec<AssignedAddress>,
}

/// Result of the release operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResult {
    /// Addresses actually released (empty when there was nothing to do).
    pub released: Vec<IpAddr>,
}

/// A pool as shown by the admin views.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    /// Pool name.
    pub name: String,
    /// Pool CIDR.
    pub cidr: IpNet,
    /// Prefix length of its blocks.
    pub block_size: u8,
    /// Encapsulation mode (`none`, `ipip`, `ipip_cross_subnet`, `vxlan`,
    /// `vxlan_cross_subnet` in JSON).
    pub encapsulation: crate::Encapsulation,
    /// Outgoing NAT.
    pub nat_outgoing: bool,
    /// Node selector expression.
    pub node_selector: String,
    /// Disabled pools hand out nothing new.
    pub disabled: bool,
    /// Blocks claimed out of this pool.
    pub blocks: u64,
    /// Addresses in the pool.
    pub capacity: u128,
    /// Addresses allocated.
    pub allocated: u64,
}

/// A block as shown by the admin views.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockView {
    /// Block CIDR.
    pub cidr: IpNet,
    /// Pool it belongs to.
    pub pool: String,
    /// Node with affinity, if any.
    pub affinity: Option<String>,
    /// Addresses that can be handed out (size minus reserved).
    pub usable: u64,
    /// Addresses allocated.
    pub allocated: u64,
}

/// A handle as shown by the admin views and [`IpamOp::IpamQueryHandle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleView {
    /// The key.
    pub handle: HandleId,
    /// Its attributes.
    pub attrs: Attributes,
    /// The addresses it holds.
    pub addresses: Vec<IpAddr>,
}

/// What a GC run reclaimed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Handles released.
    pub handles: Vec<HandleId>,
    /// Addresses released.
    pub addresses: Vec<IpAddr>,
    /// Blocks deleted (empty blocks of dead nodes).
    pub blocks: Vec<IpNet>,
}

/// Result of [`IpamOp::IpamStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamStatus {
    /// Which datastore serves (`embedded`, `etcd`, `memory`).
    pub datastore: String,
    /// Enabled pools.
    pub pools: u64,
    /// Free addresses over all enabled pools (capped at `u64::MAX`).
    pub free: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_by_op_and_carry_the_version() {
        let req = IpamRequest::new(IpamOp::IpamReleaseHandle {
            handle: HandleId {
                network: "net".into(),
                container_id: "c1".into(),
                ifname: "eth0".into(),
            },
        });
        let json = serde_json::to_string(&req).unwrap();
        assert_eq!(
            json,
            r#"{"v":1,"op":"ipam_release_handle","handle":{"network":"net","container_id":"c1","ifname":"eth0"}}"#
        );
        let back: IpamRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn allocate_defaults_to_ipv4_only() {
        let req: IpamRequest = serde_json::from_str(
            r#"{"v":1,"op":"ipam_allocate","handle":{"network":"n","container_id":"c","ifname":"eth0"},"node":"a"}"#,
        )
        .unwrap();
        match req.op {
            IpamOp::IpamAllocate { ipv4, ipv6, .. } => assert!(ipv4 && !ipv6),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn handle_parts_with_a_slash_are_refused() {
        let h = HandleId {
            network: "n".into(),
            container_id: "a/b".into(),
            ifname: "eth0".into(),
        };
        assert!(h.validate().is_err());
        let ok = HandleId {
            container_id: "ab".into(),
            ..h
        };
        assert!(ok.validate().is_ok());
    }
}
