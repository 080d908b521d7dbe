//! Fuzz target: the resource parser (multi-document YAML, JSON, Lists).
//! Whatever parses and validates must round-trip through its stored JSON
//! value and compile without panicking, with two endpoints present.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::{Resource, parse_documents};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(resources) = parse_documents(text) else {
        return;
    };
    // What is stored (the JSON value) reads back to the same stored form
    // (fields accepted and dropped, such as `status`, are not stored).
    for r in &resources {
        let stored = r.to_value();
        let back = Resource::from_value(stored.clone()).expect("a stored resource reads back");
        assert_eq!(back.to_value(), stored);
    }
    let mut c = Compiler::new();
    let mut changes: Vec<Change> = resources.into_iter().map(Change::Apply).collect();
    for (i, ns) in ["default", "a"].into_iter().enumerate() {
        changes.push(Change::Endpoint(
            EndpointKey::new(ns, "p"),
            Some(EndpointInfo {
                addrs: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1))],
                local: true,
            }),
        ));
    }
    let update = c.apply(changes);
    let mut dp = brindle_policy::classify::PolicyState::default();
    if !update.is_empty() {
        dp.apply(&update).expect("the compiler's update applies");
    }
});
