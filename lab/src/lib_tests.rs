//! Unit tests of the lab library (pure parts: parsing, tables, paths).

use serde_json::{Value, json};

use super::*;

fn cfg(nodes: u8, subnets: u8, encap: &str) -> LabConfig {
    LabConfig {
        nodes,
        subnets,
        encap: encap.into(),
        ..LabConfig::new(PathBuf::new())
    }
}

#[test]
fn the_borrow_lab_needs_three_nodes_and_no_step_that_outgrows_its_pool() {
    let ok = LabConfig {
        borrow: true,
        ..cfg(3, 2, "ipip")
    };
    assert!(ok.check().is_ok());
    for bad in [
        LabConfig {
            nodes: 4,
            ..ok.clone()
        },
        LabConfig {
            density: 10,
            ..ok.clone()
        },
        LabConfig {
            policy_cases: 1,
            ..ok.clone()
        },
        LabConfig {
            pods: 9,
            ..ok.clone()
        },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
    // The pool of two /28 blocks.
    let env = crate::borrow::ctrl_env();
    assert!(env.contains(&("BRINDLE_IPAM_DEFAULT_POOL_CIDR", "10.244.0.0/27".into())));
}

#[test]
fn two_subnets_put_the_last_third_of_the_nodes_behind_the_router() {
    let c = cfg(3, 2, "cross-subnet");
    let addrs: Vec<String> = (1..=3).map(|n| c.node_addr(n).to_string()).collect();
    assert_eq!(addrs, ["10.99.0.11", "10.99.0.12", "10.99.1.13"]);
    let c = cfg(6, 2, "ipip");
    let subnets: Vec<u8> = (1..=6).map(|n| c.subnet_of(n)).collect();
    assert_eq!(subnets, [0, 0, 0, 0, 1, 1]);
    let c = cfg(3, 1, "ipip");
    assert!((1..=3).all(|n| c.subnet_of(n) == 0));
}

#[test]
fn cross_subnet_is_native_within_a_subnet_and_ipip_across_the_router() {
    let c = cfg(3, 2, "cross-subnet");
    assert_eq!(c.expected_path(1, 2), "native");
    assert_eq!(c.expected_path(2, 1), "native");
    assert_eq!(c.expected_path(1, 3), "ipip");
    assert_eq!(c.expected_path(3, 2), "ipip");
    assert_eq!(cfg(3, 2, "vxlan").expected_path(1, 2), "vxlan");
    assert_eq!(cfg(3, 1, "none").expected_path(1, 3), "native");
}

#[test]
fn native_routing_across_the_router_is_refused() {
    assert!(cfg(3, 2, "none").check().is_err());
    assert!(cfg(3, 1, "none").check().is_ok());
    assert!(cfg(3, 2, "geneve").check().is_err());
}

#[test]
fn the_path_comes_from_the_route_naming_the_node() {
    let c = cfg(3, 2, "cross-subnet");
    let routes: Vec<Value> = serde_json::from_value(json!([
        {"prefix": "10.244.1.0/26", "target": {"kind": "gateway", "via": "10.99.0.12", "port": "eth0"}},
        {"prefix": "10.244.2.0/26", "target": {"kind": "encap", "encap": "ipip", "remote": "10.99.1.13"}},
        {"prefix": "10.244.0.1/32", "target": {"kind": "local", "port": "bri0"}}
    ]))
    .unwrap();
    assert_eq!(
        path_to(&c, &routes, 2),
        (
            "native".into(),
            "10.244.1.0/26 native via 10.99.0.12 (eth0)".into()
        )
    );
    assert_eq!(
        path_to(&c, &routes, 3),
        ("ipip".into(), "10.244.2.0/26 ipip to 10.99.1.13".into())
    );
    assert_eq!(path_to(&c, &routes, 1).0, "missing");
}

#[test]
fn counters_are_summed_over_workers_and_drops_keyed_by_reason() {
    let sums = worker_counters(
        "# HELP brindle_vrouter_worker_encap_ipip_total IPIP\n\
         brindle_vrouter_worker_encap_ipip_total{worker=\"0\"} 2\n\
         brindle_vrouter_worker_encap_ipip_total{worker=\"1\"} 3\n\
         brindle_vrouter_worker_rx_packets_total{worker=\"1\"} 9\n\
         brindle_vrouter_worker_drops_total{worker=\"1\",reason=\"not_for_us\"} 1\n\
         brindle_vrouter_port_rx_packets_total{port=\"eth0\",worker=\"0\"} 7\n",
    );
    assert_eq!(sums.get("encap_ipip"), Some(&5));
    assert_eq!(sums.get("drop:not_for_us"), Some(&1));
    assert_eq!(sums.len(), 2, "{sums:?}");
}
