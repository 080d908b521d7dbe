//! The forwarding pipeline: what happens to a batch of frames between a
//! port's `rx_burst` and the `tx_burst` of the ports they leave by.
//!
//! Per frame, in order:
//!
//! 1. classify: Ethernet (one 802.1Q tag allowed) -> ARP, IPv4, IPv6 (proxy
//!    NDP, then routed natively by LPM with a hop-limit decrement and
//!    ICMPv6 errors, see `ipv6.rs`), or dropped as an unknown ethertype;
//! 2. ARP: proxy ARP on pod ports (reply built in place) and on the host
//!    port (for what the vrouter routes), learning on the uplink
//!    ([`crate::arp`]); the host port's frames also keep the kernel's MAC
//!    behind it current;
//! 3. decap, on the uplink only: IPIP to the node address, VXLAN to the node
//!    address on the VTEP's UDP port and VNI, from a known node when the
//!    tunnel peer allow-list is on;
//! 4. anti-spoof, on pod ports only: the source must be one of the pod's
//!    addresses;
//! 5. LPM in the FIB; from the uplink only local pods and the host are
//!    reachable (the vrouter is not a transit router); from the host port
//!    anything but the host again (no hairpin), with no source check and
//!    never a decapsulation;
//! 6. TTL: <= 1 is answered with ICMP time exceeded (source: the node
//!    address), built in place and routed back like any packet;
//! 7. network policy and the flow table, for packets from or to a pod
//!    ([`crate::policy::Flows::check`]: a new flow classified, a tracked
//!    one passed, drops `policy_denied`, `conntrack_full`,
//!    `conntrack_invalid`);
//! 8. egress: the port, next-hop MAC (pod MAC, or the underlay neighbour from
//!    [`NeighTable`], whose miss sends a rate-limited ARP request and holds
//!    the finished frame in [`HeldFrames`] until the reply) and MTU (minus
//!    encapsulation overhead); too big with DF set is answered with ICMP
//!    fragmentation needed carrying that MTU;
//! 9. TTL decrement with an RFC 1624 incremental checksum, MAC rewrite, and
//!    the outer headers written into the headroom for IPIP/VXLAN;
//! 10. the frame joins its egress port's TX batch.
//!
//! Nothing here allocates: frames stay in their arena chunk from RX to TX
//! (replies and ICMP errors reuse the received frame), TX batches are
//! preallocated, and the only new frames, ARP requests, come from the
//! arena's free list.

mod forward;
mod icmp;
mod ipv6;
mod police;
mod superpkt;

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::arp::{self, ArpAction};
use crate::counters::{Counters, DropReason};
use crate::endpoint::{GATEWAY_V4, PortKind, PortTable};
use crate::fib::{FibReader, FibSnapshot, NextHop};
use crate::frame::{FrameArena, FrameDesc, PortId};
use crate::neigh::{FastHasher, HeldFrame, HeldFrames, MissAction, NeighTable};
use crate::policy::Flows;
use crate::wire::ethernet::{self, EtherType};
use crate::wire::udp::UdpChecksum;

/// The source MAC a frame from the host port carries while it is handed to
/// another worker's pod port: the owner reads it as "entered from the host
/// port" (its flow table marks the flow, so the replies go back to the
/// kernel) and restores the pod port's MAC before the pod sees the frame.
/// It never leaves the vrouter.
pub const HANDED_FROM_HOST_MAC: [u8; 6] = [0xee, 0xee, 0xee, 0xee, 0xee, 0xef];

/// What the owner of a pod port does with a frame another worker handed
/// over for it ([`Pipeline::police_handed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handed {
    /// Network policy drops it (counted).
    Drop,
    /// Send it on the pod port.
    Send,
    /// The reply of a flow that entered from the host port: send it on
    /// this (host) port instead, its MACs rewritten for the kernel.
    ToHost(PortId),
}

/// Most frames a worker takes from one port per `rx_burst`.
pub const BURST: usize = 64;

