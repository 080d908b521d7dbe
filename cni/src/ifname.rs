//! The host end's name: `bri` + 11 hex digits of SHA-256 of the handle.
//!
//! 14 bytes, within IFNAMSIZ - 1 = 15. Derived from the handle (network +
//! container ID + ifname), so DEL finds the interface without any state, and
//! a retried ADD reuses the same name. 44 bits of hash: the chance of any
//! collision among 10 000 pods on one node is about 3 in a million.

use sha2::{Digest, Sha256};

/// Prefix of every host-side interface the plugin creates.
pub const HOST_IFNAME_PREFIX: &str = "bri";

/// Hex digits of the hash after the prefix.
pub const HOST_IFNAME_HASH_DIGITS: usize = 11;

/// The host end's name for an attachment handle.
pub fn host_ifname(handle: &str) -> String {
    let digest = Sha256::digest(handle.as_bytes());
    let mut name = String::with_capacity(HOST_IFNAME_PREFIX.len() + HOST_IFNAME_HASH_DIGITS);
    name.push_str(HOST_IFNAME_PREFIX);
    name.push_str(&hex::encode(&digest[..6])[..HOST_IFNAME_HASH_DIGITS]);
    name
}

/// Whether `name` looks like a host end this plugin made.
pub fn is_host_ifname(name: &str) -> bool {
    name.len() == HOST_IFNAME_PREFIX.len() + HOST_IFNAME_HASH_DIGITS
        && name.starts_with(HOST_IFNAME_PREFIX)
        && name[HOST_IFNAME_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn names_are_stable() {
        // Fixed vector: changing the scheme would orphan every existing veth.
        let name = host_ifname("k8s-pod-network/c0ffee/eth0");
        assert_eq!(name, host_ifname("k8s-pod-network/c0ffee/eth0"));
        let digest = hex::encode(Sha256::digest(b"k8s-pod-network/c0ffee/eth0"));
        assert_eq!(name, format!("bri{}", &digest[..11]));
        assert_eq!(name.len(), 14);
        assert!(is_host_ifname(&name));
        assert!(!is_host_ifname("eth0"));
        assert!(!is_host_ifname("bri0123456789ag"));
    }

    #[test]
    fn no_collisions_over_a_large_sample() {
        let mut seen = HashSet::new();
        for i in 0..200_000u32 {
            let handle = format!("k8s-pod-network/{:064x}/eth{}", u64::from(i) * 7919, i % 3);
            assert!(seen.insert(host_ifname(&handle)), "collision at {i}");
        }
    }

    proptest! {
        #[test]
        fn names_always_fit_ifnamsiz(handle in ".{0,300}") {
            let name = host_ifname(&handle);
            prop_assert!(name.len() <= 15);
            prop_assert!(is_host_ifname(&name));
            prop_assert!(brindle_api::cni::valid_ifname(&name));
        }
    }
}
