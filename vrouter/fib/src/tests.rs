use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn local(port: PortId) -> NextHop {
    NextHop::Local { port }
}

#[test]
fn empty_fib_finds_no_route() {
    let (fib, r) = Fib::new();
    assert!(fib.is_empty());
    assert_eq!(r.lookup_v4(v4("10.0.0.1")), None);
    assert_eq!(r.lookup_v6(v6("2001:db8::1")), None);
}

#[test]
fn longest_prefix_wins_over_shorter_covering_route() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("10.1.0.0/16"), local(1));
    fib.insert(net("10.1.2.0/24"), local(2));
    fib.insert(net("10.1.2.128/25"), local(3));
    fib.insert(net("10.1.2.192/26"), local(4));
    assert_eq!(r.lookup_v4(v4("10.9.9.9")), Some(NextHop::Blackhole));
    assert_eq!(r.lookup_v4(v4("10.1.9.9")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("10.1.2.127")), Some(local(2)));
    assert_eq!(r.lookup_v4(v4("10.1.2.128")), Some(local(3)));
    assert_eq!(r.lookup_v4(v4("10.1.2.191")), Some(local(3)));
    assert_eq!(r.lookup_v4(v4("10.1.2.192")), Some(local(4)));
    assert_eq!(r.lookup_v4(v4("10.1.2.255")), Some(local(4)));
    assert_eq!(r.lookup_v4(v4("11.0.0.0")), None);
}

#[test]
fn shorter_route_inserted_later_does_not_hide_longer_ones() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.1.2.3/32"), local(3));
    fib.insert(net("10.1.0.0/16"), local(1));
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("0.0.0.0/0"), NextHop::Host);
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(local(3)));
    assert_eq!(r.lookup_v4(v4("10.1.2.4")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("10.2.0.0")), Some(NextHop::Blackhole));
    assert_eq!(r.lookup_v4(v4("192.0.2.1")), Some(NextHop::Host));
}

#[test]
fn default_route_matches_every_address_of_its_family_only() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("0.0.0.0/0"), NextHop::Host);
    for a in ["0.0.0.0", "1.2.3.4", "127.0.0.1", "255.255.255.255"] {
        assert_eq!(r.lookup_v4(v4(a)), Some(NextHop::Host), "{a}");
    }
    assert_eq!(r.lookup_v6(v6("::1")), None);
    fib.insert(net("::/0"), NextHop::Blackhole);
    for a in [
        "::",
        "2001:db8::1",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    ] {
        assert_eq!(r.lookup_v6(v6(a)), Some(NextHop::Blackhole), "{a}");
    }
    assert_eq!(r.lookup_v4(v4("1.2.3.4")), Some(NextHop::Host));
}

#[test]
fn host_route_v4_matches_only_its_address() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.244.1.7/32"), local(7));
    assert_eq!(r.lookup_v4(v4("10.244.1.7")), Some(local(7)));
    assert_eq!(r.lookup_v4(v4("10.244.1.6")), None);
    assert_eq!(r.lookup_v4(v4("10.244.1.8")), None);
    fib.insert(net("255.255.255.255/32"), local(9));
    fib.insert(net("0.0.0.0/32"), local(8));
    assert_eq!(r.lookup_v4(v4("255.255.255.255")), Some(local(9)));
    assert_eq!(r.lookup_v4(v4("255.255.255.254")), None);
    assert_eq!(r.lookup_v4(v4("0.0.0.0")), Some(local(8)));
    assert_eq!(r.lookup_v4(v4("0.0.0.1")), None);
}

#[test]
fn host_route_v6_matches_only_its_address() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("fd00:10:244::7/128"), local(7));
    assert_eq!(r.lookup_v6(v6("fd00:10:244::7")), Some(local(7)));
    assert_eq!(r.lookup_v6(v6("fd00:10:244::6")), None);
    assert_eq!(r.lookup_v6(v6("fd00:10:244::8")), None);
    assert_eq!(r.lookup_v6(v6("fd00:10:244::1:7")), None);
    fib.insert(net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"), local(9));
    assert_eq!(
        r.lookup_v6(v6("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")),
        Some(local(9))
    );
    assert_eq!(
        r.lookup_v6(v6("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")),
        None
    );
}

