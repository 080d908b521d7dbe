//! Property tests: random interleavings of allocate, release (by handle and by
//! address), block claims, borrowing and both kinds of GC, checked against a
//! simple model after every step: never a duplicate address, never a lost one,
//! and "exhausted" only when the rules really leave nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use brindle_api::ipam::Attachment;
use brindle_ipam::model::{IpamConfig, Pool, Reservation};
use brindle_ipam::store::MemoryStore;
use brindle_ipam::{AllocateArgs, Ipam, IpamError};
use common::handle;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Allocate { node: u8, container: u8 },
    ReleaseHandle { container: u8 },
    ReleaseAddress { pick: usize },
    GcNodes { live_mask: u8 },
    GcAttachments { node: u8, valid_mask: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u8..24).prop_map(|(node, container)| Op::Allocate { node, container }),
        2 => (0u8..24).prop_map(|container| Op::ReleaseHandle { container }),
        1 => any::<usize>().prop_map(|pick| Op::ReleaseAddress { pick }),
        1 => (0u8..8).prop_map(|live_mask| Op::GcNodes { live_mask }),
        1 => (0u8..3, any::<u32>()).prop_map(|(node, valid_mask)| Op::GcAttachments { node, valid_mask }),
    ]
}

const NODES: [&str; 3] = ["n0", "n1", "n2"];
const BLOCKS_IN_POOL: usize = 4;

fn setup(strict: bool, cap: u32, reserve: bool) -> Ipam<MemoryStore> {
    let ipam = Ipam::new(MemoryStore::new(), "/t");
    // 16 addresses in four /30 blocks.
    let mut pool = Pool::new("p", "10.9.0.0/28".parse().unwrap());
    pool.block_size = Some(30);
    ipam.put_pool(&pool).unwrap();
    ipam.set_config(&IpamConfig {
        strict_affinity: strict,
        max_blocks_per_host: cap,
    })
    .unwrap();
    if reserve {
        ipam.put_reservation(&Reservation {
            name: "r".into(),
            cidrs: vec!["10.9.0.5/32".parse().unwrap()],
        })
        .unwrap();
    }
    ipam
}

/// Checks that "exhausted" for `node` is what the rules say.
fn exhaustion_is_real(
    ipam: &Ipam<MemoryStore>,
    node: &str,
    strict: bool,
    cap: u32,
) -> Result<(), String> {
    let blocks = ipam.blocks().unwrap();
    let mine: Vec<_> = blocks
        .iter()
        .filter(|b| b.affinity.as_deref() == Some(node))
        .collect();
    if mine.iter().any(|b| b.allocated < b.usable) {
        return Err(format!("{node} has room in its own block: {mine:?}"));
    }
    let can_claim = blocks.len() < BLOCKS_IN_POOL && (cap == 0 || (mine.len() as u32) < cap);
    if can_claim {
        return Err(format!("{node} could claim a block: {blocks:?}"));
    }
    if !strict && blocks.iter().any(|b| b.allocated < b.usable) {
        return Err(format!("{node} could borrow: {blocks:?}"));
    }
    Ok(())
}

