//! Everything the owner loop reacts to, as one enum. Each variant has one
//! producer: a child task or thread (`tasks`), or the `ctrl.sock` server.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use brindle_api::framing::Reply;
use ipnet::IpNet;
use serde_json::Value;

use crate::bgp::rib::RouteChange;
use crate::config::{Config, Validated};
use crate::ctrl_api::CtrlRequest;
use crate::endpoints::EndpointChange;
use crate::neighbors::NeighborChange;
use crate::registry::NodeRecord;
use crate::routing::PoolRouting;

/// One input of the owner loop.
#[derive(Debug)]
pub enum Event {
    /// The periodic tick (every second): refresh the datastore view,
    /// reconcile the vrouter, refresh the BGP metrics.
    Tick,
    /// A best route learned over BGP changed (the speaker's channel).
    Route(RouteChange),
    /// The uplink's kernel neighbours changed (netlink).
    Neighbors(Vec<NeighborChange>),
    /// The uplink's default gateway in the kernel, when not configured
    /// (netlink).
    Gateway(Option<Ipv4Addr>),
    /// What the datastore holds now: the answer to
    /// [`super::effect::DatastoreRequest::Refresh`].
    Datastore(DatastoreView),
    /// An endpoint was stored or deleted over `ctrl.sock`.
    Endpoint(EndpointChange),
    /// The vrouter answered (or stopped answering) the executor; sent on the
    /// executor's first attempt and on every change.
    Vrouter {
        /// It answered the last call.
        reachable: bool,
    },
    /// The speaker refused a peer the owner asked for (it is retried on the
    /// next datastore view).
    PeerFailed(IpAddr),
    /// A `ctrl_*` request over `ctrl.sock`, answered through `reply`.
    Query(CtrlRequest, Responder),
    /// SIGHUP: the configuration read again and validated, or why not.
    Reload(Result<Box<(Config, Validated)>, String>),
    /// SIGTERM or SIGINT.
    Shutdown,
    /// Policy resources and other nodes' endpoints changed in the datastore
    /// (the datastore thread's [`crate::policy::PolicyWatch`]), for the
    /// policy compiler.
    Policy(Vec<brindle_policy::compile::Change>),
    /// A `brindlectl apply|delete` changed the policy records here, or the
    /// periodic check (`POLICY_CHECK`): read the marker key, and the records
    /// when it changed.
    PolicyStored,
    /// A net change of the cluster from the Kubernetes API
    /// ([`super::kube_task`]).
    Kube(Box<brindle_kube::KubeEvent>),
}

impl From<RouteChange> for Event {
    fn from(c: RouteChange) -> Self {
        Event::Route(c)
    }
}

impl From<EndpointChange> for Event {
    fn from(c: EndpointChange) -> Self {
        Event::Endpoint(c)
    }
}

/// The datastore as one refresh read it (`None`: that read failed and was
/// logged). The node's heartbeat was written in the same refresh.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatastoreView {
    /// The IP pools, for routing learned prefixes.
    pub pools: Option<Vec<PoolRouting>>,
    /// The blocks affine to this node.
    pub affine_blocks: Option<BTreeSet<IpNet>>,
    /// Every other block (another node's, or of no node): our pods'
    /// addresses in them are borrowed (from the same read as
    /// `affine_blocks`).
    pub foreign_blocks: Option<BTreeSet<IpNet>>,
    /// Every node record, live or not.
    pub nodes: Option<Vec<NodeRecord>>,
    /// The heartbeat was written.
    pub heartbeat_ok: bool,
    /// When the view was read (ms since the Unix epoch), for node liveness:
    /// the owner reads no clock.
    pub now_ms: u64,
}

impl DatastoreView {
    /// Every read and the heartbeat worked.
    pub fn ok(&self) -> bool {
        self.heartbeat_ok
            && self.pools.is_some()
            && self.affine_blocks.is_some()
            && self.nodes.is_some()
    }
}

/// Where the answer to a [`Event::Query`] goes: a channel of one, so the
/// answer can come from the owner or from a child task (BGP queries) and
/// the asker can wait with a timeout from a plain thread. Responders
/// compare by identity, so recorded effects can be compared.
#[derive(Debug)]
pub struct Responder {
    id: u64,
    tx: mpsc::SyncSender<Reply<Value>>,
}

impl PartialEq for Responder {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Responder {
    /// A responder and the receiver its answer arrives on.
    pub fn new() -> (Responder, mpsc::Receiver<Reply<Value>>) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let (tx, rx) = mpsc::sync_channel(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        (Responder { id, tx }, rx)
    }

    /// Answers (an asker that gave up is not an error).
    pub fn send(self, reply: Reply<Value>) {
        let _ = self.tx.try_send(reply);
    }
}
