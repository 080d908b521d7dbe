//! The datastore suite every backend must pass: first the key-value contract,
//! then the IPAM behaviour on top of it. Each case gets a fresh store (or a
//! fresh key prefix on a shared etcd).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Barrier;

use brindle_api::ipam::Attachment;
use brindle_ipam::model::{IpamConfig, Pool, Reservation};
use brindle_ipam::store::{Compare, Datastore, Write};
use brindle_ipam::{AllocateArgs, Ipam, IpamError};
use ipnet::IpNet;

use super::handle;

/// A case of the suite: a store and a key prefix to work under.
pub type Case = fn(&dyn Datastore, &str);

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    (
        "a_txn_on_an_absent_key_creates_it_once",
        a_txn_on_an_absent_key_creates_it_once,
    ),
    (
        "a_revision_compare_fails_after_another_write",
        a_revision_compare_fails_after_another_write,
    ),
    (
        "list_returns_exactly_the_prefix_in_key_order",
        list_returns_exactly_the_prefix_in_key_order,
    ),
    ("a_failed_txn_writes_nothing", a_failed_txn_writes_nothing),
    (
        "allocate_is_idempotent_per_handle",
        allocate_is_idempotent_per_handle,
    ),
    (
        "a_first_allocation_claims_a_block_affine_to_the_node",
        a_first_allocation_claims_a_block_affine_to_the_node,
    ),
    (
        "a_full_block_makes_the_node_claim_another",
        a_full_block_makes_the_node_claim_another,
    ),
    (
        "borrowing_happens_only_when_no_free_block_remains",
        borrowing_happens_only_when_no_free_block_remains,
    ),
    (
        "strict_affinity_never_borrows",
        strict_affinity_never_borrows,
    ),
    (
        "max_blocks_per_host_caps_claims_then_borrows",
        max_blocks_per_host_caps_claims_then_borrows,
    ),
    (
        "release_by_handle_frees_exactly_its_addresses",
        release_by_handle_frees_exactly_its_addresses,
    ),
    (
        "release_by_address_updates_the_handle",
        release_by_address_updates_the_handle,
    ),
    (
        "dual_stack_allocates_one_address_of_each_family",
        dual_stack_allocates_one_address_of_each_family,
    ),
    (
        "reserved_addresses_are_never_handed_out",
        reserved_addresses_are_never_handed_out,
    ),
    (
        "an_exhausted_pool_says_so_and_leaks_nothing",
        an_exhausted_pool_says_so_and_leaks_nothing,
    ),
    (
        "cni_gc_releases_only_attachments_not_in_the_valid_list",
        cni_gc_releases_only_attachments_not_in_the_valid_list,
    ),
    (
        "node_gc_releases_dead_nodes_and_deletes_their_empty_blocks",
        node_gc_releases_dead_nodes_and_deletes_their_empty_blocks,
    ),
    (
        "disabled_pools_and_unselected_nodes_get_nothing",
        disabled_pools_and_unselected_nodes_get_nothing,
    ),
    (
        "overlapping_pools_are_refused",
        overlapping_pools_are_refused,
    ),
    (
        "disabling_a_pool_or_reserving_addresses_takes_effect_at_once",
        disabling_a_pool_or_reserving_addresses_takes_effect_at_once,
    ),
    (
        "an_emptied_block_beyond_the_first_gives_up_its_affinity",
        an_emptied_block_beyond_the_first_gives_up_its_affinity,
    ),
    (
        "parallel_allocations_claim_only_the_blocks_they_need",
        parallel_allocations_claim_only_the_blocks_they_need,
    ),
    (
        "one_handle_allocated_twice_at_once_gets_one_address",
        one_handle_allocated_twice_at_once_gets_one_address,
    ),
];

/// Runs every case, each against the store `make` returns for it.
pub fn run_all(mut make: impl FnMut(&str) -> (Box<dyn Datastore>, String)) {
    for (name, case) in CASES {
        eprintln!("suite case {name}");
        let (store, prefix) = make(name);
        case(store.as_ref(), &prefix);
    }
}

fn ipam<'a>(store: &'a dyn Datastore, prefix: &str) -> Ipam<&'a dyn Datastore> {
    Ipam::new(store, prefix)
}

fn pool(ipam: &Ipam<&dyn Datastore>, name: &str, cidr: &str, block: u8) -> Pool {
    let mut p = Pool::new(name, cidr.parse().unwrap());
    p.block_size = Some(block);
    ipam.put_pool(&p).unwrap();
    p
}

