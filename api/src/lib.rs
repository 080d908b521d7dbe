//! Wire contracts shared by Brindle's processes.
//!
//! Every process boundary in Brindle is a contract in this crate, so that the
//! two sides are compiled against the same types:
//!
//! - [`cni`]: the CNI specification's types (network config, results for every
//!   supported `cniVersion`, the error JSON and its codes, the environment),
//!   used by the `brindle` plugin and the `brindle-ipam` plugin.
//! - [`endpoint`]: what the CNI plugin tells the node daemon about pods over
//!   `/run/brindle/ctrl.sock`.
//! - [`ipam`]: allocation requests from the IPAM plugin to the node daemon over
//!   the same socket.
//! - [`vrouter`]: how the node daemon programs the vrouter over
//!   `/run/brindle/vrouter.sock`.
//! - [`framing`]: the socket framing both sockets use (one JSON document per
//!   line, one response per request) and a small blocking client.
//!
//! Tests: `cargo test -p brindle-api` (no root needed).
#![forbid(unsafe_code)]

pub mod cni;
pub mod endpoint;
pub mod framing;
pub mod ipam;
pub mod vrouter;

/// Default path of the node daemon's endpoint/IPAM socket.
pub const CTRL_SOCKET: &str = "/run/brindle/ctrl.sock";
/// Default path of the vrouter's programming socket.
pub const VROUTER_SOCKET: &str = "/run/brindle/vrouter.sock";

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The pod's IPv4 gateway (as in Calico): the CNI plugin routes every pod's
/// traffic via it and the vrouter answers ARP for it by proxy; it is never
/// assigned anywhere.
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The MAC of every pod veth's host end, which the vrouter answers proxy
/// ARP/NDP with on pod ports.
pub const POD_GATEWAY_MAC: [u8; 6] = [0xee; 6];
/// The pod's IPv6 gateway: the link-local address derived from
/// [`POD_GATEWAY_MAC`] (EUI-64).
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// How traffic from a pool's addresses crosses between nodes: the pool's
/// setting in the IPAM (`encapsulation` in a pool, snake_case in JSON and
/// TOML), which the node daemon turns into vrouter routes
/// ([`Encapsulation::between`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encapsulation {
    /// Routed natively.
    #[default]
    None,
    /// IP-in-IP always.
    Ipip,
    /// IP-in-IP only towards nodes in another subnet.
    IpipCrossSubnet,
    /// VXLAN always.
    Vxlan,
    /// VXLAN only towards nodes in another subnet.
    VxlanCrossSubnet,
}

impl Encapsulation {
    /// Every mode, in the order the docs list them.
    pub const ALL: [Encapsulation; 5] = [
        Encapsulation::None,
        Encapsulation::Ipip,
        Encapsulation::IpipCrossSubnet,
        Encapsulation::Vxlan,
        Encapsulation::VxlanCrossSubnet,
    ];

    /// The snake_case name, as in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Encapsulation::None => "none",
            Encapsulation::Ipip => "ipip",
            Encapsulation::IpipCrossSubnet => "ipip_cross_subnet",
            Encapsulation::Vxlan => "vxlan",
            Encapsulation::VxlanCrossSubnet => "vxlan_cross_subnet",
        }
    }

    /// The vrouter encapsulation towards a node, given whether the node is
    /// on our underlay subnet; `None`: route natively.
    pub fn between(self, same_subnet: bool) -> Option<vrouter::Encap> {
        match self {
            Encapsulation::None => None,
            Encapsulation::Ipip => Some(vrouter::Encap::Ipip),
            Encapsulation::Vxlan => Some(vrouter::Encap::Vxlan),
            Encapsulation::IpipCrossSubnet => (!same_subnet).then_some(vrouter::Encap::Ipip),
            Encapsulation::VxlanCrossSubnet => (!same_subnet).then_some(vrouter::Encap::Vxlan),
        }
    }
}

impl std::fmt::Display for Encapsulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Encapsulation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Encapsulation::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown encapsulation {s:?}: one of none, ipip, ipip_cross_subnet, vxlan, vxlan_cross_subnet"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encapsulation_names_round_trip_through_str_and_json() {
        for e in Encapsulation::ALL {
            assert_eq!(e.as_str().parse::<Encapsulation>(), Ok(e));
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(json, format!("\"{}\"", e.as_str()));
            assert_eq!(serde_json::from_str::<Encapsulation>(&json).unwrap(), e);
        }
        assert!("gre".parse::<Encapsulation>().is_err());
    }

    #[test]
    fn cross_subnet_modes_encapsulate_only_beyond_the_subnet() {
        use vrouter::Encap;
        assert_eq!(Encapsulation::None.between(false), None);
        assert_eq!(Encapsulation::Ipip.between(true), Some(Encap::Ipip));
        assert_eq!(Encapsulation::Vxlan.between(true), Some(Encap::Vxlan));
        assert_eq!(Encapsulation::IpipCrossSubnet.between(true), None);
        assert_eq!(
            Encapsulation::IpipCrossSubnet.between(false),
            Some(Encap::Ipip)
        );
        assert_eq!(Encapsulation::VxlanCrossSubnet.between(true), None);
        assert_eq!(
            Encapsulation::VxlanCrossSubnet.between(false),
            Some(Encap::Vxlan)
        );
    }
}
