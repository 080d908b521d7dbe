//! IPv4: decapsulation, anti-spoofing, route lookup, TTL, MTU, MAC rewrite
//! and encapsulation. Offsets are relative to the frame's arena chunk, so a
//! frame can grow into its headroom.

use std::net::{IpAddr, Ipv4Addr};

use super::{Cx, Pipeline, Verdict};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::fib::{Encap, NextHop};
use crate::frame::PortId;
use crate::policy::Flow;
use crate::wire::encap::{self, IpipEncap, OuterHeader, VxlanEncap};
use crate::wire::ethernet::{self, EtherType, EthernetRepr, MacAddr};
use crate::wire::icmpv4::Icmpv4Error;
use crate::wire::ip::IpProtocol;
use crate::wire::{checksum, ipv4, udp, vxlan};

/// The facts of an IPv4 header the pipeline uses, read once.
#[derive(Clone, Copy, Debug)]
pub(super) struct V4 {
    /// Chunk offset of the header.
    pub l3: usize,
    /// Header length (options included).
    pub ihl: usize,
    /// Total length (Ethernet padding excluded).
    pub len: usize,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub tos: u8,
    pub df: bool,
    pub fragment: bool,
    pub proto: IpProtocol,
}

/// Reads and checks the IPv4 header at `l3`, which must end by `end`.
pub(super) fn parse_v4(buf: &[u8], l3: usize, end: usize) -> Result<V4, DropReason> {
    let bytes = buf.get(l3..end).ok_or(DropReason::ParseError)?;
    let p = ipv4::Packet::new_checked(bytes).map_err(|_| DropReason::ParseError)?;
    if !p.verify_checksum() {
        return Err(DropReason::ParseError);
    }
    Ok(V4 {
        l3,
        ihl: p.header_len(),
        len: usize::from(p.total_len()),
        src: p.src_addr(),
        dst: p.dst_addr(),
        ttl: p.ttl(),
        tos: p.tos(),
        df: p.dont_frag(),
        fragment: p.is_fragment(),
        proto: p.protocol(),
    })
}

/// Where and how a packet leaves.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub port: PortId,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// Largest inner IP packet that fits (egress MTU minus overhead).
    pub mtu: usize,
    pub encap: Option<(Encap, Ipv4Addr)>,
    /// The next hop whose MAC is not known yet: the frame is built with a
    /// placeholder destination MAC and held until it is.
    pub unresolved: Option<Ipv4Addr>,
}

/// A flow hash of the inner packet for the VXLAN source port: addresses,
/// protocol, and the TCP/UDP ports of first fragments, so that the underlay
/// spreads flows across ECMP paths but keeps each flow on one.
fn flow_hash(buf: &[u8], m: &V4) -> u32 {
    let mut h = u32::from(m.src) ^ u32::from(m.dst).rotate_left(16) ^ u32::from(u8::from(m.proto));
    if matches!(m.proto, IpProtocol::Tcp | IpProtocol::Udp)
        && !m.fragment
        && let Some(p) = buf.get(m.l3 + m.ihl..m.l3 + m.ihl + 4)
    {
        h ^= u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
    }
    h = h.wrapping_mul(0x9e37_79b1);
    h ^ (h >> 15)
}

