//! Random worlds for the model test, from one seed (proptest draws the
//! seeds; a failure prints the seed, the resources and the packet), and
//! their rendering as the resources kubectl/calicoctl would take.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::spec::*;

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}

const KEYS: [&str; 3] = ["app", "team", "role"];
const VALUES: [&str; 3] = ["a", "b", "c"];
pub const OUTSIDE: [Ipv4Addr; 2] = [Ipv4Addr::new(192, 168, 1, 1), Ipv4Addr::new(10, 0, 0, 200)];

fn cidr(s: &str) -> Cidr {
    let (a, l) = s.split_once('/').expect("a cidr");
    Cidr(a.parse().expect("an address"), l.parse().expect("a length"))
}

pub fn labels(r: &mut Rng) -> Labels {
    let mut l = BTreeMap::new();
    for _ in 0..r.below(3) {
        l.insert(r.pick(&KEYS).to_owned(), r.pick(&VALUES).to_owned());
    }
    l
}

fn values(r: &mut Rng) -> Vec<String> {
    let mut v: Vec<String> = (0..1 + r.below(2))
        .map(|_| r.pick(&VALUES).to_owned())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn sel(r: &mut Rng, depth: u32, positive: bool) -> Sel {
    let k = r.pick(&KEYS).to_owned();
    let choice = if depth == 0 { r.below(6) } else { r.below(9) };
    let s = match choice {
        0 => Sel::All,
        1 | 2 => Sel::Eq(k, r.pick(&VALUES).to_owned()),
        3 => Sel::In(k, values(r)),
        4 => Sel::Has(k),
        5 if !positive => Sel::Ne(k, r.pick(&VALUES).to_owned()),
        5 => Sel::Has(k),
        6 if !positive => Sel::NotIn(k, values(r)),
        6 => Sel::Eq(k, r.pick(&VALUES).to_owned()),
        7 => Sel::And(
            Box::new(sel(r, depth - 1, positive)),
            Box::new(sel(r, depth - 1, positive)),
        ),
        _ => Sel::Or(
            Box::new(sel(r, depth - 1, positive)),
            Box::new(sel(r, depth - 1, positive)),
        ),
    };
    if !positive && r.chance(10) {
        Sel::Not(Box::new(s))
    } else {
        s
    }
}

fn k8s_sel(r: &mut Rng, ns: bool) -> K8sSel {
    let mut s = K8sSel::default();
    for _ in 0..r.below(2) {
        s.match_labels
            .push((r.pick(&KEYS).to_owned(), r.pick(&VALUES).to_owned()));
    }
    if ns && r.chance(20) {
        s.match_labels.push((
            "kubernetes.io/metadata.name".into(),
            r.pick(&["n1", "n2", "n3"]).to_owned(),
        ));
    }
    s.match_labels.sort();
    s.match_labels.dedup_by(|a, b| a.0 == b.0);
    for _ in 0..r.below(2) {
        let op = r.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
        let vs = if matches!(op, "In" | "NotIn") {
            values(r)
        } else {
            Vec::new()
        };
        s.exprs.push((r.pick(&KEYS).to_owned(), op, vs));
    }
    s
}

const BLOCKS: [(&str, &[&str]); 3] = [
    ("10.0.0.0/24", &["10.0.0.0/30", "10.0.0.4/31"]),
    ("192.168.0.0/16", &["192.168.1.0/24"]),
    ("0.0.0.0/0", &["10.0.0.0/29", "192.168.1.1/32"]),
];
const NETS: [&str; 5] = [
    "10.0.0.0/30",
    "10.0.0.4/31",
    "192.168.0.0/16",
    "10.0.0.2/32",
    "10.0.0.128/25",
];

fn k8s_rule(r: &mut Rng) -> K8sRule {
    let mut rule = K8sRule::default();
    for _ in 0..r.below(3) {
        rule.peers.push(match r.below(4) {
            0 => K8sPeer::Pods(k8s_sel(r, false)),
            1 => K8sPeer::Namespaces(k8s_sel(r, true)),
            2 => K8sPeer::Both(k8s_sel(r, true), k8s_sel(r, false)),
            _ => {
                let (c, ex) = r.pick(&BLOCKS);
                let except = ex
                    .iter()
                    .filter(|_| r.chance(50))
                    .map(|e| cidr(e))
                    .collect();
                K8sPeer::Block(cidr(c), except)
            }
        });
    }
    for _ in 0..r.below(3) {
        let protocol = r.pick(&[6u8, 6, 17]);
        let port = match r.below(4) {
            0 => None,
            1 => Some(K8sPortValue::Number(r.pick(&[53, 80, 81]), None)),
            2 => Some(K8sPortValue::Number(80, Some(81))),
            _ => Some(K8sPortValue::Name(r.pick(&["http", "dns"]).to_owned())),
        };
        rule.ports.push(K8sPort { protocol, port });
    }
    rule
}

fn entity(r: &mut Rng, ported: bool, dst: bool) -> Entity {
    let mut e = Entity::default();
    if r.chance(25) {
        e.nets.push(cidr(r.pick(&NETS)));
    }
    if r.chance(15) {
        e.not_nets.push(cidr(r.pick(&NETS)));
    }
    if r.chance(40) {
        e.selector = Some(sel(r, 1, false));
    }
    if r.chance(15) {
        e.not_selector = Some(sel(r, 1, false));
    }
    if r.chance(20) {
        e.namespace_selector = Some(if r.chance(25) {
            None
        } else {
            Some(sel(r, 1, true))
        });
    }
    if dst && ported && r.chance(60) {
        e.ports
            .push(r.pick(&[(53, 53), (80, 80), (80, 81), (81, 8080)]));
    }
    if dst && ported && r.chance(25) {
        e.named_ports.push(r.pick(&["http", "dns"]).to_owned());
    }
    if r.chance(15) {
        let names = if r.chance(50) {
            vec![r.pick(&["default", "robot"]).to_owned()]
        } else {
            Vec::new()
        };
        let s = if names.is_empty() || r.chance(30) {
            Some(sel(r, 0, false))
        } else {
            None
        };
        e.service_accounts = Some((names, s));
    }
    e
}

fn calico_rule(r: &mut Rng) -> CalicoRule {
    let action = r.pick(&[
        Action::Allow,
        Action::Allow,
        Action::Deny,
        Action::Pass,
        Action::Log,
    ]);
    let protocol = r.pick(&[None, Some(6u8), Some(17), Some(1)]);
    let ported = matches!(protocol, Some(6 | 17));
    let icmp_type = if protocol == Some(1) && r.chance(50) {
        Some(r.pick(&[0u8, 8]))
    } else {
        None
    };
    let not_protocol = if r.chance(15) {
        Some(r.pick(&[6u8, 17, 1]))
    } else {
        None
    };
    CalicoRule {
        action,
        protocol,
        not_protocol,
        icmp_type,
        source: entity(r, ported, false),
        destination: entity(r, ported, true),
    }
}

fn types(r: &mut Rng) -> Option<(bool, bool)> {
    r.pick(&[
        None,
        None,
        Some((true, false)),
        Some((false, true)),
        Some((true, true)),
    ])
}

/// A random world.
pub fn world(seed: u64) -> World {
    let mut r = Rng::new(seed);
    let mut w = World::default();
    for name in ["n1", "n2", "n3"] {
        w.namespaces.push(Namespace {
            name: name.into(),
            labels: labels(&mut r),
        });
    }
    for ns in ["n1", "n2", "n3"] {
        for sa in ["default", "robot"] {
            if r.chance(60) {
                w.service_accounts
                    .insert((ns.to_owned(), sa.to_owned()), labels(&mut r));
            }
        }
    }
    for i in 0..3 + r.below(4) {
        let mut ports = Vec::new();
        if r.chance(50) {
            ports.push(("http".to_owned(), 6, r.pick(&[80u16, 81, 8080])));
        }
        if r.chance(30) {
            ports.push(("dns".to_owned(), 17, 53));
        }
        w.pods.push(Pod {
            namespace: r.pick(&["n1", "n2", "n3"]).to_owned(),
            name: format!("p{i}"),
            labels: labels(&mut r),
            ip: Ipv4Addr::new(10, 0, 0, i as u8 + 1),
            service_account: r.pick(&["default", "robot"]).to_owned(),
            ports,
        });
    }
    for i in 0..r.below(3) {
        w.netsets.push(NetSet {
            name: format!("s{i}"),
            labels: labels(&mut r),
            nets: (0..1 + r.below(2)).map(|_| cidr(r.pick(&NETS))).collect(),
        });
    }
    for (name, order) in [("t1", 10.0), ("t2", 2_000_000.0)] {
        if r.chance(50) {
            w.tiers.push(Tier {
                name: name.into(),
                order,
                pass_by_default: r.chance(40),
            });
        }
    }
    for i in 0..r.below(4) {
        w.k8s.push(K8sPolicy {
            namespace: r.pick(&["n1", "n2", "n3"]).to_owned(),
            name: format!("k{i}"),
            pod_selector: k8s_sel(&mut r, false),
            policy_types: types(&mut r),
            ingress: (0..r.below(3)).map(|_| k8s_rule(&mut r)).collect(),
            egress: (0..r.below(3)).map(|_| k8s_rule(&mut r)).collect(),
        });
    }
    let mut orders = vec![1.0, 5.0, 50.0, 500.0, 999.0, 1001.0, 1500.0, 9000.0];
    for i in 0..r.below(4) {
        let mut tiers = vec!["default".to_owned()];
        tiers.extend(w.tiers.iter().map(|t| t.name.clone()));
        let tier = r.pick(&tiers);
        let order = orders.remove(r.below(orders.len()));
        let namespace = if r.chance(50) {
            Some(r.pick(&["n1", "n2", "n3"]).to_owned())
        } else {
            None
        };
        let global = namespace.is_none();
        w.calico.push(CalicoPolicy {
            namespace,
            name: if tier == "default" {
                format!("c{i}")
            } else {
                format!("{tier}.c{i}")
            },
            tier,
            order,
            selector: sel(&mut r, 1, false),
            sa_selector: if r.chance(20) {
                Some(sel(&mut r, 0, false))
            } else {
                None
            },
            namespace_selector: if global && r.chance(25) {
                Some(sel(&mut r, 1, false))
            } else {
                None
            },
            types: types(&mut r),
            ingress: (0..r.below(4)).map(|_| calico_rule(&mut r)).collect(),
            egress: (0..r.below(4)).map(|_| calico_rule(&mut r)).collect(),
        });
    }
    w
}

/// Random packets between the pods and two outside addresses.
pub fn traffic(seed: u64, w: &World, n: usize) -> Vec<Traffic> {
    let mut r = Rng::new(seed ^ 0x5eed);
    let mut addrs: Vec<Ipv4Addr> = w.pods.iter().map(|p| p.ip).collect();
    addrs.extend(OUTSIDE);
    (0..n)
        .map(|_| Traffic {
            src: r.pick(&addrs),
            dst: r.pick(&addrs),
            protocol: r.pick(&[6u8, 6, 17, 1]),
            dst_port: r.pick(&[53u16, 80, 81, 8080]),
            icmp_type: r.pick(&[8u8, 0]),
        })
        .collect()
}

// ===== rendering =====

fn labels_json(l: &Labels) -> Value {
    json!(l)
}

fn k8s_sel_json(s: &K8sSel) -> Value {
    let ml: BTreeMap<&str, &str> = s
        .match_labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let me: Vec<Value> = s
        .exprs
        .iter()
        .map(|(k, op, vs)| {
            if vs.is_empty() {
                json!({"key": k, "operator": op})
            } else {
                json!({"key": k, "operator": op, "values": vs})
            }
        })
        .collect();
    json!({"matchLabels": ml, "matchExpressions": me})
}

fn cidr_str(c: &Cidr) -> String {
    format!("{}/{}", c.0, c.1)
}

fn k8s_rule_json(rule: &K8sRule, peers_key: &str) -> Value {
    let peers: Vec<Value> = rule
        .peers
        .iter()
        .map(|p| match p {
            K8sPeer::Pods(s) => json!({"podSelector": k8s_sel_json(s)}),
            K8sPeer::Namespaces(s) => json!({"namespaceSelector": k8s_sel_json(s)}),
            K8sPeer::Both(n, s) => {
                json!({"namespaceSelector": k8s_sel_json(n), "podSelector": k8s_sel_json(s)})
            }
            K8sPeer::Block(c, ex) => json!({"ipBlock": {
                "cidr": cidr_str(c),
                "except": ex.iter().map(cidr_str).collect::<Vec<_>>(),
            }}),
        })
        .collect();
    let ports: Vec<Value> = rule
        .ports
        .iter()
        .map(|p| {
            let proto = if p.protocol == 17 { "UDP" } else { "TCP" };
            match &p.port {
                None => json!({"protocol": proto}),
                Some(K8sPortValue::Number(a, None)) => json!({"protocol": proto, "port": a}),
                Some(K8sPortValue::Number(a, Some(e))) => {
                    json!({"protocol": proto, "port": a, "endPort": e})
                }
                Some(K8sPortValue::Name(n)) => json!({"protocol": proto, "port": n}),
            }
        })
        .collect();
    json!({peers_key: peers, "ports": ports})
}

fn types_json(t: Option<(bool, bool)>) -> Option<Vec<&'static str>> {
    t.map(|(i, e)| {
        let mut v = Vec::new();
        if i {
            v.push("Ingress");
        }
        if e {
            v.push("Egress");
        }
        v
    })
}

