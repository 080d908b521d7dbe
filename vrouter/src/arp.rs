//! Proxy ARP on pod ports, neighbour learning on the uplink, and the ARP
//! requests of the neighbour miss path.
//!
//! On a pod port the vrouter is the pod's only neighbour: it answers every
//! request, for the gateway 169.254.1.1 and for any other address, with its
//! own MAC (ee:ee:ee:ee:ee:ee), as Calico does, so the pod sends everything
//! to the vrouter. The one exception is the pod's own address: a pod probing
//! for its address (duplicate address detection, gratuitous ARP) must hear
//! nothing. The reply is built in place from the request frame.
//!
//! On the host port (the node's kernel behind `brindle0`) it answers only
//! for what it carries: 169.254.1.1, the next hop of the kernel's routes
//! into the vrouter, and addresses it routes elsewhere than back to the
//! host (the pipeline decides with its FIB).
//!
//! On the uplink the vrouter answers nothing: the node's address belongs to
//! the kernel. It learns the sender of replies addressed to the node and
//! refreshes entries it already has from requests and gratuitous ARP
//! (RFC 826's merge rule), so a peer that moves is followed.

use std::net::{IpAddr, Ipv4Addr};

use crate::wire::arp::{self, ArpRepr, Operation};
use crate::wire::ethernet::{self, EtherType, EthernetRepr, MacAddr};

/// What to do with an ARP frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpAction {
    /// The frame was turned into a reply in place; send it back out of the
    /// port it came from. The reply is this many bytes from the frame start.
    Reply {
        /// Length of the reply frame (header and ARP packet, no padding).
        len: usize,
    },
    /// Add or update (`addr` is at `mac`): a reply to us.
    Learn {
        /// Sender's address.
        addr: Ipv4Addr,
        /// Sender's MAC.
        mac: [u8; 6],
    },
    /// Update `addr` only if already known (request or gratuitous ARP).
    Refresh {
        /// Sender's address.
        addr: Ipv4Addr,
        /// Sender's MAC.
        mac: [u8; 6],
    },
    /// Nothing to do (a probe for the pod's own address, a reply we did not
    /// ask for, a request on the uplink).
    Ignore,
    /// Not a well-formed Ethernet/IPv4 ARP packet.
    Malformed,
}

/// Handles an ARP frame received on a pod port: answers every request
/// except those for `own` addresses with `our_mac`, in place.
///
/// `frame` is the whole Ethernet frame and `l3` the offset of the ARP packet
/// in it (after the tag, if any).
pub fn on_pod_port(frame: &mut [u8], l3: usize, own: &[IpAddr], our_mac: [u8; 6]) -> ArpAction {
    answer(frame, l3, our_mac, |target| {
        !own.contains(&IpAddr::V4(target))
    })
}

/// Handles an ARP frame received on the host port (the node's kernel):
/// answers, in place with `our_mac`, the requests whose target `routed`
/// says the vrouter carries (169.254.1.1, the next hop of the kernel's
/// routes into the vrouter, and any address the vrouter routes somewhere
/// other than back to the host), and nothing else: the kernel's own
/// addresses, its probes and gratuitous announcements go unanswered.
pub fn on_host_port(
    frame: &mut [u8],
    l3: usize,
    our_mac: [u8; 6],
    routed: impl FnOnce(Ipv4Addr) -> bool,
) -> ArpAction {
    answer(frame, l3, our_mac, routed)
}

