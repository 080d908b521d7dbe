//! The source against recorded API traffic: no API server runs here, so a
//! scripted responder (`api_server/mod.rs`) plays what one sends: lists, watch
//! streams with ADDED/MODIFIED/DELETED, BOOKMARK, a `410 Gone` ERROR event
//! and the relist that must follow. Asserted: the events the source emits,
//! the requests it makes (the watch resumes from the bookmark's version),
//! and the IPAM releases the events cause through `brindle_ipam::gc`.

mod api_server;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use api_server::{ApiServer, Response};
use brindle_api::ipam::{Attributes, HandleId, HandleView};
use brindle_ipam::gc::{Collector, Liveness};
use brindle_kube::{Cluster, Counters, Feed, KubeEvent};
use brindle_policy::resource::{Kind, Resource, ResourceKey};
use serde_json::{Value, json};

const PODS: &str = "/api/v1/pods";
const NODES: &str = "/api/v1/nodes";
const NAMESPACES: &str = "/api/v1/namespaces";
const POLICIES: &str = "/apis/networking.k8s.io/v1/networkpolicies";

fn pod(name: &str, rv: &str, app: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                     "resourceVersion": rv, "labels": {"app": app},
                     "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"nodeName": "n1", "serviceAccountName": "default",
                 "containers": [{"name": "c", "image": "nginx",
                                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    })
}

/// As a watch event carries it: with `apiVersion` and `kind`.
fn typed(mut object: Value, kind: &str, api_version: &str) -> Value {
    object["kind"] = kind.into();
    object["apiVersion"] = api_version.into();
    object
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn list(kind: &str, rv: &str, items: Vec<Value>) -> Response {
    Response::List(
        json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}),
    )
}

fn node(name: &str, rv: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]}
    })
}

fn pod_key(name: &str) -> ResourceKey {
    ResourceKey {
        kind: Kind::Pod,
        namespace: Some("shop".into()),
        name: name.into(),
    }
}

fn script(api: &ApiServer) {
    // Pods: a list, a watch that adds, modifies, bookmarks and ends; a
    // watch resumed from the bookmark that deletes, then 410 Gone; the
    // relist (pod c went away unseen, d came); an idle watch.
    api.push(
        PODS,
        false,
        list(
            "PodList",
            "100",
            vec![
                pod("a", "90", "web", "10.244.0.1"),
                pod("b", "91", "db", "10.244.0.2"),
            ],
        ),
    );
    api.push(
        PODS,
        true,
        Response::Watch(vec![
            event(
                "ADDED",
                typed(pod("c", "101", "web", "10.244.0.3"), "Pod", "v1"),
            ),
            event(
                "MODIFIED",
                typed(pod("a", "102", "shop", "10.244.0.1"), "Pod", "v1"),
            ),
            event(
                "BOOKMARK",
                json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "150",
              "annotations": {"k8s.io/initial-events-end": "true"}}}),
            ),
        ]),
    );
    api.push(
        PODS,
        true,
        Response::Watch(vec![
            event(
                "DELETED",
                typed(pod("b", "151", "db", "10.244.0.2"), "Pod", "v1"),
            ),
            event(
                "ERROR",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "too old resource version: 151 (180)", "reason": "Expired", "code": 410}),
            ),
        ]),
    );
    api.push(
        PODS,
        false,
        list(
            "PodList",
            "200",
            vec![
                pod("a", "102", "shop", "10.244.0.1"),
                pod("d", "190", "web", "10.244.0.4"),
            ],
        ),
    );
    // Nodes: this node and another; the other is deleted.
    api.push(
        NODES,
        false,
        list(
            "NodeList",
            "50",
            vec![
                node("n1", "40", "10.99.0.11"),
                node("n2", "41", "10.99.0.12"),
            ],
        ),
    );
    api.push(
        NODES,
        true,
        Response::Watch(vec![event(
            "DELETED",
            typed(node("n2", "51", "10.99.0.12"), "Node", "v1"),
        )]),
    );
    // Namespaces and one policy: listed, then idle.
    api.push(NAMESPACES, false, list("NamespaceList", "60", vec![
        json!({"metadata": {"name": "shop", "resourceVersion": "5", "labels": {"kubernetes.io/metadata.name": "shop", "team": "a"}},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
    ]));
    api.push(POLICIES, false, Response::List(json!({"kind": "NetworkPolicyList", "apiVersion": "networking.k8s.io/v1",
        "metadata": {"resourceVersion": "70"}, "items": [
        {"metadata": {"name": "web-from-shop", "namespace": "shop", "resourceVersion": "7", "generation": 1},
         "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
                               "ports": [{"protocol": "TCP", "port": "http"}, {"protocol": "TCP", "port": 9000, "endPort": 9100}]}]}}]})));
}

