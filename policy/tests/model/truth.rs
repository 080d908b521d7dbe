//! The lab's cases (issue 15) as truth tables: three namespaces × three
//! pods, TCP and UDP on ports 80 and 81, probed all pairs, printed the way
//! the Kubernetes e2e network-policy tests print theirs (rows: from, columns:
//! to, `.` allowed, `X` denied); the classifier's table must equal the
//! model's for every case. `cargo test -p brindle-policy --test model truth
//! -- --nocapture` prints them.

use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::classify::{Packet, PolicyState};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::{Direction, EndpointKey};
use brindle_policy::resource::parse_documents;

use super::spec::*;
use super::worlds::render;

const NS: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn base() -> World {
    let mut w = World::default();
    for (i, ns) in NS.iter().enumerate() {
        w.namespaces.push(Namespace {
            name: (*ns).to_owned(),
            labels: labels(&[("ns", ns)]),
        });
        for (j, pod) in PODS.iter().enumerate() {
            w.pods.push(Pod {
                namespace: (*ns).to_owned(),
                name: (*pod).to_owned(),
                labels: labels(&[("pod", pod)]),
                ip: Ipv4Addr::new(10, 0, i as u8, j as u8 + 1),
                service_account: "default".into(),
                ports: vec![
                    ("serve-80-tcp".into(), 6, 80),
                    ("serve-81-tcp".into(), 6, 81),
                    ("serve-80-udp".into(), 17, 80),
                    ("serve-81-udp".into(), 17, 81),
                ],
            });
        }
    }
    w
}

fn k8s(ns: &str, name: &str, types: (bool, bool)) -> K8sPolicy {
    K8sPolicy {
        namespace: ns.into(),
        name: name.into(),
        pod_selector: K8sSel::default(),
        policy_types: Some(types),
        ingress: Vec::new(),
        egress: Vec::new(),
    }
}

fn sel_ns(ns: &str) -> K8sSel {
    K8sSel {
        match_labels: vec![("ns".into(), ns.into())],
        exprs: Vec::new(),
    }
}

fn sel_pod(pod: &str) -> K8sSel {
    K8sSel {
        match_labels: vec![("pod".into(), pod.into())],
        exprs: Vec::new(),
    }
}

fn port(protocol: u8, port: Option<K8sPortValue>) -> K8sPort {
    K8sPort { protocol, port }
}

fn cases() -> Vec<(&'static str, World)> {
    let mut out = Vec::new();

    let mut w = base();
    w.k8s.push(k8s("x", "deny-all-ingress", (true, false)));
    out.push(("deny-all ingress in x", w));

    let mut w = base();
    let mut p = k8s("x", "deny-egress-but-dns", (false, true));
    p.egress.push(K8sRule {
        peers: Vec::new(),
        ports: vec![port(17, Some(K8sPortValue::Number(53, None)))],
    });
    w.k8s.push(p);
    out.push(("deny-all egress from x, DNS allowed", w));

    let mut w = base();
    let mut p = k8s("x", "from-y", (true, false));
    p.ingress.push(K8sRule {
        peers: vec![K8sPeer::Namespaces(sel_ns("y"))],
        ports: Vec::new(),
    });
    w.k8s.push(p);
    out.push(("x allows ingress from namespace y", w));

    let mut w = base();
    let mut p = k8s("x", "from-y-b", (true, false));
    p.ingress.push(K8sRule {
        peers: vec![K8sPeer::Both(sel_ns("y"), sel_pod("b"))],
        ports: Vec::new(),
    });
    w.k8s.push(p);
    out.push(("x allows ingress from pod b of namespace y", w));

    let mut w = base();
    let mut p = k8s("x", "ipblock", (true, false));
    p.ingress.push(K8sRule {
        peers: vec![K8sPeer::Block(
            Cidr(Ipv4Addr::new(10, 0, 0, 0), 16),
            vec![Cidr(Ipv4Addr::new(10, 0, 1, 0), 24)],
        )],
        ports: Vec::new(),
    });
    w.k8s.push(p);
    out.push(("x allows 10.0.0.0/16 except 10.0.1.0/24 (y)", w));

    let mut w = base();
    let mut p = k8s("x", "named", (true, false));
    p.ingress.push(K8sRule {
        peers: Vec::new(),
        ports: vec![port(6, Some(K8sPortValue::Name("serve-81-tcp".into())))],
    });
    w.k8s.push(p);
    out.push(("x allows the named port serve-81-tcp", w));

    let mut w = base();
    let mut p = k8s("x", "end-port", (true, false));
    p.ingress.push(K8sRule {
        peers: Vec::new(),
        ports: vec![port(17, Some(K8sPortValue::Number(79, Some(80))))],
    });
    w.k8s.push(p);
    out.push(("x allows UDP 79-80 (endPort)", w));

    let mut w = base();
    w.tiers.push(Tier {
        name: "security".into(),
        order: 100.0,
        pass_by_default: false,
    });
    w.calico.push(CalicoPolicy {
        namespace: None,
        name: "security.guard-x".into(),
        tier: "security".into(),
        order: 10.0,
        selector: Sel::Eq("pod".into(), "a".into()),
        sa_selector: None,
        namespace_selector: None,
        types: Some((true, false)),
        ingress: vec![
            CalicoRule {
                action: Action::Pass,
                protocol: None,
                not_protocol: None,
                icmp_type: None,
                source: Entity {
                    namespace_selector: Some(Some(Sel::In(
                        "ns".into(),
                        vec!["x".into(), "y".into()],
                    ))),
                    ..Entity::default()
                },
                destination: Entity::default(),
            },
            CalicoRule {
                action: Action::Deny,
                protocol: None,
                not_protocol: None,
                icmp_type: None,
                source: Entity::default(),
                destination: Entity::default(),
            },
        ],
        egress: Vec::new(),
    });
    let mut p = k8s("y", "only-b", (true, false));
    p.ingress.push(K8sRule {
        peers: vec![K8sPeer::Both(K8sSel::default(), sel_pod("b"))],
        ports: Vec::new(),
    });
    w.k8s.push(p);
    out.push((
        "tier security passes x and y to pods a, the default tier allows only pods b into y",
        w,
    ));

    let mut w = base();
    w.calico.push(CalicoPolicy {
        namespace: None,
        name: "no-81-to-a-b".into(),
        tier: "default".into(),
        order: 500.0,
        selector: Sel::And(
            Box::new(Sel::In("pod".into(), vec!["a".into(), "b".into()])),
            Box::new(Sel::Not(Box::new(Sel::Has("exempt".into())))),
        ),
        sa_selector: None,
        namespace_selector: None,
        types: Some((true, false)),
        ingress: vec![
            CalicoRule {
                action: Action::Deny,
                protocol: Some(6),
                not_protocol: None,
                icmp_type: None,
                source: Entity::default(),
                destination: Entity {
                    ports: vec![(81, 81)],
                    ..Entity::default()
                },
            },
            CalicoRule {
                action: Action::Allow,
                protocol: None,
                not_protocol: None,
                icmp_type: None,
                source: Entity::default(),
                destination: Entity::default(),
            },
        ],
        egress: Vec::new(),
    });
    out.push((
        "GlobalNetworkPolicy pod in {a, b} && !has(exempt): no TCP 81",
        w,
    ));
    out
}

