//! What the owner loop decides, as values. Each kind has one applier in
//! `tasks`: vrouter programming goes to the executor thread, BGP commands
//! to the speaker task, datastore requests to the datastore thread; the
//! owner itself never does I/O.

use std::collections::BTreeSet;
use std::net::IpAddr;

use brindle_api::framing::Reply;
use ipnet::IpNet;
use serde_json::Value;

use super::event::Responder;
use crate::bgp::speaker::PeerConfig;
use crate::health::Health;
use crate::hostpath::HostState;
use crate::programming::Work;

/// One side effect.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Vrouter programming, for the executor (recorded in its desired
    /// state, sent, resynced).
    Vrouter(Work),
    /// A command for the BGP speaker.
    Bgp(BgpCommand),
    /// Datastore I/O; answered by an [`super::event::Event::Datastore`].
    Datastore(DatastoreRequest),
    /// The answer to a query.
    Answer(Responder, Reply<Value>),
    /// Readiness changed: publish it to `ctrl.sock` and `/readyz`.
    Health(Health),
    /// The kernel's host path (routes into the host port, natOutgoing),
    /// for its thread ([`crate::hostpath::spawn`]).
    Host(HostState),
}

/// What the speaker task does for the owner, in order.
#[derive(Debug, PartialEq)]
pub enum BgpCommand {
    /// Announce a prefix of this node with this next hop.
    Announce(IpNet, IpAddr),
    /// Withdraw a prefix of this node.
    Withdraw(IpNet),
    /// Add a peer (a failure comes back as `Event::PeerFailed`).
    AddPeer(Box<PeerConfig>),
    /// Remove a peer (Cease, its routes withdrawn).
    RemovePeer(IpAddr),
    /// Answer with every peer's status.
    Peers(Responder),
    /// Answer with every path of the Loc-RIB.
    Routes(Responder),
    /// Export the peers' counters to the metrics.
    RefreshMetrics,
    /// Cease to every peer, then stop.
    Shutdown,
}

/// Datastore work for the datastore thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatastoreRequest {
    /// Write the heartbeat (the node record with the blocks affine to us)
    /// and read pools, blocks and nodes.
    Refresh,
    /// One pass of the automatic IPAM GC with what the owner knows now.
    IpamGc(GcPass),
    /// Read the policy records and other nodes' endpoints (also part of
    /// every `Refresh`); answered by an `Event::Policy` when something
    /// changed.
    ReadPolicy,
}

/// What one automatic IPAM GC pass is told of the world
/// ([`brindle_ipam::gc::Liveness`], owned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPass {
    /// `(container_id, ifname)` of every endpoint of this node.
    pub endpoints: BTreeSet<(String, String)>,
    /// Every pod that exists (namespace, name); `None` without a pod
    /// source: then the endpoints decide.
    pub pods: Option<BTreeSet<(String, String)>>,
    /// Nodes whose lease is live.
    pub live_nodes: BTreeSet<String>,
    /// When (ms since the Unix epoch), from the datastore view.
    pub now_ms: u64,
}
