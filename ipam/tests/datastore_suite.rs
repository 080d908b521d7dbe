//! The shared datastore suite on every backend: memory, embedded (redb, in
//! both modes) and a real etcd.

mod common;

use std::time::Duration;

use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore, MemoryStore};

#[test]
fn the_shared_suite_passes_on_the_memory_store() {
    common::suite::run_all(|name| {
        (
            Box::new(MemoryStore::new()) as Box<dyn Datastore>,
            common::unique_prefix(name),
        )
    });
}

#[test]
fn the_shared_suite_passes_on_the_embedded_store_in_shared_mode() {
    let dir = tempfile::tempdir().unwrap();
    common::suite::run_all(|name| {
        let store = EmbeddedStore::open(
            dir.path().join(format!("{name}.redb")),
            EmbeddedMode::Shared,
            Duration::from_secs(10),
        )
        .unwrap();
        (
            Box::new(store) as Box<dyn Datastore>,
            common::unique_prefix(name),
        )
    });
}

#[test]
fn the_shared_suite_passes_on_the_embedded_store_in_exclusive_mode() {
    let dir = tempfile::tempdir().unwrap();
    common::suite::run_all(|name| {
        let store = EmbeddedStore::open(
            dir.path().join(format!("{name}.redb")),
            EmbeddedMode::Exclusive,
            Duration::from_secs(10),
        )
        .unwrap();
        (
            Box::new(store) as Box<dyn Datastore>,
            common::unique_prefix(name),
        )
    });
}

#[test]
fn the_shared_suite_passes_on_a_real_etcd() {
    let cluster = common::etcd::EtcdCluster::start(1);
    common::suite::run_all(|name| {
        (
            Box::new(cluster.store()) as Box<dyn Datastore>,
            common::unique_prefix(name),
        )
    });
}

#[test]
fn an_exclusive_holder_makes_a_shared_opener_give_up_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let daemon =
        EmbeddedStore::open(&path, EmbeddedMode::Exclusive, Duration::from_secs(1)).unwrap();
    let plugin =
        EmbeddedStore::open(&path, EmbeddedMode::Shared, Duration::from_millis(200)).unwrap();
    match plugin.get("/x") {
        Err(brindle_ipam::store::StoreError::Unavailable(_)) => {}
        other => panic!("expected unavailable, got {other:?}"),
    }
    drop(daemon);
    assert_eq!(
        plugin.get("/x").unwrap(),
        None,
        "usable once the holder is gone"
    );
}
