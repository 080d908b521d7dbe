//! The daemon's readiness as one value: the owner loop is its only writer
//! (it publishes it on a `tokio::sync::watch` channel when it changes);
//! `ctrl.sock` (`status`, the ADD refusal) and `/readyz` read it.

/// What the daemon knows about the things it depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// The last datastore refresh (pools, blocks, heartbeat, nodes) worked.
    pub datastore_ok: bool,
    /// The vrouter answered the executor's last call; `None` until the
    /// executor tried for the first time.
    pub vrouter_reachable: Option<bool>,
}

impl Health {
    /// Whether the vrouter answered last time (false while unknown).
    pub fn vrouter_up(&self) -> bool {
        self.vrouter_reachable == Some(true)
    }

    /// Ready to serve pods: datastore and vrouter both reachable.
    pub fn ready(&self) -> bool {
        self.datastore_ok && self.vrouter_up()
    }
}

/// The receiving side, as the servers hold it.
pub type HealthWatch = tokio::sync::watch::Receiver<Health>;