/// Proxy ARP: turns a request whose target `wanted` accepts into the reply
/// from `our_mac`, in place. The prefilter reads the target address with no
/// validation: a request for an address not answered is dropped before any
/// parsing, and a frame too short to hold one is malformed anyway.
fn answer(
    frame: &mut [u8],
    l3: usize,
    our_mac: [u8; 6],
    wanted: impl FnOnce(Ipv4Addr) -> bool,
) -> ArpAction {
    let Some(payload) = frame.get(l3..) else {
        return ArpAction::Malformed;
    };
    let Some(target) = arp::speculative_target_ip(payload) else {
        return ArpAction::Malformed;
    };
    if !wanted(target) {
        return ArpAction::Ignore;
    }
    let Ok(mut packet) = arp::Packet::new_checked(&mut frame[l3..]) else {
        return ArpAction::Malformed;
    };
    if !packet.is_ethernet_ipv4() {
        return ArpAction::Malformed;
    }
    if packet.operation() != Operation::Request {
        return ArpAction::Ignore;
    }
    let requester = packet.source_hardware_addr();
    if !requester.is_unicast() {
        return ArpAction::Malformed;
    }
    packet.make_reply_in_place(MacAddr(our_mac));
    let mut eth = ethernet::Frame::new_unchecked(&mut frame[..l3]);
    eth.rewrite_addrs(MacAddr(our_mac), requester);
    ArpAction::Reply {
        len: l3 + arp::PACKET_LEN,
    }
}

/// Handles an ARP frame received on the uplink, whose node address is
/// `node`: never answers; says what to learn.
pub fn on_uplink(frame: &[u8], l3: usize, node: Ipv4Addr) -> ArpAction {
    let Some(payload) = frame.get(l3..) else {
        return ArpAction::Malformed;
    };
    let to_us = arp::test_speculative_tpa(payload, node);
    let Ok(packet) = arp::Packet::new_checked(payload) else {
        return ArpAction::Malformed;
    };
    let Ok(repr) = ArpRepr::parse(&packet) else {
        return ArpAction::Malformed;
    };
    let addr = repr.source_protocol_addr;
    let mac = repr.source_hardware_addr;
    if !mac.is_unicast() || addr.is_unspecified() || addr == node {
        return ArpAction::Ignore;
    }
    let gratuitous = addr == repr.target_protocol_addr;
    match repr.operation {
        Operation::Reply if to_us => ArpAction::Learn { addr, mac: mac.0 },
        Operation::Request if to_us => ArpAction::Refresh { addr, mac: mac.0 },
        Operation::Request | Operation::Reply if gratuitous => {
            ArpAction::Refresh { addr, mac: mac.0 }
        }
        _ => ArpAction::Ignore,
    }
}

/// Length of an ARP request frame as [`write_request`] builds it (no
/// padding: the NIC pads short frames).
pub const REQUEST_LEN: usize = ethernet::HEADER_LEN + arp::PACKET_LEN;

