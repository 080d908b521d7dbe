//! `brindle-ipam`: Calico-style address management. See `ipam/README.md`.
//!
//! - [`model`]: pools, blocks, handles, selectors and the address arithmetic
//!   (pure).
//! - [`store`]: the [`store::Datastore`] seam and its backends (memory,
//!   embedded redb, etcd v3).
//! - [`allocator`]: allocation, release, views, GC and audit over a datastore.
//! - [`server`]: the node daemon's side of the IPAM socket protocol.
#![forbid(unsafe_code)]

pub mod allocator;
pub mod model;
pub mod server;
pub mod store;

pub use allocator::{AllocateArgs, Ipam, IpamError};
