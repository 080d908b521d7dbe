//! Property test (the fuzz target's invariants, in every `cargo test`):
//! arbitrary frames, and valid frames with arbitrary byte patches and cuts,
//! from any port of the demo node never panic, every frame is accounted for
//! and no arena chunk leaks; with and without network policy (pod B
//! isolated both ways, pod A unpoliced: denied, tracked and invalid
//! packets drop counted like any other).

use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::parse_documents;
use brindle_vrouter::demo::frames::{arp_request, ipip_frame, udp_frame, udp_packet, vxlan_frame};
use brindle_vrouter::demo::ports;
use brindle_vrouter::demo::{Node, VNI, addr::*};
use brindle_vrouter::endpoint::{GATEWAY_MAC, GATEWAY_V4};
use brindle_vrouter::frame::PortId;
use brindle_vrouter::pipeline::vtep_mac;
use brindle_vrouter::policy::{PolicyCell, PolicyView};
use brindle_vrouter::wire::ipv4;
use proptest::prelude::*;

const ISOLATE_B: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: demo, labels: {app: b}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-b, namespace: demo}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress, Egress]
  ingress:
  - ports: [{protocol: UDP, port: 5000}]
"#;

/// Pod B (demo/b) isolated but for UDP 5000 in; pod A (demo/a) without a
/// program.
fn police(node: &mut Node) -> PolicyCell {
    let mut changes: Vec<Change> = parse_documents(ISOLATE_B)
        .expect("parses")
        .into_iter()
        .map(Change::Apply)
        .collect();
    changes.push(Change::Endpoint(
        EndpointKey::new("demo", "b"),
        Some(EndpointInfo {
            addrs: vec![POD_B.into()],
            local: true,
        }),
    ));
    let update = Compiler::new().apply(changes);
    let view = PolicyView::new()
        .with_workload(ports::POD_A, Some(EndpointKey::new("demo", "a")))
        .with_workload(ports::POD_B, Some(EndpointKey::new("demo", "b")))
        .with_update(&update)
        .expect("applies");
    let cell = PolicyCell::new();
    cell.publish(view);
    node.worker
        .pipeline_mut()
        .flows_mut()
        .set_reader(cell.reader());
    cell
}

fn templates() -> Vec<Vec<u8>> {
    let p = [0x42u8; 18];
    vec![
        udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, POD_B, 64, &p),
        udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_IPIP, 2, &p),
        udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_VXLAN, 64, &p),
        udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, REMOTE_POD_UNRESOLVED, 64, &p),
        ipip_frame(
            REMOTE_IPIP_MAC,
            UPLINK_MAC,
            REMOTE_IPIP,
            NODE,
            &udp_packet(REMOTE_POD_IPIP, POD_A, 1, &p),
        ),
        vxlan_frame(
            REMOTE_VXLAN_MAC,
            UPLINK_MAC,
            REMOTE_VXLAN,
            NODE,
            50000,
            VNI,
            &udp_frame(
                vtep_mac(REMOTE_VXLAN),
                vtep_mac(NODE),
                REMOTE_POD_VXLAN,
                POD_B,
                64,
                &p,
            ),
            1,
        ),
        arp_request(POD_A_MAC, POD_A, GATEWAY_V4),
    ]
}

#[derive(Debug, Clone)]
enum Input {
    Raw(Vec<u8>),
    Patched {
        template: usize,
        patches: Vec<(u8, u8)>,
        cut: Option<u8>,
        fix_checksums: bool,
    },
}

fn input() -> impl Strategy<Value = (PortId, Input)> {
    let raw = proptest::collection::vec(any::<u8>(), 0..200).prop_map(Input::Raw);
    let patched = (
        0..7usize,
        proptest::collection::vec(any::<(u8, u8)>(), 0..6),
        proptest::option::of(any::<u8>()),
        any::<bool>(),
    )
        .prop_map(|(template, patches, cut, fix_checksums)| Input::Patched {
            template,
            patches,
            cut,
            fix_checksums,
        });
    (0..3u16, prop_oneof![raw, patched])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_frame_is_accounted_for_and_nothing_leaks(
        inputs in proptest::collection::vec(input(), 1..8),
        policed in any::<bool>(),
    ) {
        let templates = templates();
        let mut node = Node::new();
        let _cell = policed.then(|| police(&mut node));
        for (port, input) in inputs {
            let frame = match input {
                Input::Raw(bytes) => bytes,
                Input::Patched { template, patches, cut, fix_checksums } => {
                    let mut f = templates[template].clone();
                    for (at, value) in patches {
                        let at = usize::from(at) % f.len();
                        f[at] = value;
                    }
                    if let Some(cut) = cut {
                        f.truncate(usize::from(cut) % (f.len() + 1));
                    }
                    if fix_checksums {
                        for at in [14, 34, 64] {
                            if let Some(b) = f.get_mut(at..)
                                && let Ok(mut p) = ipv4::Packet::new_checked(b)
                            {
                                p.fill_checksum();
                            }
                        }
                    }
                    f
                }
            };
            let before = node.worker.counters().tx_packets;
            let out = node.send(port, &frame);
            let c = node.worker.counters();
            prop_assert!(c.balanced(), "unbalanced: {:?}", c);
            prop_assert_eq!(c.tx_packets - before, out.len() as u64);
            prop_assert!(node.no_frame_leaked());
        }
    }
}
