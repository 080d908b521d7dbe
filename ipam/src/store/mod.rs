//! The datastore seam: a small key-value interface with etcd's transaction
//! model (compare revisions, then apply writes atomically), implemented by an
//! in-memory store (tests), the embedded redb store and etcd v3.
//!
//! The IPAM logic is written once against [`Datastore`]; every update it makes
//! is a compare-and-swap on the revisions it read, so the same code is safe
//! on every backend.

use std::fmt;

pub mod embedded;
pub mod etcd;
pub mod memory;

pub use embedded::{EmbeddedMode, EmbeddedStore};
pub use etcd::{EtcdStore, EtcdTls};
pub use memory::MemoryStore;

/// A stored value and the revision of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Full key.
    pub key: String,
    /// Value bytes (JSON for every IPAM record).
    pub value: Vec<u8>,
    /// Revision of the last write to this key; never 0 for a present key.
    pub revision: u64,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists with exactly this revision.
    Revision(String, u64),
}

impl Compare {
    /// `Revision` when `entry` is some, `Absent` otherwise: "unchanged since I
    /// read it".
    pub fn unchanged(key: &str, entry: Option<&Entry>) -> Self {
        match entry {
            Some(e) => Compare::Revision(key.to_owned(), e.revision),
            None => Compare::Absent(key.to_owned()),
        }
    }
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Set the key.
    Put(String, Vec<u8>),
    /// Remove the key (no-op if absent).
    Delete(String),
}

/// What a datastore can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached now (etcd down, lock held too long);
    /// the caller may retry later.
    #[error("datastore unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something that is not ours.
    #[error("datastore corrupt: {0}")]
    Corrupt(String),
    /// Any other backend failure.
    #[error("datastore: {0}")]
    Backend(String),
}

/// A transactional key-value store with per-key revisions.
pub trait Datastore: Send + Sync {
    /// Short name for status output (`memory`, `embedded`, `etcd`).
    fn kind(&self) -> &'static str;
    /// Reads one key.
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError>;
    /// Reads every key starting with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError>;
    /// Applies `writes` atomically if every compare holds; returns the
    /// revision the written keys now have, or `None` when a compare failed.
    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError>;
    /// Applies `writes` atomically if every compare holds; returns whether it
    /// did.
    fn txn(&self, compares: &[Compare], writes: &[Write]) -> Result<bool, StoreError> {
        Ok(self.txn_revision(compares, writes)?.is_some())
    }
    /// Starts a scope in which this thread's operations form one exclusive
    /// session (the embedded store opens the file once for a whole IPAM
    /// operation). Scopes nest. Default: nothing.
    fn begin_scope(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Ends the innermost scope.
    fn end_scope(&self) {}
}

impl<D: Datastore + ?Sized> Datastore for Box<D> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        (**self).get(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        (**self).list(prefix)
    }
    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
        (**self).txn_revision(compares, writes)
    }
    fn begin_scope(&self) -> Result<(), StoreError> {
        (**self).begin_scope()
    }
    fn end_scope(&self) {
        (**self).end_scope()
    }
}

impl<D: Datastore + ?Sized> Datastore for &D {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        (**self).get(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        (**self).list(prefix)
    }
    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
        (**self).txn_revision(compares, writes)
    }
    fn begin_scope(&self) -> Result<(), StoreError> {
        (**self).begin_scope()
    }
    fn end_scope(&self) {
        (**self).end_scope()
    }
}

impl<D: Datastore + ?Sized> Datastore for std::sync::Arc<D> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        (**self).get(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        (**self).list(prefix)
    }
    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
        (**self).txn_revision(compares, writes)
    }
    fn begin_scope(&self) -> Result<(), StoreError> {
        (**self).begin_scope()
    }
    fn end_scope(&self) {
        (**self).end_scope()
    }
}

/// Ends a scope when dropped, also on early return.
pub struct ScopeGuard<'a> {
    store: &'a dyn Datastore,
}

impl<'a> ScopeGuard<'a> {
    /// Begins a scope on `store`.
    pub fn begin(store: &'a dyn Datastore) -> Result<Self, StoreError> {
        store.begin_scope()?;
        Ok(ScopeGuard { store })
    }
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        self.store.end_scope();
    }
}

impl fmt::Debug for ScopeGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScopeGuard({})", self.store.kind())
    }
}
