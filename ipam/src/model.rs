//! The IPAM model: pools, blocks, handles and the address arithmetic between
//! them. Pure data and functions: no I/O, no clock.
//!
//! Addresses of both families are handled as `u128` offsets so that one code
//! path serves IPv4 and IPv6.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use brindle_api::ipam::{Attributes, HandleId};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// Why a pool or a selector is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The pool's CIDR has host bits set.
    #[error("pool {name}: CIDR {cidr} has host bits set (did you mean {trunc}?)")]
    HostBitsSet {
        /// Pool name.
        name: String,
        /// As given.
        cidr: IpNet,
        /// As it should be.
        trunc: IpNet,
    },
    /// The block size is outside the allowed range for its family or is
    /// larger than the pool.
    #[error(
        "pool {name}: block size /{block_size} not allowed for {cidr} (IPv4 /20-/32, IPv6 /116-/128, and not larger than the pool)"
    )]
    BadBlockSize {
        /// Pool name.
        name: String,
        /// Pool CIDR.
        cidr: IpNet,
        /// Requested prefix length.
        block_size: u8,
    },
    /// The per-block reservation leaves no address.
    #[error(
        "pool {name}: reserving {first} first and {last} last addresses leaves nothing in a /{block_size} block"
    )]
    BlockReserveTooLarge {
        /// Pool name.
        name: String,
        /// Reserved at the start.
        first: u32,
        /// Reserved at the end.
        last: u32,
        /// Block prefix length.
        block_size: u8,
    },
    /// A pool name that cannot be a key.
    #[error("pool name {0:?} must be 1-63 characters of [a-z0-9.-]")]
    BadName(String),
    /// A node selector that does not parse.
    #[error("node selector {selector:?}: {reason}")]
    BadSelector {
        /// As given.
        selector: String,
        /// What is wrong.
        reason: String,
    },
}

/// How traffic from a pool's addresses crosses between nodes (the API's
/// type: the IPAM does not act on it; the node daemon reads it to program
/// the vrouter).
pub use brindle_api::Encapsulation;

/// An IP pool (Calico's `IPPool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Name, also its key.
    pub name: String,
    /// The addresses it covers.
    pub cidr: IpNet,
    /// Prefix length of its blocks; default /26 (IPv4) or /122 (IPv6).
    #[serde(default)]
    pub block_size: Option<u8>,
    /// Encapsulation between nodes.
    #[serde(default)]
    pub encapsulation: Encapsulation,
    /// Masquerade traffic leaving the pool.
    #[serde(default)]
    pub nat_outgoing: bool,
    /// Which nodes may claim blocks from it (`all()` when empty).
    #[serde(default)]
    pub node_selector: String,
    /// A disabled pool hands out nothing new; existing allocations stay.
    #[serde(default)]
    pub disabled: bool,
    /// Addresses at the start of every block never handed out (Calico's
    /// Windows rule reserves 3: network, gateway, DNS).
    #[serde(default)]
    pub block_reserve_first: u32,
    /// Addresses at the end of every block never handed out (Calico's
    /// Windows rule reserves 1: broadcast).
    #[serde(default)]
    pub block_reserve_last: u32,
}

impl Pool {
    /// A pool with the defaults for everything but name and CIDR.
    pub fn new(name: &str, cidr: IpNet) -> Self {
        Pool {
            name: name.to_owned(),
            cidr,
            block_size: None,
            encapsulation: Encapsulation::None,
            nat_outgoing: false,
            node_selector: String::new(),
            disabled: false,
            block_reserve_first: 0,
            block_reserve_last: 0,
        }
    }

    /// Prefix length of this pool's blocks.
    pub fn block_prefix(&self) -> u8 {
        self.block_size.unwrap_or(match self.cidr {
            IpNet::V4(_) => 26,
            IpNet::V6(_) => 122,
        })
    }

