//! The forwarding information base: longest-prefix match for IPv4 and IPv6.
//!
//! The control thread owns the [`Fib`] and changes it; every worker holds a
//! [`FibReader`] and looks up destinations without taking a lock, while the
//! control thread keeps changing routes (no stop-the-world).
//!
//! This first implementation is a correct placeholder (sorted per-length hash
//! maps published through `arc-swap`); the lookup structure is replaced by a
//! faster one behind the same API.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use ipnet::IpNet;

/// Index of a port in a worker's port table (the same type as
/// `brindle_vrouter::frame::PortId`).
pub type PortId = u16;

/// Which encapsulation a remote node's block is reached with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encap {
    /// IPv4-in-IPv4 (IP protocol 4).
    Ipip,
    /// VXLAN (RFC 7348) with this VNI, to the configured UDP port.
    Vxlan {
        /// VXLAN network identifier (24 bits).
        vni: u32,
    },
}

/// Where a matching packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NextHop {
    /// A pod on this node, behind a local port.
    Local {
        /// The pod's port.
        port: PortId,
    },
    /// A remote node's block: encapsulate and send to the node's address.
    Encap {
        /// The encapsulation.
        encap: Encap,
        /// The remote node's underlay address (outer destination).
        remote: Ipv4Addr,
    },
    /// Route natively via a gateway on a port (usually the uplink).
    Gateway {
        /// The gateway's address, resolved through the neighbour table.
        via: IpAddr,
        /// The port the gateway is on.
        port: PortId,
    },
    /// Drop.
    Blackhole,
    /// Hand to the node's kernel.
    Host,
}

/// Per-prefix-length tables, longest first. Each table maps the masked
/// network address to a next hop.
#[derive(Clone, Default)]
struct Tables {
    v4: Vec<(u8, HashMap<u32, NextHop>)>,
    v6: Vec<(u8, HashMap<u128, NextHop>)>,
}

fn mask_v4(addr: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        addr & (u32::MAX << (32 - len))
    }
}

fn mask_v6(addr: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        addr & (u128::MAX << (128 - len))
    }
}

/// The writer side of the FIB, owned by the control thread.
pub struct Fib {
    routes: HashMap<IpNet, NextHop>,
    published: Arc<ArcSwap<Tables>>,
}

/// The reader side of the FIB; cheap to clone, one per worker.
#[derive(Clone)]
pub struct FibReader {
    published: Arc<ArcSwap<Tables>>,
}

impl Fib {
    /// An empty FIB and a reader of it.
    pub fn new() -> (Fib, FibReader) {
        let published = Arc::new(ArcSwap::from_pointee(Tables::default()));
        (
            Fib {
                routes: HashMap::new(),
                published: published.clone(),
            },
            FibReader { published },
        )
    }

    /// Another reader of this FIB.
    pub fn reader(&self) -> FibReader {
        FibReader {
            published: self.published.clone(),
        }
    }

    /// Adds or replaces the route for `prefix` (host bits are ignored);
    /// returns the next hop it replaced.
    pub fn insert(&mut self, prefix: IpNet, next_hop: NextHop) -> Option<NextHop> {
        let old = self.routes.insert(prefix.trunc(), next_hop);
        self.publish();
        old
    }

    /// Removes the route for exactly `prefix`; returns its next hop.
    pub fn remove(&mut self, prefix: &IpNet) -> Option<NextHop> {
        let old = self.routes.remove(&prefix.trunc());
        if old.is_some() {
            self.publish();
        }
        old
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether the FIB has no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every route, in no particular order.
    pub fn routes(&self) -> impl Iterator<Item = (IpNet, NextHop)> + '_ {
        self.routes.iter().map(|(p, n)| (*p, *n))
    }

    fn publish(&self) {
        let mut v4: HashMap<u8, HashMap<u32, NextHop>> = HashMap::new();
        let mut v6: HashMap<u8, HashMap<u128, NextHop>> = HashMap::new();
        for (p, nh) in &self.routes {
            match p {
                IpNet::V4(n) => {
                    v4.entry(n.prefix_len())
                        .or_default()
                        .insert(u32::from(n.network()), *nh);
                }
                IpNet::V6(n) => {
                    v6.entry(n.prefix_len())
                        .or_default()
                        .insert(u128::from(n.network()), *nh);
                }
            }
        }
        let mut t = Tables {
            v4: v4.into_iter().collect(),
            v6: v6.into_iter().collect(),
        };
        t.v4.sort_by_key(|t| std::cmp::Reverse(t.0));
        t.v6.sort_by_key(|t| std::cmp::Reverse(t.0));
        self.published.store(Arc::new(t));
    }
}

impl FibReader {
    /// The next hop of the longest prefix that holds `dst`.
    pub fn lookup(&self, dst: IpAddr) -> Option<NextHop> {
        match dst {
            IpAddr::V4(a) => self.lookup_v4(a),
            IpAddr::V6(a) => self.lookup_v6(a),
        }
    }

    /// Longest-prefix match for an IPv4 destination.
    pub fn lookup_v4(&self, dst: Ipv4Addr) -> Option<NextHop> {
        let t = self.published.load();
        let a = u32::from(dst);
        t.v4.iter()
            .find_map(|(len, m)| m.get(&mask_v4(a, *len)).copied())
    }

    /// Longest-prefix match for an IPv6 destination.
    pub fn lookup_v6(&self, dst: Ipv6Addr) -> Option<NextHop> {
        let t = self.published.load();
        let a = u128::from(dst);
        t.v6.iter()
            .find_map(|(len, m)| m.get(&mask_v6(a, *len)).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_and_removal_falls_back() {
        let (mut fib, r) = Fib::new();
        fib.insert("0.0.0.0/0".parse().unwrap(), NextHop::Host);
        fib.insert("10.0.0.0/8".parse().unwrap(), NextHop::Blackhole);
        fib.insert("10.1.2.3/32".parse().unwrap(), NextHop::Local { port: 3 });
        assert_eq!(
            r.lookup_v4(Ipv4Addr::new(10, 1, 2, 3)),
            Some(NextHop::Local { port: 3 })
        );
        assert_eq!(
            r.lookup_v4(Ipv4Addr::new(10, 1, 2, 4)),
            Some(NextHop::Blackhole)
        );
        assert_eq!(r.lookup_v4(Ipv4Addr::new(8, 8, 8, 8)), Some(NextHop::Host));
        fib.remove(&"10.0.0.0/8".parse().unwrap());
        assert_eq!(r.lookup_v4(Ipv4Addr::new(10, 1, 2, 4)), Some(NextHop::Host));
        assert_eq!(r.lookup_v6("::1".parse().unwrap()), None);
    }
}
