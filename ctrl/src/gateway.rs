//! The underlay gateway: the gateway of the kernel's IPv4 default route on
//! the uplink (main table, lowest metric), learned over rtnetlink and
//! followed as it changes. The vrouter sends tunnels to nodes outside the
//! underlay subnet through it (`NodeConfig.underlay_gateway`).
//!
//! The choice among route messages is pure ([`default_gateway`]); [`watch`]
//! dumps the main table, then dumps again after every IPv4 route change
//! of a default route, and sends the gateway whenever it differs from the
//! last one sent.
//!
//! The gateway's MAC reaches the vrouter two ways: the uplink's kernel
//! neighbours ([`crate::neighbors`]) include it once the kernel has
//! resolved it, and the vrouter itself reads the kernel's entry for the
//! next hops it needs and, when there is none, makes the kernel resolve it
//! (one datagram to the discard port). The vrouter knows when it needs the
//! gateway (a tunnel route beyond the subnet) and which entry it lacks, so
//! the resolution is left to it rather than duplicated here.

use std::net::Ipv4Addr;

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType,
};
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::{MulticastGroup, RouteMessageBuilder};
use tracing::{info, warn};

use crate::neighbors::{NeighborError, Subscription};

/// The table a route message belongs to (the attribute when the header's
/// 8-bit field cannot hold it).
fn table_of(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

/// The gateway of the IPv4 unicast default route of the main table that
/// leaves through `ifindex`, the one with the lowest metric when there are
/// several; `None` when there is no such route or it has no gateway (a
/// default route straight onto the link).
pub fn default_gateway(routes: &[RouteMessage], ifindex: u32) -> Option<Ipv4Addr> {
    routes
        .iter()
        .filter(|m| {
            m.header.destination_prefix_length == 0
                && m.header.kind == RouteType::Unicast
                && table_of(m) == u32::from(RouteHeader::RT_TABLE_MAIN)
                && m.attributes.contains(&RouteAttribute::Oif(ifindex))
        })
        .filter_map(|m| {
            let gateway = m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
                _ => None,
            })?;
            let metric = m
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Priority(p) => Some(*p),
                    _ => None,
                })
                .unwrap_or(0);
            Some((metric, gateway))
        })
        .min()
        .map(|(_, gateway)| gateway)
}

/// Whether a route message is about an IPv4 default route (the only ones
/// that can change the gateway).
fn is_default_route(msg: &RouteNetlinkMessage) -> bool {
    match msg {
        RouteNetlinkMessage::NewRoute(m) | RouteNetlinkMessage::DelRoute(m) => {
            m.header.destination_prefix_length == 0
        }
        _ => false,
    }
}

/// Follows the default gateway of `uplink` and hands it to `send`: first
/// the current one (or `None`), then each change. Returns when `send` says
/// its receiver is gone (returns false), or with an error when netlink
/// fails.
pub async fn watch(
    uplink: String,
    mut send: impl FnMut(Option<Ipv4Addr>) -> bool,
) -> Result<(), NeighborError> {
    // Subscribe before dumping so a change between the two is not lost.
    let Subscription {
        ifindex,
        handle,
        mut events,
        _driver,
    } = Subscription::open(&uplink, &[MulticastGroup::Ipv4Route])?;
    let dump = || async {
        let mut routes = Vec::new();
        let mut stream = handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute();
        while let Some(r) = stream.next().await {
            routes.push(r.map_err(|e| NeighborError::Netlink(e.to_string()))?);
        }
        Ok::<_, NeighborError>(default_gateway(&routes, ifindex))
    };
    let mut current = dump().await?;
    info!(%uplink, gateway = ?current, "underlay gateway from the kernel");
    if !send(current) {
        return Ok(());
    }
    while let Some((msg, _)) = events.next().await {
        let NetlinkPayload::InnerMessage(inner) = msg.payload else {
            continue;
        };
        if !is_default_route(&inner) {
            continue;
        }
        let now = dump().await?;
        if now != current {
            info!(%uplink, gateway = ?now, "underlay gateway changed");
            current = now;
            if !send(current) {
                return Ok(());
            }
        }
    }
    warn!(%uplink, "the netlink route stream ended");
    Err(NeighborError::Netlink("the route stream ended".into()))
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::AddressFamily;

    use super::*;

    fn route(
        prefix_len: u8,
        oif: u32,
        gateway: Option<Ipv4Addr>,
        metric: Option<u32>,
    ) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.destination_prefix_length = prefix_len;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.kind = RouteType::Unicast;
        m.attributes.push(RouteAttribute::Table(254));
        m.attributes.push(RouteAttribute::Oif(oif));
        if let Some(g) = gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(g)));
        }
        if let Some(p) = metric {
            m.attributes.push(RouteAttribute::Priority(p));
        }
        m
    }

    const GW: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 254);

    #[test]
    fn the_default_route_on_the_uplink_gives_its_gateway() {
        let routes = [
            route(24, 7, None, None),
            route(16, 7, Some(Ipv4Addr::new(10, 99, 0, 9)), None),
            route(0, 7, Some(GW), Some(100)),
        ];
        assert_eq!(default_gateway(&routes, 7), Some(GW));
    }

    #[test]
    fn the_lowest_metric_wins_and_other_interfaces_and_tables_are_ignored() {
        let other = Ipv4Addr::new(10, 99, 0, 253);
        let mut local_table = route(0, 7, Some(Ipv4Addr::new(10, 99, 0, 1)), Some(0));
        local_table.header.table = 100;
        local_table.attributes[0] = RouteAttribute::Table(100);
        let routes = [
            route(0, 7, Some(other), Some(200)),
            route(0, 8, Some(Ipv4Addr::new(192, 168, 0, 1)), Some(0)),
            local_table,
            route(0, 7, Some(GW), Some(100)),
        ];
        assert_eq!(default_gateway(&routes, 7), Some(GW));
        assert_eq!(
            default_gateway(&routes, 8),
            Some(Ipv4Addr::new(192, 168, 0, 1))
        );
    }

    #[test]
    fn no_default_route_or_one_without_gateway_gives_none() {
        assert_eq!(default_gateway(&[route(24, 7, None, None)], 7), None);
        assert_eq!(default_gateway(&[route(0, 7, None, None)], 7), None);
        let mut blackhole = route(0, 7, Some(GW), None);
        blackhole.header.kind = RouteType::BlackHole;
        assert_eq!(default_gateway(&[blackhole], 7), None);
    }

    #[test]
    fn only_default_route_changes_trigger_a_new_dump() {
        let r = route(0, 7, Some(GW), None);
        assert!(is_default_route(&RouteNetlinkMessage::NewRoute(r.clone())));
        assert!(is_default_route(&RouteNetlinkMessage::DelRoute(r)));
        assert!(!is_default_route(&RouteNetlinkMessage::NewRoute(route(
            24, 7, None, None
        ))));
    }
}
