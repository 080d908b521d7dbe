//! The whole forwarding pipeline on arbitrary frames, from the pod ports and
//! from the uplink of the demo node (two pods, an uplink with IPIP and VXLAN
//! peers, a neighbour that is not resolved yet).
//!
//! The input is a sequence of records `[selector][length][bytes]`:
//! - selector bits 0-1: ingress port (pod A, pod B, uplink, uplink);
//! - bits 2-4: 0 = the bytes are the frame; 1-7 = start from a valid frame
//!   (pod -> pod, IPIP and VXLAN encap, IPIP and VXLAN decap, ARP, IPv6
//!   neighbor solicitation) and apply the bytes as (offset, value) patches;
//! - bit 5: cut the frame to a length taken from the first patch byte;
//! - bit 6: re-fix the IPv4 header checksums after patching (to get past
//!   the checksum check into the deeper stages);
//! - bit 7 of the first record's selector: the node runs with network
//!   policy (pod B isolated but for UDP 5000 in, pod A tracked without a
//!   program), so frames also go through the flow table and its parser.
//!
//! After every record: nothing panicked, every frame is accounted for
//! (`rx + generated == tx + consumed + dropped`), what the ports received
//! matches `tx_packets`, and every arena chunk is back in the free list.
#![no_main]

use std::sync::{Arc, OnceLock};

use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::parse_documents;
use brindle_vrouter::demo::ports;
use brindle_vrouter::policy::PolicyView;

use brindle_vrouter::demo::frames::{arp_request, ipip_frame, udp_frame, udp_packet, vxlan_frame};
use brindle_vrouter::demo::{Node, VNI, addr::*};
use brindle_vrouter::endpoint::{GATEWAY_MAC, GATEWAY_V4};
use brindle_vrouter::pipeline::vtep_mac;
use brindle_vrouter::wire::ipv4;
use libfuzzer_sys::fuzz_target;

fn templates() -> &'static [Vec<u8>] {
    static T: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    T.get_or_init(|| {
        let p = [0x42u8; 18];
        let mut v6 = Vec::new();
        ipv6_frame(&mut v6);
        vec![
            udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &p),
            udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_IPIP, 64, &p),
            udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_VXLAN, 2, &p),
            ipip_frame(
                REMOTE_IPIP_MAC,
                UPLINK_MAC,
                REMOTE_IPIP,
                NODE,
                &udp_packet(REMOTE_POD_IPIP, POD_A, 64, &p),
            ),
            vxlan_frame(
                REMOTE_VXLAN_MAC,
                UPLINK_MAC,
                REMOTE_VXLAN,
                NODE,
                50000,
                VNI,
                &udp_frame(vtep_mac(REMOTE_VXLAN), vtep_mac(NODE), REMOTE_POD_VXLAN, POD_B, 64, &p),
                1,
            ),
            arp_request(POD_A_MAC, POD_A, GATEWAY_V4),
            v6,
        ]
    })
}

/// A neighbor solicitation from pod A for its gateway
/// fe80::ecee:eeff:feee:eeee (checksum included), which proxy NDP answers.
fn ipv6_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0x33, 0x33, 0xff, 0xee, 0xee, 0xee]);
    out.extend_from_slice(&POD_A_MAC);
    out.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]);
    let src = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x08, 0x58, 0x0a, 0xff, 0xfe, 0x41, 0, 2];
    let dst = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xee, 0xee, 0xee];
    let target = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xec, 0xee, 0xee, 0xff, 0xfe, 0xee, 0xee, 0xee];
    out.extend_from_slice(&src);
    out.extend_from_slice(&dst);
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target);
    icmp.extend_from_slice(&[1, 1]);
    icmp.extend_from_slice(&POD_A_MAC);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src);
    pseudo.extend_from_slice(&dst);
    pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&icmp);
    let sum = brindle_vrouter::wire::checksum::checksum(&pseudo);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&icmp);
}

fn policy() -> Arc<PolicyView> {
    static V: OnceLock<Arc<PolicyView>> = OnceLock::new();
    V.get_or_init(|| {
        let yaml = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\n\
            apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: demo, labels: {app: b}}\n---\n\
            apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: isolate-b, namespace: demo}\n\
            spec:\n  podSelector: {matchLabels: {app: b}}\n  policyTypes: [Ingress, Egress]\n\
            \x20 ingress:\n  - ports: [{protocol: UDP, port: 5000}]\n";
        let mut changes: Vec<Change> =
            parse_documents(yaml).expect("parses").into_iter().map(Change::Apply).collect();
        changes.push(Change::Endpoint(
            EndpointKey::new("demo", "b"),
            Some(EndpointInfo { addrs: vec![POD_B.into()], local: true }),
        ));
        let update = Compiler::new().apply(changes);
        let view = PolicyView::new()
            .with_workload(ports::POD_A, Some(EndpointKey::new("demo", "a")))
            .with_workload(ports::POD_B, Some(EndpointKey::new("demo", "b")))
            .with_update(&update)
            .expect("applies");
        assert!(view.state().endpoints() == 1, "the policy compiles to B's program");
        Arc::new(view)
    })
    .clone()
}

fn fix_ipv4_checksum(frame: &mut [u8], at: usize) {
    if let Some(b) = frame.get_mut(at..)
        && let Ok(mut p) = ipv4::Packet::new_checked(b)
    {
        p.fill_checksum();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut node = Node::new();
    if data.first().is_some_and(|s| s & 0x80 != 0) {
        node.worker.pipeline_mut().flows_mut().set_view(policy());
    }
    let mut rest = data;
    while let [selector, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let port = (selector & 0x3).min(2) as u16;
        let mode = usize::from((selector >> 2) & 0x7);
        let frame = if mode == 0 {
            bytes.to_vec()
        } else {
            let mut f = templates()[mode - 1].clone();
            for pair in bytes.chunks_exact(2) {
                let at = usize::from(pair[0]) % f.len();
                f[at] = pair[1];
            }
            if selector & 0x20 != 0
                && let Some(&cut) = bytes.first()
            {
                f.truncate(usize::from(cut) % (f.len() + 1));
            }
            if selector & 0x40 != 0 {
                fix_ipv4_checksum(&mut f, 14);
                fix_ipv4_checksum(&mut f, 34);
                fix_ipv4_checksum(&mut f, 64);
            }
            f
        };
        let before = node.worker.counters().tx_packets;
        let out = node.send(port, &frame);
        let c = node.worker.counters();
        assert!(c.balanced(), "frames unaccounted for: {c:?}");
        assert_eq!(c.tx_packets - before, out.len() as u64);
        assert!(node.no_frame_leaked(), "a frame leaked from the arena");
    }
});
