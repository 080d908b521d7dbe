//! The embedded datastore: one redb file, for a single node with no server.
//!
//! redb lets one process at a time hold a database open, and the store is
//! touched by many short-lived plugin processes plus, when it runs, the node
//! daemon. Two modes make that safe:
//!
//! - [`EmbeddedMode::Shared`] (plugins, admin commands): every IPAM operation
//!   is one session: take an exclusive `flock` on `<file>.lock` (polling with
//!   backoff, bounded by a deadline), open the database, run the operation's
//!   reads and transactions, close, unlock. Sessions of different processes
//!   and threads are serialised, so an operation never races another one.
//! - [`EmbeddedMode::Exclusive`] (the node daemon): take the same lock once and
//!   keep the database open for the life of the process; every plugin then goes
//!   through the daemon's socket. A plugin configured for the embedded store
//!   that finds the lock held for longer than its deadline fails with
//!   "try again later" instead of waiting forever.
//!
//! In exclusive mode, transactions of concurrent threads are committed in
//! groups: the first thread to find no commit in flight takes every queued
//! transaction, evaluates each one's compares in order inside one redb write
//! transaction (later ones see earlier ones' writes, so the result is the same
//! as running them one after another) and commits once. One `fsync` then
//! serves many allocations, which is what bounds throughput on real disks.
//!
//! Values are stored as an 8-byte little-endian revision followed by the
//! value; a global revision counter in the `meta` table gives etcd's
//! semantics, so the IPAM logic's compare-and-swap works unchanged. Commits are
//! durable (`Durability::Immediate`): an address handed out survives a crash.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::{Compare, Datastore, Entry, StoreError, Write};

const KV: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const REVISION_KEY: &str = "revision";

/// How the store shares the file with other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddedMode {
    /// Open, transact and close per operation under the file lock.
    Shared,
    /// Hold the file lock and the database for the life of the store.
    Exclusive,
}

/// The redb-backed [`Datastore`].
pub struct EmbeddedStore {
    path: PathBuf,
    lock_path: PathBuf,
    lock_timeout: Duration,
    mode: EmbeddedMode,
    /// In exclusive mode, the open session; in shared mode, the session of the
    /// thread holding the scope.
    state: Mutex<SharedState>,
    released: Condvar,
    group: Mutex<GroupState>,
    group_done: Condvar,
}

type Queued = (u64, Vec<Compare>, Vec<Write>);

/// The group-commit queue (exclusive mode).
#[derive(Default)]
struct GroupState {
    next_id: u64,
    queue: Vec<Queued>,
    committing: bool,
    results: std::collections::HashMap<u64, Result<Option<u64>, String>>,
}

struct Session {
    // Field order matters: the database closes before the lock is released.
    db: Arc<Database>,
    _lock: File,
}

#[derive(Default)]
struct SharedState {
    holder: Option<ThreadId>,
    depth: u32,
    session: Option<Session>,
}

