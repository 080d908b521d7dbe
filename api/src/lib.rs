//! Wire contracts shared by Brindle's processes.
//!
//! Every process boundary in Brindle is a contract in this crate, so that the
//! two sides are compiled against the same types:
//!
//! - [`cni`]: the CNI specification's types (network config, results for every
//!   supported `cniVersion`, the error JSON and its codes, the environment),
//!   used by the `brindle` plugin and the `brindle-ipam` plugin.
//! - [`endpoint`]: what the CNI plugin tells the node daemon about pods over
//!   `/run/brindle/ctrl.sock`.
//! - [`ipam`]: allocation requests from the IPAM plugin to the node daemon over
//!   the same socket.
//! - [`vrouter`]: how the node daemon programs the vrouter over
//!   `/run/brindle/vrouter.sock`.
//! - [`framing`]: the socket framing both sockets use (one JSON document per
//!   line, one response per request) and a small blocking client.
//!
//! Tests: `cargo test -p brindle-api` (no root needed).
#![forbid(unsafe_code)]

pub mod cni;
pub mod endpoint;
pub mod framing;
pub mod ipam;
pub mod vrouter;

/// Default path of the node daemon's endpoint/IPAM socket.
pub const CTRL_SOCKET: &str = "/run/brindle/ctrl.sock";
/// Default path of the vrouter's programming socket.
pub const VROUTER_SOCKET: &str = "/run/brindle/vrouter.sock";
