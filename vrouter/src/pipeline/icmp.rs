//! ICMP errors (time exceeded, fragmentation needed) built in place from
//! the dropped frame and routed back to its sender like any packet.

use super::forward::{V4, parse_v4};
use super::{Cx, Pipeline, Verdict};
use crate::counters::DropReason;
use crate::endpoint::PortKind;
use crate::wire::ethernet::{self, MacAddr};
use crate::wire::icmpv4::{self, ErrorHeader, Icmpv4Error};
use crate::wire::ipv4;

impl Pipeline {
    /// Answers the packet `m` (in a frame starting at chunk offset `start`)
    /// with `error`, or drops it for `reason` when RFC 1812 forbids an
    /// answer (an ICMP error, a non-first fragment, a broadcast source...).
    pub(super) fn icmp_error(
        &mut self,
        buf: &mut [u8],
        start: usize,
        m: V4,
        error: Icmpv4Error,
        reason: DropReason,
        cx: &Cx,
    ) -> Verdict {
        let may = ipv4::Packet::new_checked(&buf[m.l3..m.l3 + m.len])
            .is_ok_and(|p| icmpv4::may_send_error_about(&p));
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
            src_addr: self.cfg.node_v4,
            ttl: 64,
            ident: self.next_ident(),
        };
        let Ok(len) = icmpv4::emit_error_in_place(&mut buf[start..], m.l3 - start, error, &header)
        else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        let l3 = start + ethernet::HEADER_LEN;
        let reply = match parse_v4(buf, l3, start + len) {
            Ok(r) => r,
            Err(r) => return Verdict::Drop(r),
        };
        let v = self.route_v4(buf, PortKind::Host, start, reply, true, cx);
        if matches!(v, Verdict::Tx { .. } | Verdict::Hold { .. }) {
            self.counters.icmp_generated += 1;
        }
        v
    }
}
