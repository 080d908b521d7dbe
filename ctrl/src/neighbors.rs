//! The underlay neighbours of the uplink, from the kernel's neighbour table
//! over rtnetlink, as vrouter programming: the vrouter then has the MACs of
//! the next hops (other nodes, the gateway) without resolving them itself.
//!
//! The translation of a netlink message into a [`NeighborChange`] is pure
//! ([`change_for`]); [`watch`] dumps the table once and then follows
//! RTM_NEWNEIGH / RTM_DELNEIGH, sending the changes as values.

use std::net::IpAddr;

use brindle_api::vrouter::{Mac, Neighbor};
use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use rtnetlink::MulticastGroup;
use rtnetlink::packet_core::NetlinkPayload;
use tracing::{debug, info, warn};

/// What the vrouter must learn about one neighbour of the uplink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeighborChange {
    /// Its MAC is known (new, or changed).
    Set(Neighbor),
    /// It is gone or unresolvable: the vrouter must forget it.
    Removed {
        /// The uplink port.
        port: String,
        /// The neighbour's address.
        ip: IpAddr,
    },
}

/// Why the watcher stopped.
#[derive(Debug, thiserror::Error)]
pub enum NeighborError {
    /// The uplink does not exist.
    #[error("uplink {0}: no such interface")]
    NoUplink(String),
    /// A netlink socket or request failed.
    #[error("netlink: {0}")]
    Netlink(String),
}

/// The change a neighbour message means for the port `port` (ifindex
/// `ifindex`), or `None` when it is about another interface or carries
/// nothing usable (multicast, no link-layer address yet). An entry that is
/// resolving or failed counts as removed: its old MAC may be wrong.
pub fn change_for(
    msg: &NeighbourMessage,
    deleted: bool,
    ifindex: u32,
    port: &str,
) -> Option<NeighborChange> {
    if msg.header.ifindex != ifindex {
        return None;
    }
    let ip = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })?;
    if ip.is_multicast() || ip.is_unspecified() {
        return None;
    }
    let removed = || {
        Some(NeighborChange::Removed {
            port: port.to_owned(),
            ip,
        })
    };
    if deleted {
        return removed();
    }
    match msg.header.state {
        NeighbourState::Reachable
        | NeighbourState::Stale
        | NeighbourState::Delay
        | NeighbourState::Probe
        | NeighbourState::Permanent => {}
        NeighbourState::Failed | NeighbourState::Incomplete => return removed(),
        _ => return None,
    }
    let mac: [u8; 6] = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) => l.as_slice().try_into().ok(),
        _ => None,
    })?;
    if mac == [0; 6] {
        return None;
    }
    Some(NeighborChange::Set(Neighbor {
        port: port.to_owned(),
        ip,
        mac: Mac(mac),
    }))
}

/// Follows the kernel's neighbours of `uplink` and hands their changes to
/// `send`, starting with every usable entry of the table. Returns when
/// `send` says its receiver is gone (returns false), or with an error when
/// netlink fails.
pub async fn watch(
    uplink: String,
    mut send: impl FnMut(Vec<NeighborChange>) -> bool,
) -> Result<(), NeighborError> {
    // Subscribe before dumping so nothing between the two is lost (a change
    // seen twice is harmless: the result is a value, applied idempotently).
    let Subscription {
        ifindex,
        handle,
        mut events,
        _driver,
    } = Subscription::open(&uplink, &[MulticastGroup::Neigh])?;
    let mut dump = handle.neighbours().get().execute();
    let mut initial = Vec::new();
    while let Some(msg) = dump.next().await {
        let msg = msg.map_err(|e| NeighborError::Netlink(e.to_string()))?;
        if let Some(c) = change_for(&msg, false, ifindex, &uplink) {
            initial.push(c);
        }
    }
    info!(%uplink, neighbours = initial.len(), "underlay neighbours from the kernel");
    if !send(initial) {
        return Ok(());
    }
    while let Some((msg, _)) = events.next().await {
        let change = match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(m)) => {
                change_for(&m, false, ifindex, &uplink)
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelNeighbour(m)) => {
                change_for(&m, true, ifindex, &uplink)
            }
            _ => None,
        };
        if let Some(c) = change {
            debug!(?c, "neighbour change");
            if !send(vec![c]) {
                return Ok(());
            }
        }
    }
    warn!(%uplink, "the netlink neighbour stream ended");
    Err(NeighborError::Netlink("the neighbour stream ended".into()))
}

