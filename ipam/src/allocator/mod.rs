//! Allocation, release, views and garbage collection over a [`Datastore`].
//!
//! Keys, under the configured prefix `P`:
//!
//! | key | value |
//! |---|---|
//! | `P/config/ipam` | [`IpamConfig`] |
//! | `P/config/pools/<name>` | [`Pool`] |
//! | `P/config/reservations/<name>` | [`Reservation`] |
//! | `P/blocks/<addr>-<len>` | [`Block`] (allocations and affinity) |
//! | `P/affinity/<node>/<addr>-<len>` | pool name (index of the node's blocks) |
//! | `P/nodes/<node>` | [`NodeAffinity`]: bumped by every change of the node's affinities |
//! | `P/handles/<network>/<container>/<ifname>` | [`HandleRecord`] |
//!
//! Every change is one transaction that compares the revisions of every key
//! it read and depends on (the block, the handle, the absence of a new block)
//! and writes the block, the affinity index and the handle together, so an
//! address is in a block's allocations exactly when it is in its handle's
//! record. A failed compare means someone else changed what we read: re-read
//! and try again.
//!
//! A node's set of affine blocks changes (a claim, a release of affinity) only
//! with a compare on its `P/nodes/<node>` key as read before the node's
//! affinities were listed: a claim made while another allocation for the same
//! node claimed a block fails and re-reads, finding room in the new block,
//! so parallel allocations claim only the blocks they need.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use brindle_api::framing::RemoteErrorKind;
use brindle_api::ipam::{AssignedAddress, Attributes, HandleId};
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::{Block, HandleRecord, IpamConfig, ModelError, Pool, Reservation};
use crate::store::{Compare, Datastore, Entry, ScopeGuard, StoreError, Write};

mod batch;
mod inspect;
mod release;

/// Why an IPAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The request is malformed (bad handle, unknown pool, bad node name).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A pool or config given to the IPAM is not valid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// No address is free for this node.
    #[error("no free address: {0}")]
    Exhausted(String),
    /// The thing asked about does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Too many concurrent updates beat us; try again.
    #[error("too much contention: {0}")]
    Contention(String),
    /// The datastore failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IpamError {
    /// The socket protocol's error class for this error.
    pub fn kind(&self) -> RemoteErrorKind {
        match self {
            IpamError::InvalidRequest(_) | IpamError::Model(_) => RemoteErrorKind::InvalidRequest,
            IpamError::Exhausted(_) => RemoteErrorKind::Exhausted,
            IpamError::NotFound(_) => RemoteErrorKind::NotFound,
            IpamError::Contention(_) | IpamError::Store(StoreError::Unavailable(_)) => {
                RemoteErrorKind::TryAgainLater
            }
            IpamError::Store(_) => RemoteErrorKind::Internal,
        }
    }
}

/// An allocation request (the library form of `IpamOp::IpamAllocate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateArgs {
    /// The allocation's key.
    pub handle: HandleId,
    /// The node it is for.
    pub node: String,
    /// The node's labels, for pool selectors.
    pub node_labels: BTreeMap<String, String>,
    /// Pod namespace and name; `node` is filled from `node`.
    pub attrs: Attributes,
    /// Restrict to these pools (empty: all).
    pub pools: Vec<String>,
    /// Want an IPv4 address.
    pub ipv4: bool,
    /// Want an IPv6 address.
    pub ipv6: bool,
}

impl AllocateArgs {
    /// An IPv4-only request with no labels or attributes.
    pub fn v4(handle: HandleId, node: &str) -> Self {
        AllocateArgs {
            handle,
            node: node.to_owned(),
            node_labels: BTreeMap::new(),
            attrs: Attributes::default(),
            pools: Vec::new(),
            ipv4: true,
            ipv6: false,
        }
    }
}

/// The configuration snapshot one operation works from.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    config: IpamConfig,
    pools: Vec<Pool>,
    reserved: Vec<IpNet>,
}

