//! AF_XDP and AF_PACKET by raw syscalls, and the XDP steering program. The
//! only crate of the workspace that contains `unsafe` code, all of it in the
//! private `sys` module. See `vrouter/xsk/README.md`.
//!
//! - [`Umem`]: the mmap'ed frame region a worker owns, cut into power-of-two
//!   chunks; [`XskSocket`]s bound on it share it (XDP_SHARED_UMEM), so frames
//!   move between interfaces by [`Desc`]riptor, without a copy.
//! - [`Steering`]: the XDP program and its maps (pod prefixes, node address,
//!   VXLAN port, sockets per queue), attached by BPF link.
//! - [`PacketSocket`]: the AF_PACKET (PACKET_MMAP, TPACKET_V2) fallback with
//!   the same batch shape, copying between its rings and caller memory.
//! - [`Tap`]: TAP devices with virtio-net headers and offloads (pod ports
//!   and the host port), created in or attached from a network namespace
//!   entered with a [`NetnsGuard`].
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

// Every module but `sys` is safe code, and the compiler holds it to that.
#[forbid(unsafe_code)]
mod error;
#[forbid(unsafe_code)]
pub mod live;
#[forbid(unsafe_code)]
pub mod netns;
#[forbid(unsafe_code)]
mod packet;
#[forbid(unsafe_code)]
mod ring;
#[forbid(unsafe_code)]
mod socket;
#[forbid(unsafe_code)]
pub mod steer;
mod sys;
#[forbid(unsafe_code)]
pub mod tap;
#[forbid(unsafe_code)]
mod umem;

pub use error::{Error, Result};
pub use live::{FlowRotation, LiveFrameConfig, LiveFrameGenerator};
pub use netns::NetnsGuard;
pub use packet::{PacketConfig, PacketSocket, PacketStats};
pub use socket::{BindMode, BusyPoll, XdpStats, XskConfig, XskSocket};
pub use steer::{Role, Steering, SteeringConfig, Verdict, XdpAttachment, XdpCounters, XdpMode};
pub use tap::{Tap, TapConfig, TapOffloads, TapQueue, VNET_HDR_LEN};
pub use umem::{Umem, UmemConfig, UmemHandle};

/// One frame in a UMEM: `len` bytes from byte `addr`; the layout of
/// `struct xdp_desc` without its `options` word.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Offset of the frame's first byte from the start of the UMEM.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// Headroom the kernel leaves in front of every AF_XDP RX frame
/// (`XDP_PACKET_HEADROOM`) in addition to the UMEM's configured headroom.
pub const XDP_PACKET_HEADROOM: u32 = 256;

/// Resolves an interface name to its index in the caller's network namespace.
pub fn ifindex(name: &str) -> Result<u32> {
    sys::if_nametoindex(name).map_err(|source| Error::NoSuchInterface {
        name: name.to_owned(),
        source,
    })
}