fn alloc(ipam: &Ipam<&dyn Datastore>, c: &str, node: &str) -> Result<IpAddr, IpamError> {
    ipam.allocate(&AllocateArgs::v4(handle(c), node))
        .map(|a| a[0].address.addr())
}

fn assert_consistent(ipam: &Ipam<&dyn Datastore>) {
    let problems = ipam.audit().unwrap();
    assert!(problems.is_empty(), "audit: {problems:#?}");
}

fn k(prefix: &str, s: &str) -> String {
    format!("{prefix}/{s}")
}

pub fn a_txn_on_an_absent_key_creates_it_once(s: &dyn Datastore, p: &str) {
    let key = k(p, "a");
    assert!(
        s.txn(
            &[Compare::Absent(key.clone())],
            &[Write::Put(key.clone(), b"1".to_vec())]
        )
        .unwrap()
    );
    assert!(
        !s.txn(
            &[Compare::Absent(key.clone())],
            &[Write::Put(key.clone(), b"2".to_vec())]
        )
        .unwrap()
    );
    let e = s.get(&key).unwrap().unwrap();
    assert_eq!(e.value, b"1");
    assert!(e.revision > 0);
}

pub fn a_revision_compare_fails_after_another_write(s: &dyn Datastore, p: &str) {
    let key = k(p, "a");
    s.txn(&[], &[Write::Put(key.clone(), b"1".to_vec())])
        .unwrap();
    let first = s.get(&key).unwrap().unwrap();
    assert!(
        s.txn(
            &[Compare::Revision(key.clone(), first.revision)],
            &[Write::Put(key.clone(), b"2".to_vec())]
        )
        .unwrap()
    );
    let second = s.get(&key).unwrap().unwrap();
    assert!(second.revision > first.revision);
    assert!(
        !s.txn(
            &[Compare::Revision(key.clone(), first.revision)],
            &[Write::Put(key.clone(), b"3".to_vec())]
        )
        .unwrap()
    );
    assert!(
        s.txn(
            &[Compare::Revision(key.clone(), second.revision)],
            &[Write::Delete(key.clone())]
        )
        .unwrap()
    );
    assert_eq!(s.get(&key).unwrap(), None);
}

pub fn list_returns_exactly_the_prefix_in_key_order(s: &dyn Datastore, p: &str) {
    for name in ["x/b", "x/a", "x/c", "xy/a", "w"] {
        s.txn(&[], &[Write::Put(k(p, name), name.as_bytes().to_vec())])
            .unwrap();
    }
    let keys: Vec<String> = s
        .list(&k(p, "x/"))
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, vec![k(p, "x/a"), k(p, "x/b"), k(p, "x/c")]);
}

pub fn a_failed_txn_writes_nothing(s: &dyn Datastore, p: &str) {
    s.txn(&[], &[Write::Put(k(p, "held"), b"1".to_vec())])
        .unwrap();
    let ok = s
        .txn(
            &[Compare::Absent(k(p, "new")), Compare::Absent(k(p, "held"))],
            &[
                Write::Put(k(p, "new"), b"1".to_vec()),
                Write::Delete(k(p, "held")),
            ],
        )
        .unwrap();
    assert!(!ok);
    assert!(s.get(&k(p, "new")).unwrap().is_none());
    assert!(s.get(&k(p, "held")).unwrap().is_some());
}

pub fn allocate_is_idempotent_per_handle(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    let a = alloc(&i, "c1", "n1").unwrap();
    assert_eq!(alloc(&i, "c1", "n1").unwrap(), a);
    let b = alloc(&i, "c2", "n1").unwrap();
    assert_ne!(a, b);
    assert_eq!(i.handles().unwrap().len(), 2);
    assert_consistent(&i);
}

pub fn a_first_allocation_claims_a_block_affine_to_the_node(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    let a = alloc(&i, "c1", "n1").unwrap();
    let blocks = i.blocks().unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].affinity.as_deref(), Some("n1"));
    assert!(blocks[0].cidr.contains(&a));
    assert_eq!((blocks[0].usable, blocks[0].allocated), (64, 1));
    let b = alloc(&i, "c2", "n2").unwrap();
    let blocks = i.blocks().unwrap();
    assert_eq!(blocks.len(), 2, "a second node claims its own block");
    assert!(
        blocks
            .iter()
            .any(|bl| bl.affinity.as_deref() == Some("n2") && bl.cidr.contains(&b))
    );
    assert_consistent(&i);
}