fn entity_json(e: &Entity) -> Value {
    let mut m = serde_json::Map::new();
    if !e.nets.is_empty() {
        m.insert(
            "nets".into(),
            json!(e.nets.iter().map(cidr_str).collect::<Vec<_>>()),
        );
    }
    if !e.not_nets.is_empty() {
        m.insert(
            "notNets".into(),
            json!(e.not_nets.iter().map(cidr_str).collect::<Vec<_>>()),
        );
    }
    if let Some(s) = &e.selector {
        m.insert("selector".into(), json!(s.render()));
    }
    if let Some(s) = &e.not_selector {
        m.insert("notSelector".into(), json!(s.render()));
    }
    match &e.namespace_selector {
        Some(Some(s)) => {
            m.insert("namespaceSelector".into(), json!(s.render()));
        }
        Some(None) => {
            m.insert("namespaceSelector".into(), json!("global()"));
        }
        None => {}
    }
    if !e.ports.is_empty() || !e.named_ports.is_empty() {
        let mut ports: Vec<Value> = e
            .ports
            .iter()
            .map(|(a, b)| {
                if a == b {
                    json!(a)
                } else {
                    json!(format!("{a}:{b}"))
                }
            })
            .collect();
        ports.extend(e.named_ports.iter().map(|n| json!(n)));
        m.insert("ports".into(), Value::Array(ports));
    }
    if let Some((names, s)) = &e.service_accounts {
        let mut sa = serde_json::Map::new();
        if !names.is_empty() {
            sa.insert("names".into(), json!(names));
        }
        if let Some(s) = s {
            sa.insert("selector".into(), json!(s.render()));
        }
        m.insert("serviceAccounts".into(), Value::Object(sa));
    }
    Value::Object(m)
}