impl Snapshot {
    fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    fn pool_of(&self, ip: IpAddr) -> Option<&Pool> {
        self.pools.iter().find(|p| p.cidr.contains(&ip))
    }
}

/// The value of `P/nodes/<node>`: its revision is what claims and releases of
/// the node's affinities compare; the count is for people reading the store.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct NodeAffinity {
    changes: u64,
}

/// A problem found by [`Ipam::audit`].
pub type AuditProblem = String;

/// The IPAM over one datastore.
pub struct Ipam<S> {
    store: S,
    prefix: String,
    retry_deadline: Duration,
    cache: Mutex<Cache>,
    /// Held by each batch of allocations (batch.rs) and each release by
    /// handle of this process, so they run one at a time. Concurrent ones
    /// would all compare on the node's one block: every commit fails the
    /// others' compares, and each loser retries the full, re-reading path
    /// (6 datastore round trips). Measured with 110 parallel ADDs on one
    /// node (perf/README.md, "Pod density"): the daemon and etcd spent 7 ms
    /// of CPU each per ADD. Other processes still meet the compares.
    writer: Mutex<()>,
    /// Allocations waiting for `writer`, committed in groups (batch.rs).
    queue: Mutex<batch::Queue>,
}

/// What a long-lived `Ipam` (the daemon's) remembers between operations to
/// make the common allocation a single transaction. Nothing here is trusted:
/// the hinted block is written with a compare on the revision it was cached
/// at, and any failure falls back to the full, re-reading path.
#[derive(Default)]
struct Cache {
    /// Pools, settings and reservations, with the time they were read.
    snapshot: Option<(Instant, Arc<Snapshot>)>,
    /// Per (node, IPv6?): the node's block that last had room, as written.
    hints: HashMap<(String, bool), (Entry, Block)>,
}

/// Forgets the cached configuration when dropped: at the end of an operation
/// that changed it, so that no allocation running meanwhile re-caches the
/// old one for long.
struct InvalidateOnDrop<'a>(&'a Mutex<Cache>);

impl Drop for InvalidateOnDrop<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).snapshot = None;
    }
}

/// How long the fast path trusts the cached pools and settings. Changes made
/// through this `Ipam` invalidate it at once; changes made elsewhere (another
/// process) take effect within this time.
pub const CONFIG_CACHE_TTL: Duration = Duration::from_secs(2);

const MAX_CONFLICTS: u32 = 200;

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising our own plain structs to JSON cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(e: &Entry) -> Result<T, IpamError> {
    serde_json::from_slice(&e.value)
        .map_err(|err| IpamError::Store(StoreError::Corrupt(format!("{}: {err}", e.key))))
}

fn net_key(n: &IpNet) -> String {
    format!("{}-{}", n.addr(), n.prefix_len())
}

fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn validate_node(node: &str) -> Result<(), IpamError> {
    if node.is_empty()
        || node.len() > 253
        || node
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(IpamError::InvalidRequest(format!(
            "node name {node:?} must be 1-253 characters without '/' or whitespace"
        )));
    }
    Ok(())
}

