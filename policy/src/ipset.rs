//! IP sets as the classifier reads them: sorted, disjoint, merged address
//! ranges (membership is one binary search, whatever the set's size), and
//! named-port sets as sorted `(address, protocol, port)` triples.
//!
//! Both are built once by the compiler and shipped whole (serde); the
//! classifier never allocates to look one up.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// An address as one number: IPv4 in the low 32 bits of the v4 table, IPv6
/// whole in the v6 table.
fn v6_bits(a: std::net::Ipv6Addr) -> u128 {
    u128::from(a)
}

/// A set of addresses: IPv4 and IPv6 ranges (inclusive), sorted, disjoint,
/// adjacent ranges merged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IpSet {
    /// IPv4 ranges `(first, last)`.
    pub v4: Vec<(u32, u32)>,
    /// IPv6 ranges `(first, last)` (on the wire as address strings, see
    /// [`wire`]).
    #[serde(with = "wire::ranges")]
    pub v6: Vec<(u128, u128)>,
}

fn net_range4(n: &ipnet::Ipv4Net) -> (u32, u32) {
    (u32::from(n.network()), u32::from(n.broadcast()))
}

fn net_range6(n: &ipnet::Ipv6Net) -> (u128, u128) {
    (v6_bits(n.network()), v6_bits(n.broadcast()))
}

/// Sorts and merges overlapping or adjacent ranges.
fn normalize<T: Copy + Ord + num::Succ>(mut r: Vec<(T, T)>) -> Vec<(T, T)> {
    r.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a <= last.1.succ_sat() => {
                if b > last.1 {
                    last.1 = b;
                }
            }
            _ => out.push((a, b)),
        }
    }
    out
}

/// `ranges` minus `holes` (both normalized).
fn subtract<T: Copy + Ord + num::Succ>(ranges: &[(T, T)], holes: &[(T, T)]) -> Vec<(T, T)> {
    let mut out = Vec::new();
    for &(a, b) in ranges {
        let mut start = Some(a);
        for &(ha, hb) in holes {
            let Some(s) = start else { break };
            if hb < s || ha > b {
                continue;
            }
            if ha > s {
                out.push((s, ha.pred_sat()));
            }
            start = if hb >= b { None } else { Some(hb.succ_sat()) };
        }
        if let Some(s) = start {
            out.push((s, b));
        }
    }
    out
}

mod num {
    pub trait Succ {
        fn succ_sat(self) -> Self;
        fn pred_sat(self) -> Self;
    }
    impl Succ for u32 {
        fn succ_sat(self) -> Self {
            self.saturating_add(1)
        }
        fn pred_sat(self) -> Self {
            self.saturating_sub(1)
        }
    }
    impl Succ for u128 {
        fn succ_sat(self) -> Self {
            self.saturating_add(1)
        }
        fn pred_sat(self) -> Self {
            self.saturating_sub(1)
        }
    }
}

impl IpSet {
    /// The union of `nets`.
    pub fn from_nets<'a>(nets: impl IntoIterator<Item = &'a IpNet>) -> IpSet {
        IpSet::from_nets_except(nets, [])
    }

    /// The union of `nets` minus the union of `except`.
    pub fn from_nets_except<'a, 'b>(
        nets: impl IntoIterator<Item = &'a IpNet>,
        except: impl IntoIterator<Item = &'b IpNet>,
    ) -> IpSet {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for n in nets {
            match n {
                IpNet::V4(n) => v4.push(net_range4(n)),
                IpNet::V6(n) => v6.push(net_range6(n)),
            }
        }
        let (mut h4, mut h6) = (Vec::new(), Vec::new());
        for n in except {
            match n {
                IpNet::V4(n) => h4.push(net_range4(n)),
                IpNet::V6(n) => h6.push(net_range6(n)),
            }
        }
        let (v4, h4) = (normalize(v4), normalize(h4));
        let (v6, h6) = (normalize(v6), normalize(h6));
        IpSet {
            v4: subtract(&v4, &h4),
            v6: subtract(&v6, &h6),
        }
    }

    /// The set of these single addresses.
    pub fn from_addrs(addrs: impl IntoIterator<Item = IpAddr>) -> IpSet {
        let nets: Vec<IpNet> = addrs.into_iter().map(IpNet::from).collect();
        IpSet::from_nets(&nets)
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &IpSet) -> IpSet {
        let mut v4 = self.v4.clone();
        v4.extend_from_slice(&other.v4);
        let mut v6 = self.v6.clone();
        v6.extend_from_slice(&other.v6);
        IpSet {
            v4: normalize(v4),
            v6: normalize(v6),
        }
    }

    /// Whether `addr` is in the set: one binary search.
    #[inline]
    pub fn contains(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                let i = self.v4.partition_point(|r| r.1 < a);
                self.v4.get(i).is_some_and(|r| r.0 <= a)
            }
            IpAddr::V6(a) => {
                let a = v6_bits(a);
                let i = self.v6.partition_point(|r| r.1 < a);
                self.v6.get(i).is_some_and(|r| r.0 <= a)
            }
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Number of ranges (its size in the dataplane).
    pub fn ranges(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

/// Endpoints' named ports: which `(address, protocol, port)` a named port
/// resolves to, sorted for binary search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortSet {
    /// `(address as u128 (IPv4 mapped), protocol, port)`, sorted, unique
    /// (on the wire the address as an IPv6 string, see [`wire`]).
    #[serde(with = "wire::ports")]
    pub entries: Vec<(u128, u8, u16)>,
}