/// Node-wide settings of the pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// This node's underlay address: tunnel endpoint, outer source, and the
    /// source of ICMP errors.
    pub node_v4: Ipv4Addr,
    /// This node's IPv6 address, the source of ICMPv6 errors; without one,
    /// IPv6 packets that need an error are dropped silently (but counted).
    pub node_v6: Option<Ipv6Addr>,
    /// Prefix length of the uplink's subnet: remote nodes inside it are
    /// direct neighbours (and, in cross-subnet mode, reached natively).
    pub underlay_prefix_len: u8,
    /// The uplink's default gateway, next hop for remote nodes outside the
    /// subnet. `None`: every remote node is treated as on-link.
    pub underlay_gateway: Option<Ipv4Addr>,
    /// UDP port of our VTEP (4789).
    pub vxlan_port: u16,
    /// The VNI we accept (Calico: 4096).
    pub vxlan_vni: u32,
    /// Compute the outer UDP checksum of VXLAN (Linux: no).
    pub vxlan_udp_checksum: UdpChecksum,
    /// Our VTEP MAC: the inner source MAC of VXLAN frames.
    pub vtep_mac: [u8; 6],
    /// Calico's CrossSubnet mode: encapsulate only to remote nodes outside
    /// our subnet, route natively to those inside.
    pub cross_subnet: bool,
    /// ICMP errors allowed in a burst (token bucket size).
    pub icmp_burst: u32,
    /// ICMP errors allowed per second (token refill rate).
    pub icmp_per_sec: u32,
}

impl PipelineConfig {
    /// Defaults for a node at `node_v4` in a `/prefix_len` underlay: VXLAN
    /// on 4789 with VNI 4096, no UDP checksum, always encapsulate, ICMP
    /// errors at up to 1000/s with bursts of 100.
    pub fn new(node_v4: Ipv4Addr, underlay_prefix_len: u8) -> Self {
        PipelineConfig {
            node_v4,
            node_v6: None,
            underlay_prefix_len,
            underlay_gateway: None,
            vxlan_port: crate::wire::VXLAN_PORT,
            vxlan_vni: 4096,
            vxlan_udp_checksum: UdpChecksum::Zero,
            vtep_mac: vtep_mac(node_v4),
            cross_subnet: false,
            icmp_burst: 100,
            icmp_per_sec: 1000,
        }
    }

    /// Whether `addr` is in the uplink's subnet.
    #[inline]
    pub fn on_link(&self, addr: Ipv4Addr) -> bool {
        let len = u32::from(self.underlay_prefix_len.min(32));
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        u32::from(addr) & mask == u32::from(self.node_v4) & mask
    }
}

/// The VTEP MAC of the node at `node`: locally administered, derived from
/// the address, so that every Brindle node knows every other node's VTEP
/// MAC without asking (the inner destination MAC of VXLAN frames). A node
/// whose VTEP MAC differs (a Linux VXLAN device) is configured with
/// [`Pipeline::set_vtep_mac`].
pub fn vtep_mac(node: Ipv4Addr) -> [u8; 6] {
    let o = node.octets();
    [0x02, 0xb1, o[0], o[1], o[2], o[3]]
}

/// A token bucket for ICMP errors, refilled from the `now` passed in.
#[derive(Clone, Copy, Debug)]
struct TokenBucket {
    tokens: u32,
    burst: u32,
    per_sec: u32,
    last: Option<Instant>,
}

