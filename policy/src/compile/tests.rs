use std::net::IpAddr;

use super::*;
use crate::classify::{ApplyError, Decision, Packet, PolicyState};
use crate::program::{Direction, RuleAction};
use crate::resource::parse_documents;

const BASE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: red}}
---
apiVersion: v1
kind: Namespace
metadata: {name: b, labels: {team: blue}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web}}
spec:
  containers:
  - name: c
    ports: [{name: http, containerPort: 8080}, {name: dns, containerPort: 53, protocol: UDP}]
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: a, labels: {app: db}}
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: b, labels: {app: cli}}
spec: {serviceAccountName: robot}
"#;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Lab {
    c: Compiler,
    dp: PolicyState,
}

impl Lab {
    fn new(yaml: &str) -> Lab {
        let mut lab = Lab {
            c: Compiler::new(),
            dp: PolicyState::default(),
        };
        let mut changes: Vec<Change> = parse_documents(BASE)
            .unwrap()
            .into_iter()
            .map(Change::Apply)
            .collect();
        for (ns, name, addr) in [
            ("a", "web", "10.0.0.1"),
            ("a", "db", "10.0.0.2"),
            ("b", "cli", "10.0.1.1"),
        ] {
            changes.push(Change::Endpoint(
                EndpointKey::new(ns, name),
                Some(EndpointInfo {
                    addrs: vec![ip(addr)],
                    local: true,
                }),
            ));
        }
        lab.step(changes);
        lab.apply(yaml);
        lab
    }

    fn step(&mut self, changes: Vec<Change>) -> Update {
        let u = self.c.apply(changes);
        if !u.is_empty() {
            self.dp.apply(&u).unwrap();
        }
        u
    }

    fn apply(&mut self, yaml: &str) -> Update {
        let changes = parse_documents(yaml)
            .unwrap()
            .into_iter()
            .map(Change::Apply)
            .collect();
        self.step(changes)
    }

    /// Whether `src` may send to `dst` (egress of the source endpoint,
    /// ingress of the destination one; outside addresses have neither).
    fn allowed(&self, src: &str, dst: &str, proto: u8, port: u16) -> bool {
        let pkt = Packet::ported(ip(src), ip(dst), proto, 40000, port);
        self.allowed_pkt(&pkt)
    }

    fn allowed_pkt(&self, pkt: &Packet) -> bool {
        let ep = |a: IpAddr| {
            [
                ("10.0.0.1", "a", "web"),
                ("10.0.0.2", "a", "db"),
                ("10.0.1.1", "b", "cli"),
            ]
            .iter()
            .find(|(x, _, _)| ip(x) == a)
            .map(|(_, ns, n)| EndpointKey::new(*ns, *n))
        };
        let out = ep(pkt.src).is_none_or(|k| self.dp.classify(&k, Direction::Egress, pkt).allow);
        let inn = ep(pkt.dst).is_none_or(|k| self.dp.classify(&k, Direction::Ingress, pkt).allow);
        out && inn
    }
}

#[test]
fn no_policy_allows_and_deny_all_ingress_drops_at_the_end_of_the_default_tier() {
    let mut lab = Lab::new("");
    assert!(lab.allowed("10.0.1.1", "10.0.0.1", 6, 80));
    lab.apply(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: a}
spec: {podSelector: {}}
"#,
    );
    assert!(!lab.allowed("10.0.1.1", "10.0.0.1", 6, 80));
    assert!(!lab.allowed("10.0.0.2", "10.0.0.1", 6, 80));
    // Egress of namespace a is not policed; b's ingress neither.
    assert!(lab.allowed("10.0.0.1", "10.0.1.1", 17, 53));
    let k = EndpointKey::new("a", "web");
    let pkt = Packet::ported(ip("9.9.9.9"), ip("10.0.0.1"), 6, 1, 80);
    let v = lab.dp.classify(&k, Direction::Ingress, &pkt);
    assert_eq!(v.decision, Decision::EndOfTier { tier: 0 });
    let p = lab.c.program(&k).unwrap();
    assert_eq!(p.ingress.tiers[0].tier, "default");
    assert_eq!(p.policies[0].name, "a/knp.default.deny");
    assert!(p.egress.tiers.is_empty());
}

#[test]
fn kubernetes_peers_ports_named_ports_and_ip_blocks() {
    let lab = Lab::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchExpressions: [{key: app, operator: In, values: [cli]}]}
    ports: [{port: http}, {port: 9000, endPort: 9010}]
  - from:
    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.1.0/24]}
    ports: [{protocol: UDP, port: dns}]