#[test]
fn removal_falls_back_to_the_covering_route() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("0.0.0.0/0"), NextHop::Host);
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("10.1.2.0/24"), local(2));
    fib.insert(net("10.1.2.3/32"), local(3));
    assert_eq!(fib.remove(&net("10.1.2.3/32")), Some(local(3)));
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(local(2)));
    assert_eq!(fib.remove(&net("10.1.2.0/24")), Some(local(2)));
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(NextHop::Blackhole));
    assert_eq!(fib.remove(&net("10.0.0.0/8")), Some(NextHop::Blackhole));
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(NextHop::Host));
    assert_eq!(fib.remove(&net("0.0.0.0/0")), Some(NextHop::Host));
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), None);
    assert!(fib.is_empty());
}

#[test]
fn removing_a_covering_route_keeps_the_longer_ones() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("10.1.2.128/25"), local(3));
    fib.insert(net("2001:db8::/32"), NextHop::Blackhole);
    fib.insert(net("2001:db8:1::/48"), local(4));
    fib.remove(&net("10.0.0.0/8"));
    fib.remove(&net("2001:db8::/32"));
    assert_eq!(r.lookup_v4(v4("10.1.2.200")), Some(local(3)));
    assert_eq!(r.lookup_v4(v4("10.1.2.100")), None);
    assert_eq!(r.lookup_v6(v6("2001:db8:1::1")), Some(local(4)));
    assert_eq!(r.lookup_v6(v6("2001:db8:2::1")), None);
}

#[test]
fn removing_an_absent_route_changes_nothing() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    assert_eq!(fib.remove(&net("10.0.0.0/9")), None);
    assert_eq!(fib.remove(&net("10.1.2.3/32")), None);
    assert_eq!(fib.remove(&net("::/0")), None);
    assert_eq!(fib.len(), 1);
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(NextHop::Blackhole));
}

#[test]
fn insert_replaces_the_next_hop_of_the_same_prefix() {
    let (mut fib, r) = Fib::new();
    assert_eq!(fib.insert(net("10.1.0.0/16"), local(1)), None);
    assert_eq!(fib.insert(net("10.1.0.0/16"), local(2)), Some(local(1)));
    assert_eq!(fib.insert(net("10.1.0.0/16"), local(2)), Some(local(2)));
    assert_eq!(fib.len(), 1);
    assert_eq!(r.lookup_v4(v4("10.1.200.1")), Some(local(2)));
    assert_eq!(fib.insert(net("10.1.2.3/32"), local(5)), None);
    assert_eq!(fib.insert(net("10.1.2.3/32"), local(6)), Some(local(5)));
    assert_eq!(r.lookup_v4(v4("10.1.2.3")), Some(local(6)));
    assert_eq!(fib.insert(net("fd00::/8"), local(1)), None);
    assert_eq!(fib.insert(net("fd00::/8"), local(2)), Some(local(1)));
    assert_eq!(r.lookup_v6(v6("fd12::1")), Some(local(2)));
    assert_eq!(fib.len(), 3);
}

#[test]
fn prefixes_with_host_bits_set_are_stored_as_their_network() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.1.2.3/16"), local(1));
    assert_eq!(fib.get(&net("10.1.0.0/16")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("10.1.255.255")), Some(local(1)));
    assert_eq!(fib.insert(net("10.1.9.9/16"), local(2)), Some(local(1)));
    assert_eq!(fib.len(), 1);
    fib.insert(net("2001:db8::1/32"), local(3));
    assert_eq!(r.lookup_v6(v6("2001:db8:ffff::")), Some(local(3)));
    assert_eq!(fib.remove(&net("10.1.77.77/16")), Some(local(2)));
    assert_eq!(fib.remove(&net("2001:db8:1::/32")), Some(local(3)));
    assert!(fib.is_empty());
    let routes: Vec<_> = fib.routes().collect();
    assert!(routes.is_empty());
}

#[test]
fn ipv4_and_ipv6_routes_are_kept_apart() {
    let (mut fib, r) = Fib::new();
    // ::/96 and ::ffff:0:0/96 hold the same low 32 bits as these v4 routes.
    fib.insert(net("10.0.0.0/8"), local(4));
    fib.insert(net("::a00:0/104"), local(6));
    assert_eq!(r.lookup_v4(v4("10.1.1.1")), Some(local(4)));
    assert_eq!(r.lookup_v6(v6("::a01:101")), Some(local(6)));
    assert_eq!(r.lookup_v6(v6("::ffff:10.1.1.1")), None);
    assert_eq!(
        r.lookup(IpAddr::V6(v6("::ffff:10.1.1.1"))),
        None,
        "a v4-mapped v6 address is not looked up in the v4 table"
    );
    fib.remove(&net("10.0.0.0/8"));
    assert_eq!(r.lookup_v6(v6("::a01:101")), Some(local(6)));
    assert_eq!(r.lookup_v4(v4("10.1.1.1")), None);
}