/// Finishes a TCP or UDP checksum that a pod left to offload.
///
/// A pod's kernel with TX checksum offload on (the veth default) sends TCP
/// and UDP as CHECKSUM_PARTIAL: the checksum field holds only the folded
/// pseudo-header sum, and whoever transmits the skb finishes it. A frame that
/// AF_XDP takes from the host end of the veth never gets that fix-up, so the
/// vrouter does it: when the field equals the pseudo-header sum, the full
/// checksum is computed. A complete checksum that happens to equal the
/// pseudo-header sum is recomputed to the same value, so it can never corrupt
/// a packet.
///
/// This runs for every TCP/UDP packet from a pod, so the test is kept to a
/// few instructions inline: the pseudo-header sum straight from the header
/// bytes (addresses as two 32-bit words, added in a 64-bit accumulator, one
/// fold) and one compare; the full sum is out of line.
#[inline(always)]
fn complete_partial_l4_checksum(buf: &mut [u8], m: &V4) {
    let (field, min_len) = match m.proto {
        IpProtocol::Tcp => (16, 20),
        IpProtocol::Udp => (6, 8),
        _ => return,
    };
    let l4 = m.l3 + m.ihl;
    let seg_len = m.len.wrapping_sub(m.ihl);
    if m.fragment || seg_len < min_len || seg_len > usize::from(u16::MAX) {
        return;
    }
    // The header was parsed from these bytes: addresses at 12..20, and the
    // segment ends at `m.len`, within `buf`.
    let (Some(addrs), Some(stored)) = (
        buf.get(m.l3 + 12..m.l3 + 20),
        buf.get(l4 + field..l4 + field + 2),
    ) else {
        return;
    };
    let src = u32::from_be_bytes([addrs[0], addrs[1], addrs[2], addrs[3]]);
    let dst = u32::from_be_bytes([addrs[4], addrs[5], addrs[6], addrs[7]]);
    let stored = u16::from_be_bytes([stored[0], stored[1]]);
    let mut acc = u64::from(src >> 16)
        + u64::from(src & 0xffff)
        + u64::from(dst >> 16)
        + u64::from(dst & 0xffff)
        + u64::from(u8::from(m.proto))
        + seg_len as u64;
    // At most 6 x 0xffff: two folds always suffice.
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    let pseudo = acc as u16;
    if stored == pseudo {
        finish_l4_checksum(buf, m, field, pseudo);
    }
}

/// The slow half of [`complete_partial_l4_checksum`]: the checksum over the
/// whole segment, for packets whose field held the pseudo-header sum (every
/// TCP/UDP packet of a pod with offload on; out of line so the test stays
/// small where it is inlined).
#[inline(never)]
fn finish_l4_checksum(buf: &mut [u8], m: &V4, field: usize, pseudo: u16) {
    let Some(segment) = buf.get_mut(m.l3 + m.ihl..m.l3 + m.len) else {
        return;
    };
    segment[field..field + 2].copy_from_slice(&[0, 0]);
    let mut sum = checksum::result(checksum::combine(&[pseudo, checksum::data(segment)]));
    if m.proto == IpProtocol::Udp && sum == 0 {
        // RFC 768: a computed zero is sent as all ones (zero means "none").
        sum = 0xffff;
    }
    segment[field..field + 2].copy_from_slice(&sum.to_be_bytes());
}

impl Pipeline {
    /// An IPv4 frame whose header starts at `l3`, received on `ingress`.
    pub(super) fn ipv4(
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
        let mut m = match parse_v4(buf, l3, end) {
            Ok(m) => m,
            Err(r) => return Verdict::Drop(r),
        };
        match kind {
            PortKind::Uplink if m.dst == self.cfg.node_v4 => {
                m = match self.decap(buf, &m) {
                    Ok(inner) => inner,
                    Err(r) => return Verdict::Drop(r),
                };
            }
            PortKind::Pod => {
                let owned = self
                    .ports
                    .get(ingress)
                    .is_some_and(|ep| ep.owns(IpAddr::V4(m.src)));
                if !owned {
                    return Verdict::Drop(DropReason::Spoofed);
                }
                // A super-packet carried whole keeps the pseudo-header sum
                // its NEEDS_CSUM header asks for: the receiving kernel
                // finishes it (or cuts it, starting from that sum).
                if self.super_segment == 0 {
                    complete_partial_l4_checksum(buf, &m);
                }
            }
            PortKind::Uplink | PortKind::Host => {}
        }
        self.route_v4(buf, kind, start, m, false, cx)
    }