"#,
    );
    // cli (namespace b, team blue) to the named port (8080/TCP) and the range.
    assert!(lab.allowed("10.0.1.1", "10.0.0.1", 6, 8080));
    assert!(lab.allowed("10.0.1.1", "10.0.0.1", 6, 9010));
    assert!(!lab.allowed("10.0.1.1", "10.0.0.1", 6, 9011));
    assert!(!lab.allowed("10.0.1.1", "10.0.0.1", 17, 8080));
    // db is in namespace a: not selected.
    assert!(!lab.allowed("10.0.0.2", "10.0.0.1", 6, 8080));
    // ipBlock with except, named UDP port.
    assert!(lab.allowed("192.168.2.3", "10.0.0.1", 17, 53));
    assert!(!lab.allowed("192.168.1.3", "10.0.0.1", 17, 53));
    assert!(!lab.allowed("192.168.2.3", "10.0.0.1", 6, 53));
    // db itself is not selected by the policy.
    assert!(lab.allowed("10.0.1.1", "10.0.0.2", 6, 1));
}

#[test]
fn calico_tiers_pass_log_deny_and_global_policy_selector_expressions() {
    let mut lab = Lab::new(
        r#"
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.guard}
spec:
  tier: security
  order: 10
  selector: app in {"web", "db"} && !has(exempt)
  ingress:
  - action: Log
  - action: Deny
    protocol: TCP
    destination: {ports: ["22"]}
  - action: Pass
    source: {namespaceSelector: team == "blue"}
  - action: Allow
    protocol: ICMP
    icmp: {type: 8}
"#,
    );
    let web = EndpointKey::new("a", "web");
    // From b: Log, then Pass to the default tier, which has no policy for
    // web: allowed after passing every tier.
    let pkt = Packet::ported(ip("10.0.1.1"), ip("10.0.0.1"), 6, 1, 80);
    let v = lab.dp.classify(&web, Direction::Ingress, &pkt);
    assert!(v.allow);
    assert_eq!(v.decision, Decision::PassedAll);
    assert_eq!(v.logged, Some((0, 0)));
    // Port 22 denied by rule 1 even from b.
    assert!(!lab.allowed("10.0.1.1", "10.0.0.1", 6, 22));
    // From db (namespace a, red): not passed, end-of-tier drop...
    assert!(!lab.allowed("10.0.0.2", "10.0.0.1", 6, 80));
    // ...but ping allowed.
    let ping = Packet {
        src: ip("10.0.0.2"),
        dst: ip("10.0.0.1"),
        protocol: 1,
        src_port: 0,
        dst_port: 0,
        icmp: Some((8, 0)),
    };
    assert!(lab.allowed_pkt(&ping));
    // cli is not selected (app=cli).
    assert!(lab.allowed("10.0.0.2", "10.0.1.1", 6, 22));
    // A default-tier policy now decides what security passes.
    lab.apply(
        r#"
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: only-http, namespace: a}
spec:
  selector: app == "web"
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: ["80:81"]}
"#,
    );
    assert!(lab.allowed("10.0.1.1", "10.0.0.1", 6, 81));
    assert!(!lab.allowed("10.0.1.1", "10.0.0.1", 6, 82));
    // The deciding rule, named for counters: security|security.guard rule 1.
    let pkt = Packet::ported(ip("10.0.1.1"), ip("10.0.0.1"), 6, 1, 22);
    let v = lab.dp.classify(&web, Direction::Ingress, &pkt);
    let Decision::Rule { tier, rule } = v.decision else {
        panic!("{v:?}")
    };
    let p = lab.c.program(&web).unwrap();
    let (policy, index) = p.rule_of(Direction::Ingress, tier, rule).unwrap();
    assert_eq!(policy.to_string(), "security|security.guard");
    assert_eq!(index, 1);
    let p = lab.c.program(&web).unwrap();
    assert_eq!(
        p.ingress
            .tiers
            .iter()
            .map(|t| t.tier.as_str())
            .collect::<Vec<_>>(),
        ["security", "default"]
    );
    assert_eq!(p.ingress.tiers[0].rules[0].action, RuleAction::Log);
}

#[test]
fn tier_default_action_pass_and_calico_nets_not_nets_not_selector_service_accounts() {
    let lab = Lab::new(
        r#"
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: soft}
spec: {order: 1, defaultAction: Pass}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: soft.p}
spec:
  tier: soft
  selector: app == "db"
  ingress:
  - action: Deny
    source: {nets: [10.0.0.0/16], notNets: [10.0.1.0/24]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: sa, namespace: a}
spec:
  selector: app == "db"
  ingress:
  - action: Allow
    source:
      namespaceSelector: all()
      serviceAccounts: {names: [robot]}
  - action: Allow
    source: {notSelector: app == "cli", nets: [172.16.0.0/12]}
