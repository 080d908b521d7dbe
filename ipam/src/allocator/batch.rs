//! Allocations of one process committed in groups: concurrent requests
//! queue, and whoever takes the writer lock allocates for every request
//! waiting, those alike (same node, one family, same pools) in one
//! transaction on the node's hinted block, the rest one by one.
//!
//! Why: 110 parallel ADDs on one node all want the node's one block. One
//! at a time, each is a transaction whose commit (an etcd write, fsynced)
//! the next waits for, so the last ADD waited for 110 commits; together
//! they are a few.

use std::collections::{HashMap, HashSet};

use brindle_api::ipam::AssignedAddress;

use super::{AllocateArgs, Ipam, IpamError, eligible_pools, encode, host_net};
use crate::store::{Compare, Datastore, Entry, Write};

/// Requests in one transaction at most: etcd refuses a transaction of more
/// than 128 operations by default (`--max-txn-ops`); each request is one
/// write, plus the block's.
pub(super) const MAX_BATCH: usize = 64;

/// The requests waiting for the writer lock and the answers for those
/// another thread allocated.
#[derive(Default)]
pub(super) struct Queue {
    next: u64,
    waiting: Vec<(u64, AllocateArgs)>,
    done: HashMap<u64, Result<Vec<AssignedAddress>, IpamError>>,
}

type Answers = HashMap<u64, Result<Vec<AssignedAddress>, IpamError>>;

impl<S: Datastore> Ipam<S> {
    /// Queues `args`, then either finds it allocated by the thread that held
    /// the writer lock before, or allocates everything waiting.
    pub(super) fn allocate_queued(
        &self,
        args: AllocateArgs,
    ) -> Result<Vec<AssignedAddress>, IpamError> {
        let id = {
            let mut q = self.queue();
            let id = q.next;
            q.next += 1;
            q.waiting.push((id, args));
            id
        };
        let _writer = self.writer();
        if let Some(answer) = self.queue().done.remove(&id) {
            return answer;
        }
        // Ours is waiting: whoever takes a batch answers it before
        // releasing the writer lock.
        let batch = std::mem::take(&mut self.queue().waiting);
        let scope = match self.scope() {
            Ok(s) => s,
            Err(e) => {
                // Put the others back: their own threads try again.
                self.queue()
                    .waiting
                    .extend(batch.into_iter().filter(|(i, _)| *i != id));
                return Err(e);
            }
        };
        let mut answers = self.allocate_batch(&batch);
        drop(scope);
        let mine = answers.remove(&id).unwrap_or_else(|| {
            Err(IpamError::Contention(
                "allocation lost from its batch".into(),
            ))
        });
        self.queue().done.extend(answers);
        mine
    }

    /// Allocates for every request of `batch` (under the writer lock and
    /// the scope).
    fn allocate_batch(&self, batch: &[(u64, AllocateArgs)]) -> Answers {
        let mut answers = Answers::new();
        if let Some((_, first)) = batch.first()
            && first.ipv4 != first.ipv6
            && batch.len() > 1
        {
            let v6 = first.ipv6;
            let mut handles = HashSet::new();
            // The same handle twice (a retried ADD racing itself) is left
            // to the one-by-one path, which finds the first one's record.
            let alike: Vec<&(u64, AllocateArgs)> = batch
                .iter()
                .filter(|(_, a)| {
                    a.node == first.node
                        && a.ipv4 == first.ipv4
                        && a.ipv6 == first.ipv6
                        && a.pools == first.pools
                        && a.node_labels == first.node_labels
                })
                .filter(|(_, a)| handles.insert(a.handle.clone()))
                .collect();
            for chunk in alike.chunks(MAX_BATCH).filter(|c| c.len() > 1) {
                let args: Vec<&AllocateArgs> = chunk.iter().map(|(_, a)| a).collect();
                // Any failure (no hint, no room, a compare lost, the
                // datastore) leaves the chunk to the one-by-one path.
                if let Ok(Some(assigned)) = self.try_fast_batch(&args, v6) {
                    for ((id, _), a) in chunk.iter().zip(assigned) {
                        answers.insert(*id, Ok(vec![a]));
                    }
                }
            }
        }
        for (id, args) in batch {
            if !answers.contains_key(id) {
                answers.insert(*id, self.allocate_unqueued(args));
            }
        }
        answers
    }

    /// [`Ipam::try_fast_allocate`] for several new handles of one node and
    /// family at once: one transaction writes them all into the node's
    /// hinted block. `None` when it cannot (then nothing was written).
    fn try_fast_batch(
        &self,
        args: &[&AllocateArgs],
        v6: bool,
    ) -> Result<Option<Vec<AssignedAddress>>, IpamError> {
        let Some(first) = args.first() else {
            return Ok(Some(Vec::new()));
        };
        let Some((entry, mut block)) = self.cache().hints.remove(&(first.node.clone(), v6)) else {
            return Ok(None);
        };
        let snap = self.cached_snapshot()?;
        let Ok(eligible) = eligible_pools(&snap, first, v6) else {
            return Ok(None);
        };
        let Some(pool) = eligible.iter().find(|p| p.name == block.pool) else {
            return Ok(None);
        };
        let mut compares = vec![Compare::Revision(entry.key.clone(), entry.revision)];
        let mut writes = Vec::with_capacity(args.len() + 1);
        let mut assigned = Vec::with_capacity(args.len());
        for a in args {
            let Some(ord) = block.first_free(pool, &snap.reserved) else {
                return Ok(None);
            };
            block.allocations.insert(ord, a.handle.clone());
            let ip = block.address(ord);
            let hkey = self.k_handle(&a.handle);
            compares.push(Compare::Absent(hkey.clone()));
            writes.push(Write::Put(hkey, encode(&self.record_with(a, None, ip))));
            assigned.push(AssignedAddress {
                address: host_net(ip),
                pool: block.pool.clone(),
                block: block.cidr,
            });
        }
        let value = encode(&block);
        writes.push(Write::Put(entry.key.clone(), value.clone()));
        let Some(rev) = self.store.txn_revision(&compares, &writes)? else {
            return Ok(None);
        };
        self.remember_block(
            &first.node,
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
}