async fn client(url: &str) -> kube::Client {
    let mut config = kube::Config::new(url.parse().unwrap());
    brindle_kube::config::with_timeouts(&mut config);
    kube::Client::try_from(config).unwrap()
}

/// Takes events until `done` says the sequence is complete (a generous
/// bound guards a hang; nothing is asserted on time).
async fn collect(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<KubeEvent>,
    done: impl Fn(&[KubeEvent]) -> bool,
) -> Vec<KubeEvent> {
    let mut got = Vec::new();
    while !done(&got) {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(e)) => got.push(e),
            _ => panic!("the source stopped; events so far: {got:#?}"),
        }
    }
    got
}

fn pods_of(events: &[KubeEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            KubeEvent::Apply(Resource::Pod(p)) => Some(format!(
                "apply {} app={}",
                p.metadata.name, p.metadata.labels["app"]
            )),
            KubeEvent::Delete(k) if k.kind == Kind::Pod => Some(format!("delete {}", k.name)),
            KubeEvent::Synced(Feed::Pods) => Some("synced".into()),
            _ => None,
        })
        .collect()
}

fn handle(node: &str, pod: &str, ip: &str) -> HandleView {
    HandleView {
        handle: HandleId {
            network: "k8s-pod-network".into(),
            container_id: format!("ctr-{pod}"),
            ifname: "eth0".into(),
        },
        attrs: Attributes {
            node: node.into(),
            namespace: Some("shop".into()),
            pod: Some(pod.into()),
        },
        addresses: vec![ip.parse::<IpAddr>().unwrap()],
    }
}

