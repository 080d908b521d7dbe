//! The automatic GC (`brindle_ipam::gc`) on real stores: the embedded redb
//! store and a real etcd. One scenario: two live nodes and a dead one; a
//! leaked handle, a handle whose endpoint is gone but whose pod lives, a
//! dead node's handles and blocks. What is released, what is kept, and that
//! the datastore stays consistent (the allocator's audit).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use brindle_api::ipam::Attributes;
use brindle_ipam::gc::{Collector, Liveness, Release};
use brindle_ipam::model::Pool;
use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore};
use brindle_ipam::{AllocateArgs, Ipam};
use common::handle;

fn alloc(i: &Ipam<&dyn Datastore>, c: &str, node: &str, pod: &str) {
    let mut args = AllocateArgs::v4(handle(c), node);
    args.attrs = Attributes {
        namespace: Some("ns".into()),
        pod: Some(pod.into()),
        node: node.into(),
    };
    i.allocate(&args).unwrap();
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

fn scenario(store: &dyn Datastore, prefix: &str) {
    let i = Ipam::new(store, prefix);
    let mut pool = Pool::new("p", "10.0.0.0/24".parse().unwrap());
    pool.block_size = Some(28);
    i.put_pool(&pool).unwrap();
    // n1 (this node): c-live has its endpoint; c-leak lost endpoint and pod;
    // c-podlives lost its endpoint but its pod still exists.
    alloc(&i, "c-live", "n1", "live");
    alloc(&i, "c-leak", "n1", "leak");
    alloc(&i, "c-podlives", "n1", "podlives");
    // n2: alive, its handle is none of n1's business.
    alloc(&i, "c-n2", "n2", "on-n2");
    // dead: no lease; two pods, both gone.
    alloc(&i, "c-dead1", "dead", "d1");
    alloc(&i, "c-dead2", "dead", "d2");
    assert_eq!(i.blocks().unwrap().len(), 3);

    let endpoints = BTreeSet::from([pair("c-live", "eth0")]);
    let pods = BTreeSet::from([
        pair("ns", "live"),
        pair("ns", "podlives"),
        pair("ns", "on-n2"),
    ]);
    let live_nodes = BTreeSet::from(["n1".to_owned(), "n2".to_owned()]);
    let live = Liveness {
        node: "n1",
        endpoints: &endpoints,
        pods: Some(&pods),
        live_nodes: &live_nodes,
    };
    let mut gc = Collector::new(Duration::from_secs(30));

    // Within the grace: nothing goes.
    let (plan, released) = gc.collect(&i, &live, 0).unwrap();
    assert!(released.is_empty(), "{released:?}");
    assert_eq!(plan.kept_for_pod, [handle("c-podlives")]);
    let (_, released) = gc.collect(&i, &live, 29_999).unwrap();
    assert!(released.is_empty(), "{released:?}");

    // After it: the leaked handle, the dead node's handles and its now
    // empty block; nothing else.
    let (_, released) = gc.collect(&i, &live, 30_000).unwrap();
    let kinds: Vec<&str> = released.iter().map(Release::kind).collect();
    assert_eq!(
        kinds,
        [
            "leaked_handle",
            "dead_node_handle",
            "dead_node_handle",
            "dead_node_block"
        ],
        "{released:?}"
    );
    match &released[0] {
        Release::LeakedHandle {
            handle: h,
            pod,
            addresses,
        } => {
            assert_eq!(h, &handle("c-leak"));
            assert_eq!(pod, &Some(pair("ns", "leak")));
            assert_eq!(addresses.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    let left: BTreeSet<String> = i
        .handles()
        .unwrap()
        .into_iter()
        .map(|h| h.handle.container_id)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from(["c-live".into(), "c-podlives".into(), "c-n2".into()])
    );
    let owners: BTreeSet<Option<String>> = i
        .blocks()
        .unwrap()
        .into_iter()
        .map(|b| b.affinity)
        .collect();
    assert_eq!(
        owners,
        BTreeSet::from([Some("n1".to_owned()), Some("n2".to_owned())])
    );
    assert!(i.audit().unwrap().is_empty(), "{:?}", i.audit());

    // A later pass finds nothing more; the live pod's address stays.
    let (_, released) = gc.collect(&i, &live, 1_000_000).unwrap();
    assert!(released.is_empty(), "{released:?}");
    assert!(i.query_handle(&handle("c-podlives")).unwrap().is_some());
}

#[test]
fn gc_on_the_embedded_store_releases_leaks_and_dead_nodes_and_keeps_live_pods() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(
        dir.path().join("gc.redb"),
        EmbeddedMode::Exclusive,
        Duration::from_secs(10),
    )
    .unwrap();
    scenario(&store, &common::unique_prefix("gc"));
}

#[test]
fn gc_on_a_real_etcd_releases_leaks_and_dead_nodes_and_keeps_live_pods() {
    let cluster = common::etcd::EtcdCluster::start(1);
    let store = cluster.store();
    scenario(&store, &common::unique_prefix("gc"));
}