pub fn a_full_block_makes_the_node_claim_another(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 30);
    let ips: BTreeSet<IpAddr> = (0..5)
        .map(|n| alloc(&i, &format!("c{n}"), "n1").unwrap())
        .collect();
    assert_eq!(ips.len(), 5);
    let blocks = i.blocks().unwrap();
    assert_eq!(blocks.len(), 2);
    assert!(blocks.iter().all(|b| b.affinity.as_deref() == Some("n1")));
    assert_consistent(&i);
}

pub fn borrowing_happens_only_when_no_free_block_remains(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    // Two /30 blocks: n1 claims one, n2 the other.
    pool(&i, "p", "10.0.0.0/29", 30);
    let a = alloc(&i, "a1", "n1").unwrap();
    alloc(&i, "b1", "n2").unwrap();
    for n in 2..=4 {
        alloc(&i, &format!("b{n}"), "n2").unwrap();
    }
    // n2's block is full and no block is free: n2 borrows from n1's.
    let borrowed = alloc(&i, "b5", "n2").unwrap();
    let n1_block = i
        .blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.cidr.contains(&a))
        .unwrap();
    assert_eq!(
        n1_block.affinity.as_deref(),
        Some("n1"),
        "borrowing does not move affinity"
    );
    assert!(n1_block.cidr.contains(&borrowed));
    assert_consistent(&i);
}

pub fn strict_affinity_never_borrows(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    i.set_config(&IpamConfig {
        strict_affinity: true,
        max_blocks_per_host: 0,
    })
    .unwrap();
    pool(&i, "p", "10.0.0.0/29", 30);
    alloc(&i, "a1", "n1").unwrap();
    for n in 1..=4 {
        alloc(&i, &format!("b{n}"), "n2").unwrap();
    }
    assert!(matches!(
        alloc(&i, "b5", "n2"),
        Err(IpamError::Exhausted(_))
    ));
    assert!(i.query_handle(&handle("b5")).unwrap().is_none());
    assert_consistent(&i);
}

pub fn max_blocks_per_host_caps_claims_then_borrows(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    i.set_config(&IpamConfig {
        strict_affinity: false,
        max_blocks_per_host: 1,
    })
    .unwrap();
    pool(&i, "p", "10.0.0.0/28", 30);
    alloc(&i, "a1", "n1").unwrap();
    for n in 1..=4 {
        alloc(&i, &format!("b{n}"), "n2").unwrap();
    }
    // n2 may not claim a second block although two are free: it borrows.
    alloc(&i, "b5", "n2").unwrap();
    let blocks = i.blocks().unwrap();
    assert_eq!(
        blocks
            .iter()
            .filter(|b| b.affinity.as_deref() == Some("n2"))
            .count(),
        1
    );
    assert_eq!(blocks.len(), 2);
    // With strict affinity as well, the capped node is exhausted.
    i.set_config(&IpamConfig {
        strict_affinity: true,
        max_blocks_per_host: 1,
    })
    .unwrap();
    assert!(matches!(
        alloc(&i, "b6", "n2"),
        Err(IpamError::Exhausted(_))
    ));
    assert_consistent(&i);
}

pub fn release_by_handle_frees_exactly_its_addresses(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    let a = alloc(&i, "c1", "n1").unwrap();
    let b = alloc(&i, "c2", "n1").unwrap();
    assert_eq!(i.release_handle(&handle("c1")).unwrap(), vec![a]);
    assert_eq!(
        i.release_handle(&handle("c1")).unwrap(),
        Vec::<IpAddr>::new(),
        "release is idempotent"
    );
    assert!(i.query_handle(&handle("c1")).unwrap().is_none());
    assert_eq!(
        i.query_handle(&handle("c2")).unwrap().unwrap().addresses,
        vec![b]
    );
    // The freed address is handed out again.
    assert_eq!(alloc(&i, "c3", "n1").unwrap(), a);
    assert_consistent(&i);
}