    /// Checks the pool once, at the edge.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.name.is_empty()
            || self.name.len() > 63
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        {
            return Err(ModelError::BadName(self.name.clone()));
        }
        if self.cidr.trunc() != self.cidr {
            return Err(ModelError::HostBitsSet {
                name: self.name.clone(),
                cidr: self.cidr,
                trunc: self.cidr.trunc(),
            });
        }
        let bs = self.block_prefix();
        let range = match self.cidr {
            IpNet::V4(_) => 20..=32,
            IpNet::V6(_) => 116..=128,
        };
        if !range.contains(&bs) || bs < self.cidr.prefix_len() {
            return Err(ModelError::BadBlockSize {
                name: self.name.clone(),
                cidr: self.cidr,
                block_size: bs,
            });
        }
        let size = 1u64 << (self.cidr.max_prefix_len() - bs);
        if u64::from(self.block_reserve_first) + u64::from(self.block_reserve_last) >= size {
            return Err(ModelError::BlockReserveTooLarge {
                name: self.name.clone(),
                first: self.block_reserve_first,
                last: self.block_reserve_last,
                block_size: bs,
            });
        }
        Selector::parse(&self.node_selector)?;
        Ok(())
    }

    /// Addresses per block.
    pub fn block_len(&self) -> u32 {
        1u32 << (self.cidr.max_prefix_len() - self.block_prefix())
    }

    /// Number of blocks in the pool (saturating for huge IPv6 pools).
    pub fn block_count(&self) -> u128 {
        let bits = u32::from(self.block_prefix() - self.cidr.prefix_len());
        1u128.checked_shl(bits).unwrap_or(u128::MAX)
    }

    /// The `index`-th block of the pool.
    pub fn block_at(&self, index: u128) -> Option<IpNet> {
        if index >= self.block_count() {
            return None;
        }
        let shift = u32::from(self.cidr.max_prefix_len() - self.block_prefix());
        let base = to_u128(self.cidr.network()) + (index << shift);
        Some(net_of(
            from_u128(self.cidr.network(), base),
            self.block_prefix(),
        ))
    }

    /// Index of the block containing `ip`, if `ip` is in the pool.
    pub fn block_index_of(&self, ip: IpAddr) -> Option<u128> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        let shift = u32::from(self.cidr.max_prefix_len() - self.block_prefix());
        Some((to_u128(ip) - to_u128(self.cidr.network())) >> shift)
    }

    /// The block containing `ip`, if `ip` is in the pool.
    pub fn block_of(&self, ip: IpAddr) -> Option<IpNet> {
        self.block_index_of(ip).and_then(|i| self.block_at(i))
    }

    /// Whether a node with `labels` may use this pool.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        Selector::parse(&self.node_selector)
            .map(|s| s.matches(labels))
            .unwrap_or(false)
    }

    /// Addresses in the pool (saturating).
    pub fn capacity(&self) -> u128 {
        let bits = u32::from(self.cidr.max_prefix_len() - self.cidr.prefix_len());
        1u128.checked_shl(bits).unwrap_or(u128::MAX)
    }
}

/// Cluster-wide IPAM settings (Calico's `IPAMConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IpamConfig {
    /// Never borrow from another node's block.
    pub strict_affinity: bool,
    /// Most blocks one node may hold affinity for; 0 means no limit.
    pub max_blocks_per_host: u32,
}

/// Addresses never handed out (Calico's `IPReservation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    /// Name, also its key.
    pub name: String,
    /// The reserved ranges.
    pub cidrs: Vec<IpNet>,
}

/// A block of a pool, with the node it has affinity to and its allocations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// The block's CIDR.
    pub cidr: IpNet,
    /// The pool it was carved from.
    pub pool: String,
    /// The node it belongs to; `None` once that node is gone.
    pub affinity: Option<String>,
    /// Allocated ordinals (offset from the block's first address) and the
    /// handle holding each.
    pub allocations: BTreeMap<u32, HandleId>,
}

impl Block {
    /// An empty block.
    pub fn new(cidr: IpNet, pool: &str, affinity: Option<&str>) -> Self {
        Block {
            cidr,
            pool: pool.to_owned(),
            affinity: affinity.map(str::to_owned),
            allocations: BTreeMap::new(),
        }
    }

    /// Addresses in the block.
    pub fn len(&self) -> u32 {
        1u32 << (self.cidr.max_prefix_len() - self.cidr.prefix_len()).min(31)
    }

    /// Whether no address is allocated.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }

    /// The address at `ordinal`.
    pub fn address(&self, ordinal: u32) -> IpAddr {
        from_u128(
            self.cidr.network(),
            to_u128(self.cidr.network()) + u128::from(ordinal),
        )
    }

