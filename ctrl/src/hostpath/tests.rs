use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn state(routes: &[&str]) -> HostState {
    HostState {
        port: "brindle0".into(),
        mtu: 1480,
        routes: routes.iter().map(|s| net(s)).collect(),
        nat: NatPools {
            masquerade: [net("10.244.0.0/16")].into(),
            pools: [net("10.244.0.0/16"), net("10.250.0.0/16")].into(),
        },
    }
}

fn kernel_with_port() -> RecordingKernel {
    let mut k = RecordingKernel::default();
    k.links.insert("brindle0".into(), (9, 1500, false));
    k
}

fn routes(k: &RecordingKernel) -> Vec<String> {
    k.routes
        .iter()
        .map(|r| format!("{}@{}", r.prefix, r.ifindex))
        .collect()
}

#[test]
fn the_port_comes_up_with_the_pod_mtu_and_every_pod_prefix_is_routed_into_it() {
    let mut p = HostProgrammer::new(kernel_with_port());
    p.set(state(&[
        "10.244.1.0/26",
        "10.244.0.0/26",
        "10.244.2.7/32",
        "fd00:244::/122",
    ]));
    assert!(p.in_sync());
    let k = p.kernel();
    assert_eq!(k.links["brindle0"], (9, 1480, true));
    assert_eq!(
        routes(k),
        [
            "10.244.0.0/26@9",
            "10.244.1.0/26@9",
            "10.244.2.7/32@9",
            "fd00:244::/122@9"
        ]
    );
    assert_eq!(k.sysctls["net/ipv4/ip_forward"], "1");
    // Off: "loose" drops every source not routed via an addressless port.
    assert_eq!(k.sysctls["net/ipv4/conf/brindle0/rp_filter"], "0");
    assert_eq!(k.sysctls["net/ipv6/conf/all/forwarding"], "1");
    assert_eq!(k.nft.len(), 1);
}

#[test]
fn a_withdrawn_block_is_removed_and_only_changes_are_made() {
    let mut p = HostProgrammer::new(kernel_with_port());
    p.set(state(&["10.244.1.0/26", "10.244.2.0/26"]));
    p.set(state(&["10.244.2.0/26", "10.244.3.0/26"]));
    assert_eq!(routes(p.kernel()), ["10.244.2.0/26@9", "10.244.3.0/26@9"]);
    assert_eq!(
        p.kernel().route_calls,
        [
            "+10.244.1.0/26@9",
            "+10.244.2.0/26@9",
            "-10.244.1.0/26@9",
            "+10.244.3.0/26@9"
        ]
    );
    // The same state again, and a recheck: nothing is done.
    p.set(state(&["10.244.2.0/26", "10.244.3.0/26"]));
    p.reconcile();
    assert_eq!(p.kernel().route_calls.len(), 4);
    assert_eq!(
        p.kernel().nft.len(),
        1,
        "the table is replaced only when it changes"
    );
}

#[test]
fn routes_of_ours_left_by_a_previous_run_go_at_start_and_a_removed_one_comes_back() {
    let mut k = kernel_with_port();
    // A previous run's routes: one still wanted, one not, one on an old
    // brindle0 that was recreated.
    for (p, i) in [
        ("10.244.1.0/26", 9),
        ("10.244.9.0/26", 9),
        ("10.244.2.0/26", 4),
    ] {
        k.routes.insert(KernelRoute {
            prefix: net(p),
            ifindex: i,
        });
    }
    let mut p = HostProgrammer::new(k);
    p.set(state(&["10.244.1.0/26", "10.244.2.0/26"]));
    assert_eq!(routes(p.kernel()), ["10.244.1.0/26@9", "10.244.2.0/26@9"]);
    // Someone deletes one: the next check puts it back.
    p.kernel.routes.remove(&KernelRoute {
        prefix: net("10.244.1.0/26"),
        ifindex: 9,
    });
    p.reconcile();
    assert_eq!(routes(p.kernel()), ["10.244.1.0/26@9", "10.244.2.0/26@9"]);
}

#[test]
fn without_the_port_the_table_is_made_and_the_routes_wait_for_it() {
    let mut p = HostProgrammer::new(RecordingKernel::default());
    p.set(state(&["10.244.1.0/26"]));
    assert!(!p.in_sync());
    assert_eq!(p.kernel().nft.len(), 1);
    assert!(p.kernel().routes.is_empty());
    // The vrouter makes brindle0; the next attempt completes.
    p.kernel.links.insert("brindle0".into(), (12, 1500, false));
    p.reconcile();
    assert!(p.in_sync());
    assert_eq!(routes(p.kernel()), ["10.244.1.0/26@12"]);
    assert_eq!(p.kernel().links["brindle0"], (12, 1480, true));
    assert_eq!(p.kernel().nft.len(), 1);
}

#[test]
fn a_refused_ruleset_is_retried_and_nothing_else_is_programmed_before_it() {
    let mut k = kernel_with_port();
    k.fail_nft = true;
    let mut p = HostProgrammer::new(k);
    p.set(state(&["10.244.1.0/26"]));
    assert!(!p.in_sync());
    assert!(p.kernel().routes.is_empty());
    p.reconcile();
    assert!(p.in_sync());
    assert_eq!(p.kernel().nft.len(), 1);
    assert_eq!(routes(p.kernel()), ["10.244.1.0/26@9"]);
}

#[test]
fn the_ruleset_masquerades_natoutgoing_pools_to_destinations_outside_every_pool() {
    let text = nft::ruleset(&state(&[]).nat);
    assert_eq!(
        text,
        "table inet brindle\n\
         delete table inet brindle\n\
         table inet brindle {\n\
         \tset masq_v4 {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\tauto-merge\n\
         \t\telements = { 10.244.0.0/16 }\n\t}\n\
         \tset pools_v4 {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\tauto-merge\n\
         \t\telements = { 10.244.0.0/16, 10.250.0.0/16 }\n\t}\n\
         \tset masq_v6 {\n\t\ttype ipv6_addr\n\t\tflags interval\n\t\tauto-merge\n\t}\n\
         \tset pools_v6 {\n\t\ttype ipv6_addr\n\t\tflags interval\n\t\tauto-merge\n\t}\n\
         \tchain postrouting {\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr @masq_v4 ip daddr != @pools_v4 masquerade\n\
         \t\tip6 saddr @masq_v6 ip6 daddr != @pools_v6 masquerade\n\
         \t}\n\
         }\n"
    );
}