fn backend(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Backend(e.into().to_string())
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store at `path`. `lock_timeout` bounds
    /// how long an operation waits for another process's session.
    pub fn open(
        path: impl AsRef<Path>,
        mode: EmbeddedMode,
        lock_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Backend(format!("create {}: {e}", dir.display())))?;
        }
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let store = EmbeddedStore {
            path,
            lock_path: PathBuf::from(lock_path),
            lock_timeout,
            mode,
            state: Mutex::new(SharedState::default()),
            released: Condvar::new(),
            group: Mutex::new(GroupState::default()),
            group_done: Condvar::new(),
        };
        if mode == EmbeddedMode::Exclusive {
            let session = store.open_session()?;
            store.state().session = Some(session);
        }
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the file lock (bounded) and opens the database.
    fn open_session(&self) -> Result<Session, StoreError> {
        let deadline = Instant::now() + self.lock_timeout;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| StoreError::Backend(format!("open {}: {e}", self.lock_path.display())))?;
        let mut backoff = Duration::from_micros(100);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(StoreError::Backend(format!(
                        "lock {}: {e}",
                        self.lock_path.display()
                    )));
                }
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "{} is held by another process (the node daemon?) for more than {:?}",
                    self.lock_path.display(),
                    self.lock_timeout
                )));
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(5));
        }
        let db = loop {
            match Database::builder().create(&self.path) {
                Ok(db) => break db,
                // Someone opened the file without our lock file (an older
                // binary, a debugging tool): wait like for the lock.
                Err(redb::DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(2));
                }
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(StoreError::Unavailable(format!(
                        "{} is open in another process",
                        self.path.display()
                    )));
                }
                Err(e) => return Err(backend(e)),
            }
        };
        Ok(Session {
            db: Arc::new(db),
            _lock: lock,
        })
    }

    /// Runs `f` on the open database, opening a session around it when this
    /// thread holds no scope.
    fn with_db<R>(
        &self,
        f: impl FnOnce(&Database) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let db = {
            let st = self.state();
            match (self.mode, &st.session, st.holder) {
                (EmbeddedMode::Exclusive, Some(s), _) => Some(s.db.clone()),
                (EmbeddedMode::Shared, Some(s), Some(h)) if h == thread::current().id() => {
                    Some(s.db.clone())
                }
                _ => None,
            }
        };
        match db {
            Some(db) => f(&db),
            None => {
                self.begin_scope()?;
                let db = self.state().session.as_ref().map(|s| s.db.clone());
                let r = match db {
                    Some(db) => f(&db),
                    None => Err(StoreError::Backend("session vanished".into())),
                };
                self.end_scope();
                r
            }
        }
    }
}

