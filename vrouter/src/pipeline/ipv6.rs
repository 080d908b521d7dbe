//! IPv6: classified and forwarded natively by longest-prefix match, with a
//! hop-limit decrement (IPv6 has no header checksum).
//!
//! Not yet: ICMPv6 errors (an expired hop limit or a too-big packet is a
//! counted drop), proxy NDP for pods, NDP resolution of gateways (static
//! neighbour entries only), and IPv6 over the tunnels.

use std::net::{IpAddr, Ipv6Addr};

use super::forward::write_ethernet_for;
use super::{Cx, Pipeline, Verdict};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::fib::NextHop;
use crate::frame::PortId;
use crate::wire::ethernet::{self, EtherType};
use crate::wire::ipv6;

/// Link-local (fe80::/10): neighbour discovery, not forwarded.
fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

impl Pipeline {
    /// An IPv6 frame whose header starts at `l3`, received on `ingress`.
    pub(super) fn ipv6(
        &mut self,
        buf: &mut [u8],
        ingress: PortId,
        l3: usize,
        end: usize,
        cx: &Cx,
    ) -> Verdict {
        let Some(kind) = self.ports.get(ingress).map(|e| e.kind) else {
            return Verdict::Drop(DropReason::NotForUs);
        };
        let (src, dst, hop_limit, len) = match ipv6::Packet::new_checked(&buf[l3..end]) {
            Ok(p) => (p.src_addr(), p.dst_addr(), p.hop_limit(), p.total_len()),
            Err(_) => return Verdict::Drop(DropReason::ParseError),
        };
        if dst.is_multicast() || is_link_local(src) || is_link_local(dst) {
            // Neighbour discovery and other link-scope traffic: proxy NDP
            // is not implemented yet.
            return Verdict::Drop(DropReason::Unsupported);
        }
        if kind == PortKind::Pod
            && !self
                .ports
                .get(ingress)
                .is_some_and(|ep| ep.owns(IpAddr::V6(src)))
        {
            return Verdict::Drop(DropReason::Spoofed);
        }
        let Some(nh) = cx.fib.lookup_v6(dst) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if kind == PortKind::Uplink && !matches!(nh, NextHop::Local { .. } | NextHop::Host) {
            return Verdict::Drop(DropReason::NotForUs);
        }
        if hop_limit <= 1 {
            return Verdict::Drop(DropReason::Ttl);
        }
        let plan = match nh {
            NextHop::Local { port } => self.direct(port, None),
            NextHop::Host => match self.ports.host() {
                Some(port) => self.direct(port, None),
                None => Err(Verdict::Drop(DropReason::NoHostPort)),
            },
            NextHop::Gateway {
                via: IpAddr::V6(via),
                port,
            } => match self.neigh.lookup(port, via.into()) {
                Some(mac) => self.direct(port, Some(mac)),
                None => Err(Verdict::Drop(DropReason::NoNeighbour)),
            },
            NextHop::Blackhole => Err(Verdict::Drop(DropReason::Blackhole)),
            NextHop::Gateway { .. } | NextHop::Encap { .. } => {
                Err(Verdict::Drop(DropReason::Unsupported))
            }
        };
        let plan = match plan {
            Ok(p) => p,
            Err(v) => return v,
        };
        if len > plan.mtu {
            return Verdict::Drop(DropReason::Mtu);
        }
        let Some(s) = l3.checked_sub(ethernet::HEADER_LEN) else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        ipv6::Packet::new_unchecked(&mut buf[l3..l3 + len]).decrement_hop_limit();
        write_ethernet_for(&mut buf[s..l3], plan.src_mac, plan.dst_mac, EtherType::Ipv6);
        self.counters.forwarded += 1;
        Verdict::Tx {
            port: plan.port,
            start: s,
            len: l3 + len - s,
        }
    }
}
