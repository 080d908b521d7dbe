//! The worker's port table: what each local port is and what may come from it.
//!
//! A pod port is the host end of a pod's veth. The pod believes its gateway
//! is 169.254.1.1 and learns [`GATEWAY_MAC`] for it by proxy ARP, so every
//! frame the vrouter sends to a pod carries that source MAC; the pod's own MAC
//! (the peer) comes from the CNI plugin or is learned from its frames. The
//! pod's addresses are the anti-spoofing allow-list.

use std::net::{IpAddr, Ipv4Addr};

use crate::frame::PortId;

/// The MAC the vrouter uses toward pods, as Calico does (the API's
/// constant, which the CNI plugin gives every host end).
pub const GATEWAY_MAC: [u8; 6] = brindle_api::POD_GATEWAY_MAC;

/// The link-local gateway every pod routes through (the API's constant).
pub const GATEWAY_V4: Ipv4Addr = brindle_api::POD_GATEWAY_V4;

/// What a port connects to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortKind {
    /// A pod's veth: proxy ARP, anti-spoofing.
    Pod,
    /// The node's underlay NIC: tunnels and native routes.
    Uplink,
    /// A way into the node's own kernel (next hop `Host`).
    Host,
}

/// Configuration of one local port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Kind of port.
    pub kind: PortKind,
    /// Source MAC of frames the vrouter sends on this port
    /// ([`GATEWAY_MAC`] on pod ports, the NIC's MAC on the uplink).
    pub mac: [u8; 6],
    /// Largest IP packet the port carries.
    pub mtu: u32,
    /// The pod's addresses (anti-spoofing allow-list; empty otherwise).
    pub addrs: Vec<IpAddr>,
    /// MAC of the device at the other end (the pod's eth0, the host's
    /// interface), if known.
    pub peer_mac: Option<[u8; 6]>,
}

impl Endpoint {
    /// A pod port with its addresses and, if known, the pod's MAC.
    pub fn pod(addrs: Vec<IpAddr>, peer_mac: Option<[u8; 6]>, mtu: u32) -> Self {
        Endpoint {
            kind: PortKind::Pod,
            mac: GATEWAY_MAC,
            mtu,
            addrs,
            peer_mac,
        }
    }

    /// The uplink with the NIC's MAC.
    pub fn uplink(mac: [u8; 6], mtu: u32) -> Self {
        Endpoint {
            kind: PortKind::Uplink,
            mac,
            mtu,
            addrs: Vec::new(),
            peer_mac: None,
        }
    }

    /// A port into the host kernel whose far end has `peer_mac`.
    pub fn host(mac: [u8; 6], peer_mac: [u8; 6], mtu: u32) -> Self {
        Endpoint {
            kind: PortKind::Host,
            mac,
            mtu,
            addrs: Vec::new(),
            peer_mac: Some(peer_mac),
        }
    }

    /// Whether `src` is one of the pod's addresses. A short linear scan: a
    /// pod has one or two addresses.
    #[inline]
    pub fn owns(&self, src: IpAddr) -> bool {
        self.addrs.contains(&src)
    }
}

/// The endpoints of a worker, indexed by [`PortId`].
#[derive(Clone, Debug, Default)]
pub struct PortTable {
    endpoints: Vec<Endpoint>,
    /// Ports that take super-packets whole (TAP ports held by this worker).
    takes_super: Vec<bool>,
    uplink: Option<PortId>,
    host: Option<PortId>,
}

impl PortTable {
    /// Adds an endpoint; returns its id (the next index).
    pub fn push(&mut self, endpoint: Endpoint) -> PortId {
        let id = self.endpoints.len() as PortId;
        match endpoint.kind {
            PortKind::Uplink => self.uplink = Some(id),
            PortKind::Host => self.host = Some(id),
            PortKind::Pod => {}
        }
        self.endpoints.push(endpoint);
        id
    }

    /// Marks whether `port` takes super-packets whole (a TAP port this
    /// worker holds a queue of).
    pub fn set_takes_super(&mut self, port: PortId, on: bool) {
        let i = port as usize;
        if self.takes_super.len() <= i {
            self.takes_super.resize(i + 1, false);
        }
        self.takes_super[i] = on;
    }

    /// Whether `port` takes super-packets whole.
    #[inline]
    pub fn takes_super(&self, port: PortId) -> bool {
        self.takes_super
            .get(port as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The endpoint of `port`.
    #[inline]
    pub fn get(&self, port: PortId) -> Option<&Endpoint> {
        self.endpoints.get(port as usize)
    }

    /// The endpoint of `port`, writable (to learn the peer MAC or change
    /// addresses).
    #[inline]
    pub fn get_mut(&mut self, port: PortId) -> Option<&mut Endpoint> {
        self.endpoints.get_mut(port as usize)
    }

    /// Number of ports.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are no ports.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The uplink's id, if one is configured.
    #[inline]
    pub fn uplink(&self) -> Option<PortId> {
        self.uplink
    }

    /// The host port's id, if one is configured.
    #[inline]
    pub fn host(&self) -> Option<PortId> {
        self.host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_remembers_the_uplink_and_host_ports() {
        let mut t = PortTable::default();
        let pod = t.push(Endpoint::pod(
            vec!["10.65.0.2".parse().unwrap()],
            None,
            1500,
        ));
        let up = t.push(Endpoint::uplink([2, 0, 0, 0, 0, 1], 1500));
        assert_eq!((pod, up), (0, 1));
        assert_eq!(t.uplink(), Some(1));
        assert_eq!(t.host(), None);
        let ep = t.get(pod).unwrap();
        assert!(ep.owns("10.65.0.2".parse().unwrap()));
        assert!(!ep.owns("10.65.0.3".parse().unwrap()));
        assert_eq!(ep.mac, GATEWAY_MAC);
    }
}