    /// Strips IPIP or VXLAN addressed to this node; returns the inner
    /// IPv4 header.
    fn decap(&mut self, buf: &[u8], m: &V4) -> Result<V4, DropReason> {
        if m.fragment {
            // Reassembly is not done: the underlay MTU is sized so tunnels
            // never fragment (that is what fragmentation-needed is for).
            return Err(DropReason::Unsupported);
        }
        let ip_end = m.l3 + m.len;
        match m.proto {
            IpProtocol::IpIp => {
                if !self.tunnel_peer_allowed(m.src) {
                    return Err(DropReason::UnknownTunnelPeer);
                }
                let inner = parse_v4(buf, m.l3 + m.ihl, ip_end)?;
                self.counters.decap_ipip += 1;
                Ok(inner)
            }
            IpProtocol::Udp => {
                // The outer Ethernet and IPv4 headers are already checked:
                // read UDP and VXLAN here rather than re-parsing the whole
                // frame with `encap::vxlan_inner`.
                let l4 = m.l3 + m.ihl;
                let udp = buf
                    .get(l4..ip_end)
                    .and_then(|b| udp::Packet::new_checked(b).ok())
                    .ok_or(DropReason::ParseError)?;
                if udp.dst_port() != self.cfg.vxlan_port {
                    return Err(DropReason::NotForUs);
                }
                if !self.tunnel_peer_allowed(m.src) {
                    return Err(DropReason::UnknownTunnelPeer);
                }
                let udp_end = l4 + usize::from(udp.len());
                let vx_start = l4 + udp::HEADER_LEN;
                let vx = buf
                    .get(vx_start..udp_end)
                    .and_then(|b| vxlan::Packet::new_checked(b).ok())
                    .ok_or(DropReason::ParseError)?;
                if !vx.has_vni() {
                    return Err(DropReason::ParseError);
                }
                if vx.vni() != self.cfg.vxlan_vni {
                    return Err(DropReason::NotForUs);
                }
                let inner_start = vx_start + vxlan::HEADER_LEN;
                let inner_end = udp_end;
                let eth = ethernet::Frame::new_checked(&buf[inner_start..inner_end])
                    .map_err(|_| DropReason::ParseError)?;
                if eth.ethertype() != EtherType::Ipv4 {
                    return Err(DropReason::UnknownEthertype);
                }
                let inner = parse_v4(buf, inner_start + eth.header_len(), inner_end)?;
                self.counters.decap_vxlan += 1;
                Ok(inner)
            }
            _ => Err(DropReason::NotForUs),
        }
    }

    /// Routes the IPv4 packet `m`. `local` marks a packet this node built
    /// (an ICMP error): no TTL decrement, no ingress restriction, and never
    /// another ICMP error about it.
    pub(super) fn route_v4(
        &mut self,
        buf: &mut [u8],
        kind: PortKind,
        start: usize,
        m: V4,
        local: bool,
        cx: &Cx,
    ) -> Verdict {
        let Some(nh) = cx.fib.lookup_v4(m.dst) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if kind == PortKind::Uplink
            && !local
            && !matches!(nh, NextHop::Local { .. } | NextHop::Host)
        {
            // From the underlay only pods and the host are reachable: no
            // transit, no hairpin back into the underlay.
            return Verdict::Drop(DropReason::NotForUs);
        }
        if kind == PortKind::Host && !local && nh == NextHop::Host {
            // What the kernel routed into the vrouter never goes back to it.
            return Verdict::Drop(DropReason::HostHairpin);
        }
        if !local && m.ttl <= 1 {
            return self.icmp_error(
                buf,
                start,
                m,
                Icmpv4Error::TimeExceeded,
                DropReason::Ttl,
                cx,
            );
        }
        // Network policy and the flow table (issue 15); `flow` says
        // whether this is a reply of a flow that entered from the host.
        let flow = if local {
            Default::default()
        } else {
            match self.police(buf, kind, nh, m.l3, m.l3 + m.len, false, cx) {
                Ok(f) => f,
                Err(v) => return v,
            }
        };
        let nh = reply_route(kind, nh, flow);
        let plan = match self.plan_v4(nh) {
            Ok(p) => p,
            Err(v) => return v,
        };
        // A super-packet carried whole: its segments must fit.
        if m.len > plan.mtu && !self.super_fits(plan.port, plan.mtu) {
            if m.df && !local {
                let next_hop_mtu = u16::try_from(plan.mtu).unwrap_or(u16::MAX);
                return self.icmp_error(
                    buf,
                    start,
                    m,
                    Icmpv4Error::FragmentationNeeded { next_hop_mtu },
                    DropReason::Mtu,
                    cx,
                );
            }
            // This vrouter does not fragment.
            return Verdict::Drop(DropReason::Mtu);
        }
        let mut ttl = m.ttl;
        if !local {
            ttl = ipv4::Packet::new_unchecked(&mut buf[m.l3..m.l3 + m.ihl]).decrement_ttl();
        }
        let v = self.emit_v4(buf, &m, ttl, &plan);
        match (v, plan.unresolved) {
            // Built in full but for the destination MAC: held until the
            // next hop resolves (counted forwarded when it is sent).
            (Verdict::Tx { port, start, len }, Some(next_hop)) => Verdict::Hold {
                port,
                start,
                len,
                next_hop,
                forwarded: !local,
            },
            (Verdict::Tx { .. }, None) if !local => {
                self.counters.forwarded += 1;
                v
            }
            _ => v,
        }
    }

