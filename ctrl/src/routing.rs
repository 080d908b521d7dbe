//! BGP ⇄ IPAM blocks ⇄ vrouter routes, as pure functions.
//!
//! - The blocks affine to this node are announced with the node address as
//!   next hop; a released block is withdrawn ([`block_diff`]).
//! - A pod address of this node that lies in a block NOT affine to it (IPAM
//!   borrowed it when the pool had no block left to claim, or the block's
//!   node is gone) is announced as a host route, /32 or /128 ([`borrowed`]),
//!   and withdrawn with its pod. Calico does the same: BIRD exports every
//!   workload route inside a pool except those under a block confirmed
//!   affine to this node, which it aggregates as the block. Every other node
//!   learns the host route and longest prefix wins over the block's route,
//!   on the block's own node too (its blackhole is only the /26).
//! - A learned best route becomes one vrouter route ([`route_for`]): the
//!   pool containing the prefix decides the encapsulation (IPIP, VXLAN, or
//!   native via the uplink for `none`; the cross-subnet modes route natively
//!   when the BGP next hop is on the node's underlay subnet and encapsulate
//!   otherwise). A prefix in no pool (a top-of-rack route, a service range)
//!   is routed natively, or, with a host port, handed to the node's kernel
//!   (a ClusterIP must meet this node's kube-proxy, traffic to the outside
//!   its natOutgoing masquerade).
//! - With a host port, every node that announces a block is routed like
//!   that block ([`node_routes`]): its underlay address as a /32.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use brindle_api::Encapsulation;
use brindle_api::vrouter::{Route, RouteTarget, VrouterRequest};
use ipnet::IpNet;

use crate::bgp::rib::{BestRoute, RouteChange};

/// A pool's CIDR and encapsulation mode, as the routing needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRouting {
    /// The pool's CIDR.
    pub cidr: IpNet,
    /// The pool's encapsulation mode.
    pub encapsulation: Encapsulation,
    /// Traffic from the pool to a destination outside every pool is
    /// masqueraded (by the kernel, on the host path).
    pub nat_outgoing: bool,
}

/// What this node knows about its own underlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    /// The uplink port's interface name.
    pub uplink: String,
    /// The node's subnet, for cross-subnet decisions.
    pub subnet: Option<IpNet>,
    /// The vrouter has a host port: what is in no pool goes to the node's
    /// kernel (its kube-proxy, its masquerade, its routes) rather than
    /// straight out of the uplink.
    pub host_port: bool,
}

/// The vrouter route for a learned best route.
pub fn route_for(best: &BestRoute, pools: &[PoolRouting], underlay: &Underlay) -> Route {
    let native = RouteTarget::Gateway {
        via: best.next_hop,
        port: underlay.uplink.clone(),
    };
    // The most specific pool containing the prefix.
    let pool = pools
        .iter()
        .filter(|p| p.cidr.contains(&best.prefix))
        .max_by_key(|p| p.cidr.prefix_len());
    let same_subnet = underlay.subnet.is_some_and(|s| s.contains(&best.next_hop));
    let encap = pool.and_then(|p| p.encapsulation.between(same_subnet));
    let target = match (encap, best.next_hop) {
        _ if pool.is_none() && underlay.host_port => RouteTarget::Host,
        (Some(encap), IpAddr::V4(remote)) => RouteTarget::Encap { encap, remote },
        // No IPv6 outer header in the vrouter's encapsulations: an IPv6 next
        // hop is reached natively.
        _ => native,
    };
    Route {
        prefix: best.prefix,
        target,
    }
}