/// A node holding more than one block holds no empty one: emptied blocks
/// beyond a node's first give up their affinity.
fn no_empty_block_beyond_the_first(ipam: &Ipam<MemoryStore>) -> Result<(), String> {
    let blocks = ipam.blocks().unwrap();
    for node in NODES {
        let mine: Vec<_> = blocks
            .iter()
            .filter(|b| b.affinity.as_deref() == Some(node))
            .collect();
        if mine.len() > 1 && mine.iter().any(|b| b.allocated == 0) {
            return Err(format!(
                "{node} keeps an empty block beside another: {mine:?}"
            ));
        }
    }
    if let Some(orphan) = blocks
        .iter()
        .find(|b| b.affinity.is_none() && b.allocated == 0)
    {
        return Err(format!("an empty block nobody holds is kept: {orphan:?}"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_never_duplicate_or_lose_an_address(
        strict in any::<bool>(),
        cap in 0u32..3,
        reserve in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let ipam = setup(strict, cap, reserve);
        // container -> (node, address)
        let mut model: BTreeMap<u8, (u8, IpAddr)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Allocate { node, container } => {
                    let r = ipam.allocate(&AllocateArgs::v4(handle(&format!("c{container}")), NODES[node as usize]));
                    match (r, model.get(&container)) {
                        (Ok(got), Some((_, ip))) => prop_assert_eq!(got[0].address.addr(), *ip, "not idempotent"),
                        (Ok(got), None) => {
                            let ip = got[0].address.addr();
                            prop_assert!(model.values().all(|(_, other)| *other != ip), "{} handed out twice", ip);
                            prop_assert!(ip != "10.9.0.5".parse::<IpAddr>().unwrap() || !reserve, "reserved address handed out");
                            model.insert(container, (node, ip));
                        }
                        (Err(IpamError::Exhausted(_)), None) => {
                            if let Err(why) = exhaustion_is_real(&ipam, NODES[node as usize], strict, cap) {
                                return Err(TestCaseError::fail(why));
                            }
                        }
                        (Err(e), _) => return Err(TestCaseError::fail(format!("allocate failed: {e}"))),
                    }
                }
                Op::ReleaseHandle { container } => {
                    let released = ipam.release_handle(&handle(&format!("c{container}"))).unwrap();
                    let expect: Vec<IpAddr> = model.remove(&container).map(|(_, ip)| ip).into_iter().collect();
                    prop_assert_eq!(released, expect);
                }
                Op::ReleaseAddress { pick } => {
                    if model.is_empty() { continue; }
                    let (&container, &(_, ip)) = model.iter().nth(pick % model.len()).unwrap();
                    prop_assert_eq!(ipam.release_address(ip).unwrap(), Some(ip));
                    model.remove(&container);
                }
                Op::GcNodes { live_mask } => {
                    let live: Vec<String> = (0..3).filter(|i| live_mask & (1 << i) != 0).map(|i| NODES[i].to_owned()).collect();
                    let report = ipam.gc_nodes(&live).unwrap();
                    let dead: BTreeSet<IpAddr> = model.values().filter(|(n, _)| live_mask & (1 << n) == 0).map(|(_, ip)| *ip).collect();
                    model.retain(|_, (n, _)| live_mask & (1 << *n) != 0);
                    prop_assert_eq!(report.addresses.into_iter().collect::<BTreeSet<_>>(), dead);
                }
                Op::GcAttachments { node, valid_mask } => {
                    let valid: Vec<Attachment> = (0..24u8).filter(|c| valid_mask & (1 << c) != 0)
                        .map(|c| Attachment { container_id: format!("c{c}"), ifname: "eth0".into() }).collect();
                    let report = ipam.gc_attachments("net", NODES[node as usize], &valid).unwrap();
                    let gone: BTreeSet<IpAddr> = model.iter()
                        .filter(|(c, (n, _))| *n == node && valid_mask & (1 << **c) == 0)
                        .map(|(_, (_, ip))| *ip).collect();
                    model.retain(|c, (n, _)| !(*n == node && valid_mask & (1 << *c) == 0));
                    prop_assert_eq!(report.addresses.into_iter().collect::<BTreeSet<_>>(), gone);
                }
            }
            let problems = ipam.audit().unwrap();
            prop_assert!(problems.is_empty(), "audit: {:?}", problems);
            if let Err(why) = no_empty_block_beyond_the_first(&ipam) {
                return Err(TestCaseError::fail(why));
            }
            let held: BTreeSet<IpAddr> = ipam.handles().unwrap().into_iter().flat_map(|h| h.addresses).collect();
            let expect: BTreeSet<IpAddr> = model.values().map(|(_, ip)| *ip).collect();
            prop_assert_eq!(held, expect, "datastore and model disagree");
        }
        // Releasing everything gives every address back.
        for c in model.keys() {
            ipam.release_handle(&handle(&format!("c{c}"))).unwrap();
        }
        let blocks = ipam.blocks().unwrap();
        prop_assert!(blocks.iter().all(|b| b.allocated == 0));
        prop_assert!(blocks.len() <= NODES.len(), "one block at most per node: {:?}", blocks);
        prop_assert_eq!(ipam.status().unwrap().free, 16);
    }
}

#[test]
fn threads_racing_on_one_store_never_hand_out_an_address_twice() {
    let ipam = Arc::new(Ipam::new(MemoryStore::new(), "/t"));
    let mut pool = Pool::new("p", "10.8.0.0/24".parse().unwrap());
    pool.block_size = Some(29);
    ipam.put_pool(&pool).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let ipam = ipam.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..60 {
                    let h = handle(&format!("t{t}-{i}"));
                    let got = ipam
                        .allocate(&AllocateArgs::v4(h.clone(), &format!("n{}", (t + i) % 3)))
                        .unwrap();
                    mine.push(got[0].address.addr());
                    if i % 3 == 0 {
                        ipam.release_handle(&h).unwrap();
                        mine.pop();
                    }
                }
                mine
            })
        })
        .collect();
    let all: Vec<IpAddr> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let unique: BTreeSet<IpAddr> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "an address was handed out twice");
    assert_eq!(unique.len(), 4 * 40);
    assert!(ipam.audit().unwrap().is_empty());
    let held: BTreeSet<IpAddr> = ipam
        .handles()
        .unwrap()
        .into_iter()
        .flat_map(|h| h.addresses)
        .collect();
    assert_eq!(held, unique, "every address accounted for");
}
