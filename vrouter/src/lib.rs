//! `brindle-vrouter`: the per-node forwarding engine.
//!
//! The crate owns everything a frame meets between an RX ring and a TX ring:
//!
//! - [`wire`] (crate `brindle-wire`): zero-copy views over Ethernet/802.1Q,
//!   ARP, IPv4, IPv6, ICMPv4, UDP, VXLAN and IPIP, plus checksums.
//! - [`fib`] (crate `brindle-fib`): longest-prefix match for IPv4 and IPv6,
//!   read by workers without locks while the control thread changes it.
//! - `brindle-xsk`: AF_XDP and AF_PACKET sockets by raw syscalls, the only
//!   crate with `unsafe` code.
//! - [`frame`]: the frame arena (the UMEM, or a heap buffer in tests) and the
//!   [`frame::Port`] trait every port implements.
//! - [`port`]: the AF_XDP port and the AF_PACKET fallback, the in-memory
//!   and replay ports, and pcap middleware.
//! - [`endpoint`]: the port table (pod, uplink, host; MACs, MTU, the pod's
//!   addresses for anti-spoofing).
//! - [`neigh`]: the neighbour table and its miss path.
//! - [`arp`]: proxy ARP on pod ports, learning on the uplink.
//! - [`pipeline`]: classify, ARP/NDP, decap, anti-spoof, LPM, TTL/ICMP, MTU,
//!   rewrite, encap, per-port TX batches.
//! - [`policy`]: network policy and the per-worker flow table (the hook
//!   the pipeline calls for frames from and to pods, the policy view the
//!   control thread publishes to the workers).
//! - [`counters`]: per-worker counters and drop reasons.
//! - [`worker`]: the poll loop over a worker's ports.
//! - `demo` (feature `demo`): the demo node (also the fixture of tests,
//!   benchmarks and fuzz targets).
//! - [`engine`]: the running dataplane: worker threads over one shared
//!   UMEM, the FIB writer, the steering maps, opening and placing ports
//!   (`Dataplane::open`, used by both modes).
//! - [`control`]: the programmable state and every decision about it
//!   (`Control<E: Effects>::handle(request)`), effects through one trait
//!   with the dataplane and a recording implementation.
//! - [`app`]: `brindle-vrouter run` (static) and `serve` (programmed over
//!   the Unix socket): configs, the socket server, metrics and health,
//!   signals, logging. Direction: app → control → engine → worker.
//!
//! Tests: `cargo test -p brindle-vrouter` (no root). Benchmarks:
//! `cargo bench -p brindle-vrouter`. See `vrouter/README.md`.
#![forbid(unsafe_code)]

pub mod app;
pub mod arp;
pub mod control;
pub mod counters;
#[cfg(feature = "demo")]
pub mod demo;
pub mod endpoint;
pub mod engine;
pub mod frame;
pub mod neigh;
pub mod pipeline;
pub mod policy;
pub mod port;
pub mod worker;

pub use brindle_fib as fib;
pub use brindle_wire as wire;