#[test]
fn every_next_hop_kind_round_trips() {
    let (mut fib, r) = Fib::new();
    let hops = [
        (net("10.0.1.0/24"), local(1)),
        (
            net("10.0.2.0/24"),
            NextHop::Encap {
                encap: Encap::Ipip,
                remote: v4("192.168.0.2"),
            },
        ),
        (
            net("10.0.3.0/24"),
            NextHop::Encap {
                encap: Encap::Vxlan { vni: 4096 },
                remote: v4("192.168.0.3"),
            },
        ),
        (
            net("0.0.0.0/0"),
            NextHop::Gateway {
                via: IpAddr::V4(v4("192.168.0.1")),
                port: 0,
            },
        ),
        (net("10.0.5.0/24"), NextHop::Blackhole),
        (net("192.168.0.10/32"), NextHop::Host),
    ];
    for (prefix, hop) in hops {
        fib.insert(prefix, hop);
    }
    for (prefix, hop) in hops {
        let IpNet::V4(n) = prefix else { unreachable!() };
        assert_eq!(r.lookup_v4(n.network()), Some(hop), "{prefix}");
        assert_eq!(fib.get(&prefix), Some(hop));
    }
    let mut routes: Vec<_> = fib.routes().collect();
    routes.sort_by_key(|(p, _)| *p);
    let mut expected = hops.to_vec();
    expected.sort_by_key(|(p, _)| *p);
    assert_eq!(routes, expected);
}

#[test]
fn next_hop_serde_shape_is_tagged_by_kind() {
    let hop = NextHop::Encap {
        encap: Encap::Vxlan { vni: 7 },
        remote: v4("192.0.2.1"),
    };
    let json = serde_json::to_string(&hop).unwrap();
    assert_eq!(
        json,
        r#"{"kind":"encap","encap":{"vxlan":{"vni":7}},"remote":"192.0.2.1"}"#
    );
    assert_eq!(serde_json::from_str::<NextHop>(&json).unwrap(), hop);
    assert_eq!(
        serde_json::to_string(&NextHop::Local { port: 3 }).unwrap(),
        r#"{"kind":"local","port":3}"#
    );
}

#[test]
fn batch_apply_publishes_all_changes_together() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.9.0.0/16"), local(9));
    let before = r.snapshot();
    fib.apply([
        FibChange::Upsert {
            prefix: net("10.0.0.0/8"),
            next_hop: NextHop::Blackhole,
        },
        FibChange::Upsert {
            prefix: net("10.1.2.3/32"),
            next_hop: local(3),
        },
        FibChange::Remove {
            prefix: net("10.9.0.0/16"),
        },
        FibChange::Upsert {
            prefix: net("fd00::/8"),
            next_hop: local(6),
        },
    ])
    .unwrap();
    // A snapshot taken before the batch still answers with the old FIB.
    assert_eq!(before.lookup_v4(v4("10.9.1.1")), Some(local(9)));
    assert_eq!(before.lookup_v4(v4("10.1.2.3")), None);
    assert_eq!(before.lookup_v6(v6("fd00::1")), None);
    let after = r.snapshot();
    assert_eq!(after.lookup_v4(v4("10.9.1.1")), Some(NextHop::Blackhole));
    assert_eq!(after.lookup_v4(v4("10.1.2.3")), Some(local(3)));
    assert_eq!(after.lookup_v6(v6("fd00::1")), Some(local(6)));
    assert_eq!(fib.len(), 3);
}

#[test]
fn batch_lookup_matches_single_lookups() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.0.0.0/8"), NextHop::Blackhole);
    fib.insert(net("10.1.2.0/25"), local(1));
    fib.insert(net("fd00::/16"), local(2));
    let dsts = [v4("10.1.2.3"), v4("10.1.2.200"), v4("11.0.0.1")];
    let mut out = [Some(NextHop::Host); 3];
    r.lookup_v4_batch(&dsts, &mut out);
    assert_eq!(out, [Some(local(1)), Some(NextHop::Blackhole), None]);
    let dsts6 = [v6("fd00::1"), v6("fd01::1")];
    let (_empty_fib, empty) = Fib::new();
    let mut out6 = [Some(NextHop::Host); 2];
    empty.lookup_v6_batch(&dsts6, &mut out6);
    assert_eq!(out6, [None, None]);
    let mut out6 = [None; 2];
    r.snapshot().lookup_v6_batch(&dsts6, &mut out6);
    assert_eq!(out6, [Some(local(2)), None]);
}

