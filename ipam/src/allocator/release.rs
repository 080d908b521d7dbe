//! Release (by handle, by address) and garbage collection.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use brindle_api::ipam::{Attachment, GcReport, HandleId};
use ipnet::IpNet;

use super::{Attempt, Ipam, IpamError, Snapshot, decode, encode};
use crate::model::{Block, HandleRecord};
use crate::store::{Compare, Datastore, Entry, Write};

impl<S: Datastore> Ipam<S> {
    // ===== release =====

    /// Finds the block holding `ip`: computed from its pool, or by scanning
    /// when the pool is gone.
    fn block_entry_of(&self, snap: &Snapshot, ip: IpAddr) -> Result<Option<Entry>, IpamError> {
        if let Some(cidr) = snap.pool_of(ip).and_then(|p| p.block_of(ip)) {
            return Ok(self.store.get(&self.k_block(&cidr))?);
        }
        for e in self.store.list(&self.k_blocks())? {
            let b: Block = decode(&e)?;
            if b.cidr.contains(&ip) {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Releases everything `handle` holds. An unknown handle releases nothing
    /// (CNI DEL is idempotent).
    pub fn release_handle(&self, handle: &HandleId) -> Result<Vec<IpAddr>, IpamError> {
        handle.validate().map_err(IpamError::InvalidRequest)?;
        let _writer = self.writer();
        let _scope = self.scope()?;
        self.retry("release", || self.release_handle_once(handle))
    }

    fn release_handle_once(&self, handle: &HandleId) -> Result<Attempt<Vec<IpAddr>>, IpamError> {
        let hkey = self.k_handle(handle);
        let Some(he) = self.store.get(&hkey)? else {
            return Ok(Attempt::Done(Vec::new()));
        };
        let rec: HandleRecord = decode(&he)?;
        let snap = self.snapshot()?;
        let mut compares = vec![Compare::Revision(hkey.clone(), he.revision)];
        let mut blocks: BTreeMap<String, Block> = BTreeMap::new();
        let mut released = Vec::new();
        for ip in &rec.addresses {
            let Some(be) = self.block_entry_of(&snap, *ip)? else {
                tracing::warn!(%ip, handle = %handle, "address of handle is in no block");
                continue;
            };
            if !blocks.contains_key(&be.key) {
                compares.push(Compare::Revision(be.key.clone(), be.revision));
                blocks.insert(be.key.clone(), decode(&be)?);
            }
            if let Some(block) = blocks.get_mut(&be.key)
                && let Some(ord) = block.ordinal(*ip)
                && block.allocations.get(&ord) == Some(handle)
            {
                block.allocations.remove(&ord);
                released.push(*ip);
            }
        }
        let mut writes = vec![Write::Delete(hkey)];
        self.put_back(&blocks, &mut compares, &mut writes)?;
        if self.store.txn(&compares, &writes)? {
            Ok(Attempt::Done(released))
        } else {
            Ok(Attempt::Conflict)
        }
    }

    /// Releases one address whoever holds it; `None` when it was free.
    pub fn release_address(&self, ip: IpAddr) -> Result<Option<IpAddr>, IpamError> {
        let _scope = self.scope()?;
        self.retry("release address", || {
            let snap = self.snapshot()?;
            let Some(be) = self.block_entry_of(&snap, ip)? else {
                return Ok(Attempt::Done(None));
            };
            let mut block: Block = decode(&be)?;
            let Some(ord) = block.ordinal(ip) else {
                return Ok(Attempt::Done(None));
            };
            let Some(handle) = block.allocations.remove(&ord) else {
                return Ok(Attempt::Done(None));
            };
            let hkey = self.k_handle(&handle);
            let he = self.store.get(&hkey)?;
            let mut compares = vec![Compare::Revision(be.key.clone(), be.revision)];
            let mut writes = Vec::new();
            if let Some(he) = &he {
                compares.push(Compare::Revision(hkey.clone(), he.revision));
                let mut rec: HandleRecord = decode(he)?;
                rec.addresses.remove(&ip);
                if rec.addresses.is_empty() {
                    writes.push(Write::Delete(hkey.clone()));
                } else {
                    writes.push(Write::Put(hkey.clone(), encode(&rec)));
                }
            }
            let blocks = BTreeMap::from([(be.key.clone(), block)]);
            self.put_back(&blocks, &mut compares, &mut writes)?;
            Ok(if self.store.txn(&compares, &writes)? {
                Attempt::Done(Some(ip))
            } else {
                Attempt::Conflict
            })
        })
    }

    /// The writes that store `blocks` (keyed by their keys) after addresses
    /// were taken out of them. A block left empty is retired when nobody
    /// needs it: deleted when no node has affinity for it, and deleted with
    /// its affinity when its node keeps another block of the same family, as
    /// Calico releases such affinities: a burst of pods does not leave a
    /// node holding blocks it no longer uses, so pools do not fragment. The
    /// node's affinity record is compared and bumped, so two releases at once
    /// never leave the node without a block.
    fn put_back(
        &self,
        blocks: &BTreeMap<String, Block>,
        compares: &mut Vec<Compare>,
        writes: &mut Vec<Write>,
    ) -> Result<(), IpamError> {
        let mut retired: HashSet<IpNet> = HashSet::new();
        let mut nodes_changed: BTreeMap<String, Option<Entry>> = BTreeMap::new();
        for (key, block) in blocks {
            if !block.is_empty() {
                writes.push(Write::Put(key.clone(), encode(block)));
                continue;
            }
            let Some(node) = &block.affinity else {
                writes.push(Write::Delete(key.clone()));
                continue;
            };
            let node_key = self.k_node(node);
            let node_entry = match nodes_changed.get(node) {
                Some(e) => e.clone(),
                None => self.store.get(&node_key)?,
            };
            let v6 = block.cidr.addr().is_ipv6();
            let keeps_another = self
                .store
                .list(&self.k_affinities(node))?
                .iter()
                .filter_map(|a| affinity_block(&a.key))
                .any(|cidr| {
                    cidr != block.cidr && cidr.addr().is_ipv6() == v6 && !retired.contains(&cidr)
                });
            if !keeps_another {
                writes.push(Write::Put(key.clone(), encode(block)));
                continue;
            }
            tracing::debug!(%node, block = %block.cidr, "releasing the affinity of an empty block");
            retired.insert(block.cidr);
            writes.push(Write::Delete(key.clone()));
            writes.push(Write::Delete(self.k_affinity(node, &block.cidr)));
            nodes_changed.insert(node.clone(), node_entry);
        }
        for (node, entry) in nodes_changed {
            let (compare, write) = self.affinity_change(&self.k_node(&node), entry.as_ref())?;
            compares.push(compare);
            writes.push(write);
        }
        Ok(())
    }

    // ===== garbage collection =====

    /// CNI GC: releases every handle of `network` on `node` that is not one of
    /// the `valid` attachments.
    pub fn gc_attachments(
        &self,
        network: &str,
        node: &str,
        valid: &[Attachment],
    ) -> Result<GcReport, IpamError> {
        let _scope = self.scope()?;
        let valid: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let mut report = GcReport::default();
        let prefix = format!("{}{network}/", self.k_handles());
        for e in self.store.list(&prefix)? {
            let rec: HandleRecord = decode(&e)?;
            if rec.attrs.node != node
                || valid.contains(&(rec.handle.container_id.as_str(), rec.handle.ifname.as_str()))
            {
                continue;
            }
            let released = self.retry("gc release", || self.release_handle_once(&rec.handle))?;
            report.addresses.extend(released);
            report.handles.push(rec.handle);
        }
        Ok(report)
    }

    /// Node GC: releases every handle of a node not in `live_nodes`, deletes
    /// the blocks of such nodes once empty, and gives up their affinity while
    /// they still hold addresses of other nodes' pods (borrowed).
    pub fn gc_nodes(&self, live_nodes: &[String]) -> Result<GcReport, IpamError> {
        let _scope = self.scope()?;
        let live: HashSet<&str> = live_nodes.iter().map(String::as_str).collect();
        let mut report = GcReport::default();
        for e in self.store.list(&self.k_handles())? {
            let rec: HandleRecord = decode(&e)?;
            if live.contains(rec.attrs.node.as_str()) {
                continue;
            }
            let released = self.retry("gc release", || self.release_handle_once(&rec.handle))?;
            report.addresses.extend(released);
            report.handles.push(rec.handle);
        }
        let candidates: Vec<IpNet> = self
            .all_blocks()?
            .into_iter()
            .filter(|(_, b)| b.affinity.as_deref().is_none_or(|n| !live.contains(n)))
            .map(|(_, b)| b.cidr)
            .collect();
        for cidr in candidates {
            let deleted = self.retry("gc block", || {
                let key = self.k_block(&cidr);
                let Some(be) = self.store.get(&key)? else {
                    return Ok(Attempt::Done(false));
                };
                let mut block: Block = decode(&be)?;
                let Some(owner) = block.affinity.clone().or_else(|| {
                    // An orphan block: delete it when empty.
                    block.is_empty().then(String::new)
                }) else {
                    return Ok(Attempt::Done(false));
                };
                if live.contains(owner.as_str()) {
                    return Ok(Attempt::Done(false));
                }
                let compares = [Compare::Revision(key.clone(), be.revision)];
                let aff = (!owner.is_empty()).then(|| self.k_affinity(&owner, &cidr));
                let (writes, deleted) = if block.is_empty() {
                    let mut w = vec![Write::Delete(key.clone())];
                    w.extend(aff.map(Write::Delete));
                    (w, true)
                } else {
                    block.affinity = None;
                    let mut w = vec![Write::Put(key.clone(), encode(&block))];
                    w.extend(aff.map(Write::Delete));
                    (w, false)
                };
                Ok(if self.store.txn(&compares, &writes)? {
                    Attempt::Done(deleted)
                } else {
                    Attempt::Conflict
                })
            })?;
            if deleted {
                report.blocks.push(cidr);
            }
        }
        // The affinity records of gone nodes (their affinities are gone).
        let nodes_prefix = self.k_nodes();
        let gone: Vec<Write> = self
            .store
            .list(&nodes_prefix)?
            .into_iter()
            .filter(|e| !live.contains(&e.key[nodes_prefix.len()..]))
            .map(|e| Write::Delete(e.key))
            .collect();
        if !gone.is_empty() {
            self.store.txn(&[], &gone)?;
        }
        Ok(report)
    }
}

/// The block an affinity key (`P/affinity/<node>/<addr>-<len>`) names.
fn affinity_block(key: &str) -> Option<IpNet> {
    let (addr, len) = key.rsplit('/').next()?.rsplit_once('-')?;
    IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()
}
