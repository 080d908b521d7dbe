//! Per-worker counters.
//!
//! Plain `u64` fields owned by one worker and bumped without atomics; the
//! control side reads a [`Counters`] copy (a snapshot) between iterations.
//!
//! Every received frame ends in exactly one of: transmitted (forwarded, or
//! turned in place into an ARP reply or an ICMP error), consumed (an ARP reply
//! the worker learned from), or dropped for one [`DropReason`]. Frames the
//! worker creates itself (ARP requests on a neighbour miss) are counted as
//! `generated`. A frame waiting for its next hop's MAC is `neighbor_held`
//! (a gauge) until it is sent or dropped. So, after every iteration:
//!
//! `rx_packets + generated + handed_dropped == tx_packets + consumed +
//! dropped() + neighbor_held`
//!
//! (`handed_dropped`: frames another worker handed over for this worker's
//! pod, dropped here by network policy; the sender counted them as sent.)
//!
//! (see [`Counters::balanced`]); the fuzz target and the tests assert it.

use std::fmt;

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// Truncated or malformed headers (Ethernet, ARP, IP, UDP, VXLAN).
    ParseError = 0,
    /// A pod sent a packet whose source is not one of its addresses.
    Spoofed,
    /// No route for the destination.
    NoRoute,
    /// TTL/hop limit expired (an ICMP error was sent when allowed; this
    /// counts the ones that could not be answered, e.g. ICMP errors, IPv6).
    Ttl,
    /// A pod's MAC is unknown (not configured, not yet learned from its
    /// frames), or an IPv6 gateway's. Underlay next hops are resolved while
    /// a few frames wait: see `NeighborQueueFull` and `NeighborTimeout`.
    NoNeighbour,
    /// Larger than the egress MTU and not answerable (no DF: this vrouter
    /// does not fragment; or an ICMP error that would need answering).
    Mtu,
    /// The route is a blackhole.
    Blackhole,
    /// Neither IPv4, IPv6 nor ARP.
    UnknownEthertype,
    /// The egress port's TX ring was full.
    TxRingFull,
    /// Not addressed to this node: tunnel to another address or VNI, an
    /// uplink frame to a non-local destination, ARP we do not answer.
    NotForUs,
    /// Next hop Host without a host port configured.
    NoHostPort,
    /// A valid packet this version does not handle (IPv6 encap, IP options
    /// on a frame that must be rewritten, fragments of ICMP-answered packets).
    Unsupported,
    /// The frame has no room for the outer header (headroom/tailroom).
    NoRoom,
    /// ICMP error rate limit reached.
    IcmpRateLimited,
    /// IPIP or VXLAN from an address that is not a known node (when the
    /// tunnel peer allow-list is on).
    UnknownTunnelPeer,
    /// The next hop's MAC is being resolved and its queue (or the worker's)
    /// is full.
    NeighborQueueFull,
    /// The frame waited for its next hop's MAC longer than the resolution
    /// timeout.
    NeighborTimeout,
    /// Network policy denied it (a new flow, or a tracked one revalidated
    /// under a newer policy).
    PolicyDenied,
    /// A new allowed flow that the full connection table cannot hold.
    ConntrackFull,
    /// No tracked state accepts it: out-of-state TCP, an ICMP error about
    /// no flow, a fragment or truncated L4 header of a policed pod.
    ConntrackInvalid,
    /// The host port sent a packet whose route leads back to the host (the
    /// kernel routed into the vrouter what the vrouter routes to the
    /// kernel): dropped rather than looped until its TTL runs out.
    HostHairpin,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 21] = [
        DropReason::ParseError,
        DropReason::Spoofed,
        DropReason::NoRoute,
        DropReason::Ttl,
        DropReason::NoNeighbour,
        DropReason::Mtu,
        DropReason::Blackhole,
        DropReason::UnknownEthertype,
        DropReason::TxRingFull,
        DropReason::NotForUs,
        DropReason::NoHostPort,
        DropReason::Unsupported,
        DropReason::NoRoom,
        DropReason::IcmpRateLimited,
        DropReason::UnknownTunnelPeer,
        DropReason::NeighborQueueFull,
        DropReason::NeighborTimeout,
        DropReason::PolicyDenied,
        DropReason::ConntrackFull,
        DropReason::ConntrackInvalid,
        DropReason::HostHairpin,
    ];

    /// Stable snake_case name (metrics label).
    pub fn name(self) -> &'static str {
        match self {
            DropReason::ParseError => "parse_error",
            DropReason::Spoofed => "spoofed",
            DropReason::NoRoute => "no_route",
            DropReason::Ttl => "ttl",
            DropReason::NoNeighbour => "no_neighbour",
            DropReason::Mtu => "mtu",
            DropReason::Blackhole => "blackhole",
            DropReason::UnknownEthertype => "unknown_ethertype",
            DropReason::TxRingFull => "tx_ring_full",
            DropReason::NotForUs => "not_for_us",
            DropReason::NoHostPort => "no_host_port",
            DropReason::Unsupported => "unsupported",
            DropReason::NoRoom => "no_room",
            DropReason::IcmpRateLimited => "icmp_rate_limited",
            DropReason::UnknownTunnelPeer => "unknown_tunnel_peer",
            DropReason::NeighborQueueFull => "neighbor_queue_full",
            DropReason::NeighborTimeout => "neighbor_timeout",
            DropReason::PolicyDenied => "policy_denied",
            DropReason::ConntrackFull => "conntrack_full",
            DropReason::ConntrackInvalid => "conntrack_invalid",
            DropReason::HostHairpin => "host_hairpin",
        }
    }
}

