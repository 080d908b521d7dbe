//! Brindle's Kubernetes API source (see README.md): watchers on Nodes,
//! Pods, Namespaces and NetworkPolicies whose net changes reach the node
//! daemon as [`KubeEvent`]s: policy resources as `brindle_policy` types,
//! node changes, and the moment each feed was fully listed.
//!
//! - [`store`]: the resync semantics (Init, InitApply, InitDone) as a pure
//!   state machine;
//! - [`source`]: the one interface of policy/label sources
//!   ([`ResourceSource`]) and the driver that runs sources through stores;
//! - [`watch`]: the Kubernetes API as a source (kube-runtime watchers);
//! - [`cluster`]: the state the daemon keeps from the events, with the
//!   questions IPAM garbage collection asks (which pods and nodes exist);
//! - [`config`]: `[datastore.kubernetes]` and the API client.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod config;
pub mod convert;
pub mod event;
pub mod source;
pub mod store;
pub mod watch;

pub use cluster::{Cluster, PodKey};
pub use config::KubeConfig;
pub use event::{Feed, KubeEvent, NodeInfo};
pub use source::{ResourceSource, StaticSource};
pub use watch::{Counters, run};
// The resource types the events carry, for users that do not depend on
// brindle-policy themselves.
pub use brindle_policy::resource::{Kind, Resource, ResourceKey};
