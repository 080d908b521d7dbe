//! `brindle-ctrl`: the node daemon's library (BGP, registry, endpoint API,
//! vrouter programming). See `ctrl/README.md`.
//!
//! Unsafe code is denied by the workspace lints; the one exception is the
//! TCP-MD5 `setsockopt` in `bgp::md5::sys`, which opts back in locally.
#![deny(unsafe_code)]

pub mod api_server;
pub mod bgp;
pub mod config;
pub mod ctrl_api;
pub mod daemon;
pub mod endpoints;
pub mod gateway;
pub mod health;
pub mod hostpath;
pub mod metrics;
pub mod neighbors;
pub mod policy;
pub mod programming;
pub mod registry;
pub mod routing;