#[tokio::test]
async fn watch_bookmark_gone_and_relist_become_net_changes_and_releases() {
    let api = ApiServer::default();
    script(&api);
    let url = api.start().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let source = tokio::spawn(brindle_kube::run(
        client(&url).await,
        counters.clone(),
        move |e| tx.send(e).is_ok(),
    ));

    let mut cluster = Cluster::new("n1");
    let mut collector = Collector::new(Duration::from_secs(60));
    let mut handles = vec![
        handle("n1", "a", "10.244.0.1"),
        handle("n1", "b", "10.244.0.2"),
        handle("n1", "c", "10.244.0.3"),
        handle("n2", "x", "10.244.1.9"),
    ];
    let endpoints = BTreeSet::new(); // every endpoint of this node is gone
    let blocks = BTreeSet::from(["n1".to_owned(), "n2".to_owned()]);
    let plan = |cluster: &Cluster, collector: &mut Collector, handles: &[HandleView], now: u64| {
        // Nodes deleted from the API are not live, whatever their lease.
        let live: BTreeSet<String> = ["n1", "n2"]
            .into_iter()
            .filter(|n| cluster.node_deleted(n) != Some(true))
            .map(str::to_owned)
            .collect();
        let live = Liveness {
            node: "n1",
            endpoints: &endpoints,
            pods: cluster.pods(),
            live_nodes: &live,
        };
        collector.plan(handles, &blocks, &live, now)
    };

    // Before any list: no pod source yet, so nothing may be said to be gone.
    assert_eq!(cluster.pods(), None);

    // The first lists, the first watch (with its bookmark) and the delete.
    let first = collect(&mut rx, |got| {
        pods_of(got).contains(&"delete b".to_owned())
            && got.contains(&KubeEvent::NodeDelete("n2".into()))
            && got.contains(&KubeEvent::Synced(Feed::NetworkPolicies))
            && got.contains(&KubeEvent::Synced(Feed::Namespaces))
    })
    .await;
    assert_eq!(
        pods_of(&first),
        [
            "apply a app=web",
            "apply b app=db",
            "synced",
            "apply c app=web",
            "apply a app=shop",
            "delete b"
        ]
    );
    for e in &first {
        cluster.apply(e);
    }
    let n1 = cluster.this_node().expect("this node");
    assert_eq!(n1.internal_ips, ["10.99.0.11".parse::<IpAddr>().unwrap()]);
    assert_eq!(n1.pod_cidrs, ["10.244.1.0/24"]);
    assert_eq!(cluster.node_deleted("n2"), Some(true));
    let a = cluster.resources().find_map(|r| match r {
        Resource::Pod(p) if p.metadata.name == "a" => Some(p.clone()),
        _ => None,
    });
    let a = a.expect("pod a");
    assert_eq!(a.named_ports().len(), 1, "the named port http");
    assert_eq!(a.named_ports()[0].port, 8080);
    let kinds: BTreeSet<Kind> = cluster.resources().map(Resource::kind).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([Kind::Namespace, Kind::Pod, Kind::KubernetesNetworkPolicy])
    );
    let ns = first.iter().find_map(|e| match e {
        KubeEvent::Apply(Resource::Namespace(n)) => Some(n.metadata.labels["team"].clone()),
        _ => None,
    });
    assert_eq!(ns.as_deref(), Some("a"));

    // Releases: pod b's handle and the deleted node's waited the grace
    // period; a's and c's pods exist, so theirs are kept.
    assert_eq!(plan(&cluster, &mut collector, &handles, 1_000).leaked, []);
    let p = plan(&cluster, &mut collector, &handles, 61_000);
    assert_eq!(p.leaked, [handles[1].handle.clone()]);
    assert_eq!(p.dead_nodes, BTreeSet::from(["n2".to_owned()]));
    assert_eq!(p.kept_for_pod.len(), 2);
    // What the daemon's collect() then releases is gone from the store.
    handles.retain(|h| !p.leaked.contains(&h.handle) && !p.dead_nodes.contains(&h.attrs.node));

    // 410 Gone: the watcher relists; c vanished while no watch was open,
    // d appeared. The relist turns into a delete and an apply.
    let second = collect(&mut rx, |got| pods_of(got).contains(&"synced".to_owned())).await;
    assert_eq!(pods_of(&second), ["delete c", "apply d app=web", "synced"]);
    assert!(second.contains(&KubeEvent::Delete(pod_key("c"))));
    for e in &second {
        cluster.apply(e);
    }
    let pods: Vec<&str> = cluster
        .pods()
        .unwrap()
        .iter()
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(pods, ["a", "d"]);
    // c's handle now starts its grace period: released a grace later.
    assert!(
        plan(&cluster, &mut collector, &handles, 62_000)
            .leaked
            .is_empty()
    );
    let c = handles
        .iter()
        .find(|h| h.attrs.pod.as_deref() == Some("c"))
        .unwrap()
        .handle
        .clone();
    assert_eq!(
        plan(&cluster, &mut collector, &handles, 122_000).leaked,
        [c]
    );

    // The requests: the second watch resumed from the bookmark's version,
    // and the 410 was followed by a list.
    // (The watch after the relist is requested after its events: wait.)
    for _ in 0..600 {
        if api
            .requests()
            .iter()
            .filter(|r| r.starts_with(PODS))
            .count()
            >= 5
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reqs = api.requests();
    let pods: Vec<&String> = reqs.iter().filter(|r| r.starts_with(PODS)).collect();
    assert_eq!(
        pods.len(),
        5,
        "list, watch, watch, relist, watch: {pods:#?}"
    );
    assert!(!pods[0].contains("watch=true") && pods[1].contains("resourceVersion=100"));
    assert!(
        pods[2].contains("watch=true") && pods[2].contains("resourceVersion=150"),
        "{}",
        pods[2]
    );
    assert!(
        !pods[3].contains("watch=true"),
        "a relist after 410: {}",
        pods[3]
    );
    assert!(pods[4].contains("resourceVersion=200"));
    assert!(
        pods.iter()
            .filter(|r| r.contains("watch=true"))
            .all(|r| r.contains("allowWatchBookmarks=true"))
    );
    assert_eq!(
        counters
            .watch_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the 410"
    );
    assert_eq!(
        counters.dropped.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    source.abort();
}

#[tokio::test]
async fn events_round_trip_through_json_for_recording() {
    let r = Resource::from_value(typed(pod("a", "1", "web", "10.244.0.1"), "Pod", "v1")).unwrap();
    for e in [
        KubeEvent::Apply(r),
        KubeEvent::Delete(pod_key("a")),
        KubeEvent::NodeDelete("n2".into()),
        KubeEvent::Synced(Feed::Pods),
    ] {
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(
            serde_json::from_str::<KubeEvent>(&text).unwrap(),
            e,
            "{text}"
        );
    }
}