impl EmbeddedStore {
    fn group_lock(&self) -> MutexGuard<'_, GroupState> {
        self.group.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one transaction and waits for its group's commit, leading the
    /// commit when none is in flight.
    fn group_txn(&self, compares: &[Compare], writes: &[Write]) -> Result<Option<u64>, StoreError> {
        let mut g = self.group_lock();
        let id = g.next_id;
        g.next_id += 1;
        g.queue.push((id, compares.to_vec(), writes.to_vec()));
        loop {
            if let Some(r) = g.results.remove(&id) {
                return r.map_err(StoreError::Backend);
            }
            if !g.committing {
                g.committing = true;
                let batch = std::mem::take(&mut g.queue);
                drop(g);
                let outcome = self.with_db(|db| commit_batch(db, &batch));
                g = self.group_lock();
                g.committing = false;
                match outcome {
                    Ok(applied) => {
                        for ((qid, _, _), ok) in batch.iter().zip(applied) {
                            g.results.insert(*qid, Ok(ok));
                        }
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        for (qid, _, _) in &batch {
                            g.results.insert(*qid, Err(msg.clone()));
                        }
                    }
                }
                self.group_done.notify_all();
                continue;
            }
            g = self.group_done.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Applies `batch` in order in one write transaction and commits once.
/// Returns, per transaction, the revision it wrote, or `None` when its
/// compares failed.
fn commit_batch(db: &Database, batch: &[Queued]) -> Result<Vec<Option<u64>>, StoreError> {
    let wtx = db.begin_write().map_err(backend)?;
    let mut applied = Vec::with_capacity(batch.len());
    {
        let mut kv = wtx.open_table(KV).map_err(backend)?;
        let mut meta = wtx.open_table(META).map_err(backend)?;
        let mut rev = meta
            .get(REVISION_KEY)
            .map_err(backend)?
            .map(|v| v.value())
            .unwrap_or(0);
        let mut buf = Vec::new();
        for (_, compares, writes) in batch {
            let mut holds = true;
            for c in compares {
                let ok = match c {
                    Compare::Absent(k) => kv.get(k.as_str()).map_err(backend)?.is_none(),
                    Compare::Revision(k, r) => match kv.get(k.as_str()).map_err(backend)? {
                        Some(v) => decode(k, v.value())?.revision == *r,
                        None => false,
                    },
                };
                if !ok {
                    holds = false;
                    break;
                }
            }
            if holds {
                rev += 1;
                for w in writes {
                    match w {
                        Write::Put(k, v) => {
                            buf.clear();
                            buf.extend_from_slice(&rev.to_le_bytes());
                            buf.extend_from_slice(v);
                            kv.insert(k.as_str(), buf.as_slice()).map_err(backend)?;
                        }
                        Write::Delete(k) => {
                            kv.remove(k.as_str()).map_err(backend)?;
                        }
                    }
                }
            }
            applied.push(holds.then_some(rev));
        }
        meta.insert(REVISION_KEY, rev).map_err(backend)?;
    }
    if applied.iter().any(Option::is_some) {
        wtx.commit().map_err(backend)?;
    } else {
        wtx.abort().map_err(backend)?;
    }
    Ok(applied)
}

fn decode(key: &str, raw: &[u8]) -> Result<Entry, StoreError> {
    if raw.len() < 8 {
        return Err(StoreError::Corrupt(format!(
            "value of {key} shorter than its revision"
        )));
    }
    let (rev, value) = raw.split_at(8);
    let mut r = [0u8; 8];
    r.copy_from_slice(rev);
    Ok(Entry {
        key: key.to_owned(),
        value: value.to_vec(),
        revision: u64::from_le_bytes(r),
    })
}

impl Datastore for EmbeddedStore {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.with_db(|db| {
            let rtx = db.begin_read().map_err(backend)?;
            let table = match rtx.open_table(KV) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(backend(e)),
            };
            match table.get(key).map_err(backend)? {
                Some(v) => Ok(Some(decode(key, v.value())?)),
                None => Ok(None),
            }
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        self.with_db(|db| {
            let rtx = db.begin_read().map_err(backend)?;
            let table = match rtx.open_table(KV) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(backend(e)),
            };
            let mut out = Vec::new();
            for item in table.range(prefix..).map_err(backend)? {
                let (k, v) = item.map_err(backend)?;
                let k = k.value();
                if !k.starts_with(prefix) {
                    break;
                }
                out.push(decode(k, v.value())?);
            }
            Ok(out)
        })
    }

    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
        if self.mode == EmbeddedMode::Exclusive {
            return self.group_txn(compares, writes);
        }
        self.with_db(|db| {
            let results = commit_batch(db, &[(0, compares.to_vec(), writes.to_vec())])?;
            Ok(results.first().copied().flatten())
        })
    }

    fn begin_scope(&self) -> Result<(), StoreError> {
        if self.mode == EmbeddedMode::Exclusive {
            return Ok(());
        }
        let me = thread::current().id();
        let deadline = Instant::now() + self.lock_timeout;
        let mut st = self.state();
        loop {
            match st.holder {
                None => break,
                Some(h) if h == me => {
                    st.depth += 1;
                    return Ok(());
                }
                Some(_) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(StoreError::Unavailable(
                            "another thread held the embedded store too long".into(),
                        ));
                    }
                    st = self
                        .released
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        st.holder = Some(me);
        st.depth = 1;
        drop(st);
        match self.open_session() {
            Ok(s) => {
                self.state().session = Some(s);
                Ok(())
            }
            Err(e) => {
                let mut st = self.state();
                st.holder = None;
                st.depth = 0;
                drop(st);
                self.released.notify_one();
                Err(e)
            }
        }
    }

    fn end_scope(&self) {
        if self.mode == EmbeddedMode::Exclusive {
            return;
        }
        let mut st = self.state();
        if st.holder != Some(thread::current().id()) {
            return;
        }
        st.depth = st.depth.saturating_sub(1);
        if st.depth == 0 {
            let session = st.session.take();
            st.holder = None;
            drop(st);
            // Close the database, then release the file lock, before anyone
            // else may open it.
            drop(session);
            self.released.notify_one();
        }
    }
}
