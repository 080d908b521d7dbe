use super::calico::{Action, Port, Protocol, infer_types};
use super::*;

const MIXED: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {team: a}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: prod
  labels: {app: web}
  uid: 0b5e7f   # dropped
spec:
  serviceAccountName: web-sa
  containers:
  - name: nginx
    image: nginx:1.27          # ignored: not policy's business
    ports:
    - {name: http, containerPort: 8080}
    - {name: dns, containerPort: 53, protocol: UDP}
    - {containerPort: 9000}
status:
  podIP: 10.0.0.5
  podIPs: [{ip: 10.0.0.5}, {ip: "fd00::5"}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web}
spec:
  podSelector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: tier, operator: NotIn, values: [db]}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: a}}
      podSelector: {}
    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.1.0/24]}
    ports:
    - {port: http}
    - {protocol: UDP, port: 1000, endPort: 2000}
---
# an empty document is skipped
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.block}
spec:
  tier: security
  order: 10
  selector: app == 'web' || has(legacy)
  namespaceSelector: team in {'a', 'b'}
  egress:
  - action: Deny
    protocol: TCP
    destination:
      nets: [10.1.0.0/16]
      ports: [22, "8000:8080", http]
  - action: Pass
    protocol: ICMP
    icmp: {type: 8, code: 0}
  - action: Allow
    destination:
      selector: role == 'db'
      namespaceSelector: global()
      serviceAccounts: {names: [db-sa], selector: "x == 'y'"}
---
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100, defaultAction: Pass}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {name: outside, labels: {role: db}}
spec: {nets: [203.0.113.0/24, 198.51.100.7]}
"#;

#[test]
fn a_multi_document_file_yields_every_kind_with_defaults_applied() {
    let rs = parse_documents(MIXED).unwrap();
    let kinds: Vec<Kind> = rs.iter().map(Resource::kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::Namespace,
            Kind::Pod,
            Kind::KubernetesNetworkPolicy,
            Kind::GlobalNetworkPolicy,
            Kind::Tier,
            Kind::GlobalNetworkSet
        ]
    );
    let Resource::Pod(pod) = &rs[1] else { panic!() };
    assert_eq!(pod.service_account(), "web-sa");
    let names: Vec<_> = pod
        .named_ports()
        .into_iter()
        .map(|p| (p.name, p.protocol, p.port))
        .collect();
    assert_eq!(names, [("dns".into(), 17, 53), ("http".into(), 6, 8080)]);
    assert_eq!(pod.addresses().len(), 2);
    let Resource::KubernetesNetworkPolicy(np) = &rs[2] else {
        panic!()
    };
    assert_eq!(
        np.metadata.namespace(),
        "default",
        "kubectl's default namespace"
    );
    assert_eq!(np.spec.applies(), (true, false));
    assert_eq!(
        np.spec.pod_selector.to_selector().to_string(),
        "app == \"web\" && tier not in {\"db\"}"
    );
    let Resource::GlobalNetworkPolicy(gnp) = &rs[3] else {
        panic!()
    };
    let egress = gnp.spec.egress.as_deref().unwrap();
    assert_eq!(egress[0].protocol, Some(Protocol::TCP));
    assert_eq!(
        egress[0].destination.ports,
        [
            Port::Range(22, 22),
            Port::Range(8000, 8080),
            Port::Named("http".into())
        ]
    );
    assert_eq!(egress[1].action, Action::Pass);
    let Resource::Tier(tier) = &rs[4] else {
        panic!()
    };
    assert!(tier.passes_by_default());
    let Resource::GlobalNetworkSet(set) = &rs[5] else {
        panic!()
    };
    assert_eq!(set.nets().len(), 2);
    assert_eq!(set.nets()[1].to_string(), "198.51.100.7/32");
}

#[test]
fn json_comes_as_one_object_a_stream_an_array_or_a_list() {
    let ns = |n: &str| {
        format!(r#"{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{n}"}}}}"#)
    };
    let one = parse_documents(&ns("a")).unwrap();
    assert_eq!(one.len(), 1);
    let stream = parse_documents(&format!("{}\n{}", ns("a"), ns("b"))).unwrap();
    assert_eq!(stream.len(), 2);
    let array = parse_documents(&format!("[{}, {}]", ns("a"), ns("b"))).unwrap();
    assert_eq!(array.len(), 2);
    let list = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}, {}]}}"#,
        ns("a"),
        ns("b")
    );
    assert_eq!(parse_documents(&list).unwrap().len(), 2);
    // A typed list whose items leave out their type.
    let typed = r#"{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicyList",
        "items":[{"metadata":{"name":"x","namespace":"n"},"spec":{"podSelector":{}}}]}"#;
    let rs = parse_documents(typed).unwrap();
    assert_eq!(rs[0].key().to_string(), "NetworkPolicy n/x");
}

#[test]
fn a_yaml_list_kind_is_flattened_too() {
    let text = "apiVersion: projectcalico.org/v3\nkind: TierList\nitems:\n- metadata: {name: a}\n  spec: {order: 1}\n- metadata: {name: b}\n";
    let rs = parse_documents(text).unwrap();
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[1].kind(), Kind::Tier);
}

fn error_of(text: &str) -> String {
    parse_documents(text).unwrap_err().to_string()
}

#[test]
fn mistakes_are_reported_with_document_kind_name_and_field() {
    let e = error_of(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podselector: {}}\n",
    );
    assert!(
        e.starts_with("document 2 (NetworkPolicy p): unknown field `podselector`"),
        "{e}"
    );
    let e = error_of("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n");
    assert!(
        e.contains("unsupported kind Deployment (apiVersion apps/v1)"),
        "{e}"
    );
    let e = error_of("kind: Pod\n");
    assert!(e.contains("missing apiVersion"), "{e}");
    let e = error_of("a: [\n");
    assert!(e.starts_with("document 1:"), "{e}");
    let e = error_of(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: n}