/// An rtnetlink connection subscribed to multicast groups, for following
/// one of `uplink`'s kernel tables: the uplink's index, the handle for
/// dumps, the stream of events, and the connection's driver task, aborted
/// when this is dropped.
pub(crate) struct Subscription {
    pub(crate) ifindex: u32,
    pub(crate) handle: rtnetlink::Handle,
    pub(crate) events: futures::channel::mpsc::UnboundedReceiver<(
        rtnetlink::packet_core::NetlinkMessage<netlink_packet_route::RouteNetlinkMessage>,
        rtnetlink::sys::SocketAddr,
    )>,
    pub(crate) _driver: AbortOnDrop,
}

impl Subscription {
    pub(crate) fn open(uplink: &str, groups: &[MulticastGroup]) -> Result<Self, NeighborError> {
        let ifindex = nix::net::if_::if_nametoindex(uplink)
            .map_err(|_| NeighborError::NoUplink(uplink.to_owned()))?;
        let (conn, handle, events) = rtnetlink::new_multicast_connection(groups)
            .map_err(|e| NeighborError::Netlink(e.to_string()))?;
        Ok(Subscription {
            ifindex,
            handle,
            events,
            _driver: AbortOnDrop(tokio::spawn(conn)),
        })
    }
}

pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use netlink_packet_route::AddressFamily;

    use super::*;

    fn msg(
        ifindex: u32,
        state: NeighbourState,
        ip: Ipv4Addr,
        mac: Option<[u8; 6]>,
    ) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.ifindex = ifindex;
        m.header.state = state;
        m.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        if let Some(mac) = mac {
            m.attributes
                .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        }
        m
    }

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x21];

    #[test]
    fn a_reachable_entry_on_the_uplink_becomes_a_static_neighbour() {
        let m = msg(
            7,
            NeighbourState::Reachable,
            Ipv4Addr::new(10, 0, 0, 1),
            Some(MAC),
        );
        assert_eq!(
            change_for(&m, false, 7, "eth0"),
            Some(NeighborChange::Set(Neighbor {
                port: "eth0".into(),
                ip: "10.0.0.1".parse().unwrap(),
                mac: Mac(MAC),
            }))
        );
        // Stale, delay, probe and permanent entries still carry a usable MAC.
        for s in [
            NeighbourState::Stale,
            NeighbourState::Delay,
            NeighbourState::Probe,
            NeighbourState::Permanent,
        ] {
            let m = msg(7, s, Ipv4Addr::new(10, 0, 0, 1), Some(MAC));
            assert!(matches!(
                change_for(&m, false, 7, "eth0"),
                Some(NeighborChange::Set(_))
            ));
        }
    }

    #[test]
    fn deleted_and_failed_entries_are_removals_and_others_are_ignored() {
        let removed = Some(NeighborChange::Removed {
            port: "eth0".into(),
            ip: "10.0.0.1".parse().unwrap(),
        });
        let m = msg(
            7,
            NeighbourState::Reachable,
            Ipv4Addr::new(10, 0, 0, 1),
            Some(MAC),
        );
        assert_eq!(change_for(&m, true, 7, "eth0"), removed);
        let m = msg(7, NeighbourState::Failed, Ipv4Addr::new(10, 0, 0, 1), None);
        assert_eq!(change_for(&m, false, 7, "eth0"), removed);
        let m = msg(
            7,
            NeighbourState::Incomplete,
            Ipv4Addr::new(10, 0, 0, 1),
            None,
        );
        assert_eq!(change_for(&m, false, 7, "eth0"), removed);
        // Another interface, a multicast address, no MAC, NOARP.
        let m = msg(
            8,
            NeighbourState::Reachable,
            Ipv4Addr::new(10, 0, 0, 1),
            Some(MAC),
        );
        assert_eq!(change_for(&m, false, 7, "eth0"), None);
        let m = msg(
            7,
            NeighbourState::Noarp,
            Ipv4Addr::new(224, 0, 0, 22),
            Some(MAC),
        );
        assert_eq!(change_for(&m, false, 7, "eth0"), None);
        let m = msg(
            7,
            NeighbourState::Reachable,
            Ipv4Addr::new(10, 0, 0, 1),
            None,
        );
        assert_eq!(change_for(&m, false, 7, "eth0"), None);
    }
}
