//! `brindle-perf`: the throughput and latency harness. It builds its own
//! topologies in network namespaces, sends UDP probes from an AF_XDP
//! generator, counts them at an AF_XDP sink (loss, reordering, one-way
//! latency in an HdrHistogram), and runs the kernel's forwarding, the
//! kernel with a Calico-style iptables rule set, the kernel's VXLAN path,
//! a null AF_XDP forwarder and (once it exists) the brindle vrouter back
//! to back. See `perf/README.md`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod calico;
pub mod calico_policy;
pub mod control;
pub mod daemon;
pub mod forwarder;
pub mod frame;
pub mod plot;
pub mod pods;
pub mod report;
pub mod runner;
pub mod search;
pub mod selftest;
pub mod stats;
pub mod topo;
pub mod traffic;