pub fn release_by_address_updates_the_handle(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    pool(&i, "p6", "fd00::/120", 122);
    let mut args = AllocateArgs::v4(handle("c1"), "n1");
    args.ipv6 = true;
    let got = i.allocate(&args).unwrap();
    let v4 = got[0].address.addr();
    let v6 = got[1].address.addr();
    assert_eq!(i.release_address(v4).unwrap(), Some(v4));
    assert_eq!(i.release_address(v4).unwrap(), None);
    assert_eq!(
        i.query_handle(&handle("c1")).unwrap().unwrap().addresses,
        vec![v6]
    );
    assert_eq!(i.release_address(v6).unwrap(), Some(v6));
    assert!(
        i.query_handle(&handle("c1")).unwrap().is_none(),
        "an empty handle is deleted"
    );
    assert_consistent(&i);
}

pub fn dual_stack_allocates_one_address_of_each_family(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    pool(&i, "p6", "fd00::/116", 122);
    let mut args = AllocateArgs::v4(handle("c1"), "n1");
    args.ipv6 = true;
    let got = i.allocate(&args).unwrap();
    assert_eq!(got.len(), 2);
    assert!(got[0].address.addr().is_ipv4() && got[0].address.prefix_len() == 32);
    assert!(got[1].address.addr().is_ipv6() && got[1].address.prefix_len() == 128);
    assert_eq!(got[1].pool, "p6");
    assert_eq!(
        i.allocate(&args).unwrap(),
        got,
        "idempotent across families"
    );
    assert_consistent(&i);
}

pub fn reserved_addresses_are_never_handed_out(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    let mut pl = Pool::new("p", "10.0.0.0/28".parse().unwrap());
    pl.block_size = Some(28);
    pl.block_reserve_first = 3;
    pl.block_reserve_last = 1;
    i.put_pool(&pl).unwrap();
    i.put_reservation(&Reservation {
        name: "r".into(),
        cidrs: vec!["10.0.0.4/31".parse().unwrap()],
    })
    .unwrap();
    let mut got = BTreeSet::new();
    while let Ok(ip) = alloc(&i, &format!("c{}", got.len()), "n1") {
        got.insert(ip.to_string());
    }
    // Ordinals 0-2 and 15 are the per-block reserve, 4-5 the reservation.
    let expect: BTreeSet<String> = [3]
        .into_iter()
        .chain(6..=14)
        .map(|o| format!("10.0.0.{o}"))
        .collect();
    assert_eq!(got, expect);
    assert_consistent(&i);
}

pub fn an_exhausted_pool_says_so_and_leaks_nothing(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/30", 30);
    for n in 0..4 {
        alloc(&i, &format!("c{n}"), "n1").unwrap();
    }
    let before = i.handles().unwrap();
    assert!(matches!(
        alloc(&i, "c9", "n1"),
        Err(IpamError::Exhausted(_))
    ));
    assert!(matches!(
        alloc(&i, "c9", "n2"),
        Err(IpamError::Exhausted(_))
    ));
    assert_eq!(i.handles().unwrap(), before);
    assert_eq!(i.status().unwrap().free, 0);
    assert_consistent(&i);
}

pub fn cni_gc_releases_only_attachments_not_in_the_valid_list(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    let keep = alloc(&i, "keep", "n1").unwrap();
    let stale = alloc(&i, "stale", "n1").unwrap();
    let other_node = alloc(&i, "other", "n2").unwrap();
    let valid = vec![Attachment {
        container_id: "keep".into(),
        ifname: "eth0".into(),
    }];
    let report = i.gc_attachments("net", "n1", &valid).unwrap();
    assert_eq!(report.addresses, vec![stale]);
    assert_eq!(report.handles, vec![handle("stale")]);
    let held: BTreeSet<IpAddr> = i
        .handles()
        .unwrap()
        .into_iter()
        .flat_map(|h| h.addresses)
        .collect();
    assert_eq!(held, BTreeSet::from([keep, other_node]));
    assert_consistent(&i);
}

pub fn node_gc_releases_dead_nodes_and_deletes_their_empty_blocks(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/29", 30);
    let dead = alloc(&i, "d1", "dead").unwrap();
    for n in 1..=4 {
        alloc(&i, &format!("l{n}"), "live").unwrap();
    }
    // live borrows from dead's block.
    let borrowed = alloc(&i, "l5", "live").unwrap();
    let report = i.gc_nodes(&["live".to_owned()]).unwrap();
    assert_eq!(report.addresses, vec![dead]);
    assert!(
        report.blocks.is_empty(),
        "dead's block still holds a borrowed address"
    );
    let dead_block = i
        .blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.cidr.contains(&borrowed))
        .unwrap();
    assert_eq!(
        dead_block.affinity, None,
        "affinity of a dead node is dropped"
    );
    i.release_handle(&handle("l5")).unwrap();
    assert!(
        i.blocks()
            .unwrap()
            .iter()
            .all(|b| b.cidr != dead_block.cidr),
        "the orphan block goes with its last address"
    );
    assert_eq!(i.blocks().unwrap().len(), 1);
    assert!(i.gc_nodes(&["live".to_owned()]).unwrap().blocks.is_empty());
    assert_consistent(&i);
}

