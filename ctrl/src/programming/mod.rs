//! Programming the vrouter: the desired state as values, one executor that
//! applies them through a [`Dataplane`], and resync.
//!
//! The rest of the daemon never talks to the vrouter: it turns events
//! (endpoint added, route learned) into [`VrouterRequest`] values
//! ([`desired`]), hands them to the [`executor::Executor`], which records
//! them in the [`desired::Desired`] state and sends them when the vrouter is
//! reachable. When it is not, or when it restarted (a new
//! [`brindle_api::vrouter::Hello::boot_id`]), the executor sends one `Sync`
//! with the whole desired state once it answers again. Tests use
//! [`dataplane::RecordingDataplane`] and assert the exact requests.
//!
//! [`VrouterRequest`]: brindle_api::vrouter::VrouterRequest
//! [`Dataplane`]: dataplane::Dataplane

pub mod acks;
pub mod coalesce;
pub mod dataplane;
pub mod desired;
pub mod executor;

use brindle_api::vrouter::VrouterRequest;

use crate::neighbors::NeighborChange;

/// One item of the executor's queue.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Requests to record and send.
    Apply(Vec<VrouterRequest>),
    /// Underlay neighbour changes from the kernel
    /// ([`executor::Executor::neighbors`]).
    Neighbors(Vec<NeighborChange>),
    /// Check the vrouter and resync it if it was away or restarted
    /// ([`executor::Executor::reconcile`]); the daemon sends one per tick.
    Reconcile,
}

impl Work {
    /// Requests or neighbour changes held (how far a merge has grown).
    pub fn items(&self) -> usize {
        match self {
            Work::Apply(reqs) => reqs.len(),
            Work::Neighbors(changes) => changes.len(),
            Work::Reconcile => 0,
        }
    }
}

impl From<Vec<VrouterRequest>> for Work {
    fn from(reqs: Vec<VrouterRequest>) -> Self {
        Work::Apply(reqs)
    }
}