#[test]
fn batch_lookup_stops_at_the_shorter_slice() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("0.0.0.0/0"), NextHop::Host);
    let mut out = [None; 2];
    r.lookup_v4_batch(&[v4("1.1.1.1")], &mut out);
    assert_eq!(out, [Some(NextHop::Host), None]);
    // Across the internal blocks of 32 too.
    let dsts = vec![v4("1.1.1.1"); 33];
    let mut out = vec![None; 64];
    r.lookup_v4_batch(&dsts, &mut out);
    assert_eq!(out.iter().filter(|o| o.is_some()).count(), 33);
    assert!(out[33..].iter().all(Option::is_none));
}

#[test]
fn memory_of_a_small_fib_is_far_below_a_flat_dir_24_8() {
    let (mut fib, _r) = Fib::new();
    fib.insert(net("0.0.0.0/0"), NextHop::Host);
    fib.insert(net("10.244.0.0/16"), NextHop::Blackhole);
    for i in 0..100u8 {
        fib.insert(net(&format!("10.244.1.{i}/32")), local(u16::from(i)));
    }
    let memory = fib.memory();
    assert!(
        memory.total_bytes() < 1 << 20,
        "{memory:?} should be well under 1 MiB (flat tbl24: 64 MiB)"
    );
    assert_eq!(memory.next_hops, 102);
}

#[test]
fn freed_next_hop_index_is_reused_without_changing_old_snapshots() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("10.0.0.0/8"), local(1));
    let old = r.snapshot();
    fib.remove(&net("10.0.0.0/8"));
    // local(2) takes the index local(1) had.
    fib.insert(net("11.0.0.0/8"), local(2));
    assert_eq!(old.lookup_v4(v4("10.0.0.1")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("10.0.0.1")), None);
    assert_eq!(r.lookup_v4(v4("11.0.0.1")), Some(local(2)));
}

#[test]
fn routes_spanning_many_chunks_install_and_remove_cleanly() {
    let (mut fib, r) = Fib::new();
    fib.insert(net("0.0.0.0/1"), local(1));
    fib.insert(net("64.0.0.0/3"), local(2));
    assert_eq!(r.lookup_v4(v4("0.0.0.1")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("64.0.0.1")), Some(local(2)));
    assert_eq!(r.lookup_v4(v4("95.255.255.255")), Some(local(2)));
    assert_eq!(r.lookup_v4(v4("96.0.0.0")), Some(local(1)));
    assert_eq!(r.lookup_v4(v4("128.0.0.0")), None);
    fib.remove(&net("0.0.0.0/1"));
    assert_eq!(r.lookup_v4(v4("0.0.0.1")), None);
    assert_eq!(r.lookup_v4(v4("64.0.0.1")), Some(local(2)));
    fib.remove(&net("64.0.0.0/3"));
    // Back to one shared empty chunk.
    assert!(fib.memory().v4_bytes < 64 << 10, "{:?}", fib.memory());
}

#[test]
fn old_snapshots_are_freed_by_the_writer_once_readers_drop_them() {
    let (mut fib, r) = Fib::new();
    let held = r.snapshot();
    fib.insert(net("10.0.0.0/8"), local(1));
    fib.insert(net("11.0.0.0/8"), local(2));
    assert!(!fib.retired.is_empty(), "the held snapshot is kept");
    drop(held);
    fib.reclaim();
    assert!(fib.retired.is_empty());
}

#[test]
fn writer_moves_to_the_control_thread_and_readers_are_shared_by_workers() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Fib>();
    send_sync::<FibReader>();
    let (mut fib, reader) = Fib::new();
    let worker = std::thread::spawn(move || reader.lookup_v4(v4("10.0.0.1")));
    fib.insert(net("10.0.0.0/8"), NextHop::Host);
    let answer = worker.join().unwrap();
    assert!(answer.is_none() || answer == Some(NextHop::Host));
}
