//! Views of the datastore (handles, pools, blocks, status) and the audit.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use brindle_api::ipam::{BlockView, HandleId, HandleView, IpamStatus, PoolView};

use super::{AuditProblem, Ipam, IpamError, decode};
use crate::model::{Block, HandleRecord};
use crate::store::{Datastore, Entry};

impl<S: Datastore> Ipam<S> {
    // ===== views =====

    /// What `handle` holds.
    pub fn query_handle(&self, handle: &HandleId) -> Result<Option<HandleView>, IpamError> {
        handle.validate().map_err(IpamError::InvalidRequest)?;
        let _scope = self.scope()?;
        let e = self.store.get(&self.k_handle(handle))?;
        e.map(|e| decode::<HandleRecord>(&e).map(view_of_handle))
            .transpose()
    }

    /// Every handle.
    pub fn handles(&self) -> Result<Vec<HandleView>, IpamError> {
        let _scope = self.scope()?;
        self.store
            .list(&self.k_handles())?
            .iter()
            .map(|e| decode::<HandleRecord>(e).map(view_of_handle))
            .collect()
    }

    /// Every pool with its usage.
    pub fn pools(&self) -> Result<Vec<PoolView>, IpamError> {
        let _scope = self.scope()?;
        let snap = self.snapshot()?;
        let blocks = self.all_blocks()?;
        Ok(snap
            .pools
            .iter()
            .map(|p| {
                let mine = blocks.iter().filter(|(_, b)| b.pool == p.name);
                PoolView {
                    name: p.name.clone(),
                    cidr: p.cidr,
                    block_size: p.block_prefix(),
                    encapsulation: p.encapsulation,
                    nat_outgoing: p.nat_outgoing,
                    node_selector: if p.node_selector.is_empty() {
                        "all()".to_owned()
                    } else {
                        p.node_selector.clone()
                    },
                    disabled: p.disabled,
                    blocks: mine.clone().count() as u64,
                    capacity: p.capacity(),
                    allocated: mine.map(|(_, b)| b.allocations.len() as u64).sum(),
                }
            })
            .collect())
    }

    /// Every block with affinity and usage.
    pub fn blocks(&self) -> Result<Vec<BlockView>, IpamError> {
        let _scope = self.scope()?;
        let snap = self.snapshot()?;
        Ok(self
            .all_blocks()?
            .into_iter()
            .map(|(_, b)| BlockView {
                usable: snap
                    .pool(&b.pool)
                    .map(|p| u64::from(b.usable_count(p, &snap.reserved)))
                    .unwrap_or(0),
                allocated: b.allocations.len() as u64,
                cidr: b.cidr,
                pool: b.pool,
                affinity: b.affinity,
            })
            .collect())
    }

    pub(super) fn all_blocks(&self) -> Result<Vec<(Entry, Block)>, IpamError> {
        self.store
            .list(&self.k_blocks())?
            .into_iter()
            .map(|e| decode(&e).map(|b| (e, b)))
            .collect()
    }

    /// Whether the datastore answers, and how much is free.
    pub fn status(&self) -> Result<IpamStatus, IpamError> {
        let _scope = self.scope()?;
        let snap = self.snapshot()?;
        let blocks = self.all_blocks()?;
        let mut free: u128 = 0;
        let mut pools = 0;
        for p in snap.pools.iter().filter(|p| !p.disabled) {
            pools += 1;
            let used: u128 = blocks
                .iter()
                .filter(|(_, b)| b.pool == p.name)
                .map(|(_, b)| b.allocations.len() as u128)
                .sum();
            free = free.saturating_add(p.capacity().saturating_sub(used));
        }
        Ok(IpamStatus {
            datastore: self.store.kind().to_owned(),
            pools,
            free: u64::try_from(free).unwrap_or(u64::MAX),
        })
    }

    // ===== audit =====

    /// Checks the invariants between blocks, handles and affinities; returns
    /// every violation (empty when consistent). Used by tests and by
    /// `brindle-ipam admin audit`.
    pub fn audit(&self) -> Result<Vec<AuditProblem>, IpamError> {
        let _scope = self.scope()?;
        let mut problems = Vec::new();
        let blocks = self.all_blocks()?;
        let mut owner_of: BTreeMap<IpAddr, HandleId> = BTreeMap::new();
        for (i, (_, b)) in blocks.iter().enumerate() {
            for (_, other) in blocks.iter().skip(i + 1) {
                if b.cidr.contains(&other.cidr.network()) || other.cidr.contains(&b.cidr.network())
                {
                    problems.push(format!("blocks {} and {} overlap", b.cidr, other.cidr));
                }
            }
            for (ord, h) in &b.allocations {
                if *ord >= b.len() {
                    problems.push(format!("block {} has ordinal {ord} out of range", b.cidr));
                    continue;
                }
                if let Some(prev) = owner_of.insert(b.address(*ord), h.clone()) {
                    problems.push(format!(
                        "{} allocated twice ({prev} and {h})",
                        b.address(*ord)
                    ));
                }
            }
            if let Some(node) = &b.affinity
                && self.store.get(&self.k_affinity(node, &b.cidr))?.is_none()
            {
                problems.push(format!(
                    "block {} affine to {node} has no affinity key",
                    b.cidr
                ));
            }
        }
        let handles: Vec<HandleRecord> = self
            .store
            .list(&self.k_handles())?
            .iter()
            .map(decode)
            .collect::<Result<_, _>>()?;
        let mut held: BTreeSet<IpAddr> = BTreeSet::new();
        for rec in &handles {
            for ip in &rec.addresses {
                held.insert(*ip);
                match owner_of.get(ip) {
                    Some(h) if *h == rec.handle => {}
                    Some(h) => {
                        problems.push(format!("{ip} held by {} but allocated to {h}", rec.handle))
                    }
                    None => {
                        problems.push(format!("{ip} held by {} but free in its block", rec.handle))
                    }
                }
            }
        }
        for (ip, h) in &owner_of {
            if !held.contains(ip) {
                problems.push(format!(
                    "{ip} allocated to {h} which does not hold it (leaked)"
                ));
            }
        }
        Ok(problems)
    }
}

fn view_of_handle(r: HandleRecord) -> HandleView {
    HandleView {
        handle: r.handle,
        attrs: r.attrs,
        addresses: r.addresses.into_iter().collect(),
    }
}
