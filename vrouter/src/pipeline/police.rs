//! Network policy and the flow table in the pipeline: which worker's
//! table a packet meets ([`Pipeline::keeper`]: a pod's flows with the
//! uplink and the host port live on one worker, the others hand such
//! packets there unprocessed), the hook of a routed packet
//! ([`Pipeline::police`], [`crate::policy::Flows::check`]) and the check of
//! a frame another worker handed over ([`Pipeline::police_handed`]).

use std::time::Instant;

use super::{Cx, HANDED_FROM_HOST_MAC, Handed, Pipeline, Verdict};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::fib::NextHop;
use crate::frame::{FrameArena, FrameDesc, PortId};
use crate::policy::Flow;

impl Pipeline {
    /// Network policy for a frame another worker handed over for this
    /// worker's port `port` (the frame as it will be sent). `false`: the
    /// frame is dropped; the caller frees it, and it is counted here (by
    /// reason, and in `handed_dropped`).
    ///
    /// A frame marked [`HANDED_FROM_HOST_MAC`] entered from the host port:
    /// its flow is marked so, and the pod port's MAC is put back. The reply
    /// of such a flow goes to the host port ([`Handed::ToHost`], MACs
    /// rewritten here), so the kernel un-DNATs it.
    pub fn police_handed(&mut self, frame: &mut [u8], port: PortId, now: Instant) -> Handed {
        let Some(ep) = self.ports.get(port).filter(|e| e.kind == PortKind::Pod) else {
            return Handed::Send;
        };
        let from_host = frame.get(6..12) == Some(&HANDED_FROM_HOST_MAC[..]);
        if from_host {
            frame[6..12].copy_from_slice(&ep.mac);
        }
        self.flows.begin_batch(now, self.ports.host().is_some());
        match self.flows.check_handed(frame, port, from_host) {
            Ok(flow) if flow.reply && flow.from_host && !from_host => {
                let host = self.ports.host().and_then(|h| {
                    let e = self.ports.get(h)?;
                    Some((h, e.mac, e.peer_mac?))
                });
                match (host, frame.get_mut(..12)) {
                    (Some((h, mac, peer)), Some(macs)) => {
                        macs[..6].copy_from_slice(&peer);
                        macs[6..].copy_from_slice(&mac);
                        Handed::ToHost(h)
                    }
                    _ => Handed::Send,
                }
            }
            Ok(_) => Handed::Send,
            Err(reason) => {
                self.counters.drop(reason);
                self.counters.handed_dropped += 1;
                Handed::Drop
            }
        }
    }

    /// Marks a frame from the host port that another worker's pod port
    /// takes ([`HANDED_FROM_HOST_MAC`]).
    #[cold]
    pub(super) fn mark_handed_from_host(
        &self,
        arena: &mut FrameArena,
        port: PortId,
        out: FrameDesc,
    ) {
        if self
            .ports
            .get(port)
            .is_some_and(|e| e.kind == PortKind::Pod)
            && let Some(src) = arena.data_mut(out).get_mut(6..12)
        {
            src.copy_from_slice(&HANDED_FROM_HOST_MAC);
        }
    }

