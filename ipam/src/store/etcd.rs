//! The etcd v3 datastore, for clusters.
//!
//! Keys live under a configurable prefix (the IPAM adds its own layout below
//! it). Every [`Datastore::txn`] becomes one etcd `Txn`: `Absent` compares
//! `create_revision == 0`, `Revision` compares `mod_revision`, so an update is
//! a compare-and-swap on the revision the caller read; the IPAM logic re-reads
//! and retries when the compare fails.
//!
//! The calls are blocking: a private tokio runtime with one worker drives the
//! gRPC client, which keeps the IPAM logic and the CNI plugin synchronous.
//! A transport failure during a `Txn` leaves its outcome unknown; it is
//! reported as [`StoreError::Unavailable`] and the IPAM logic's retry re-reads
//! first, which is safe because every write is conditional.

use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp,
};
use tokio::runtime::Runtime;

use super::{Compare, Datastore, Entry, StoreError, Write};

/// The etcd-backed [`Datastore`].
pub struct EtcdStore {
    runtime: Runtime,
    client: Client,
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl EtcdStore {
    /// Connects to `endpoints` (`http://host:port`). Requests time out after
    /// `timeout`.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("brindle-ipam-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("tokio runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_require_leader(true);
        let client = runtime
            .block_on(Client::connect(endpoints, Some(options)))
            .map_err(unavailable)?;
        Ok(EtcdStore { runtime, client })
    }

    fn entry(kv: &etcd_client::KeyValue) -> Result<Entry, StoreError> {
        Ok(Entry {
            key: kv
                .key_str()
                .map_err(|e| StoreError::Corrupt(format!("non-UTF-8 key: {e}")))?
                .to_owned(),
            value: kv.value().to_vec(),
            revision: u64::try_from(kv.mod_revision())
                .map_err(|_| StoreError::Corrupt("negative revision".into()))?,
        })
    }
}

impl Datastore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = self
            .runtime
            .block_on(kv.get(key, None))
            .map_err(unavailable)?;
        resp.kvs().first().map(Self::entry).transpose()
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = self
            .runtime
            .block_on(kv.get(prefix, Some(GetOptions::new().with_prefix())))
            .map_err(unavailable)?;
        resp.kvs().iter().map(Self::entry).collect()
    }

    fn txn(&self, compares: &[Compare], writes: &[Write]) -> Result<bool, StoreError> {
        let when: Vec<EtcdCompare> = compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => EtcdCompare::create_revision(k.as_str(), CompareOp::Equal, 0),
                Compare::Revision(k, r) => EtcdCompare::mod_revision(
                    k.as_str(),
                    CompareOp::Equal,
                    i64::try_from(*r).unwrap_or(i64::MAX),
                ),
            })
            .collect();
        let then: Vec<TxnOp> = writes
            .iter()
            .map(|w| match w {
                Write::Put(k, v) => TxnOp::put(k.as_str(), v.clone(), None),
                Write::Delete(k) => TxnOp::delete(k.as_str(), None),
            })
            .collect();
        let mut kv = self.client.kv_client();
        let resp = self
            .runtime
            .block_on(kv.txn(Txn::new().when(when).and_then(then)))
            .map_err(unavailable)?;
        Ok(resp.succeeded())
    }
}
