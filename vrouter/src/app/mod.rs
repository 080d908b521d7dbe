//! The daemon's edge: `brindle-vrouter run` (ports, routes and neighbours
//! from flags or a TOML file, no controller) and `serve` (programmed over
//! the Unix socket of `brindle_api::vrouter`). Both turn their input into
//! requests to the same [`crate::control::Control`] over the running
//! [`crate::engine::Dataplane`]; here are the configs, the socket server,
//! the metrics/health server, signals and logging. The only module that
//! uses `anyhow`.
//!
//! Direction: app → control → engine → worker/port/pipeline.

pub mod config;
pub mod http;
pub mod metrics;
pub mod neighbors;
pub mod run;
pub mod serve;
pub mod signals;
pub mod spec;

pub use config::{LogFormat, ServeArgs, ServeConfig, init_logging};
pub use spec::{RunArgs, RunConfig};