/// An address as a sortable key (IPv4 as its IPv6-mapped form).
#[inline]
pub fn addr_key(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => v6_bits(a.to_ipv6_mapped()),
        IpAddr::V6(a) => v6_bits(a),
    }
}

impl PortSet {
    /// Builds from triples (any order, duplicates allowed).
    pub fn new(entries: impl IntoIterator<Item = (IpAddr, u8, u16)>) -> PortSet {
        let mut entries: Vec<_> = entries
            .into_iter()
            .map(|(a, p, n)| (addr_key(a), p, n))
            .collect();
        entries.sort_unstable();
        entries.dedup();
        PortSet { entries }
    }

    /// Whether the address serves that protocol and port under the name.
    #[inline]
    pub fn contains(&self, addr: IpAddr, protocol: u8, port: u16) -> bool {
        self.entries
            .binary_search(&(addr_key(addr), protocol, port))
            .is_ok()
    }
}

/// The `u128` addresses as IPv6 address strings on the wire: serde's
/// buffering of internally tagged enums (the vrouter protocol's
/// `{"op": "apply_policy", ...}`) has no 128-bit integers, so a set with an
/// IPv6 range or a named port (an IPv4-mapped key) made the whole request,
/// and every resync carrying it, unreadable ("u128 is not supported").
pub mod wire {
    use std::net::Ipv6Addr;

    use serde::{Deserialize, Deserializer, Serializer};

    /// `Vec<(u128, u128)>` as `[[first, last], ...]` address strings.
    pub mod ranges {
        use super::*;

        /// Serializes.
        pub fn serialize<S: Serializer>(v: &[(u128, u128)], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(
                v.iter()
                    .map(|&(a, b)| (Ipv6Addr::from(a), Ipv6Addr::from(b))),
            )
        }

        /// Deserializes.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u128, u128)>, D::Error> {
            let v: Vec<(Ipv6Addr, Ipv6Addr)> = Deserialize::deserialize(d)?;
            Ok(v.into_iter()
                .map(|(a, b)| (u128::from(a), u128::from(b)))
                .collect())
        }
    }

    /// `Vec<(u128, u8, u16)>` as `[[address, protocol, port], ...]`.
    pub mod ports {
        use super::*;

        /// Serializes.
        pub fn serialize<S: Serializer>(v: &[(u128, u8, u16)], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(v.iter().map(|&(a, p, n)| (Ipv6Addr::from(a), p, n)))
        }

        /// Deserializes.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(u128, u8, u16)>, D::Error> {
            let v: Vec<(Ipv6Addr, u8, u16)> = Deserialize::deserialize(d)?;
            Ok(v.into_iter()
                .map(|(a, p, n)| (u128::from(a), p, n))
                .collect())
        }
    }
}

/// What a set id stands for in the dataplane.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SetContent {
    /// Addresses.
    Ips(IpSet),
    /// Named ports.
    Ports(PortSet),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn overlapping_and_adjacent_nets_merge() {
        let s = IpSet::from_nets(&[n("10.0.0.0/25"), n("10.0.0.128/25"), n("10.0.0.5/32")]);
        assert_eq!(s.v4, vec![(0x0a00_0000, 0x0a00_00ff)]);
        assert!(s.contains(a("10.0.0.255")));
        assert!(!s.contains(a("10.0.1.0")));
        assert!(!s.contains(a("::1")));
    }

    #[test]
    fn except_cuts_holes_at_edges_and_middle() {
        let s = IpSet::from_nets_except(
            &[n("10.0.0.0/24")],
            &[n("10.0.0.0/30"), n("10.0.0.128/26"), n("10.0.0.255/32")],
        );
        assert!(!s.contains(a("10.0.0.3")));
        assert!(s.contains(a("10.0.0.4")));
        assert!(s.contains(a("10.0.0.127")));
        assert!(!s.contains(a("10.0.0.128")));
        assert!(!s.contains(a("10.0.0.191")));
        assert!(s.contains(a("10.0.0.192")));
        assert!(s.contains(a("10.0.0.254")));
        assert!(!s.contains(a("10.0.0.255")));
    }

    #[test]
    fn whole_space_and_v6_edges() {
        let s = IpSet::from_nets_except(&[n("0.0.0.0/0"), n("::/0")], &[n("::/1")]);
        assert!(s.contains(a("255.255.255.255")));
        assert!(s.contains(a("0.0.0.0")));
        assert!(!s.contains(a("::1")));
        assert!(s.contains(a("ffff::1")));
    }

    #[test]
    fn port_set_matches_address_protocol_and_port() {
        let p = PortSet::new([(a("10.0.0.1"), 6, 80), (a("fd00::1"), 17, 53)]);
        assert!(p.contains(a("10.0.0.1"), 6, 80));
        assert!(!p.contains(a("10.0.0.1"), 17, 80));
        assert!(!p.contains(a("::ffff:10.0.0.2"), 6, 80));
        assert!(p.contains(a("fd00::1"), 17, 53));
    }
}