fn calico_rule_json(r: &CalicoRule) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("action".into(), json!(format!("{:?}", r.action)));
    if let Some(p) = r.protocol {
        m.insert(
            "protocol".into(),
            json!(match p {
                6 => "TCP",
                17 => "UDP",
                _ => "ICMP",
            }),
        );
    }
    if let Some(t) = r.icmp_type {
        m.insert("icmp".into(), json!({"type": t}));
    }
    if let Some(p) = r.not_protocol {
        m.insert(
            "notProtocol".into(),
            json!(match p {
                6 => "TCP",
                17 => "UDP",
                _ => "ICMP",
            }),
        );
    }
    m.insert("source".into(), entity_json(&r.source));
    m.insert("destination".into(), entity_json(&r.destination));
    Value::Object(m)
}

/// The world as resources (a JSON array, as `kubectl apply -f` takes it).
pub fn render(w: &World) -> Vec<Value> {
    let mut out = Vec::new();
    for n in &w.namespaces {
        out.push(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": n.name, "labels": labels_json(&n.labels)}}));
    }
    for ((ns, name), l) in &w.service_accounts {
        out.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": ns, "labels": labels_json(l)}}));
    }
    for p in &w.pods {
        let ports: Vec<Value> = p
            .ports
            .iter()
            .map(|(n, proto, num)| {
                json!({"name": n, "containerPort": num, "protocol": if *proto == 17 { "UDP" } else { "TCP" }})
            })
            .collect();
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": labels_json(&p.labels)},
            "spec": {"serviceAccountName": p.service_account, "containers": [{"name": "c", "ports": ports}]}}));
    }
    for s in &w.netsets {
        out.push(
            json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet",
            "metadata": {"name": s.name, "labels": labels_json(&s.labels)},
            "spec": {"nets": s.nets.iter().map(cidr_str).collect::<Vec<_>>()}}),
        );
    }
    for t in &w.tiers {
        out.push(json!({"apiVersion": "projectcalico.org/v3", "kind": "Tier",
            "metadata": {"name": t.name},
            "spec": {"order": t.order, "defaultAction": if t.pass_by_default { "Pass" } else { "Deny" }}}));
    }
    for p in &w.k8s {
        let mut spec = serde_json::Map::new();
        spec.insert("podSelector".into(), k8s_sel_json(&p.pod_selector));
        if let Some(t) = types_json(p.policy_types) {
            spec.insert("policyTypes".into(), json!(t));
        }
        spec.insert(
            "ingress".into(),
            json!(
                p.ingress
                    .iter()
                    .map(|r| k8s_rule_json(r, "from"))
                    .collect::<Vec<_>>()
            ),
        );
        spec.insert(
            "egress".into(),
            json!(
                p.egress
                    .iter()
                    .map(|r| k8s_rule_json(r, "to"))
                    .collect::<Vec<_>>()
            ),
        );
        out.push(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": p.name, "namespace": p.namespace}, "spec": spec}),
        );
    }
    for p in &w.calico {
        let mut spec = serde_json::Map::new();
        spec.insert("tier".into(), json!(p.tier));
        spec.insert("order".into(), json!(p.order));
        spec.insert("selector".into(), json!(p.selector.render()));
        if let Some(s) = &p.sa_selector {
            spec.insert("serviceAccountSelector".into(), json!(s.render()));
        }
        if let Some(s) = &p.namespace_selector {
            spec.insert("namespaceSelector".into(), json!(s.render()));
        }
        if let Some(t) = types_json(p.types) {
            spec.insert("types".into(), json!(t));
        }
        spec.insert(
            "ingress".into(),
            json!(p.ingress.iter().map(calico_rule_json).collect::<Vec<_>>()),
        );
        spec.insert(
            "egress".into(),
            json!(p.egress.iter().map(calico_rule_json).collect::<Vec<_>>()),
        );
        let (kind, meta) = match &p.namespace {
            Some(ns) => ("NetworkPolicy", json!({"name": p.name, "namespace": ns})),
            None => ("GlobalNetworkPolicy", json!({"name": p.name})),
        };
        out.push(json!({"apiVersion": "projectcalico.org/v3", "kind": kind,
            "metadata": meta, "spec": spec}));
    }
    out
}
