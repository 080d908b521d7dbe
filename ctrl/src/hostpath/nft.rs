//! natOutgoing as one nftables table of ours, with Calico's meaning: a
//! packet from a natOutgoing pool to a destination outside every pool
//! leaves masqueraded to the address of the interface it leaves by (the
//! node's); the kernel's conntrack translates the replies back, ICMP echo
//! and the ICMP errors about a masqueraded flow included.
//!
//! The ruleset is text for `nft -f`: the table is declared, deleted and
//! declared again with its whole content in one transaction, so the kernel
//! goes from the old table to the new one atomically and no other table
//! (kube-proxy's, Docker's, the distribution's) is touched.

use std::collections::BTreeSet;
use std::fmt::Write;

use ipnet::IpNet;

use super::NatPools;

/// The table's family and name: `inet brindle`.
pub const TABLE: &str = "brindle";

/// The `nft -f` input that makes `inet brindle` exactly this.
pub fn ruleset(nat: &NatPools) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "table inet {TABLE}");
    let _ = writeln!(out, "delete table inet {TABLE}");
    let _ = writeln!(out, "table inet {TABLE} {{");
    for (name, kind, nets) in [
        ("masq_v4", "ipv4_addr", v4(&nat.masquerade)),
        ("pools_v4", "ipv4_addr", v4(&nat.pools)),
        ("masq_v6", "ipv6_addr", v6(&nat.masquerade)),
        ("pools_v6", "ipv6_addr", v6(&nat.pools)),
    ] {
        let _ = write!(
            out,
            "\tset {name} {{\n\t\ttype {kind}\n\t\tflags interval\n\t\tauto-merge\n"
        );
        if !nets.is_empty() {
            let list: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
            let _ = writeln!(out, "\t\telements = {{ {} }}", list.join(", "));
        }
        let _ = writeln!(out, "\t}}");
    }
    out.push_str(
        "\tchain postrouting {\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr @masq_v4 ip daddr != @pools_v4 masquerade\n\
         \t\tip6 saddr @masq_v6 ip6 daddr != @pools_v6 masquerade\n\
         \t}\n\
         }\n",
    );
    out
}

fn v4(nets: &BTreeSet<IpNet>) -> Vec<IpNet> {
    nets.iter()
        .filter(|n| matches!(n, IpNet::V4(_)))
        .map(IpNet::trunc)
        .collect()
}

fn v6(nets: &BTreeSet<IpNet>) -> Vec<IpNet> {
    nets.iter()
        .filter(|n| matches!(n, IpNet::V6(_)))
        .map(IpNet::trunc)
        .collect()
}