spec:
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16, 10.0.0.0/8]}
      podSelector: {}
    - {}
    ports:
    - {port: 80, endPort: 70}
    - {port: HTTP}
    - {port: web, endPort: 90}
  policyTypes: [Ingress, Ingress]
"#,
    );
    for want in [
        "NetworkPolicy n/bad is invalid",
        "spec.ingress[0].ports[0].endPort: 70 is below port 80",
        "spec.ingress[0].ports[1].port: \"HTTP\" is not a port name",
        "spec.ingress[0].ports[2].endPort: needs a numeric port",
        "spec.ingress[0].from[0]: ipBlock may not be combined",
        "spec.ingress[0].from[0].ipBlock.except[0]: 11.0.0.0/16 must be a strict subset of 10.0.0.0/8",
        "spec.ingress[0].from[0].ipBlock.except[1]: 10.0.0.0/8 must be a strict subset",
        "spec.ingress[0].from[1]: needs one of podSelector",
        "spec.policyTypes: may hold Ingress and Egress once each",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
}

#[test]
fn calico_rules_are_checked_like_calicos_validator() {
    let e = error_of(
        r#"
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: bad, namespace: n}
spec:
  selector: "app = 'x'"
  ingress:
  - action: Allow
    destination: {ports: [80]}
  - action: Allow
    protocol: TCP
    icmp: {code: 1}
  - action: Deny
    ipVersion: 6
    protocol: ICMP
    source: {nets: [10.0.0.0/8], selector: "global()"}
  - action: Allow
    protocol: TCP
    http: {methods: [GET]}
    destination: {ports: ["90:80"]}
"#,
    );
    assert!(
        e.contains("document 1 (NetworkPolicy n/bad): port range \"90:80\" has min above max"),
        "{e}"
    );
    let e = error_of(
        r#"
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: bad, namespace: n}
spec:
  selector: "app = 'x'"
  ingress:
  - action: Allow
    destination: {ports: [80]}
  - action: Allow
    protocol: TCP
    icmp: {code: 1}
  - action: Deny
    ipVersion: 6
    protocol: ICMP
    source: {nets: [10.0.0.0/8], selector: "global()"}
  - action: Allow
    protocol: TCP
    http: {methods: [GET]}
"#,
    );
    for want in [
        "spec.selector: selector error at byte 4: expected \"==\"",
        "spec.ingress[0].destination: ports and notPorts need the rule's protocol",
        "spec.ingress[1].icmp: needs protocol ICMP or ICMPv6",
        "spec.ingress[1].icmp.code: needs a type",
        "spec.ingress[2].protocol: ICMP needs ipVersion 4",
        "spec.ingress[2].source.nets[0]: 10.0.0.0/8 is IPv4 but the rule's ipVersion is 6",
        "spec.ingress[2].source.selector: global() is only valid in a rule's namespaceSelector",
        "spec.ingress[3].http: HTTP matches are not supported",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
    let e = error_of(
        "apiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: default}\nspec: {order: 5, defaultAction: Allow}\n",
    );
    assert!(
        e.contains("spec.defaultAction: Allow is not Deny or Pass"),
        "{e}"
    );
    assert!(
        e.contains("spec.order: the default tier's order is 1000000"),
        "{e}"
    );
    let e = error_of(
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: Bad_Name}\nspec: {preDNAT: true}\n",
    );
    assert!(
        e.contains("metadata.name: \"Bad_Name\" is not a DNS-1123 subdomain"),
        "{e}"
    );
    assert!(
        e.contains("spec.preDNAT: host-endpoint policy options are not supported"),
        "{e}"
    );
}

#[test]
fn types_and_policy_types_default_as_the_apis_say() {
    let rule = calico::Rule {
        action: Action::Allow,
        ip_version: None,
        protocol: None,
        not_protocol: None,
        icmp: None,
        not_icmp: None,
        source: Default::default(),
        destination: Default::default(),
        http: None,
        metadata: None,
    };
    let r = std::slice::from_ref(&rule);
    assert_eq!(infer_types(None, &[], &[]), (true, false));
    assert_eq!(infer_types(None, r, &[]), (true, false));
    assert_eq!(infer_types(None, &[], r), (false, true));
    assert_eq!(infer_types(None, r, r), (true, true));
    assert_eq!(
        infer_types(Some(&[k8s::PolicyType::Egress]), r, &[]),
        (false, true)
    );
    let mut spec = k8s::NetworkPolicySpec::default();
    assert_eq!(spec.applies(), (true, false));
    spec.egress = Some(vec![]);
    assert_eq!(
        spec.applies(),
        (true, false),
        "an empty egress list is no egress section"
    );
    spec.egress = Some(vec![Default::default()]);
    assert_eq!(spec.applies(), (true, true));
    spec.policy_types = Some(vec![k8s::PolicyType::Egress]);
    assert_eq!(spec.applies(), (false, true));
}

#[test]
fn every_resource_survives_a_round_trip_through_its_value() {
    for r in parse_documents(MIXED).unwrap() {
        let v = r.to_value();
        let back = Resource::from_value(v.clone()).unwrap();
        assert_eq!(back, r, "{v}");
        // And through YAML text, as `get -o yaml` then `apply` would.
        let yaml = serde_norway::to_string(&v).unwrap();
        let again = parse_documents(&yaml).unwrap();
        assert_eq!(again, [r]);
    }
}