/// With a host port, the vrouter routes the address of every node that
/// announces a block in a pool like that block: `<next hop>/32` with the
/// block's target (IPIP or VXLAN to the node, or natively via it). A pod's
/// packets to another node's address then leave from the vrouter by the
/// pod path, never through this node's kernel, so the replies to another
/// node's own traffic (its host → our pod, its kube-proxy's NodePort DNAT
/// and masquerade to a backend here) go back to that node's vrouter and
/// its kernel, whose conntrack saw the request. Handed to this node's
/// kernel, such a reply meets no conntrack entry: an ICMP echo reply or a
/// SYN-ACK is INVALID, a TCP segment picked up mid-stream is masqueraded
/// by natOutgoing. A learned prefix equal to such a /32 keeps its own
/// route (the caller leaves it out); without a host port there is none:
/// the uplink's kernel route reaches the nodes.
pub fn node_routes<'a>(
    learned: impl IntoIterator<Item = &'a BestRoute>,
    pools: &[PoolRouting],
    underlay: &Underlay,
) -> BTreeMap<IpNet, RouteTarget> {
    let mut out = BTreeMap::new();
    if !underlay.host_port {
        return out;
    }
    for best in learned {
        let IpAddr::V4(node) = best.next_hop else {
            continue;
        };
        if !pools.iter().any(|p| p.cidr.contains(&best.prefix)) {
            continue;
        }
        // The block's pool decides the target, not the /32 (in no pool).
        out.entry(IpNet::from(IpAddr::V4(node)))
            .or_insert_with(|| route_for(best, pools, underlay).target);
    }
    out
}

/// The vrouter request for one change of the BGP best routes (the speaker
/// reports only routes learned from peers, never our own blocks).
pub fn request_for(
    change: &RouteChange,
    pools: &[PoolRouting],
    underlay: &Underlay,
) -> VrouterRequest {
    match change {
        RouteChange::Added(best) | RouteChange::Changed(best) => VrouterRequest::AddRoutes {
            routes: vec![route_for(best, pools, underlay)],
        },
        RouteChange::Removed { prefix } => VrouterRequest::RemoveRoutes {
            prefixes: vec![*prefix],
        },
    }
}

/// Blocks to announce and to withdraw to go from `announced` to `affine`.
pub fn block_diff(
    announced: &BTreeSet<IpNet>,
    affine: &BTreeSet<IpNet>,
) -> (Vec<IpNet>, Vec<IpNet>) {
    (
        affine.difference(announced).copied().collect(),
        announced.difference(affine).copied().collect(),
    )
}

/// The host routes to announce for this node's pod `addresses` that lie
/// in a block of another node or of none (`foreign_blocks`): borrowed
/// addresses. An address in no known block (a block claimed after the
/// datastore was last read) is not borrowed: a claim is only ever for the
/// claiming node, while borrowing takes from blocks that already existed.
pub fn borrowed<'a>(
    addresses: impl IntoIterator<Item = &'a IpNet>,
    foreign_blocks: &BTreeSet<IpNet>,
) -> BTreeSet<IpNet> {
    addresses
        .into_iter()
        .map(|a| IpNet::from(a.addr()))
        .filter(|host| foreign_blocks.iter().any(|b| b.contains(host)))
        .collect()
}

#[cfg(test)]
mod tests {
    use brindle_api::vrouter::Encap;

    use super::*;

    fn best(prefix: &str, nh: &str) -> BestRoute {
        BestRoute {
            prefix: prefix.parse().unwrap(),
            next_hop: nh.parse().unwrap(),
            peer: nh.parse().unwrap(),
            as_path: vec![],
        }
    }

    fn pools(encapsulation: &str) -> Vec<PoolRouting> {
        vec![PoolRouting {
            cidr: "10.244.0.0/16".parse().unwrap(),
            encapsulation: encapsulation.parse().unwrap(),
            nat_outgoing: true,
        }]
    }

    fn underlay() -> Underlay {
        Underlay {
            uplink: "eth0".into(),
            subnet: Some("192.168.0.0/24".parse().unwrap()),
            host_port: false,
        }
    }

    fn target(encapsulation: &str, nh: &str) -> RouteTarget {
        route_for(
            &best("10.244.1.0/26", nh),
            &pools(encapsulation),
            &underlay(),
        )
        .target
    }

    fn encap(encap: Encap, remote: &str) -> RouteTarget {
        RouteTarget::Encap {
            encap,
            remote: remote.parse().unwrap(),
        }
    }

    fn gateway(via: &str) -> RouteTarget {
        RouteTarget::Gateway {
            via: via.parse().unwrap(),
            port: "eth0".into(),
        }
    }

    #[test]
    fn ipip_and_vxlan_pools_encapsulate_to_the_bgp_next_hop_whatever_the_subnet() {
        assert_eq!(
            target("ipip", "192.168.0.12"),
            encap(Encap::Ipip, "192.168.0.12")
        );
        assert_eq!(
            target("ipip", "172.16.0.12"),
            encap(Encap::Ipip, "172.16.0.12")
        );
        assert_eq!(
            target("vxlan", "192.168.0.12"),
            encap(Encap::Vxlan, "192.168.0.12")
        );
    }