impl TokenBucket {
    fn take(&mut self, now: Instant) -> bool {
        let last = *self.last.get_or_insert(now);
        let elapsed = now.saturating_duration_since(last);
        if self.per_sec > 0 {
            let step = Duration::from_secs(1) / self.per_sec;
            let new = (elapsed.as_nanos() / step.as_nanos().max(1)).min(u128::from(self.burst));
            if new > 0 {
                self.tokens = (self.tokens + new as u32).min(self.burst);
                self.last = Some(last + step * new as u32);
            }
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// Per-port TX batches, preallocated: one burst in can produce at most two
/// frames out per frame (the frame, and an ARP request).
pub struct TxBatches {
    per_port: Vec<Vec<FrameDesc>>,
    /// Frames for another worker ([`Away`]), preallocated too.
    away: Vec<Away>,
}

/// A frame the pipeline gives another worker, because that worker keeps
/// the flows of the pod port it concerns ([`crate::policy::Flows::set_flow_home`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Away {
    /// Routed and rewritten for `port`: the owner checks it against the
    /// pod's flow table ([`Pipeline::police_handed`]) and sends it there.
    Send {
        /// The worker.
        owner: usize,
        /// The pod port.
        port: PortId,
        /// The frame.
        desc: FrameDesc,
    },
    /// Received on `ingress` and not processed: the owner runs it through
    /// its own pipeline as if its queue of `ingress` had received it.
    Receive {
        /// The worker.
        owner: usize,
        /// The pod port it came in by.
        ingress: PortId,
        /// The frame, as received.
        desc: FrameDesc,
    },
}

impl TxBatches {
    /// Batches for `ports` ports.
    pub fn new(ports: usize) -> Self {
        TxBatches {
            per_port: (0..ports).map(|_| Vec::with_capacity(2 * BURST)).collect(),
            away: Vec::with_capacity(2 * BURST),
        }
    }

    /// Queues a frame for another worker; `false` if the list is full.
    #[inline]
    fn push_away(&mut self, away: Away) -> bool {
        if self.away.len() < self.away.capacity() {
            self.away.push(away);
            true
        } else {
            false
        }
    }

    /// The frames for other workers, for the worker to hand over and clear.
    pub fn away_mut(&mut self) -> &mut Vec<Away> {
        &mut self.away
    }

    /// Makes room for one more port.
    pub fn add_port(&mut self) {
        self.per_port.push(Vec::with_capacity(2 * BURST));
    }

    /// Queues `desc` on `port`; `false` if the port does not exist or its
    /// batch is full.
    #[inline]
    fn push(&mut self, port: PortId, desc: FrameDesc) -> bool {
        match self.per_port.get_mut(port as usize) {
            Some(b) if b.len() < b.capacity() => {
                b.push(desc);
                true
            }
            _ => false,
        }
    }

    /// The batch of `port`, for the worker to transmit and clear.
    pub fn batch_mut(&mut self, port: PortId) -> Option<&mut Vec<FrameDesc>> {
        self.per_port.get_mut(port as usize)
    }

    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.per_port.len()
    }
}

/// Which kind of port a batch came in by (for the host port's and the
/// uplink's hand-off rules).
#[derive(Clone, Copy, Debug)]
struct From {
    host: bool,
    uplink: bool,
}

/// What every frame of one batch shares: one FIB version, the time, and
/// the port it came in by.
struct Cx {
    fib: FibSnapshot,
    now: Instant,
    ingress: PortId,
}

/// The outcome for one frame, in chunk-relative offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Send `len` bytes at chunk offset `start` on `port`.
    Tx {
        port: PortId,
        start: usize,
        len: usize,
    },
    /// Free the frame and count the reason.
    Drop(DropReason),
    /// Free the frame; it was taken (learned ARP).
    Consumed,
    /// The frame, as received, belongs to worker `owner`, which keeps the
    /// flows of the pod it came from ([`Away::Receive`]).
    ToOwner { owner: usize },
    /// Like `Tx`, but the next hop's MAC is unknown: hold the frame until
    /// `next_hop` resolves, and maybe ask for it with an ARP request.
    Hold {
        port: PortId,
        start: usize,
        len: usize,
        next_hop: Ipv4Addr,
        forwarded: bool,
    },
}

/// The pipeline of one worker: configuration, port table, FIB reader,
/// neighbour table and counters.
pub struct Pipeline {
    cfg: PipelineConfig,
    ports: PortTable,
    fib: FibReader,
    neigh: NeighTable,
    held: HeldFrames,
    counters: Counters,
    ident: u16,
    icmp_bucket: TokenBucket,
    vtep_macs: Vec<(Ipv4Addr, [u8; 6])>,
    tunnel_peers: Option<HashSet<Ipv4Addr, BuildHasherDefault<FastHasher>>>,
    flows: Flows,
    /// While a super-packet carried whole is handled (`superpkt.rs`): the
    /// IP length of one of its segments, checked against the egress MTU
    /// instead of its own length; 0 otherwise.
    super_segment: usize,
}