    /// The policy hook of a routed packet (IP header at `l3`, ending at
    /// `end`) that entered by `cx.ingress` (of `kind`) and goes to `nh`:
    /// the source pod's egress and the destination pod's ingress programs
    /// through the flow table ([`crate::policy::Flows::check`]). A packet of a flow
    /// another worker keeps ([`Pipeline::keeper`]) goes there unprocessed
    /// (`Err(Verdict::ToOwner)`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn police(
        &mut self,
        buf: &[u8],
        kind: PortKind,
        nh: NextHop,
        l3: usize,
        end: usize,
        v6: bool,
        cx: &Cx,
    ) -> Result<Flow, Verdict> {
        if !self.flows.tracking() {
            return Ok(Flow::default());
        }
        let ip = buf
            .get(l3..end)
            .ok_or(Verdict::Drop(DropReason::ParseError))?;
        let pod_of = |nh| self.pod_of(nh);
        let src = match kind {
            PortKind::Pod => Some(cx.ingress),
            // What the kernel hands back from a local pod (after
            // kube-proxy's DNAT) is that pod's flow: tracked in its table
            // with the "from host" mark, so the replies find it.
            PortKind::Host if v6 => ip
                .get(8..24)
                .and_then(|a| <[u8; 16]>::try_from(a).ok())
                .and_then(|a| pod_of(cx.fib.lookup_v6(a.into()))),
            PortKind::Host => ip
                .get(12..16)
                .and_then(|a| <[u8; 4]>::try_from(a).ok())
                .and_then(|a| pod_of(cx.fib.lookup_v4(a.into()))),
            PortKind::Uplink => None,
        };
        let dst = pod_of(Some(nh));
        // A flow another worker keeps goes there as received, so all its
        // packets meet one table whichever queue the pod's tun, the host
        // port's tun or the uplink's RSS gives them. A super-packet
        // carried whole never crosses (it is cut first when it would, see
        // `superpkt.rs`); a flow this worker already tracks stays.
        if let Some(owner) = self.keeper(kind, nh, src, dst, cx)
            && self.super_segment == 0
            && !self.flows.tracks(ip, v6)
        {
            return Err(Verdict::ToOwner { owner });
        }
        // From the uplink to a pod whose flows another worker keeps: that
        // worker checks it when it takes the hand-off (see `one`).
        let dst = dst.filter(|&p| kind != PortKind::Uplink || self.flows.flow_home(p).is_none());
        self.flows
            .check(ip, v6, src, dst, kind == PortKind::Host)
            .map_err(Verdict::Drop)
    }

    /// The worker that keeps the flow of a packet from `kind` (`src`, `dst`:
    /// the local pods it comes from and goes to), when it is another one
    /// ([`crate::policy::Flows::set_flow_home`]): a pod's flows with the uplink and the
    /// host port live on the worker of its port's first part.
    ///
    /// - Between two pods of this node (from one, or from the host port
    ///   after the kernel's DNAT): [`crate::policy::Flows::pair_home`], the
    ///   same for both directions (a TAP pod's kernel picks any of its
    ///   queues for a flow's packets, whatever queue the other direction
    ///   was written on).
    /// - From a pod (a TAP pod's queue on another worker) towards the
    ///   uplink or the host port: the pod's.
    /// - From the host port: the destination pod's (its replies come from
    ///   it), else the source pod's (pod -> Service -> a backend beyond
    ///   the node, after the kernel's DNAT: the backend's replies come by
    ///   the uplink, which hands them to the pod's worker).
    /// - From the uplink: none here (the uplink hands to a pod's worker
    ///   after routing, see `one` and the veth pods' stand-in ports).
    #[inline]
    fn keeper(
        &self,
        kind: PortKind,
        nh: NextHop,
        src: Option<PortId>,
        dst: Option<PortId>,
        cx: &Cx,
    ) -> Option<usize> {
        match kind {
            PortKind::Pod => match dst {
                Some(d) => self.flows.pair_home(cx.ingress, d),
                None => {
                    let home = self.flows.flow_home(cx.ingress)?;
                    (nh == NextHop::Host || self.via_uplink(nh)).then_some(home)
                }
            },
            PortKind::Host => self.host_keeper(src, dst),
            PortKind::Uplink => None,
        }
    }

    /// [`Pipeline::keeper`] of a packet from the host port.
    #[inline]
    pub(super) fn host_keeper(&self, src: Option<PortId>, dst: Option<PortId>) -> Option<usize> {
        match (src, dst) {
            (Some(s), Some(d)) => self.flows.pair_home(s, d),
            (s, d) => self.flows.flow_home(d.or(s)?),
        }
    }

    /// The local pod port `nh` leads to, if it does.
    #[inline]
    pub(super) fn pod_of(&self, nh: Option<NextHop>) -> Option<PortId> {
        match nh {
            Some(NextHop::Local { port })
                if self
                    .ports
                    .get(port)
                    .is_some_and(|e| e.kind == PortKind::Pod) =>
            {
                Some(port)
            }
            _ => None,
        }
    }

    /// Whether `nh` leaves by the uplink.
    #[inline]
    pub(super) fn via_uplink(&self, nh: NextHop) -> bool {
        match nh {
            NextHop::Encap { .. } => true,
            NextHop::Gateway { port, .. } => self.ports.uplink() == Some(port),
            _ => false,
        }
    }
}
