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
//!
//! Failover is ours, not the gRPC balancer's: the balanced channel keeps
//! picking a dead member, so the store holds one client per member, talks to
//! one at a time and moves to the next member when a call fails with a
//! transport or "unavailable" error. Reads are retried once on every member;
//! a failed `Txn` is reported (its outcome is unknown) after moving on, so the
//! caller's retry reaches a live member.
//! A transport failure during a `Txn` leaves its outcome unknown; it is
//! reported as [`StoreError::Unavailable`] and the IPAM logic's retry re-reads
//! first, which is safe because every write is conditional.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, Identity,
    TlsOptions, Txn, TxnOp,
};
use tokio::runtime::Runtime;

use super::{Compare, Datastore, Entry, StoreError, Write};

/// TLS towards etcd (Calico's etcdCACertFile, etcdCertFile, etcdKeyFile):
/// PEM files, read once at connect. With a CA the endpoints must be
/// `https://`; a certificate and key are the client identity for etcd's
/// `--client-cert-auth`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA bundle that signs the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate.
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    pub key_file: Option<PathBuf>,
}

impl EtcdTls {
    /// True when nothing is set (plain `http://`).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// The client TLS configuration, with errors naming the file.
    fn options(&self) -> Result<TlsOptions, StoreError> {
        let read = |what: &str, p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| StoreError::Backend(format!("etcd TLS {what} {}: {e}", p.display())))
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read("CA file", ca)?));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(
                    read("certificate file", cert)?,
                    read("key file", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::Backend(
                    "etcd TLS: a client certificate needs its key and the other way round".into(),
                ));
            }
        }
        Ok(tls)
    }
}

/// An error with its causes, so a TLS failure says why (an unknown
/// issuer, a refused client certificate) instead of "transport error".
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

/// The etcd-backed [`Datastore`].
pub struct EtcdStore {
    runtime: Runtime,
    endpoints: Vec<String>,
    timeout: Duration,
    tls: Option<TlsOptions>,
    /// One lazily connected client per endpoint.
    clients: Mutex<Vec<Option<Client>>>,
    /// The endpoint in use.
    current: AtomicUsize,
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(with_causes(&e))
}

impl EtcdStore {
    /// Connects to `endpoints` (`http://host:port`). Requests time out after
    /// `timeout`.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with_tls(endpoints, timeout, &EtcdTls::default())
    }

    /// [`EtcdStore::connect`] over TLS when `tls` sets anything (then every
    /// endpoint must be `https://`).
    pub fn connect_with_tls(
        endpoints: &[String],
        timeout: Duration,
        tls: &EtcdTls,
    ) -> Result<Self, StoreError> {
        let tls_options = if tls.is_empty() {
            None
        } else {
            if let Some(plain) = endpoints.iter().find(|e| e.starts_with("http://")) {
                return Err(StoreError::Backend(format!(
                    "etcd endpoint {plain}: TLS is configured, use https://"
                )));
            }
            Some(tls.options()?)
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("brindle-ipam-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("tokio runtime: {e}")))?;
        if endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints".into()));
        }
        let store = EtcdStore {
            runtime,
            endpoints: endpoints.to_vec(),
            timeout,
            tls: tls_options,
            clients: Mutex::new(vec![None; endpoints.len()]),
            current: AtomicUsize::new(0),
        };
        // Fail early when no member answers at all.
        store.read(|mut kv| async move {
            kv.get("/", Some(GetOptions::new().with_keys_only().with_limit(1)))
                .await
        })?;
        Ok(store)
    }

    /// The client of endpoint `i`, connecting it if needed.
    fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        if let Some(c) = self.clients.lock().unwrap_or_else(|p| p.into_inner())[i].clone() {
            return Ok(c);
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_timeout(self.timeout)
            .with_require_leader(true);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        let c = self
            .runtime
            .block_on(Client::connect([self.endpoints[i].as_str()], Some(options)))?;
        self.clients.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(c.clone());
        Ok(c)
    }

    /// Runs `call` on the current member; on failure moves to the next one.
    fn once<T, F, Fut>(&self, call: &F) -> Result<T, etcd_client::Error>
    where
        F: Fn(etcd_client::KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let r = self
            .client(i)
            .and_then(|c| self.runtime.block_on(call(c.kv_client())));
        if r.is_err() {
            // Someone else may have moved on already; move only from `i`.
            let _ = self.current.compare_exchange(
                i,
                (i + 1) % self.endpoints.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        r
    }

    /// A read, tried on every member before giving up.
    fn read<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(etcd_client::KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = None;
        for _ in 0..self.endpoints.len() {
            match self.once(&call) {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .map(unavailable)
            .unwrap_or_else(|| StoreError::Unavailable("no endpoint".into())))
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
        let resp = self.read(|mut kv| async move { kv.get(key, None).await })?;
        resp.kvs().first().map(Self::entry).transpose()
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let resp = self.read(|mut kv| async move {
            kv.get(prefix, Some(GetOptions::new().with_prefix())).await
        })?;
        resp.kvs().iter().map(Self::entry).collect()
    }

    fn txn_revision(
        &self,
        compares: &[Compare],
        writes: &[Write],
    ) -> Result<Option<u64>, StoreError> {
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
        let txn = Txn::new().when(when).and_then(then);
        let resp = self
            .once(&|mut kv: etcd_client::KvClient| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .map_err(unavailable)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let rev = resp
            .header()
            .and_then(|h| u64::try_from(h.revision()).ok())
            .ok_or_else(|| StoreError::Corrupt("txn response without a revision".into()))?;
        Ok(Some(rev))
    }
}