"#,
    );
    // web (10.0.0.1) denied in tier soft; cli (10.0.1.1) passes soft (notNets), then
    // allowed by its service account.
    assert!(!lab.allowed("10.0.0.1", "10.0.0.2", 6, 5432));
    assert!(lab.allowed("10.0.1.1", "10.0.0.2", 6, 5432));
    // A notSelector scopes a namespaced policy's entity to its namespace
    // (as Calico does): 172.16.0.9 is in the nets but no endpoint of a.
    assert!(!lab.allowed("172.16.0.9", "10.0.0.2", 6, 5432));
    assert!(!lab.allowed("8.8.8.8", "10.0.0.2", 6, 5432));
}

#[test]
fn a_remote_label_change_updates_a_set_and_touches_only_the_readers() {
    let mut lab = Lab::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-cli, namespace: b}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]}]
"#,
    );
    let g = lab.c.generation();
    assert!(!lab.allowed("10.0.0.1", "10.0.1.1", 6, 80));
    let u = lab.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web, role: client}}
"#,
    );
    assert_eq!(u.generation, g + 1);
    assert!(u.programs.is_empty(), "{u:?}");
    assert_eq!(u.sets.len(), 1);
    assert_eq!(u.touched, vec![EndpointKey::new("b", "cli")]);
    assert!(lab.allowed("10.0.0.1", "10.0.1.1", 6, 80));
    assert_eq!(
        lab.dp
            .endpoint(&EndpointKey::new("b", "cli"))
            .unwrap()
            .generation,
        g + 1
    );
    // The same again changes nothing: empty update, same generation.
    let u = lab.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web, role: client}}
"#,
    );
    assert!(u.is_empty());
    assert_eq!(lab.c.generation(), g + 1);
}

#[test]
fn a_policy_change_recompiles_only_the_endpoints_it_selects_and_sets_are_freed() {
    let mut lab = Lab::new("");
    let u = lab.apply(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: a}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]
"#,
    );
    let eps: Vec<_> = u.programs.iter().map(|p| p.endpoint.to_string()).collect();
    assert_eq!(eps, ["a/db"]);
    assert_eq!(lab.c.set_count(), 1);
    assert!(lab.allowed("10.0.0.1", "10.0.0.2", 6, 1));
    assert!(!lab.allowed("10.0.1.1", "10.0.0.2", 6, 1));
    let u = lab.step(vec![Change::Delete(ResourceKey {
        kind: Kind::KubernetesNetworkPolicy,
        namespace: Some("a".into()),
        name: "db".into(),
    })]);
    assert_eq!(u.programs.len(), 1);
    assert_eq!(u.sets.len(), 1);
    assert_eq!(u.sets[0].content, None);
    assert_eq!(lab.c.set_count(), 0);
    assert!(lab.allowed("10.0.1.1", "10.0.0.2", 6, 1));
    // A snapshot rebuilds the same state from nothing.
    let mut fresh = PolicyState::default();
    fresh.apply(&lab.c.snapshot()).unwrap();
    assert_eq!(fresh.endpoints(), 3);
}

#[test]
fn egress_to_a_named_port_resolves_on_the_destination_pods() {
    let lab = Lab::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out, namespace: b}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {team: red}}}]
    ports: [{port: http}]
"#,
    );
    assert!(lab.allowed("10.0.1.1", "10.0.0.1", 6, 8080));
    // db has no port named http.
    assert!(!lab.allowed("10.0.1.1", "10.0.0.2", 6, 8080));
    assert!(!lab.allowed("10.0.1.1", "8.8.8.8", 17, 53));
}

#[test]
fn the_dataplane_refuses_stale_or_dangling_updates_whole() {
    let lab = Lab::new("");
    let mut dp = lab.dp.clone();
    let stale = Update {
        generation: dp.generation(),
        ..Update::default()
    };
    assert!(matches!(
        dp.apply(&stale),
        Err(ApplyError::StaleGeneration { .. })
    ));
    let mut program = Program::default();
    program.ingress.tiers.push(TierChain {
        tier: "default".into(),
        rules: vec![CompiledRule {
            action: RuleAction::Allow,
            when: Match {
                src: Side {
                    in_sets: vec![crate::program::SetId(77)],
                    ..Side::default()
                },
                ..Match::default()
            },
            policy: 0,
            index: 0,
        }],
        end: TierEnd::Deny,
    });
    let dangling = Update {
        generation: dp.generation() + 1,
        programs: vec![ProgramUpdate {
            endpoint: EndpointKey::new("a", "web"),
            program: Some(program),
        }],
        ..Update::default()
    };
    assert!(matches!(
        dp.apply(&dangling),
        Err(ApplyError::MissingSet { .. })
    ));
    assert!(
        dp.endpoint(&EndpointKey::new("a", "web"))
            .unwrap()
            .program
            .ingress
            .tiers
            .is_empty()
    );
    // The wire format round-trips.
    let json = serde_json::to_string(&lab.c.snapshot()).unwrap();
    let back: Update = serde_json::from_str(&json).unwrap();
    assert_eq!(back, lab.c.snapshot());
}