/// Writes a broadcast "who has `target`? tell `our_ip`" frame into the start
/// of `buf`; returns its length, or `None` if `buf` is too short.
pub fn write_request(
    buf: &mut [u8],
    our_mac: [u8; 6],
    our_ip: Ipv4Addr,
    target: Ipv4Addr,
) -> Option<usize> {
    let buf = buf.get_mut(..REQUEST_LEN)?;
    let eth = EthernetRepr {
        src_addr: MacAddr(our_mac),
        dst_addr: MacAddr::BROADCAST,
        vlan: None,
        ethertype: EtherType::Arp,
    };
    eth.emit(&mut ethernet::Frame::new_unchecked(&mut *buf))
        .ok()?;
    let req = ArpRepr {
        operation: Operation::Request,
        source_hardware_addr: MacAddr(our_mac),
        source_protocol_addr: our_ip,
        target_hardware_addr: MacAddr::ZERO,
        target_protocol_addr: target,
    };
    req.emit(&mut arp::Packet::new_unchecked(
        &mut buf[ethernet::HEADER_LEN..],
    ))
    .ok()?;
    Some(REQUEST_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::GATEWAY_MAC;

    const POD_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x41, 0x00, 0x02];

    /// "Who has 169.254.1.1? Tell 10.65.0.2", as a pod sends it.
    fn request_for(target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&POD_MAC);
        f.extend_from_slice(&[0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01]);
        f.extend_from_slice(&POD_MAC);
        f.extend_from_slice(&[10, 65, 0, 2]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f
    }

    #[test]
    fn proxy_arp_answers_the_gateway_in_place_with_the_ee_mac() {
        let mut f = request_for([169, 254, 1, 1]);
        let own = ["10.65.0.2".parse().unwrap()];
        assert_eq!(
            on_pod_port(&mut f, 14, &own, GATEWAY_MAC),
            ArpAction::Reply { len: 42 }
        );
        #[rustfmt::skip]
        let expected: [u8; 42] = [
            0x0a, 0x58, 0x0a, 0x41, 0x00, 0x02, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x08, 0x06,
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02,
            0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 169, 254, 1, 1,
            0x0a, 0x58, 0x0a, 0x41, 0x00, 0x02, 10, 65, 0, 2,
        ];
        assert_eq!(f, expected);
    }

    #[test]
    fn proxy_arp_answers_other_addresses_but_not_the_pods_own() {
        let own = ["10.65.0.2".parse().unwrap()];
        let mut f = request_for([10, 65, 0, 3]);
        assert_eq!(
            on_pod_port(&mut f, 14, &own, GATEWAY_MAC),
            ArpAction::Reply { len: 42 }
        );
        let mut probe = request_for([10, 65, 0, 2]);
        let before = probe.clone();
        assert_eq!(
            on_pod_port(&mut probe, 14, &own, GATEWAY_MAC),
            ArpAction::Ignore
        );
        assert_eq!(probe, before, "an ignored frame is not touched");
    }

    #[test]
    fn the_host_port_answers_only_what_the_vrouter_routes() {
        let routed = |t: Ipv4Addr| t == Ipv4Addr::new(169, 254, 1, 1);
        let mut f = request_for([169, 254, 1, 1]);
        assert_eq!(
            on_host_port(&mut f, 14, GATEWAY_MAC, routed),
            ArpAction::Reply { len: 42 }
        );
        assert_eq!(&f[22..28], &GATEWAY_MAC, "the sender MAC of the reply");
        let mut other = request_for([192, 168, 0, 1]);
        let before = other.clone();
        assert_eq!(
            on_host_port(&mut other, 14, GATEWAY_MAC, routed),
            ArpAction::Ignore
        );
        assert_eq!(other, before, "an ignored frame is not touched");
    }

    #[test]
    fn truncated_arp_is_malformed_at_every_length() {
        let full = request_for([169, 254, 1, 1]);
        for n in 0..full.len() {
            let mut f = full[..n].to_vec();
            assert_eq!(
                on_pod_port(&mut f, 14, &[], GATEWAY_MAC),
                ArpAction::Malformed,
                "length {n}"
            );
            assert_eq!(
                on_uplink(&f, 14, Ipv4Addr::new(1, 2, 3, 4)),
                ArpAction::Malformed
            );
        }
    }

    #[test]
    fn the_uplink_learns_replies_to_us_and_never_answers() {
        let node = Ipv4Addr::new(192, 168, 0, 1);
        let peer = [2, 0, 0, 0, 0, 2];
        let mut f = vec![0x02, 0, 0, 0, 0, 1];
        f.extend_from_slice(&peer);
        f.extend_from_slice(&[0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02]);
        f.extend_from_slice(&peer);
        f.extend_from_slice(&[192, 168, 0, 2]);
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[192, 168, 0, 1]);
        assert_eq!(
            on_uplink(&f, 14, node),
            ArpAction::Learn {
                addr: Ipv4Addr::new(192, 168, 0, 2),
                mac: peer
            }
        );
        // A reply to someone else is ignored; a request to us only refreshes.
        f[41] = 9;
        assert_eq!(on_uplink(&f, 14, node), ArpAction::Ignore);
        f[41] = 1;
        f[21] = 1;
        assert!(matches!(on_uplink(&f, 14, node), ArpAction::Refresh { .. }));
    }

    #[test]
    fn request_frame_bytes() {
        let mut buf = [0xa5; 64];
        let n = write_request(
            &mut buf,
            [2, 0, 0, 0, 0, 1],
            Ipv4Addr::new(192, 168, 0, 1),
            Ipv4Addr::new(192, 168, 0, 2),
        );
        assert_eq!(n, Some(42));
        #[rustfmt::skip]
        let expected: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06,
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01,
            2, 0, 0, 0, 0, 1, 192, 168, 0, 1,
            0, 0, 0, 0, 0, 0, 192, 168, 0, 2,
        ];
        assert_eq!(&buf[..42], &expected);
        assert_eq!(buf[42], 0xa5);
    }
}