    #[test]
    fn mode_none_routes_natively_via_the_next_hop_on_the_uplink() {
        assert_eq!(target("none", "192.168.0.12"), gateway("192.168.0.12"));
        assert_eq!(target("none", "172.16.0.12"), gateway("172.16.0.12"));
    }

    #[test]
    fn cross_subnet_is_native_on_our_subnet_and_encapsulated_beyond_it() {
        assert_eq!(
            target("ipip_cross_subnet", "192.168.0.12"),
            gateway("192.168.0.12")
        );
        assert_eq!(
            target("ipip_cross_subnet", "172.16.0.12"),
            encap(Encap::Ipip, "172.16.0.12")
        );
        assert_eq!(
            target("vxlan_cross_subnet", "192.168.0.12"),
            gateway("192.168.0.12")
        );
        assert_eq!(
            target("vxlan_cross_subnet", "172.16.0.12"),
            encap(Encap::Vxlan, "172.16.0.12")
        );
    }

    #[test]
    fn cross_subnet_without_a_known_subnet_always_encapsulates() {
        let u = Underlay {
            uplink: "eth0".into(),
            subnet: None,
            host_port: false,
        };
        let r = route_for(
            &best("10.244.1.0/26", "192.168.0.12"),
            &pools("ipip_cross_subnet"),
            &u,
        );
        assert_eq!(r.target, encap(Encap::Ipip, "192.168.0.12"));
    }

    #[test]
    fn a_prefix_outside_every_pool_is_routed_natively() {
        let r = route_for(
            &best("203.0.113.0/24", "192.168.0.1"),
            &pools("ipip"),
            &underlay(),
        );
        assert_eq!(r.target, gateway("192.168.0.1"));
        assert_eq!(r.prefix, "203.0.113.0/24".parse::<IpNet>().unwrap());
    }

    #[test]
    fn with_a_host_port_a_prefix_outside_every_pool_goes_to_the_node_kernel() {
        let u = Underlay {
            host_port: true,
            ..underlay()
        };
        let r = route_for(&best("10.96.0.0/12", "192.168.0.12"), &pools("ipip"), &u);
        assert_eq!(r.target, RouteTarget::Host);
        // Pool prefixes are routed as without one.
        let r = route_for(&best("10.244.1.0/26", "192.168.0.12"), &pools("ipip"), &u);
        assert_eq!(r.target, encap(Encap::Ipip, "192.168.0.12"));
    }

    #[test]
    fn the_most_specific_pool_decides() {
        let mut p = pools("ipip");
        p.push(PoolRouting {
            cidr: "10.244.128.0/17".parse().unwrap(),
            encapsulation: Encapsulation::Vxlan,
            nat_outgoing: false,
        });
        let r = route_for(&best("10.244.200.0/26", "172.16.0.9"), &p, &underlay());
        assert_eq!(r.target, encap(Encap::Vxlan, "172.16.0.9"));
    }

    #[test]
    fn an_ipv6_next_hop_is_reached_natively() {
        let r = route_for(
            &best("fd00:244::/122", "fd00::12"),
            &[PoolRouting {
                cidr: "fd00:244::/48".parse().unwrap(),
                encapsulation: Encapsulation::Vxlan,
                nat_outgoing: false,
            }],
            &underlay(),
        );
        assert_eq!(r.target, gateway("fd00::12"));
    }

    #[test]
    fn changes_become_add_and_remove_requests() {
        let add = request_for(
            &RouteChange::Added(best("10.244.1.0/26", "192.168.0.12")),
            &pools("ipip"),
            &underlay(),
        );
        assert_eq!(
            add,
            VrouterRequest::AddRoutes {
                routes: vec![Route {
                    prefix: "10.244.1.0/26".parse().unwrap(),
                    target: encap(Encap::Ipip, "192.168.0.12"),
                }]
            }
        );
        let del = request_for(
            &RouteChange::Removed {
                prefix: "10.244.1.0/26".parse().unwrap(),
            },
            &pools("ipip"),
            &underlay(),
        );
        assert_eq!(
            del,
            VrouterRequest::RemoveRoutes {
                prefixes: vec!["10.244.1.0/26".parse().unwrap()]
            }
        );
    }

