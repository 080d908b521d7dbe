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
//!
//! Tests: `cargo test -p brindle-vrouter` (no root). Benchmarks:
//! `cargo bench -p brindle-vrouter`. See `vrouter/README.md`.
#![forbid(unsafe_code)]

pub mod arp;
pub mod counters;
pub mod demo;
pub mod endpoint;
pub mod frame;
pub mod neigh;
pub mod pipeline;
pub mod port;
pub mod worker;

pub use brindle_fib as fib;
pub use brindle_wire as wire;