    /// The ordinal of `ip` in this block.
    pub fn ordinal(&self, ip: IpAddr) -> Option<u32> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        u32::try_from(to_u128(ip) - to_u128(self.cidr.network())).ok()
    }

    /// Whether `ordinal` may ever be handed out: not in the pool's per-block
    /// reserve, not in a reservation.
    pub fn is_usable(&self, ordinal: u32, pool: &Pool, reserved: &[IpNet]) -> bool {
        if ordinal < pool.block_reserve_first
            || ordinal >= self.len().saturating_sub(pool.block_reserve_last)
        {
            return false;
        }
        let ip = self.address(ordinal);
        !reserved.iter().any(|r| r.contains(&ip))
    }

    /// Number of usable ordinals.
    pub fn usable_count(&self, pool: &Pool, reserved: &[IpNet]) -> u32 {
        (0..self.len())
            .filter(|&o| self.is_usable(o, pool, reserved))
            .count() as u32
    }

    /// The lowest free usable ordinal.
    pub fn first_free(&self, pool: &Pool, reserved: &[IpNet]) -> Option<u32> {
        (0..self.len())
            .find(|o| !self.allocations.contains_key(o) && self.is_usable(*o, pool, reserved))
    }
}

/// What a handle holds; stored under the handle's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleRecord {
    /// The key.
    pub handle: HandleId,
    /// Who it belongs to.
    pub attrs: Attributes,
    /// Its addresses.
    pub addresses: BTreeSet<IpAddr>,
}

/// A node selector: `all()` (or empty), or terms joined by `&&`, each one of
/// `k == 'v'`, `k != 'v'`, `has(k)`, `!has(k)`. A subset of Calico's grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<Term>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    Has(String),
    NotHas(String),
}

impl Selector {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, ModelError> {
        let bad = |reason: &str| ModelError::BadSelector {
            selector: text.to_owned(),
            reason: reason.to_owned(),
        };
        let t = text.trim();
        if t.is_empty() || t == "all()" {
            return Ok(Selector { terms: Vec::new() });
        }
        let mut terms = Vec::new();
        for part in t.split("&&") {
            let p = part.trim();
            let key_ok = |k: &str| {
                !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
            };
            let unquote = |v: &str| -> Option<String> {
                let v = v.trim();
                let q = v.chars().next()?;
                if (q == '\'' || q == '"') && v.len() >= 2 && v.ends_with(q) {
                    Some(v[1..v.len() - 1].to_owned())
                } else {
                    None
                }
            };
            let term = if let Some(inner) =
                p.strip_prefix("!has(").and_then(|r| r.strip_suffix(')'))
            {
                let k = inner.trim();
                if !key_ok(k) {
                    return Err(bad("bad label key"));
                }
                Term::NotHas(k.to_owned())
            } else if let Some(inner) = p.strip_prefix("has(").and_then(|r| r.strip_suffix(')')) {
                let k = inner.trim();
                if !key_ok(k) {
                    return Err(bad("bad label key"));
                }
                Term::Has(k.to_owned())
            } else if let Some((k, v)) = p.split_once("!=") {
                let k = k.trim();
                let v = unquote(v).ok_or_else(|| bad("value must be quoted"))?;
                if !key_ok(k) {
                    return Err(bad("bad label key"));
                }
                Term::Ne(k.to_owned(), v)
            } else if let Some((k, v)) = p.split_once("==") {
                let k = k.trim();
                let v = unquote(v).ok_or_else(|| bad("value must be quoted"))?;
                if !key_ok(k) {
                    return Err(bad("bad label key"));
                }
                Term::Eq(k.to_owned(), v)
            } else {
                return Err(bad("expected all(), k == 'v', k != 'v', has(k) or !has(k)"));
            };
            terms.push(term);
        }
        Ok(Selector { terms })
    }

    /// Whether a node with `labels` matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| match t {
            Term::Eq(k, v) => labels.get(k) == Some(v),
            Term::Ne(k, v) => labels.get(k) != Some(v),
            Term::Has(k) => labels.contains_key(k),
            Term::NotHas(k) => !labels.contains_key(k),
        })
    }
}