    /// Leaves by `port` to `dst_mac`, or to the port's peer (the pod, the
    /// host) when `None`.
    pub(super) fn direct(&self, port: PortId, dst_mac: Option<[u8; 6]>) -> Result<Plan, Verdict> {
        let ep = self
            .ports
            .get(port)
            .ok_or(Verdict::Drop(DropReason::NoRoute))?;
        let dst_mac = dst_mac
            .or(ep.peer_mac)
            .ok_or(Verdict::Drop(DropReason::NoNeighbour))?;
        Ok(Plan {
            port,
            src_mac: ep.mac,
            dst_mac,
            mtu: ep.mtu as usize,
            encap: None,
            unresolved: None,
        })
    }

    /// Leaves by `port` to the next hop `hop`: its MAC if known, else a
    /// placeholder and `unresolved` set, so the frame is held.
    fn via_neighbour(&self, port: PortId, hop: Ipv4Addr) -> Result<Plan, Verdict> {
        match self.neigh.lookup(port, hop.into()) {
            Some(mac) => self.direct(port, Some(mac)),
            None => {
                let mut plan = self.direct(port, Some([0; 6]))?;
                plan.unresolved = Some(hop);
                Ok(plan)
            }
        }
    }

    fn plan_v4(&self, nh: NextHop) -> Result<Plan, Verdict> {
        let direct = |port, mac| self.direct(port, mac);
        match nh {
            NextHop::Local { port } => direct(port, None),
            NextHop::Host => {
                let port = self
                    .ports
                    .host()
                    .ok_or(Verdict::Drop(DropReason::NoHostPort))?;
                direct(port, None)
            }
            NextHop::Blackhole => Err(Verdict::Drop(DropReason::Blackhole)),
            NextHop::Gateway {
                via: IpAddr::V4(via),
                port,
            } => self.via_neighbour(port, via),
            NextHop::Gateway {
                via: IpAddr::V6(_), ..
            } => Err(Verdict::Drop(DropReason::Unsupported)),
            NextHop::Encap { encap, remote } => {
                let port = self
                    .ports
                    .uplink()
                    .ok_or(Verdict::Drop(DropReason::NoRoute))?;
                let on_link = self.cfg.on_link(remote);
                let hop = match self.cfg.underlay_gateway {
                    Some(gw) if !on_link => gw,
                    _ => remote,
                };
                let mut plan = self.via_neighbour(port, hop)?;
                if self.cfg.cross_subnet && on_link {
                    return Ok(plan);
                }
                let overhead = match encap {
                    Encap::Ipip => ipv4::HEADER_LEN,
                    Encap::Vxlan { .. } => encap::VXLAN_GROWTH,
                };
                plan.mtu = plan.mtu.saturating_sub(overhead);
                plan.encap = Some((encap, remote));
                Ok(plan)
            }
        }
    }