pub fn disabled_pools_and_unselected_nodes_get_nothing(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    let mut off = Pool::new("off", "10.1.0.0/24".parse().unwrap());
    off.disabled = true;
    i.put_pool(&off).unwrap();
    let mut gpu = Pool::new("gpu", "10.2.0.0/24".parse().unwrap());
    gpu.node_selector = "gpu == 'yes'".into();
    i.put_pool(&gpu).unwrap();
    assert!(matches!(
        alloc(&i, "c1", "n1"),
        Err(IpamError::Exhausted(_))
    ));
    let mut args = AllocateArgs::v4(handle("c1"), "n1");
    args.node_labels = BTreeMap::from([("gpu".to_owned(), "yes".to_owned())]);
    let got = i.allocate(&args).unwrap();
    assert_eq!(got[0].pool, "gpu");
    args.handle = handle("c2");
    args.pools = vec!["nope".into()];
    assert!(matches!(
        i.allocate(&args),
        Err(IpamError::InvalidRequest(_))
    ));
    assert_consistent(&i);
}

pub fn overlapping_pools_are_refused(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "a", "10.0.0.0/16", 26);
    let b = Pool::new("b", "10.0.128.0/24".parse().unwrap());
    assert!(matches!(i.put_pool(&b), Err(IpamError::InvalidRequest(_))));
    assert_eq!(i.pools().unwrap().len(), 1);
}

pub fn disabling_a_pool_or_reserving_addresses_takes_effect_at_once(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    let mut pl = pool(&i, "p", "10.0.0.0/24", 26);
    // The node now has a block it allocates from in one transaction.
    let first = alloc(&i, "c1", "n1").unwrap();
    let next: IpAddr = match first {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + 1).into()),
        IpAddr::V6(_) => unreachable!("IPv4 pool"),
    };
    i.put_reservation(&Reservation {
        name: "r".into(),
        cidrs: vec![IpNet::from(next)],
    })
    .unwrap();
    let second = alloc(&i, "c2", "n1").unwrap();
    assert_ne!(second, next, "a reservation applies to the cached block");
    pl.disabled = true;
    i.put_pool(&pl).unwrap();
    assert!(matches!(
        alloc(&i, "c3", "n1"),
        Err(IpamError::Exhausted(_))
    ));
    assert_eq!(
        alloc(&i, "c1", "n1").unwrap(),
        first,
        "existing allocations stay"
    );
    assert_consistent(&i);
}

/// The blocks affine to `node`: (cidr, allocated).
fn blocks_of(i: &Ipam<&dyn Datastore>, node: &str) -> Vec<(IpNet, u64)> {
    i.blocks()
        .unwrap()
        .into_iter()
        .filter(|b| b.affinity.as_deref() == Some(node))
        .map(|b| (b.cidr, b.allocated))
        .collect()
}