    #[test]
    fn block_diff_announces_new_blocks_and_withdraws_released_ones() {
        let a: BTreeSet<IpNet> = ["10.244.0.0/26", "10.244.0.64/26"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let b: BTreeSet<IpNet> = ["10.244.0.64/26", "10.244.0.128/26"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let (announce, withdraw) = block_diff(&a, &b);
        assert_eq!(announce, vec!["10.244.0.128/26".parse::<IpNet>().unwrap()]);
        assert_eq!(withdraw, vec!["10.244.0.0/26".parse::<IpNet>().unwrap()]);
    }

    fn nets(list: &[&str]) -> BTreeSet<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn only_addresses_in_another_nodes_block_are_borrowed_and_announced_as_host_routes() {
        // Blocks of other nodes (or of none): a /26 of IPv4, a /122 of IPv6.
        let foreign = nets(&["10.244.1.0/26", "fd00:244::40/122"]);
        let ours: Vec<IpNet> = [
            "10.244.0.5/32",    // in our own block
            "10.244.1.7/32",    // borrowed
            "10.244.1.9/26",    // borrowed, whatever length the record says
            "10.244.9.1/32",    // in no block read yet: a fresh claim of ours
            "fd00:244::41/128", // borrowed IPv6
            "fd00:244::1/128",  // in no foreign block
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(
            borrowed(&ours, &foreign),
            nets(&["10.244.1.7/32", "10.244.1.9/32", "fd00:244::41/128"])
        );
        assert_eq!(borrowed(&ours, &BTreeSet::new()), BTreeSet::new());
    }

    #[test]
    fn a_learned_borrowed_host_route_beats_the_blocks_route_and_is_encapsulated_to_the_borrower() {
        // Node .12 owns the block, node .13 borrowed 10.244.1.7: every node
        // (the block's own included, whose vrouter has the block as a
        // blackhole) routes the /32 to the borrower, the rest of the block
        // to its owner; the vrouter's LPM picks the /32.
        let block = route_for(
            &best("10.244.1.0/26", "192.168.0.12"),
            &pools("ipip"),
            &underlay(),
        );
        let host = route_for(
            &best("10.244.1.7/32", "192.168.0.13"),
            &pools("ipip"),
            &underlay(),
        );
        assert_eq!(block.target, encap(Encap::Ipip, "192.168.0.12"));
        assert_eq!(host.target, encap(Encap::Ipip, "192.168.0.13"));
        assert_eq!(host.prefix, "10.244.1.7/32".parse::<IpNet>().unwrap());
        // With a host port too: a pool's /32 is a pod, not the host's.
        let u = Underlay {
            host_port: true,
            ..underlay()
        };
        let host = route_for(&best("10.244.1.7/32", "192.168.0.13"), &pools("none"), &u);
        assert_eq!(host.target, gateway("192.168.0.13"));
    }

    #[test]
    fn with_a_host_port_each_node_announcing_a_block_is_routed_like_that_block() {
        let host = Underlay {
            host_port: true,
            ..underlay()
        };
        let learned = [
            best("10.244.1.0/26", "192.168.0.12"),
            best("10.244.1.64/26", "192.168.0.12"),
            best("10.244.2.0/26", "10.0.9.13"),
            // Outside every pool: no node route from it.
            best("172.16.0.0/16", "192.168.0.14"),
        ];
        let routes = node_routes(&learned, &pools("ipip_cross_subnet"), &host);
        let got: Vec<(String, RouteTarget)> = routes
            .into_iter()
            .map(|(p, t)| (p.to_string(), t))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.9.13/32".to_string(), encap(Encap::Ipip, "10.0.9.13")),
                ("192.168.0.12/32".to_string(), gateway("192.168.0.12")),
            ]
        );
        let vxlan = node_routes(&learned[..1], &pools("vxlan"), &host);
        assert_eq!(
            vxlan.values().collect::<Vec<_>>(),
            [&encap(Encap::Vxlan, "192.168.0.12")]
        );
        // Without a host port the kernel's uplink routes reach the nodes.
        assert!(node_routes(&learned, &pools("ipip"), &underlay()).is_empty());
    }
}
