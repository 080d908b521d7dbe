//! `brindle-ipam`: Calico-style address management. See `ipam/README.md`.
//!
//! - [`model`]: pools, blocks, handles, selectors and the address arithmetic
//!   (pure).
//! - [`store`]: the [`store::Datastore`] seam and its backends (memory,
//!   embedded redb, etcd v3).
//! - [`allocator`]: allocation, release, views, GC and audit over a datastore.
//! - [`gc`]: the automatic GC the node daemon runs (leaked handles, dead
//!   nodes, a grace period, never an address whose pod exists).
//! - [`server`]: the node daemon's side of the IPAM socket protocol.
//! - [`config`]: the plugin's `ipam` settings and the [`config::Backend`]
//!   (daemon socket or a datastore opened in-process).
//! - [`plugin`]: the CNI IPAM plugin.
//!
//! The binary's `admin` mode (views, release, GC) is in `src/admin.rs`.
#![forbid(unsafe_code)]

pub mod allocator;
pub mod config;
pub mod gc;
pub mod model;
pub mod plugin;
pub mod server;
pub mod store;

pub use allocator::{AllocateArgs, Ipam, IpamError};