pub fn an_emptied_block_beyond_the_first_gives_up_its_affinity(s: &dyn Datastore, p: &str) {
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 30);
    pool(&i, "p6", "fd00::/120", 126);
    let mut args = AllocateArgs::v4(handle("c0"), "n1");
    args.ipv6 = true;
    let dual = i.allocate(&args).unwrap();
    let ips: Vec<IpAddr> = (1..=4)
        .map(|n| alloc(&i, &format!("c{n}"), "n1").unwrap())
        .collect();
    let held = blocks_of(&i, "n1");
    assert_eq!(held.len(), 3, "two IPv4 blocks and one IPv6: {held:?}");
    // c4 is alone in the second IPv4 block: releasing it gives the block up.
    let second = held
        .iter()
        .find(|(cidr, _)| cidr.contains(&ips[3]))
        .unwrap()
        .0;
    assert_eq!(i.release_handle(&handle("c4")).unwrap(), vec![ips[3]]);
    let held = blocks_of(&i, "n1");
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().all(|(cidr, _)| *cidr != second));
    assert!(
        i.blocks().unwrap().iter().all(|b| b.cidr != second),
        "the block is deleted, not left without affinity"
    );
    // Emptying the node's only block of each family keeps it.
    for n in 0..=3 {
        i.release_handle(&handle(&format!("c{n}"))).unwrap();
    }
    let held = blocks_of(&i, "n1");
    assert_eq!(
        held.len(),
        2,
        "the first block of each family stays: {held:?}"
    );
    assert!(held.iter().all(|(_, allocated)| *allocated == 0));
    assert!(
        held.iter()
            .any(|(cidr, _)| cidr.contains(&dual[0].address.addr()))
    );
    assert!(
        held.iter()
            .any(|(cidr, _)| cidr.contains(&dual[1].address.addr()))
    );
    // A released block is claimed again when needed.
    for n in 10..15 {
        alloc(&i, &format!("c{n}"), "n1").unwrap();
    }
    assert_eq!(blocks_of(&i, "n1").len(), 3);
    assert_consistent(&i);
}

/// 40 allocations for one node at once, half through one shared `Ipam` (as
/// the daemon runs them) and half each through an `Ipam` of its own (as
/// standalone plugins do), then 40 releases at once. /28 blocks: 3 are
/// needed, 3 are claimed, and 1 stays.
pub fn parallel_allocations_claim_only_the_blocks_they_need(s: &dyn Datastore, p: &str) {
    const PODS: usize = 40;
    let shared = ipam(s, p);
    pool(&shared, "p", "10.0.0.0/24", 28);
    let in_parallel = |work: &(dyn Fn(&Ipam<&dyn Datastore>, usize) + Sync)| {
        let start = Barrier::new(PODS);
        std::thread::scope(|scope| {
            for n in 0..PODS {
                let (start, shared) = (&start, &shared);
                scope.spawn(move || {
                    let own = ipam(s, p);
                    let i = if n % 2 == 0 { shared } else { &own };
                    start.wait();
                    work(i, n);
                });
            }
        });
    };
    in_parallel(&|i, n| {
        alloc(i, &format!("c{n}"), "n1").unwrap();
    });
    let held: BTreeSet<IpAddr> = shared
        .handles()
        .unwrap()
        .into_iter()
        .flat_map(|h| h.addresses)
        .collect();
    assert_eq!(held.len(), PODS);
    let blocks = blocks_of(&shared, "n1");
    assert_eq!(blocks.len(), 3, "16 addresses per block: {blocks:?}");
    assert_eq!(shared.blocks().unwrap().len(), 3);
    assert_consistent(&shared);

    in_parallel(&|i, n| {
        assert_eq!(
            i.release_handle(&handle(&format!("c{n}"))).unwrap().len(),
            1
        );
    });
    let blocks = blocks_of(&shared, "n1");
    assert_eq!(blocks.len(), 1, "only the first block stays: {blocks:?}");
    assert_eq!(blocks[0].1, 0);
    assert_eq!(shared.blocks().unwrap().len(), 1);
    assert_consistent(&shared);
}

/// A retried ADD racing the first one: both calls land in one batch of
/// the daemon's IPAM and must get the same address, once.
pub fn one_handle_allocated_twice_at_once_gets_one_address(s: &dyn Datastore, p: &str) {
    const CALLS: usize = 20;
    let i = ipam(s, p);
    pool(&i, "p", "10.0.0.0/24", 26);
    let start = Barrier::new(CALLS);
    let got: Vec<(usize, IpAddr)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..CALLS)
            .map(|n| {
                let (start, i) = (&start, &i);
                scope.spawn(move || {
                    start.wait();
                    (n % 10, alloc(i, &format!("c{}", n % 10), "n1").unwrap())
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let by_handle: BTreeMap<usize, BTreeSet<IpAddr>> =
        got.into_iter().fold(BTreeMap::new(), |mut m, (h, ip)| {
            m.entry(h).or_default().insert(ip);
            m
        });
    assert_eq!(by_handle.len(), 10);
    assert!(
        by_handle.values().all(|ips| ips.len() == 1),
        "{by_handle:?}"
    );
    let distinct: BTreeSet<IpAddr> = by_handle.values().flatten().copied().collect();
    assert_eq!(distinct.len(), 10);
    assert_eq!(i.handles().unwrap().len(), 10);
    assert_consistent(&i);
}