fn dataplane(w: &World) -> PolicyState {
    let text = serde_json::to_string(&render(w)).expect("json");
    let mut changes: Vec<Change> = parse_documents(&text)
        .expect("the cases parse")
        .into_iter()
        .map(Change::Apply)
        .collect();
    for p in &w.pods {
        changes.push(Change::Endpoint(
            EndpointKey::new(&p.namespace, &p.name),
            Some(EndpointInfo {
                addrs: vec![IpAddr::V4(p.ip)],
                local: true,
            }),
        ));
    }
    let mut dp = PolicyState::default();
    dp.apply(&Compiler::new().apply(changes))
        .expect("the update applies");
    dp
}

#[test]
fn truth_tables_of_the_lab_cases() {
    let mut mismatches = 0;
    for (name, w) in cases() {
        let dp = dataplane(&w);
        for (protocol, dst_port) in [(6u8, 80u16), (6, 81), (17, 80), (17, 81)] {
            let proto = if protocol == 6 { "TCP" } else { "UDP" };
            let mut table = format!("{name}: {proto}/{dst_port}\n      ");
            for to in &w.pods {
                table.push_str(&format!("{}/{} ", to.namespace, to.name));
            }
            table.push('\n');
            for from in &w.pods {
                table.push_str(&format!("  {}/{} ", from.namespace, from.name));
                for to in &w.pods {
                    let t = Traffic {
                        src: from.ip,
                        dst: to.ip,
                        protocol,
                        dst_port,
                        icmp_type: 0,
                    };
                    let pkt = Packet::ported(
                        IpAddr::V4(from.ip),
                        IpAddr::V4(to.ip),
                        protocol,
                        40000,
                        dst_port,
                    );
                    let k = |p: &Pod| EndpointKey::new(&p.namespace, &p.name);
                    let got = dp.classify(&k(from), Direction::Egress, &pkt).allow
                        && dp.classify(&k(to), Direction::Ingress, &pkt).allow;
                    let want = w.allowed(&t);
                    table.push_str(match (got, want) {
                        (true, true) => " .  ",
                        (false, false) => " X  ",
                        _ => {
                            mismatches += 1;
                            " !  "
                        }
                    });
                }
                table.push('\n');
            }
            println!("{table}");
        }
    }
    assert_eq!(
        mismatches, 0,
        "`!` marks where the classifier and the model differ"
    );
}
