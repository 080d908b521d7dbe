//! Ports: the in-memory port for tests, benchmarks and the demo, a replay
//! port for benchmarks, and pcap-writer middleware. The AF_XDP port lives in
//! `brindle-xsk` and implements the same [`Port`](crate::frame::Port) trait.

pub mod memory;
pub mod pcap;

pub use memory::{MemoryPort, MemoryPortHandle, ReplayPort};
pub use pcap::PcapPort;