/// Number of drop reasons.
pub const DROP_REASONS: usize = DropReason::ALL.len();

/// One worker's counters. `Copy`, so a snapshot is a plain copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames received from ports.
    pub rx_packets: u64,
    /// Bytes received from ports.
    pub rx_bytes: u64,
    /// Frames the ports accepted for transmission.
    pub tx_packets: u64,
    /// Bytes the ports accepted for transmission.
    pub tx_bytes: u64,
    /// Frames routed to another port (native, encapsulated or decapsulated).
    pub forwarded: u64,
    /// ARP requests answered in place (proxy ARP).
    pub arp_replies: u64,
    /// Neighbor solicitations answered in place (proxy NDP).
    pub nd_adverts: u64,
    /// ARP requests sent to resolve a neighbour (in `generated`).
    pub arp_requests: u64,
    /// ARP replies on the uplink learned into the neighbour table (consumed).
    pub arp_learned: u64,
    /// ICMP errors built in place (time exceeded, fragmentation needed).
    pub icmp_generated: u64,
    /// Packets encapsulated in IPIP.
    pub encap_ipip: u64,
    /// Packets encapsulated in VXLAN.
    pub encap_vxlan: u64,
    /// IPIP packets decapsulated.
    pub decap_ipip: u64,
    /// VXLAN packets decapsulated.
    pub decap_vxlan: u64,
    /// Frames the worker created (ARP requests).
    pub generated: u64,
    /// Frames taken without transmitting or dropping (learned ARP replies).
    pub consumed: u64,
    /// Frames waiting now for their next hop's MAC (a gauge, not a total).
    pub neighbor_held: u64,
    /// Frames sent after waiting for their next hop's MAC (a total).
    pub neighbor_released: u64,
    /// Frames other workers handed over for this worker's pods that this
    /// worker dropped (network policy checked at the pod's owner; in
    /// `dropped()` by reason, though not in `rx_packets`).
    pub handed_dropped: u64,
    /// TAP super-packets (TSO) handled whole, routed to a TAP pod: each is
    /// ONE frame in `rx_packets`/`tx_packets` (its bytes in `rx_bytes`),
    /// one read and one write, or one drop (anti-spoofing, policy) for all
    /// its segments.
    pub super_whole: u64,
    /// TAP super-packets cut into segments in the pipeline (each segment
    /// is a frame in `rx_packets`).
    pub super_cut: u64,
    /// Super-packets a TAP port made of frames of one TX batch (userspace
    /// GRO, one write each; their frames count in `tx_packets` as usual).
    pub gro_super: u64,
    /// The frames those super-packets held.
    pub gro_segments: u64,
    /// Drops by reason, indexed by `DropReason as usize`.
    pub drops: [u64; DROP_REASONS],
}

impl Counters {
    /// Counts one drop.
    #[inline]
    pub fn drop(&mut self, reason: DropReason) {
        self.drops[reason as usize] += 1;
    }

    /// Drops for one reason.
    #[inline]
    pub fn drops_for(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// All drops.
    pub fn dropped(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Whether every frame is accounted for:
    /// `rx + generated + handed_dropped == tx + consumed + dropped +
    /// neighbor_held`.
    pub fn balanced(&self) -> bool {
        self.rx_packets + self.generated + self.handed_dropped
            == self.tx_packets + self.consumed + self.dropped() + self.neighbor_held
    }
}

impl fmt::Display for Counters {
    /// A two-column table of every non-zero counter (and rx/tx always).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: [(&str, u64); 23] = [
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("forwarded", self.forwarded),
            ("arp_replies", self.arp_replies),
            ("nd_adverts", self.nd_adverts),
            ("arp_requests", self.arp_requests),
            ("arp_learned", self.arp_learned),
            ("icmp_generated", self.icmp_generated),
            ("encap_ipip", self.encap_ipip),
            ("encap_vxlan", self.encap_vxlan),
            ("decap_ipip", self.decap_ipip),
            ("decap_vxlan", self.decap_vxlan),
            ("generated", self.generated),
            ("consumed", self.consumed),
            ("neighbor_held", self.neighbor_held),
            ("neighbor_released", self.neighbor_released),
            ("handed_dropped", self.handed_dropped),
            ("super_whole", self.super_whole),
            ("super_cut", self.super_cut),
            ("gro_super", self.gro_super),
            ("gro_segments", self.gro_segments),
        ];
        for (name, value) in rows {
            if value != 0 || name.starts_with("rx_") || name.starts_with("tx_") {
                writeln!(f, "  {name:<24} {value:>12}")?;
            }
        }
        for reason in DropReason::ALL {
            let n = self.drops_for(reason);
            if n != 0 {
                writeln!(f, "  {:<24} {n:>12}", format!("drop_{}", reason.name()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_indexes_its_own_slot() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of order");
        }
    }

    #[test]
    fn balance_counts_generated_and_consumed_frames() {
        let mut c = Counters {
            rx_packets: 3,
            tx_packets: 2,
            generated: 1,
            consumed: 1,
            ..Counters::default()
        };
        assert!(!c.balanced());
        c.drop(DropReason::NoNeighbour);
        assert!(c.balanced());
        assert_eq!(c.drops_for(DropReason::NoNeighbour), 1);
        assert!(c.to_string().contains("drop_no_neighbour"));
    }
}