#[test]
fn an_endpoint_recompiled_to_the_same_program_is_touched_when_a_set_it_reads_changes() {
    let mut lab = Lab::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients, namespace: b}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]}]
"#,
    );
    // cli joins the set its own policy reads: its program is recompiled
    // (its labels changed) to the same rules, and it must still revalidate.
    let u = lab.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: b, labels: {app: cli, role: client}}
spec: {serviceAccountName: robot}
"#,
    );
    assert!(u.programs.is_empty(), "{u:?}");
    assert_eq!(u.touched, vec![EndpointKey::new("b", "cli")]);
    assert_eq!(
        lab.dp
            .endpoint(&EndpointKey::new("b", "cli"))
            .unwrap()
            .generation,
        u.generation
    );
}

#[test]
fn the_dataplane_refuses_to_remove_a_set_a_kept_program_reads() {
    let lab = Lab::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: a}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]
"#,
    );
    let mut dp = lab.dp.clone();
    let db = EndpointKey::new("a", "db");
    let id = dp.endpoint(&db).unwrap().program.sets().next().unwrap();
    let removal = Update {
        generation: dp.generation() + 1,
        sets: vec![crate::program::SetUpdate { id, content: None }],
        ..Update::default()
    };
    assert!(matches!(
        dp.apply(&removal),
        Err(ApplyError::MissingSet { .. })
    ));
    assert!(dp.sets().get(id).is_some());
    let huge = Update {
        generation: dp.generation() + 1,
        sets: vec![crate::program::SetUpdate {
            id: crate::program::SetId(u32::MAX),
            content: None,
        }],
        ..Update::default()
    };
    assert!(matches!(dp.apply(&huge), Err(ApplyError::SetIdTooLarge(_))));
}

#[test]
fn ipv6_endpoints_blocks_and_ip_version() {
    let mut c = Compiler::new();
    let mut dp = PolicyState::default();
    let yaml = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web}}
spec:
  containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: a, labels: {app: cli}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: cli}}}]
    ports: [{port: http}]
  - from: [{ipBlock: {cidr: "fd00:99::/32", except: ["fd00:99:1::/48"]}}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: v4-only-ping}
spec:
  selector: app == "cli"
  ingress:
  - {action: Allow, ipVersion: 4, protocol: ICMP}
  - {action: Allow, ipVersion: 6, protocol: ICMPv6, icmp: {type: 128}}
"#;
    let mut changes: Vec<Change> = parse_documents(yaml)
        .unwrap()
        .into_iter()
        .map(Change::Apply)
        .collect();
    for (name, addrs) in [
        ("web", ["10.0.0.1", "fd00::1"]),
        ("cli", ["10.0.0.2", "fd00::2"]),
    ] {
        changes.push(Change::Endpoint(
            EndpointKey::new("a", name),
            Some(EndpointInfo {
                addrs: addrs.iter().map(|a| ip(a)).collect(),
                local: true,
            }),
        ));
    }
    dp.apply(&c.apply(changes)).unwrap();
    let web = EndpointKey::new("a", "web");
    let cli = EndpointKey::new("a", "cli");
    let tcp = |s: &str, d: &str, port| Packet::ported(ip(s), ip(d), 6, 40000, port);
    let ingress = |k: &EndpointKey, p: &Packet| dp.classify(k, Direction::Ingress, p).allow;
    // cli → web on the named port, over IPv6 as over IPv4.
    assert!(ingress(&web, &tcp("fd00::2", "fd00::1", 8080)));
    assert!(ingress(&web, &tcp("10.0.0.2", "10.0.0.1", 8080)));
    assert!(!ingress(&web, &tcp("fd00::2", "fd00::1", 80)));
    // The IPv6 block, minus its exception.
    assert!(ingress(&web, &tcp("fd00:99:2::5", "fd00::1", 1)));
    assert!(!ingress(&web, &tcp("fd00:99:1::5", "fd00::1", 1)));
    // An address that is no pod's does not match the pod selector.
    assert!(!ingress(&web, &tcp("fd00:98::1", "fd00::1", 8080)));
    // ipVersion and ICMPv6 type.
    let icmp = |s: &str, d: &str, proto: u8, t: u8| Packet {
        src: ip(s),
        dst: ip(d),
        protocol: proto,
        src_port: 0,
        dst_port: 0,
        icmp: Some((t, 0)),
    };
    assert!(ingress(&cli, &icmp("10.0.0.1", "10.0.0.2", 1, 8)));
    assert!(ingress(&cli, &icmp("fd00::1", "fd00::2", 58, 128)));
    assert!(!ingress(&cli, &icmp("fd00::1", "fd00::2", 58, 129)));
    assert!(!ingress(&cli, &icmp("fd00::1", "fd00::2", 1, 8)));
}
