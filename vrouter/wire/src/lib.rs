//! `brindle-wire`: zero-copy views and emitters for every header the
//! vrouter's fast path reads or writes.
//!
//! Each format has a view, `Packet<T: AsRef<[u8]>>` (`Frame` for Ethernet),
//! over a byte buffer: `new_checked` checks the lengths once so that no
//! accessor can panic afterwards, getters read typed fields, and setters on
//! `T: AsMut<[u8]>` write them in place. A `*Repr` struct holds a header as
//! values, with `parse`, `emit` and `buffer_len`. Protocol numbers are enums
//! with an `Unknown(..)` variant, so nothing read is ever lost.
//!
//! Formats: [`ethernet`] (with one 802.1Q/802.1ad tag), [`arp`] (with a
//! speculative target-IP prefilter), [`ipv4`] (options skipped by IHL,
//! TTL decrement with an RFC 1624 checksum update), [`ipv6`], [`icmpv4`]
//! (time exceeded and fragmentation needed, built in place), [`icmpv6`]
//! (hop limit exceeded and packet too big, built in place), [`udp`],
//! [`vxlan`], and [`encap`] (IPIP and VXLAN outer headers written into the
//! headroom in front of a packet, and the decapsulation offsets);
//! [`vnet`] is the virtio-net header of TAP devices, [`gso`] cuts TCP/UDP
//! super-packets into segments and [`gro`] coalesces TCP segments into
//! super-packets, both by the Linux kernel's rules;
//! [`checksum`] has RFC 1071/1624 and the pseudo-header.
//!
//! Why hand-written views and not etherparse on the hot path: the vrouter
//! rewrites frames in place in UMEM (MACs, TTL and checksum, outer headers
//! in the headroom), and etherparse's slices are read-only while its
//! header structs are copies that must be written back. etherparse is used
//! as the independent reference in this crate's tests, and is fine for
//! slow-path parsing (logging, the control plane).
//!
//! Forwarding one frame in place:
//!
//! ```
//! use brindle_wire::{ipv4, EtherType, EthernetFrame, Ipv4Packet, MacAddr};
//!
//! // An Ethernet frame carrying an IPv4/UDP packet, TTL 64.
//! let mut frame: Vec<u8> = vec![
//!     0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, // Ethernet
//!     0x45, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, // IPv4
//!     10, 0, 0, 1, 10, 0, 1, 2,
//!     0x30, 0x39, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00, // UDP
//! ];
//! ipv4::Packet::new_unchecked(&mut frame[14..]).fill_checksum();
//!
//! let mut eth = EthernetFrame::new_checked(&mut frame[..])?;
//! assert_eq!(eth.ethertype(), EtherType::Ipv4);
//! eth.rewrite_addrs(MacAddr([0xee; 6]), MacAddr([0x02, 0, 0, 0, 0, 0x03]));
//!
//! let mut ip = Ipv4Packet::new_checked(eth.payload_mut())?;
//! assert_eq!(ip.dst_addr(), std::net::Ipv4Addr::new(10, 0, 1, 2));
//! assert_eq!(ip.decrement_ttl(), 63);
//! assert!(ip.verify_checksum()); // updated incrementally, RFC 1624
//! # Ok::<(), brindle_wire::Error>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod macros;

pub mod arp;
pub mod checksum;
pub mod encap;
pub mod error;
pub mod ethernet;
pub mod gro;
pub mod gso;
pub mod icmpv4;
pub mod icmpv6;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod udp;
pub mod vnet;
pub mod vxlan;

pub use arp::{ArpRepr, Operation as ArpOperation, Packet as ArpPacket};
pub use encap::{IpipEncap, OuterHeader, VxlanDecap, VxlanEncap};
pub use error::{Error, Result};
pub use ethernet::{EtherType, EthernetRepr, Frame as EthernetFrame, MacAddr, VlanTag};
pub use gro::{Coalesced, Gro, Push};
pub use gso::Gso;
pub use icmpv4::{Icmpv4Error, Icmpv4Repr, Packet as Icmpv4Packet};
pub use icmpv6::{Icmpv6Error, Icmpv6Repr, Packet as Icmpv6Packet};
pub use ip::IpProtocol;
pub use ipv4::{Ipv4Repr, Packet as Ipv4Packet};
pub use ipv6::{Ipv6Repr, Packet as Ipv6Packet};
pub use udp::{Packet as UdpPacket, UdpChecksum, UdpRepr};
pub use vnet::{GsoType, VnetHdr};
pub use vxlan::{Packet as VxlanPacket, VXLAN_PORT, VxlanRepr};
