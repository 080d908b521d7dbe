//! The daemon's own ops on `ctrl.sock`, for `brindlectl`: `ctrl_node_status`,
//! `ctrl_bgp_peers`, `ctrl_bgp_routes`. They live here, not in `brindle-api`,
//! because only this crate's daemon and CLI speak them. Framing is
//! `brindle_api::framing` like every other op on the socket.

use std::net::Ipv4Addr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::registry::NodeRecord;

/// A request of `brindlectl` to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CtrlRequest {
    /// Result: [`NodeStatus`].
    CtrlNodeStatus,
    /// Result: `Vec<brindle_ctrl::bgp::speaker::PeerStatus>`.
    CtrlBgpPeers,
    /// Result: `Vec<brindle_ctrl::bgp::rib::RouteEntry>`.
    CtrlBgpRoutes,
}

/// Answer to [`CtrlRequest::CtrlNodeStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node.
    pub name: String,
    /// Its underlay address.
    pub address: Ipv4Addr,
    /// Its AS.
    pub as_number: u32,
    /// `embedded` or `etcd`.
    pub datastore: String,
    /// Whether the vrouter answered last time.
    pub vrouter_reachable: bool,
    /// Endpoints on this node.
    pub endpoints: usize,
    /// Blocks announced over BGP.
    pub announced_blocks: Vec<IpNet>,
    /// Borrowed addresses (this node's pods in other nodes' blocks)
    /// announced over BGP as host routes.
    #[serde(default)]
    pub announced_borrowed: Vec<IpNet>,
    /// Service prefixes announced over BGP (`bgp.service_*_ips`).
    #[serde(default)]
    pub announced_services: Vec<IpNet>,
    /// Every registered node, with whether its lease holds.
    pub nodes: Vec<NodeView>,
}

/// A registered node as `node status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// The record.
    #[serde(flatten)]
    pub record: NodeRecord,
    /// Its lease holds.
    pub live: bool,
}

/// Whether a request line is one of ours (by its `op`).
pub fn is_ctrl_op(op: &str) -> bool {
    op.starts_with("ctrl_")
}
