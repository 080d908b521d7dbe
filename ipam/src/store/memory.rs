//! An in-memory [`Datastore`] for unit and property tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Compare, Datastore, Entry, StoreError, Write};

/// Keys in a `BTreeMap` behind a mutex, with a global revision counter like
/// etcd's.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    revision: u64,
    keys: BTreeMap<String, (u64, Vec<u8>)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied
        // transaction (writes are applied after all checks), so the data is
        // still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Datastore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.lock().keys.get(key).map(|(rev, v)| Entry {
            key: key.to_owned(),
            value: v.clone(),
            revision: *rev,
        }))
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .keys
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (rev, v))| Entry {
                key: k.clone(),
                value: v.clone(),
                revision: *rev,
            })
            .collect())
    }

    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
        let mut inner = self.lock();
        let holds = compares.iter().all(|c| match c {
            Compare::Absent(k) => !inner.keys.contains_key(k),
            Compare::Revision(k, r) => inner.keys.get(k).map(|(rev, _)| rev) == Some(r),
        });
        if !holds {
            return Ok(None);
        }
        inner.revision += 1;
        let rev = inner.revision;
        for w in writes {
            match w {
                Write::Put(k, v) => {
                    inner.keys.insert(k.clone(), (rev, v.clone()));
                }
                Write::Delete(k) => {
                    inner.keys.remove(k);
                }
            }
        }
        Ok(Some(rev))
    }
}
