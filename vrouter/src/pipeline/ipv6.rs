//! IPv6: proxy NDP on pod ports, then native forwarding by longest-prefix
//! match with a hop-limit decrement (IPv6 has no header checksum). An
//! expired hop limit or a too-big packet is answered with ICMPv6 (time
//! exceeded, packet too big) when the node has an IPv6 address configured,
//! built in place and routed back like any packet.
//!
//! Not yet: NDP resolution of gateways (static neighbour entries only) and
//! IPv6 over the tunnels (both counted drops).

use std::net::{IpAddr, Ipv6Addr};

use super::forward::write_ethernet_for;
use super::{Cx, Pipeline, Verdict};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::fib::NextHop;
use crate::frame::PortId;
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::icmpv6::{self, ErrorHeader, Icmpv6Error};
use crate::wire::ip::IpProtocol;
use crate::wire::ipv6;

/// Link-local (fe80::/10).
fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// The facts of an IPv6 header the pipeline uses.
#[derive(Clone, Copy, Debug)]
struct V6 {
    l3: usize,
    /// Header and payload.
    len: usize,
    dst: Ipv6Addr,
    hop_limit: u8,
}

impl Pipeline {
    /// An IPv6 frame starting at chunk offset `start`, header at `l3`,
    /// received on `ingress`.
    pub(super) fn ipv6(
        &mut self,
        buf: &mut [u8],
        ingress: PortId,
        start: usize,
        l3: usize,
        end: usize,
        cx: &Cx,
    ) -> Verdict {
        let Some(kind) = self.ports.get(ingress).map(|e| e.kind) else {
            return Verdict::Drop(DropReason::NotForUs);
        };
        let (src, m, next_header) = match ipv6::Packet::new_checked(&buf[l3..end]) {
            Ok(p) => (
                p.src_addr(),
                V6 {
                    l3,
                    len: p.total_len(),
                    dst: p.dst_addr(),
                    hop_limit: p.hop_limit(),
                },
                p.next_header(),
            ),
            Err(_) => return Verdict::Drop(DropReason::ParseError),
        };
        if kind != PortKind::Uplink && next_header == IpProtocol::Icmpv6 {
            let icmp = &buf[l3 + ipv6::HEADER_LEN..l3 + m.len];
            if let Some(target) = icmpv6::speculative_ns_target(icmp) {
                return self.proxy_ndp(buf, ingress, start, l3, target);
            }
        }
        if kind == PortKind::Pod
            && m.dst.is_multicast()
            && is_solicitation_or_listener_report(&buf[l3..l3 + m.len], next_header)
        {
            // A pod's kernel sends router solicitations and MLD reports on
            // its own: not errors, not answered (its routes are static, as
            // Calico's), taken as `consumed`.
            return Verdict::Consumed;
        }
        if m.dst.is_multicast() || is_link_local(src) || is_link_local(m.dst) {
            // Other link-scope traffic is not ours to forward.
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
        self.route_v6(buf, kind, start, m, false, cx)
    }

    /// Answers a neighbor solicitation from a pod for anything but its own
    /// addresses with our MAC (the IPv6 twin of proxy ARP), in place.
    fn proxy_ndp(
        &mut self,
        buf: &mut [u8],
        ingress: PortId,
        start: usize,
        l3: usize,
        target: Ipv6Addr,
    ) -> Verdict {
        let Some(ep) = self.ports.get(ingress) else {
            return Verdict::Drop(DropReason::NotForUs);
        };
        if ep.owns(IpAddr::V6(target)) {
            // The pod resolving (or defending) its own address.
            return Verdict::Drop(DropReason::NotForUs);
        }
        let mac = MacAddr(ep.mac);
        match icmpv6::emit_neighbor_advert_in_place(&mut buf[start..], l3 - start, mac, true) {
            Ok(len) => {
                self.counters.nd_adverts += 1;
                Verdict::Tx {
                    port: ingress,
                    start,
                    len,
                }
            }
            // Duplicate address detection (from ::) must not be answered.
            Err(crate::wire::Error::Unsupported) => Verdict::Drop(DropReason::NotForUs),
            Err(_) => Verdict::Drop(DropReason::ParseError),
        }
    }

    fn route_v6(
        &mut self,
        buf: &mut [u8],
        kind: PortKind,
        start: usize,
        m: V6,
        local: bool,
        cx: &Cx,
    ) -> Verdict {
        let Some(nh) = cx.fib.lookup_v6(m.dst) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if kind == PortKind::Uplink
            && !local
            && !matches!(nh, NextHop::Local { .. } | NextHop::Host)
        {
            return Verdict::Drop(DropReason::NotForUs);
        }
        if kind == PortKind::Host && !local && nh == NextHop::Host {
            return Verdict::Drop(DropReason::HostHairpin);
        }
        if !local && m.hop_limit <= 1 {
            return self.icmpv6_error(
                buf,
                start,
                m,
                Icmpv6Error::TimeExceeded,
                DropReason::Ttl,
                cx,
            );
        }
        let flow = if local {
            Default::default()
        } else {
            match self.police(buf, kind, nh, m.l3, m.l3 + m.len, true, cx) {
                Ok(f) => f,
                Err(v) => return v,
            }
        };
        let nh = super::forward::reply_route(kind, nh, flow);
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
        // A super-packet carried whole: its segments must fit.
        if m.len > plan.mtu && !self.super_fits(plan.port, plan.mtu) {
            if local {
                return Verdict::Drop(DropReason::Mtu);
            }
            let error = Icmpv6Error::PacketTooBig {
                mtu: plan.mtu as u32,
            };
            return self.icmpv6_error(buf, start, m, error, DropReason::Mtu, cx);
        }
        let Some(s) = m.l3.checked_sub(ethernet::HEADER_LEN) else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        if !local {
            ipv6::Packet::new_unchecked(&mut buf[m.l3..m.l3 + m.len]).decrement_hop_limit();
            self.counters.forwarded += 1;
        }
        write_ethernet_for(
            &mut buf[s..m.l3],
            plan.src_mac,
            plan.dst_mac,
            EtherType::Ipv6,
        );
        Verdict::Tx {
            port: plan.port,
            start: s,
            len: m.l3 + m.len - s,
        }
    }

    /// Answers `m` with an ICMPv6 error from the node's IPv6 address, or
    /// drops it for `reason` (no node address, RFC 4443 forbids an answer,
    /// rate limit).
    fn icmpv6_error(
        &mut self,
        buf: &mut [u8],
        start: usize,
        m: V6,
        error: Icmpv6Error,
        reason: DropReason,
        cx: &Cx,
    ) -> Verdict {
        let Some(node_v6) = self.cfg.node_v6 else {
            return Verdict::Drop(reason);
        };
        let may = ipv6::Packet::new_checked(&buf[m.l3..m.l3 + m.len])
            .is_ok_and(|p| icmpv6::may_send_error_about(&p));
        if !may {
            return Verdict::Drop(reason);
        }
        if !self.icmp_bucket.take(cx.now) {
            return Verdict::Drop(DropReason::IcmpRateLimited);
        }
        let header = ErrorHeader {
            // The MACs are rewritten when the error is routed.
            src_mac: MacAddr::ZERO,
            dst_mac: MacAddr::ZERO,
            src_addr: node_v6,
            hop_limit: 64,
            flow_label: 0,
        };
        let Ok(len) = icmpv6::emit_error_in_place(&mut buf[start..], m.l3 - start, error, &header)
        else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        let l3 = start + ethernet::HEADER_LEN;
        let reply = match ipv6::Packet::new_checked(&buf[l3..start + len]) {
            Ok(p) => V6 {
                l3,
                len: p.total_len(),
                dst: p.dst_addr(),
                hop_limit: p.hop_limit(),
            },
            Err(_) => return Verdict::Drop(DropReason::ParseError),
        };
        let v = self.route_v6(buf, PortKind::Host, start, reply, true, cx);
        if matches!(v, Verdict::Tx { .. }) {
            self.counters.icmp_generated += 1;
        }
        v
    }
}

/// Whether the IPv6 packet `ip` (header first) is a router solicitation
/// (ICMPv6 133) or an MLD report/done (131, 132, 143), directly or behind
/// one hop-by-hop header (MLD's router alert).
fn is_solicitation_or_listener_report(ip: &[u8], next_header: IpProtocol) -> bool {
    let mut at = ipv6::HEADER_LEN;
    let mut next = next_header;
    if next == IpProtocol::HopByHop {
        let (Some(&nh), Some(&len)) = (ip.get(at), ip.get(at + 1)) else {
            return false;
        };
        next = IpProtocol::from(nh);
        at += (usize::from(len) + 1) * 8;
    }
    next == IpProtocol::Icmpv6 && matches!(ip.get(at), Some(133 | 131 | 132 | 143))
}
