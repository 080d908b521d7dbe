//! Test support: the shared datastore suite and real etcd servers.
#![allow(dead_code)]

pub mod etcd;
pub mod suite;

use std::sync::atomic::{AtomicU32, Ordering};

use brindle_api::ipam::HandleId;

/// A unique key prefix per test, so tests can share an etcd.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "/brindle-test/{}-{}-{test}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The handle of container `c` on network `net`, interface eth0.
pub fn handle(c: &str) -> HandleId {
    HandleId {
        network: "net".into(),
        container_id: c.into(),
        ifname: "eth0".into(),
    }
}
