//! IP protocol numbers (the IPv4 protocol and IPv6 next-header field).

use crate::macros::enum_with_unknown;

enum_with_unknown! {
    /// An IANA "Assigned Internet Protocol Number".
    pub enum IpProtocol(u8) {
        /// IPv6 hop-by-hop options (0).
        HopByHop = 0,
        /// ICMP for IPv4 (1).
        Icmp = 1,
        /// IPv4 encapsulated in IPv4: IPIP (4, RFC 2003).
        IpIp = 4,
        /// TCP (6).
        Tcp = 6,
        /// UDP (17).
        Udp = 17,
        /// IPv6 encapsulated (41).
        Ipv6 = 41,
        /// IPv6 routing header (43).
        Ipv6Route = 43,
        /// IPv6 fragment header (44).
        Ipv6Frag = 44,
        /// GRE (47).
        Gre = 47,
        /// ICMP for IPv6 (58).
        Icmpv6 = 58,
        /// IPv6 "no next header" (59).
        Ipv6NoNxt = 59,
        /// IPv6 destination options (60).
        Ipv6Opts = 60,
    }
}