    /// Writes the Ethernet header (and the outer headers) in front of the
    /// IPv4 packet `m`, whose TTL is now `ttl`.
    fn emit_v4(&mut self, buf: &mut [u8], m: &V4, ttl: u8, plan: &Plan) -> Verdict {
        let ip_end = m.l3 + m.len;
        let no_room = Verdict::Drop(DropReason::NoRoom);
        match plan.encap {
            None => {
                let Some(s) = m.l3.checked_sub(ethernet::HEADER_LEN) else {
                    return no_room;
                };
                write_ethernet(&mut buf[s..m.l3], plan.src_mac, plan.dst_mac);
                Verdict::Tx {
                    port: plan.port,
                    start: s,
                    len: ip_end - s,
                }
            }
            Some((Encap::Ipip, remote)) => {
                let Some(s) = m.l3.checked_sub(encap::IPIP_HEADER_LEN) else {
                    return no_room;
                };
                let tunnel = IpipEncap {
                    outer: OuterHeader {
                        src_mac: MacAddr(plan.src_mac),
                        dst_mac: MacAddr(plan.dst_mac),
                        src_addr: self.cfg.node_v4,
                        dst_addr: remote,
                        // Linux's ipip default: the outer TTL inherits the
                        // inner one, and DF is set (path MTU discovery on).
                        ttl,
                        tos: encap::outer_tos(0, m.tos),
                        dont_frag: true,
                    },
                };
                let ident = self.next_ident();
                if tunnel.emit(&mut buf[s..ip_end], ident).is_err() {
                    return no_room;
                }
                self.counters.encap_ipip += 1;
                Verdict::Tx {
                    port: plan.port,
                    start: s,
                    len: ip_end - s,
                }
            }
            Some((Encap::Vxlan { vni }, remote)) => {
                let inner_eth = m.l3.checked_sub(ethernet::HEADER_LEN);
                let Some(s) = inner_eth.and_then(|i| i.checked_sub(encap::VXLAN_HEADER_LEN)) else {
                    return no_room;
                };
                let inner_dst = self.remote_vtep_mac(remote);
                write_ethernet(
                    &mut buf[s + encap::VXLAN_HEADER_LEN..m.l3],
                    self.cfg.vtep_mac,
                    inner_dst,
                );
                let tunnel = VxlanEncap {
                    outer: OuterHeader {
                        src_mac: MacAddr(plan.src_mac),
                        dst_mac: MacAddr(plan.dst_mac),
                        src_addr: self.cfg.node_v4,
                        dst_addr: remote,
                        // Linux's vxlan defaults: TTL 64, DF clear.
                        ttl: 64,
                        tos: encap::outer_tos(0, m.tos),
                        dont_frag: false,
                    },
                    vni,
                    dst_port: self.cfg.vxlan_port,
                    udp_checksum: self.cfg.vxlan_udp_checksum,
                };
                let (lo, hi) = encap::VXLAN_SRC_PORT_RANGE;
                let src_port = encap::flow_source_port(flow_hash(buf, m), lo, hi);
                let ident = self.next_ident();
                if tunnel.emit(&mut buf[s..ip_end], ident, src_port).is_err() {
                    return no_room;
                }
                self.counters.encap_vxlan += 1;
                Verdict::Tx {
                    port: plan.port,
                    start: s,
                    len: ip_end - s,
                }
            }
        }
    }
}

/// Where a routed packet goes once the flow table has seen it: the reply of
/// a flow whose first packet entered from the host port goes back to the
/// host whatever its route, so the kernel's conntrack sees both directions
/// and reverses its DNAT (pod → ClusterIP with the backend a pod: the
/// backend's reply must be un-DNATed to come from the ClusterIP).
#[inline]
pub(super) fn reply_route(kind: PortKind, nh: NextHop, flow: Flow) -> NextHop {
    if flow.reply && flow.from_host && kind != PortKind::Host {
        NextHop::Host
    } else {
        nh
    }
}

/// Writes an untagged IPv4 Ethernet header into `hdr` (14 bytes).
#[inline]
fn write_ethernet(hdr: &mut [u8], src: [u8; 6], dst: [u8; 6]) {
    write_ethernet_for(hdr, src, dst, EtherType::Ipv4);
}

/// Writes an untagged Ethernet header into `hdr` (14 bytes).
#[inline]
pub(super) fn write_ethernet_for(hdr: &mut [u8], src: [u8; 6], dst: [u8; 6], ethertype: EtherType) {
    let repr = EthernetRepr {
        src_addr: MacAddr(src),
        dst_addr: MacAddr(dst),
        vlan: None,
        ethertype,
    };
    // `hdr` is exactly 14 bytes by construction, so emit cannot fail.
    let _ = repr.emit(&mut ethernet::Frame::new_unchecked(hdr));
}