/// FNV-1a, to spread the first block each node tries to claim.
fn spread(node: &str) -> u64 {
    node.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What one attempt at a step concluded.
enum Attempt<T> {
    Done(T),
    /// A compare failed: re-read and retry.
    Conflict,
}

impl<S: Datastore> Ipam<S> {
    /// The IPAM over `store` with its keys under `prefix` (e.g. `/brindle/ipam`).
    pub fn new(store: S, prefix: &str) -> Self {
        Ipam {
            store,
            prefix: prefix.trim_end_matches('/').to_owned(),
            retry_deadline: Duration::from_secs(30),
            cache: Mutex::new(Cache::default()),
            writer: Mutex::new(()),
            queue: Mutex::new(batch::Queue::default()),
        }
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cached_snapshot(&self) -> Result<Arc<Snapshot>, IpamError> {
        if let Some((at, snap)) = &self.cache().snapshot
            && at.elapsed() < CONFIG_CACHE_TTL
        {
            return Ok(snap.clone());
        }
        let snap = Arc::new(self.snapshot()?);
        self.cache().snapshot = Some((Instant::now(), snap.clone()));
        Ok(snap)
    }

    fn remember_block(&self, node: &str, v6: bool, entry: Entry, block: Block) {
        self.cache()
            .hints
            .insert((node.to_owned(), v6), (entry, block));
    }

    /// The common case in one transaction: a new handle, and room in the
    /// block this node last allocated from. `None` sends the caller down the
    /// full path.
    fn try_fast_allocate(
        &self,
        args: &AllocateArgs,
        v6: bool,
    ) -> Result<Option<AssignedAddress>, IpamError> {
        // Taken out, not cloned: a concurrent allocation for the same node
        // goes down the full path instead of racing on the same block.
        let Some((entry, mut block)) = self.cache().hints.remove(&(args.node.clone(), v6)) else {
            return Ok(None);
        };
        let snap = self.cached_snapshot()?;
        let Ok(eligible) = eligible_pools(&snap, args, v6) else {
            return Ok(None);
        };
        let Some(pool) = eligible.iter().find(|p| p.name == block.pool) else {
            return Ok(None);
        };
        let Some(ord) = block.first_free(pool, &snap.reserved) else {
            return Ok(None);
        };
        block.allocations.insert(ord, args.handle.clone());
        let ip = block.address(ord);
        let rec = self.record_with(args, None, ip);
        let hkey = self.k_handle(&args.handle);
        let value = encode(&block);
        let rev = self.store.txn_revision(
            &[
                Compare::Revision(entry.key.clone(), entry.revision),
                Compare::Absent(hkey.clone()),
            ],
            &[
                Write::Put(entry.key.clone(), value.clone()),
                Write::Put(hkey, encode(&rec)),
            ],
        )?;
        let Some(rev) = rev else {
            return Ok(None);
        };
        let assigned = AssignedAddress {
            address: host_net(ip),
            pool: block.pool.clone(),
            block: block.cidr,
        };
        self.remember_block(
            &args.node,
            v6,
            Entry {
                key: entry.key,
                value,
                revision: rev,
            },
            block,
        );
        Ok(Some(assigned))
    }

    /// How long an operation keeps retrying an unavailable datastore.
    pub fn with_retry_deadline(mut self, d: Duration) -> Self {
        self.retry_deadline = d;
        self
    }

    /// The datastore.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn k_config(&self) -> String {
        format!("{}/config/", self.prefix)
    }
    fn k_ipam_config(&self) -> String {
        format!("{}/config/ipam", self.prefix)
    }
    fn k_pool(&self, name: &str) -> String {
        format!("{}/config/pools/{name}", self.prefix)
    }
    fn k_reservation(&self, name: &str) -> String {
        format!("{}/config/reservations/{name}", self.prefix)
    }
    fn k_blocks(&self) -> String {
        format!("{}/blocks/", self.prefix)
    }
    fn k_block(&self, cidr: &IpNet) -> String {
        format!("{}/blocks/{}", self.prefix, net_key(cidr))
    }
    fn k_affinities(&self, node: &str) -> String {
        format!("{}/affinity/{node}/", self.prefix)
    }
    fn k_affinity(&self, node: &str, cidr: &IpNet) -> String {
        format!("{}/affinity/{node}/{}", self.prefix, net_key(cidr))
    }
    fn k_node(&self, node: &str) -> String {
        format!("{}/nodes/{node}", self.prefix)
    }
    fn k_nodes(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }
    fn k_handles(&self) -> String {
        format!("{}/handles/", self.prefix)
    }
    fn k_handle(&self, h: &HandleId) -> String {
        format!(
            "{}/handles/{}/{}/{}",
            self.prefix, h.network, h.container_id, h.ifname
        )
    }

    /// Waits for this process's other allocations and releases (see
    /// `writer`); taken before the scope.
    fn writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, batch::Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn scope(&self) -> Result<ScopeGuard<'_>, IpamError> {
        Ok(ScopeGuard::begin(&self.store as &dyn Datastore)?)
    }

    /// Runs `step` until it is done, re-running it after a conflict (with a
    /// growing, jittered pause once conflicts repeat) and after an unavailable
    /// datastore until the retry deadline.
    fn retry<T>(
        &self,
        what: &str,
        mut step: impl FnMut() -> Result<Attempt<T>, IpamError>,
    ) -> Result<T, IpamError> {
        let deadline = Instant::now() + self.retry_deadline;
        let mut conflicts = 0u32;
        let mut pause = Duration::from_millis(5);
        loop {
            match step() {
                Ok(Attempt::Done(v)) => return Ok(v),
                Ok(Attempt::Conflict) => {
                    conflicts += 1;
                    if conflicts >= MAX_CONFLICTS {
                        return Err(IpamError::Contention(format!(
                            "{what}: {conflicts} conflicting updates in a row"
                        )));
                    }
                    if conflicts > 3 {
                        let jitter = rand::random_range(0..=u64::from(conflicts.min(20)) * 100);
                        std::thread::sleep(Duration::from_micros(jitter));
                    }
                }
                Err(IpamError::Store(StoreError::Unavailable(msg))) => {
                    if Instant::now() + pause > deadline {
                        return Err(IpamError::Store(StoreError::Unavailable(msg)));
                    }
                    tracing::warn!(what, error = %msg, "datastore unavailable, retrying");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn snapshot(&self) -> Result<Snapshot, IpamError> {
        let mut snap = Snapshot::default();
        let pools_prefix = self.k_pool("");
        let res_prefix = self.k_reservation("");
        for e in self.store.list(&self.k_config())? {
            if e.key == self.k_ipam_config() {
                snap.config = decode(&e)?;
            } else if e.key.starts_with(&pools_prefix) {
                let pool: Pool = decode(&e)?;
                // Written by another tool or an older version: never let a
                // pool that would break the arithmetic into the allocator.
                match pool.validate() {
                    Ok(()) => snap.pools.push(pool),
                    Err(err) => tracing::warn!(key = %e.key, error = %err, "ignoring invalid pool"),
                }
            } else if e.key.starts_with(&res_prefix) {
                let r: Reservation = decode(&e)?;
                snap.reserved.extend(r.cidrs);
            }
        }
        Ok(snap)
    }

    // ===== configuration =====

    /// Creates or replaces a pool. A pool may not overlap another one, and a
    /// pool that has blocks keeps its CIDR and block size.
    pub fn put_pool(&self, pool: &Pool) -> Result<(), IpamError> {
        let _fresh = InvalidateOnDrop(&self.cache);
        pool.validate()?;
        let _scope = self.scope()?;
        self.retry("put pool", || {
            let snap = self.snapshot()?;
            if let Some(other) = snap.pools.iter().find(|p| {
                p.name != pool.name
                    && (p.cidr.contains(&pool.cidr.network())
                        || pool.cidr.contains(&p.cidr.network()))
            }) {
                return Err(IpamError::InvalidRequest(format!(
                    "pool {} ({}) overlaps pool {} ({})",
                    pool.name, pool.cidr, other.name, other.cidr
                )));
            }
            let key = self.k_pool(&pool.name);
            let existing = self.store.get(&key)?;
            if let Some(e) = &existing {
                let old: Pool = decode(e)?;
                let in_use = self
                    .store
                    .list(&self.k_blocks())?
                    .iter()
                    .filter_map(|b| decode::<Block>(b).ok())
                    .any(|b| b.pool == old.name);
                if in_use && (old.cidr != pool.cidr || old.block_prefix() != pool.block_prefix()) {
                    return Err(IpamError::InvalidRequest(format!(
                        "pool {} has blocks: its CIDR and block size cannot change",
                        pool.name
                    )));
                }
            }
            let ok = self.store.txn(
                &[Compare::unchanged(&key, existing.as_ref())],
                &[Write::Put(key.clone(), encode(pool))],
            )?;
            Ok(if ok {
                Attempt::Done(())
            } else {
                Attempt::Conflict
            })
        })
    }

    /// Sets the cluster-wide IPAM settings.
    pub fn set_config(&self, config: &IpamConfig) -> Result<(), IpamError> {
        let _fresh = InvalidateOnDrop(&self.cache);
        let _scope = self.scope()?;
        let key = self.k_ipam_config();
        self.store.txn(&[], &[Write::Put(key, encode(config))])?;
        Ok(())
    }

    /// Sets the cluster-wide IPAM settings unless some are already stored.
    pub fn set_config_if_absent(&self, config: &IpamConfig) -> Result<(), IpamError> {
        let _fresh = InvalidateOnDrop(&self.cache);
        let _scope = self.scope()?;
        let key = self.k_ipam_config();
        self.store.txn(
            &[Compare::Absent(key.clone())],
            &[Write::Put(key, encode(config))],
        )?;
        Ok(())
    }

    /// Creates or replaces a reservation.
    pub fn put_reservation(&self, r: &Reservation) -> Result<(), IpamError> {
        let _fresh = InvalidateOnDrop(&self.cache);
        if r.name.is_empty() || r.name.contains('/') {
            return Err(IpamError::InvalidRequest(format!(
                "reservation name {:?}",
                r.name
            )));
        }
        let _scope = self.scope()?;
        self.store
            .txn(&[], &[Write::Put(self.k_reservation(&r.name), encode(r))])?;
        Ok(())
    }

    // ===== allocation =====

    /// Allocates one address per requested family for `args.handle`.
    /// Idempotent: addresses the handle already holds are returned again.
    pub fn allocate(&self, args: &AllocateArgs) -> Result<Vec<AssignedAddress>, IpamError> {
        args.handle.validate().map_err(IpamError::InvalidRequest)?;
        validate_node(&args.node)?;
        if !args.ipv4 && !args.ipv6 {
            return Err(IpamError::InvalidRequest(
                "neither IPv4 nor IPv6 requested".into(),
            ));
        }
        // Queued: concurrent allocations of this process are committed
        // together (batch.rs).
        self.allocate_queued(args.clone())
    }

    /// One request's allocation, not batched; the caller holds the writer
    /// lock and the scope.
    fn allocate_unqueued(&self, args: &AllocateArgs) -> Result<Vec<AssignedAddress>, IpamError> {
        let mut out = Vec::new();
        for v6 in [false, true] {
            if (v6 && !args.ipv6) || (!v6 && !args.ipv4) {
                continue;
            }
            let assigned = self.retry("allocate", || self.allocate_family(args, v6))?;
            out.push(assigned);
        }
        Ok(out)
    }

    fn allocate_family(
        &self,
        args: &AllocateArgs,
        v6: bool,
    ) -> Result<Attempt<AssignedAddress>, IpamError> {
        if let Some(done) = self.try_fast_allocate(args, v6)? {
            return Ok(Attempt::Done(done));
        }
        let family = if v6 { "IPv6" } else { "IPv4" };
        let hkey = self.k_handle(&args.handle);
        let handle_entry = self.store.get(&hkey)?;
        let record: Option<HandleRecord> = handle_entry.as_ref().map(decode).transpose()?;
        let snap = self.snapshot()?;

        if let Some(rec) = &record
            && let Some(ip) = rec.addresses.iter().find(|ip| ip.is_ipv6() == v6)
        {
            let pool = snap.pool_of(*ip);
            return Ok(Attempt::Done(AssignedAddress {
                address: host_net(*ip),
                pool: pool.map(|p| p.name.clone()).unwrap_or_default(),
                block: pool
                    .and_then(|p| p.block_of(*ip))
                    .unwrap_or_else(|| host_net(*ip)),
            }));
        }

        let eligible = eligible_pools(&snap, args, v6)?;
        let is_eligible = |name: &str| eligible.iter().any(|p| p.name == name);

        // 1. A free address in a block affine to this node. The node's
        // affinity record is read first: a claim below compares it.
        let node_key = self.k_node(&args.node);
        let node_entry = self.store.get(&node_key)?;
        let affinities = self.store.list(&self.k_affinities(&args.node))?;
        for a in &affinities {
            let Some(cidr_key) = a.key.rsplit('/').next() else {
                continue;
            };
            let bkey = format!("{}{}", self.k_blocks(), cidr_key);
            let Some(be) = self.store.get(&bkey)? else {
                continue;
            };
            let block: Block = decode(&be)?;
            if !is_eligible(&block.pool) || block.affinity.as_deref() != Some(args.node.as_str()) {
                continue;
            }
            if let Some(pool) = snap.pool(&block.pool)
                && let Some(ord) = block.first_free(pool, &snap.reserved)
            {
                return self.commit_in_block(
                    args,
                    &hkey,
                    handle_entry.as_ref(),
                    record.as_ref(),
                    &be,
                    block,
                    ord,
                );
            }
        }

        // 2. Claim a new block for this node.
        let all_blocks = self.store.list(&self.k_blocks())?;
        let under_cap = snap.config.max_blocks_per_host == 0
            || (affinities.len() as u64) < u64::from(snap.config.max_blocks_per_host);
        if under_cap {
            let taken: HashSet<&str> = all_blocks
                .iter()
                .filter_map(|e| e.key.rsplit('/').next())
                .collect();
            for pool in &eligible {
                if let Some(cidr) = self.free_block(pool, &taken, &snap, &args.node) {
                    let mut block = Block::new(cidr, &pool.name, Some(&args.node));
                    let Some(ord) = block.first_free(pool, &snap.reserved) else {
                        continue;
                    };
                    block.allocations.insert(ord, args.handle.clone());
                    let ip = block.address(ord);
                    let rec = self.record_with(args, record.as_ref(), ip);
                    let bkey = self.k_block(&cidr);
                    let value = encode(&block);
                    let (node_compare, node_write) =
                        self.affinity_change(&node_key, node_entry.as_ref())?;
                    let rev = self.store.txn_revision(
                        &[
                            Compare::Absent(bkey.clone()),
                            Compare::unchanged(&hkey, handle_entry.as_ref()),
                            node_compare,
                        ],
                        &[
                            Write::Put(bkey.clone(), value.clone()),
                            Write::Put(
                                self.k_affinity(&args.node, &cidr),
                                pool.name.clone().into_bytes(),
                            ),
                            Write::Put(hkey.clone(), encode(&rec)),
                            node_write,
                        ],
                    )?;
                    let Some(rev) = rev else {
                        return Ok(Attempt::Conflict);
                    };
                    tracing::debug!(node = %args.node, block = %cidr, "claimed block");
                    let entry = Entry {
                        key: bkey,
                        value,
                        revision: rev,
                    };
                    self.remember_block(&args.node, v6, entry, block);
                    return Ok(Attempt::Done(AssignedAddress {
                        address: host_net(ip),
                        pool: pool.name.clone(),
                        block: cidr,
                    }));
                }
            }
        }

        // 3. Borrow from any block of an eligible pool, unless affinity is strict.
        if !snap.config.strict_affinity {
            for be in &all_blocks {
                let block: Block = decode(be)?;
                if !is_eligible(&block.pool) {
                    continue;
                }
                if let Some(pool) = snap.pool(&block.pool)
                    && let Some(ord) = block.first_free(pool, &snap.reserved)
                {
                    return self.commit_in_block(
                        args,
                        &hkey,
                        handle_entry.as_ref(),
                        record.as_ref(),
                        be,
                        block,
                        ord,
                    );
                }
            }
        }
        Err(IpamError::Exhausted(format!(
            "no free {family} address for node {} (strict affinity {}, blocks {}/{})",
            args.node,
            snap.config.strict_affinity,
            affinities.len(),
            if snap.config.max_blocks_per_host == 0 {
                "unlimited".to_owned()
            } else {
                snap.config.max_blocks_per_host.to_string()
            }
        )))
    }

    /// The compare and the write that make a transaction change the node's
    /// affinities only if nobody else did since `entry` was read.
    fn affinity_change(
        &self,
        node_key: &str,
        entry: Option<&Entry>,
    ) -> Result<(Compare, Write), IpamError> {
        let mut record: NodeAffinity = entry.map(decode).transpose()?.unwrap_or_default();
        record.changes += 1;
        Ok((
            Compare::unchanged(node_key, entry),
            Write::Put(node_key.to_owned(), encode(&record)),
        ))
    }

    fn record_with(
        &self,
        args: &AllocateArgs,
        record: Option<&HandleRecord>,
        ip: IpAddr,
    ) -> HandleRecord {
        let mut rec = record.cloned().unwrap_or_else(|| HandleRecord {
            handle: args.handle.clone(),
            attrs: Attributes {
                node: args.node.clone(),
                ..args.attrs.clone()
            },
            addresses: BTreeSet::new(),
        });
        rec.addresses.insert(ip);
        rec
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_in_block(
        &self,
        args: &AllocateArgs,
        hkey: &str,
        handle_entry: Option<&Entry>,
        record: Option<&HandleRecord>,
        block_entry: &Entry,
        mut block: Block,
        ord: u32,
    ) -> Result<Attempt<AssignedAddress>, IpamError> {
        block.allocations.insert(ord, args.handle.clone());
        let ip = block.address(ord);
        let rec = self.record_with(args, record, ip);
        let value = encode(&block);
        let rev = self.store.txn_revision(
            &[
                Compare::Revision(block_entry.key.clone(), block_entry.revision),
                Compare::unchanged(hkey, handle_entry),
            ],
            &[
                Write::Put(block_entry.key.clone(), value.clone()),
                Write::Put(hkey.to_owned(), encode(&rec)),
            ],
        )?;
        let Some(rev) = rev else {
            return Ok(Attempt::Conflict);
        };
        let assigned = AssignedAddress {
            address: host_net(ip),
            pool: block.pool.clone(),
            block: block.cidr,
        };
        if block.affinity.as_deref() == Some(args.node.as_str()) {
            let v6 = ip.is_ipv6();
            let entry = Entry {
                key: block_entry.key.clone(),
                value,
                revision: rev,
            };
            self.remember_block(&args.node, v6, entry, block);
        }
        Ok(Attempt::Done(assigned))
    }

    /// A block of `pool` nobody holds and with a usable address, searched from
    /// a node-specific starting point so that nodes claiming at once rarely
    /// collide.
    fn free_block(
        &self,
        pool: &Pool,
        taken: &HashSet<&str>,
        snap: &Snapshot,
        node: &str,
    ) -> Option<IpNet> {
        let count = pool.block_count();
        let start = u128::from(spread(node)) % count;
        // Every taken block can cost one probe; a bounded number of fully
        // reserved ones more.
        let probes = (taken.len() as u128 + 4096).min(count);
        (0..probes).find_map(|i| {
            let cidr = pool.block_at((start + i) % count)?;
            if taken.contains(net_key(&cidr).as_str()) {
                return None;
            }
            let b = Block::new(cidr, &pool.name, None);
            b.first_free(pool, &snap.reserved).map(|_| cidr)
        })
    }
}

/// The pools `args` may allocate from in one family.
fn eligible_pools<'a>(
    snap: &'a Snapshot,
    args: &AllocateArgs,
    v6: bool,
) -> Result<Vec<&'a Pool>, IpamError> {
    for name in &args.pools {
        if snap.pool(name).is_none() {
            return Err(IpamError::InvalidRequest(format!("no pool named {name:?}")));
        }
    }
    let eligible: Vec<&Pool> = snap
        .pools
        .iter()
        .filter(|p| p.cidr.addr().is_ipv6() == v6 && !p.disabled)
        .filter(|p| args.pools.is_empty() || args.pools.contains(&p.name))
        .filter(|p| p.selects(&args.node_labels))
        .collect();
    if eligible.is_empty() {
        return Err(IpamError::Exhausted(format!(
            "no enabled {} pool selects node {}",
            if v6 { "IPv6" } else { "IPv4" },
            args.node
        )));
    }
    Ok(eligible)
}
