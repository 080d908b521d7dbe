//! The node registry: every node writes its record (name, address, AS,
//! role, blocks) under `/brindle/nodes/<name>` (the root is `datastore.prefix`) and refreshes it as a
//! heartbeat; a record older than its lease is a dead node, which the full
//! mesh drops as a peer.
//!
//! The lease is a timestamp in the record rather than an etcd lease because
//! the same code runs on the embedded store, which has no leases; it needs
//! the nodes' clocks to agree to within a fraction of the lease (NTP).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use brindle_ipam::store::{Datastore, StoreError, Write};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Where node records live under the datastore root prefix.
pub const NODES_DIR: &str = "nodes/";

/// A node's BGP role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A member of the full mesh (or a reflector client).
    Node,
    /// A route reflector: mesh members peer with it as its clients.
    RouteReflector,
}

/// One node's registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Node name.
    pub name: String,
    /// Underlay address (BGP and tunnel endpoint).
    pub address: Ipv4Addr,
    /// The node's AS.
    pub as_number: u32,
    /// The port its BGP speaker listens on.
    pub bgp_port: u16,
    /// Its role.
    pub role: Role,
    /// The blocks it announces.
    #[serde(default)]
    pub blocks: Vec<IpNet>,
    /// Last heartbeat, milliseconds since the Unix epoch.
    pub heartbeat_ms: u64,
    /// Dead when `heartbeat_ms` is older than this.
    pub lease_secs: u64,
}

impl NodeRecord {
    /// Whether the lease still holds at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.heartbeat_ms.saturating_add(self.lease_secs * 1000) >= now_ms
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads and writes node records.
#[derive(Clone)]
pub struct Registry {
    store: Arc<dyn Datastore>,
    prefix: String,
}

impl Registry {
    /// A registry on `store` under `root` (`datastore.prefix`, `/brindle/`).
    pub fn new(store: Arc<dyn Datastore>, root: &str) -> Self {
        Registry {
            store,
            prefix: format!("{root}{NODES_DIR}"),
        }
    }

    /// Writes (refreshes) our record. Only this node writes its key, so an
    /// unconditional put is enough.
    pub fn heartbeat(&self, record: &NodeRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(record).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.store.txn(
            &[],
            &[Write::Put(format!("{}{}", self.prefix, record.name), value)],
        )?;
        Ok(())
    }

    /// Every record, live or not; records that do not parse are skipped.
    pub fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        Ok(self
            .store
            .list(&self.prefix)?
            .into_iter()
            .filter_map(|e| serde_json::from_slice(&e.value).ok())
            .collect())
    }
}

/// The mesh peers of node `me`: every other live node.
pub fn mesh_peers<'a>(nodes: &'a [NodeRecord], me: &str, now_ms: u64) -> Vec<&'a NodeRecord> {
    nodes
        .iter()
        .filter(|n| n.name != me && n.is_live(now_ms))
        .collect()
}

/// One BGP peer the registry asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedPeer<'a> {
    /// The node.
    pub node: &'a NodeRecord,
    /// We reflect to it (we are a reflector, it is not).
    pub rr_client: bool,
}

/// The peers node `me` should have among the registered nodes:
/// - full mesh: every other live node;
/// - without the mesh, a route reflector peers with every other live node
///   (its clients, unless they are reflectors too), and any other node
///   peers with the live reflectors only (as their client).
///
/// A reflector reflects to its clients only (`rr_client`).
pub fn wanted_peers<'a>(
    nodes: &'a [NodeRecord],
    me: &str,
    full_mesh: bool,
    i_am_reflector: bool,
    now_ms: u64,
) -> Vec<WantedPeer<'a>> {
    mesh_peers(nodes, me, now_ms)
        .into_iter()
        .filter(|n| full_mesh || i_am_reflector || n.role == Role::RouteReflector)
        .map(|node| WantedPeer {
            node,
            rr_client: i_am_reflector && node.role != Role::RouteReflector,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use brindle_ipam::store::MemoryStore;

    use super::*;

    fn record(name: &str, addr: &str, heartbeat_ms: u64) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            address: addr.parse().unwrap(),
            as_number: 64512,
            bgp_port: 179,
            role: Role::Node,
            blocks: vec![],
            heartbeat_ms,
            lease_secs: 30,
        }
    }

    fn names(peers: &[WantedPeer<'_>]) -> Vec<(String, bool)> {
        peers
            .iter()
            .map(|p| (p.node.name.clone(), p.rr_client))
            .collect()
    }

    #[test]
    fn without_the_mesh_nodes_peer_with_the_reflectors_which_peer_with_everyone() {
        let mut rr = record("rr", "192.168.0.1", 100_000);
        rr.role = Role::RouteReflector;
        let mut rr2 = record("rr2", "192.168.0.2", 100_000);
        rr2.role = Role::RouteReflector;
        let nodes = vec![
            rr,
            rr2,
            record("a", "192.168.0.11", 100_000),
            record("b", "192.168.0.12", 100_000),
            record("dead", "192.168.0.13", 1),
        ];
        // A plain node: the reflectors only, not as our clients.
        assert_eq!(
            names(&wanted_peers(&nodes, "a", false, false, 100_000)),
            [("rr".to_owned(), false), ("rr2".to_owned(), false)]
        );
        // A reflector: every live node, clients except the other reflector.
        assert_eq!(
            names(&wanted_peers(&nodes, "rr", false, true, 100_000)),
            [
                ("rr2".to_owned(), false),
                ("a".to_owned(), true),
                ("b".to_owned(), true)
            ]
        );
        // Full mesh: everyone live, nobody a client.
        assert_eq!(
            names(&wanted_peers(&nodes, "a", true, false, 100_000)),
            [
                ("rr".to_owned(), false),
                ("rr2".to_owned(), false),
                ("b".to_owned(), false)
            ]
        );
    }

    #[test]
    fn the_mesh_is_every_other_live_node() {
        let reg = Registry::new(Arc::new(MemoryStore::new()), "/brindle/");
        reg.heartbeat(&record("a", "192.168.0.11", 100_000))
            .unwrap();
        reg.heartbeat(&record("b", "192.168.0.12", 100_000))
            .unwrap();
        reg.heartbeat(&record("c", "192.168.0.13", 50_000)).unwrap();
        let nodes = reg.nodes().unwrap();
        assert_eq!(nodes.len(), 3);
        let peers: Vec<&str> = mesh_peers(&nodes, "a", 100_000)
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        // c's heartbeat is 50 s old with a 30 s lease: dead.
        assert_eq!(peers, ["b"]);
        // A heartbeat brings it back.
        reg.heartbeat(&record("c", "192.168.0.13", 99_000)).unwrap();
        let nodes = reg.nodes().unwrap();
        assert_eq!(mesh_peers(&nodes, "a", 100_000).len(), 2);
    }
}
