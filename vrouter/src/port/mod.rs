//! Ports: the AF_XDP port ([`xdp`]), the AF_PACKET fallback ([`packet`]) and
//! the TAP port of TAP pods and the host port ([`tap`])
//! of the running vrouter, the in-memory port for tests, benchmarks and the
//! demo, a replay port for benchmarks, pcap-writer middleware, and the
//! placeholder of a detached slot.

pub mod handoff;
pub mod memory;
pub mod pcap;

pub use memory::{MemoryPort, MemoryPortHandle, ReplayPort};
pub use pcap::PcapPort;
pub mod packet;
pub mod tap;
pub mod xdp;

use std::time::Instant;

use crate::frame::{FrameArena, FrameDesc, Port, PortPoll};

/// What a worker's port slot holds after its port is detached at run time:
/// nothing in, nothing out (the pipeline frees and counts what it would
/// have sent), until the slot is reused.
pub struct DetachedPort;

impl Port for DetachedPort {
    fn name(&self) -> &str {
        ""
    }
    fn mac(&self) -> [u8; 6] {
        [0; 6]
    }
    fn mtu(&self) -> u32 {
        0
    }
    fn rx_burst(&mut self, _arena: &mut FrameArena, _descs: &mut [FrameDesc]) -> usize {
        0
    }
    fn tx_burst(&mut self, _arena: &mut FrameArena, _descs: &[FrameDesc]) -> usize {
        0
    }
    fn poll(&mut self, _arena: &mut FrameArena, _now: Instant) -> PortPoll {
        PortPoll::default()
    }
}