/// The address as an offset from `::`/`0.0.0.0`.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of the same family as `like` at offset `v`.
pub fn from_u128(like: IpAddr, v: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn net_of(ip: IpAddr, prefix: u8) -> IpNet {
    match ip {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::new_assert(a, prefix)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::new_assert(a, prefix)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(cidr: &str) -> Pool {
        Pool::new("p", cidr.parse().unwrap())
    }

    #[test]
    fn default_block_sizes_are_26_for_ipv4_and_122_for_ipv6() {
        assert_eq!(pool("10.0.0.0/16").block_prefix(), 26);
        assert_eq!(pool("fd00::/64").block_prefix(), 122);
        assert_eq!(pool("10.0.0.0/16").block_len(), 64);
        assert_eq!(pool("10.0.0.0/16").block_count(), 1024);
    }

    #[test]
    fn block_sizes_outside_the_allowed_ranges_are_refused() {
        let mut p = pool("10.0.0.0/16");
        p.block_size = Some(19);
        assert!(matches!(p.validate(), Err(ModelError::BadBlockSize { .. })));
        p.block_size = Some(32);
        assert!(p.validate().is_ok());
        let mut p6 = pool("fd00::/64");
        p6.block_size = Some(115);
        assert!(p6.validate().is_err());
        p6.block_size = Some(116);
        assert!(p6.validate().is_ok());
        let mut small = pool("10.0.0.0/28");
        small.block_size = Some(26);
        assert!(small.validate().is_err(), "block larger than the pool");
    }

    #[test]
    fn a_pool_cidr_with_host_bits_is_refused() {
        assert!(matches!(
            pool("10.0.0.1/16").validate(),
            Err(ModelError::HostBitsSet { .. })
        ));
    }

    #[test]
    fn blocks_tile_the_pool_in_order() {
        let p = pool("10.1.0.0/24");
        assert_eq!(p.block_at(0).unwrap().to_string(), "10.1.0.0/26");
        assert_eq!(p.block_at(3).unwrap().to_string(), "10.1.0.192/26");
        assert_eq!(p.block_at(4), None);
        assert_eq!(
            p.block_of("10.1.0.130".parse().unwrap())
                .unwrap()
                .to_string(),
            "10.1.0.128/26"
        );
        assert_eq!(p.block_of("10.2.0.1".parse().unwrap()), None);
        let p6 = pool("fd00:1::/120");
        assert_eq!(p6.block_at(2).unwrap().to_string(), "fd00:1::80/122");
    }

    #[test]
    fn ordinals_map_to_addresses_and_back() {
        let b = Block::new("10.1.0.64/26".parse().unwrap(), "p", Some("n"));
        assert_eq!(b.address(0).to_string(), "10.1.0.64");
        assert_eq!(b.address(63).to_string(), "10.1.0.127");
        assert_eq!(b.ordinal("10.1.0.100".parse().unwrap()), Some(36));
        assert_eq!(b.ordinal("10.1.0.128".parse().unwrap()), None);
    }

    #[test]
    fn windows_style_block_reserve_skips_first_three_and_last_one() {
        let mut p = pool("10.1.0.0/24");
        p.block_reserve_first = 3;
        p.block_reserve_last = 1;
        let b = Block::new(p.block_at(1).unwrap(), "p", None);
        assert_eq!(b.first_free(&p, &[]), Some(3));
        assert_eq!(b.usable_count(&p, &[]), 60);
        assert!(!b.is_usable(63, &p, &[]));
    }

    #[test]
    fn reservations_are_never_free() {
        let p = pool("10.1.0.0/24");
        let b = Block::new(p.block_at(0).unwrap(), "p", None);
        let reserved: Vec<IpNet> = vec!["10.1.0.0/30".parse().unwrap()];
        assert_eq!(b.first_free(&p, &reserved), Some(4));
        assert_eq!(b.usable_count(&p, &reserved), 60);
    }

    #[test]
    fn selectors_match_labels() {
        let mut labels = BTreeMap::new();
        labels.insert("zone".to_owned(), "a".to_owned());
        labels.insert("gpu".to_owned(), "yes".to_owned());
        assert!(Selector::parse("all()").unwrap().matches(&labels));
        assert!(Selector::parse("").unwrap().matches(&labels));
        assert!(
            Selector::parse("zone == 'a' && has(gpu)")
                .unwrap()
                .matches(&labels)
        );
        assert!(!Selector::parse("zone != \"a\"").unwrap().matches(&labels));
        assert!(!Selector::parse("!has(gpu)").unwrap().matches(&labels));
        assert!(Selector::parse("zone = a").is_err());
        assert!(Selector::parse("zone == a").is_err());
    }
}