impl Pipeline {
    /// A pipeline over `ports` reading `fib`.
    pub fn new(cfg: PipelineConfig, ports: PortTable, fib: FibReader) -> Self {
        let icmp_bucket = TokenBucket {
            tokens: cfg.icmp_burst,
            burst: cfg.icmp_burst,
            per_sec: cfg.icmp_per_sec,
            last: None,
        };
        Pipeline {
            cfg,
            ports,
            fib,
            neigh: NeighTable::new(),
            held: HeldFrames::new(),
            counters: Counters::default(),
            ident: 0,
            icmp_bucket,
            vtep_macs: Vec::new(),
            tunnel_peers: None,
            flows: Flows::new(),
            super_segment: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.cfg
    }

    /// Replaces the configuration (the daemon's control thread: node
    /// address, VXLAN settings), keeping ports, neighbours and counters.
    pub fn set_config(&mut self, cfg: PipelineConfig) {
        self.cfg = cfg;
    }

    /// The port table.
    pub fn ports(&self) -> &PortTable {
        &self.ports
    }

    /// The port table, writable (add pods, change addresses).
    pub fn ports_mut(&mut self) -> &mut PortTable {
        &mut self.ports
    }

    /// The neighbour table.
    pub fn neigh(&self) -> &NeighTable {
        &self.neigh
    }

    /// The neighbour table, writable (static entries, draining resolve
    /// requests).
    pub fn neigh_mut(&mut self) -> &mut NeighTable {
        &mut self.neigh
    }

    /// Frames held now for unresolved next hops (each in its own arena
    /// chunk).
    pub fn held_frames(&self) -> usize {
        self.held.len()
    }

    /// Sends the held frames whose next hop resolved since the last call
    /// (an ARP reply, or an entry set through [`Pipeline::neigh_mut`]), and
    /// drops as `neighbor_timeout` those that waited too long. `process`
    /// does this on every burst; a worker calls it on every iteration too,
    /// so held frames leave, or return to the arena, also while no frame
    /// arrives. Costs one branch when nothing is held.
    pub fn poll_held(&mut self, arena: &mut FrameArena, tx: &mut TxBatches, now: Instant) {
        if self.held.is_empty() {
            return;
        }
        if self.held.may_release(&self.neigh) {
            self.release_held(arena, tx);
        }
        if self
            .held
            .oldest()
            .is_some_and(|t| now.saturating_duration_since(t) >= crate::neigh::UNRESOLVED_TIMEOUT)
        {
            let (held, counters) = (&mut self.held, &mut self.counters);
            held.expire(now, |f| {
                counters.neighbor_held -= 1;
                arena.free(f.desc.addr);
                counters.drop(DropReason::NeighborTimeout);
            });
        }
    }

    /// Drops every held frame (counted `neighbor_timeout`), e.g. before the
    /// worker stops, so every chunk is back in the arena.
    pub fn drop_held(&mut self, arena: &mut FrameArena) {
        let (held, counters) = (&mut self.held, &mut self.counters);
        held.drain(|f| {
            counters.neighbor_held -= 1;
            arena.free(f.desc.addr);
            counters.drop(DropReason::NeighborTimeout);
        });
    }

    fn release_held(&mut self, arena: &mut FrameArena, tx: &mut TxBatches) {
        let (held, neigh, counters) = (&mut self.held, &self.neigh, &mut self.counters);
        held.release(neigh, |f, mac| {
            counters.neighbor_held -= 1;
            // A held frame starts with its Ethernet header (at least 14
            // bytes): the destination MAC is its first six.
            if let Some(dst) = arena.data_mut(f.desc).get_mut(..6) {
                dst.copy_from_slice(&mac);
            }
            if tx.push(f.port, f.desc) {
                counters.neighbor_released += 1;
                if f.forwarded {
                    counters.forwarded += 1;
                }
            } else {
                arena.free(f.desc.addr);
                counters.drop(DropReason::TxRingFull);
            }
        });
    }

    /// The flow table and the policy it enforces.
    pub fn flows(&self) -> &Flows {
        &self.flows
    }

    /// The flow table, writable (the policy reader, capacity, which port
    /// slots belong to other workers).
    pub fn flows_mut(&mut self) -> &mut Flows {
        &mut self.flows
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The counters, writable (the worker counts TX there).
    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// Overrides the VTEP MAC of the remote node `node` (default:
    /// [`vtep_mac`]).
    pub fn set_vtep_mac(&mut self, node: Ipv4Addr, mac: [u8; 6]) {
        match self.vtep_macs.iter_mut().find(|(n, _)| *n == node) {
            Some(e) => e.1 = mac,
            None => self.vtep_macs.push((node, mac)),
        }
    }

    /// Accepts IPIP and VXLAN only from `peers` (the other nodes'
    /// addresses), as Calico accepts tunnel traffic only from known hosts;
    /// anything else is dropped as `unknown_tunnel_peer`. `None` (the
    /// default) accepts tunnels from any source.
    pub fn set_tunnel_peers(&mut self, peers: Option<impl IntoIterator<Item = Ipv4Addr>>) {
        self.tunnel_peers = peers.map(|p| p.into_iter().collect());
    }

    /// Adds one node to the tunnel peer allow-list (turning the list on).
    pub fn add_tunnel_peer(&mut self, peer: Ipv4Addr) {
        self.tunnel_peers
            .get_or_insert_with(Default::default)
            .insert(peer);
    }

    /// Removes one node from the tunnel peer allow-list.
    pub fn remove_tunnel_peer(&mut self, peer: Ipv4Addr) {
        if let Some(p) = self.tunnel_peers.as_mut() {
            p.remove(&peer);
        }
    }

    /// Whether tunnel traffic from `src` is accepted.
    #[inline]
    fn tunnel_peer_allowed(&self, src: Ipv4Addr) -> bool {
        self.tunnel_peers.as_ref().is_none_or(|p| p.contains(&src))
    }

    fn remote_vtep_mac(&self, node: Ipv4Addr) -> [u8; 6] {
        self.vtep_macs
            .iter()
            .find(|(n, _)| *n == node)
            .map_or_else(|| vtep_mac(node), |e| e.1)
    }

    fn next_ident(&mut self) -> u16 {
        self.ident = self.ident.wrapping_add(1);
        self.ident
    }

    /// Runs every frame of `rx`, received on `ingress`, through the
    /// pipeline: each one ends in a TX batch of `tx`, or back in the arena's
    /// free list with its reason counted.
    pub fn process(
        &mut self,
        arena: &mut FrameArena,
        ingress: PortId,
        rx: &[FrameDesc],
        tx: &mut TxBatches,
        now: Instant,
    ) {
        // One FIB version for the whole batch: the atomic load is paid once.
        let cx = Cx {
            fib: self.fib.snapshot(),
            now,
            ingress,
        };
        self.flows.begin_batch(now, self.ports.host().is_some());
        self.poll_held(arena, tx, now);
        let kind = self.ports.get(ingress).map(|e| e.kind);
        let from = From {
            host: kind == Some(PortKind::Host),
            uplink: kind == Some(PortKind::Uplink),
        };
        for &desc in rx {
            if arena.is_super(desc.addr) {
                self.super_packet(arena, ingress, from, desc, tx, &cx);
            } else {
                self.one(arena, ingress, from, desc, tx, &cx);
            }
        }
    }

    /// One frame of [`Pipeline::process`].
    #[inline]
    fn one(
        &mut self,
        arena: &mut FrameArena,
        ingress: PortId,
        from: From,
        desc: FrameDesc,
        tx: &mut TxBatches,
        cx: &Cx,
    ) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += u64::from(desc.len);
        let base = arena.chunk_base(desc.addr);
        let verdict = self.handle(arena, ingress, desc, cx);
        match verdict {
            Verdict::Tx { port, start, len } => {
                let out = FrameDesc {
                    addr: base + start as u64,
                    len: len as u32,
                };
                if from.host && self.flows.is_remote(port) {
                    self.mark_handed_from_host(arena, port, out);
                }
                let queued = match self.flows.flow_home(port) {
                    // From the uplink to a pod whose flows another worker
                    // keeps: handed to it like a frame for its own port.
                    Some(owner) if from.uplink && self.flows.tracking() => {
                        tx.push_away(Away::Send {
                            owner,
                            port,
                            desc: out,
                        })
                    }
                    _ => tx.push(port, out),
                };
                if !queued {
                    arena.free(base);
                    self.counters.drop(DropReason::TxRingFull);
                }
            }
            Verdict::ToOwner { owner } => {
                // Counted by the owner, which receives it.
                self.counters.rx_packets -= 1;
                self.counters.rx_bytes -= u64::from(desc.len);
                let away = Away::Receive {
                    owner,
                    ingress,
                    desc,
                };
                if !tx.push_away(away) {
                    arena.free(base);
                    self.counters.drop(DropReason::TxRingFull);
                }
            }
            Verdict::Drop(reason) => {
                arena.free(base);
                self.counters.drop(reason);
            }
            Verdict::Consumed => {
                arena.free(base);
                self.counters.consumed += 1;
            }
            Verdict::Hold {
                port,
                start,
                len,
                next_hop,
                forwarded,
            } => {
                let frame = HeldFrame {
                    port,
                    next_hop: next_hop.into(),
                    desc: FrameDesc {
                        addr: base + start as u64,
                        len: len as u32,
                    },
                    since: cx.now,
                    forwarded,
                };
                if self.held.hold(frame).is_ok() {
                    self.counters.neighbor_held += 1;
                } else {
                    arena.free(base);
                    self.counters.drop(DropReason::NeighborQueueFull);
                }
                self.send_arp_request(arena, port, next_hop, tx, cx.now);
            }
        }
        // An ARP reply just learned: its frames leave right behind it.
        if self.held.may_release(&self.neigh) {
            self.release_held(arena, tx);
        }
    }

    fn send_arp_request(
        &mut self,
        arena: &mut FrameArena,
        port: PortId,
        addr: Ipv4Addr,
        tx: &mut TxBatches,
        now: Instant,
    ) {
        if self.neigh.miss(port, addr.into(), now) != MissAction::SendRequest {
            return;
        }
        let Some(mac) = self.ports.get(port).map(|e| e.mac) else {
            return;
        };
        let Some(chunk) = arena.alloc() else { return };
        let headroom = crate::frame::RX_HEADROOM as usize;
        let buf = arena.chunk_mut(chunk);
        let Some(len) = buf
            .get_mut(headroom..)
            .and_then(|b| arp::write_request(b, mac, self.cfg.node_v4, addr))
        else {
            arena.free(chunk);
            return;
        };
        let desc = FrameDesc {
            addr: chunk + headroom as u64,
            len: len as u32,
        };
        self.counters.generated += 1;
        self.counters.arp_requests += 1;
        if !tx.push(port, desc) {
            arena.free(chunk);
            self.counters.drop(DropReason::TxRingFull);
        }
    }

    fn handle(
        &mut self,
        arena: &mut FrameArena,
        ingress: PortId,
        desc: FrameDesc,
        cx: &Cx,
    ) -> Verdict {
        let Some(kind) = self.ports.get(ingress).map(|e| e.kind) else {
            return Verdict::Drop(DropReason::NotForUs);
        };
        let start = desc.headroom(arena.frame_size()) as usize;
        let end = start + desc.len as usize;
        let buf = arena.chunk_mut(desc.addr);
        let Ok(eth) = ethernet::Frame::new_checked(&buf[start..end]) else {
            return Verdict::Drop(DropReason::ParseError);
        };
        let ethertype = eth.ethertype();
        let l3 = start + eth.header_len();
        match kind {
            PortKind::Pod => self.learn_pod_mac(ingress, eth.src_addr().0),
            PortKind::Host => self.learn_host_mac(ingress, eth.src_addr().0),
            PortKind::Uplink => {}
        }
        match ethertype {
            EtherType::Ipv4 => self.ipv4(buf, ingress, start, l3, end, cx),
            EtherType::Arp => self.arp(buf, ingress, kind, start, l3, end, cx),
            EtherType::Ipv6 => self.ipv6(buf, ingress, start, l3, end, cx),
            _ => Verdict::Drop(DropReason::UnknownEthertype),
        }
    }

    /// Follows the pod's MAC from the frames it sends, as
    /// [`Self::learn_host_mac`] does for the host: the MAC the CNI plugin
    /// said at ADD, or none, is replaced by the one the pod uses now (a
    /// chained `tuning` with `mac`, `ip link set address` in the pod), so
    /// a pod whose MAC changed is reached at the new one once it speaks
    /// (issue 14, item 7). Unicast only (a multicast or zero source is
    /// never a pod's own); anti-spoofing stays on the IP source.
    #[inline]
    fn learn_pod_mac(&mut self, port: PortId, src: [u8; 6]) {
        if let Some(ep) = self.ports.get_mut(port)
            && ep.peer_mac != Some(src)
            && src[0] & 1 == 0
            && src != [0; 6]
        {
            ep.peer_mac = Some(src);
        }
    }

    /// Follows the kernel's MAC behind the host port (the far end of
    /// `brindle0`): every frame the kernel sends carries it, so a MAC that
    /// changes (`ip link set brindle0 address`) is the destination of the
    /// next frame to the host.
    #[inline]
    fn learn_host_mac(&mut self, port: PortId, src: [u8; 6]) {
        if let Some(ep) = self.ports.get_mut(port)
            && ep.peer_mac != Some(src)
            && src[0] & 1 == 0
            && src != [0; 6]
        {
            ep.peer_mac = Some(src);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn arp(
        &mut self,
        buf: &mut [u8],
        ingress: PortId,
        kind: PortKind,
        start: usize,
        l3: usize,
        end: usize,
        cx: &Cx,
    ) -> Verdict {
        let frame = &mut buf[start..end];
        let l3 = l3 - start;
        let Some(ep) = self.ports.get(ingress) else {
            return Verdict::Drop(DropReason::NotForUs);
        };
        let action = match kind {
            PortKind::Uplink => arp::on_uplink(frame, l3, self.cfg.node_v4),
            PortKind::Pod => arp::on_pod_port(frame, l3, &ep.addrs, ep.mac),
            PortKind::Host => arp::on_host_port(frame, l3, ep.mac, |target| {
                target == GATEWAY_V4
                    || cx
                        .fib
                        .lookup_v4(target)
                        .is_some_and(|nh| !matches!(nh, NextHop::Host | NextHop::Blackhole))
            }),
        };
        match action {
            ArpAction::Reply { len } => {
                self.counters.arp_replies += 1;
                Verdict::Tx {
                    port: ingress,
                    start,
                    len,
                }
            }
            ArpAction::Learn { addr, mac } => {
                self.neigh.insert(ingress, addr.into(), mac);
                self.counters.arp_learned += 1;
                Verdict::Consumed
            }
            ArpAction::Refresh { addr, mac } => {
                if self.neigh.refresh(ingress, addr.into(), mac) {
                    self.counters.arp_learned += 1;
                    Verdict::Consumed
                } else {
                    Verdict::Drop(DropReason::NotForUs)
                }
            }
            ArpAction::Ignore => Verdict::Drop(DropReason::NotForUs),
            ArpAction::Malformed => Verdict::Drop(DropReason::ParseError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_link_uses_the_underlay_prefix() {
        let c = PipelineConfig::new(Ipv4Addr::new(192, 168, 1, 10), 24);
        assert!(c.on_link(Ipv4Addr::new(192, 168, 1, 20)));
        assert!(!c.on_link(Ipv4Addr::new(192, 168, 2, 20)));
        let c0 = PipelineConfig::new(Ipv4Addr::new(192, 168, 1, 10), 0);
        assert!(c0.on_link(Ipv4Addr::new(8, 8, 8, 8)));
    }

    #[test]
    fn icmp_bucket_refills_with_time() {
        let mut b = TokenBucket {
            tokens: 2,
            burst: 2,
            per_sec: 10,
            last: None,
        };
        let t0 = Instant::now();
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(50)));
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(!b.take(t0 + Duration::from_millis(100)));
    }
}
