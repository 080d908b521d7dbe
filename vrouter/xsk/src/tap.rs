//! TAP devices with virtio-net headers: the pod ports and the host port of
//! the vrouter.
//!
//! A pod's `eth0` is a TAP device created inside the pod's network
//! namespace (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE`), with
//! a 12-byte `virtio_net_hdr_v1` in front of every frame read or written,
//! and offloads on (checksum, TSO, USO), so the pod's kernel hands over
//! 64 KB TCP super-packets and takes them back the same way. The device is
//! persistent: it outlives the descriptors of whoever made it (the CNI
//! plugin), keeps the pod's addresses and routes while the vrouter
//! restarts, and the vrouter attaches its queues (one per worker) by name
//! and namespace with [`Tap::attach`].
//!
//! ```no_run
//! # fn main() -> brindle_xsk::Result<()> {
//! use std::os::fd::AsFd;
//! use brindle_xsk::tap::{Tap, TapConfig};
//!
//! let pod_ns = std::fs::File::open("/var/run/netns/pod1").unwrap();
//! // CNI ADD: the pod's eth0, persistent; the plugin's queue closes here.
//! let tap = Tap::create(Some(pod_ns.as_fd()), &TapConfig::pod("eth0").mtu(1450))?;
//! drop(tap);
//! // The vrouter: two queues, one per worker.
//! let tap = Tap::attach(Some(pod_ns.as_fd()), "eth0", 2, TapConfig::pod("eth0").offloads)?;
//! let mut frame = [0u8; 65536 + 12];
//! match tap.queues()[0].read(&mut frame) {
//!     Ok(n) => { /* frame[..12] is the virtio_net_hdr_v1, frame[12..n] the Ethernet frame */ }
//!     Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
//!     Err(e) => return Err(brindle_xsk::Error::Sys { what: "read", source: e }),
//! }
//! // CNI DEL:
//! drop(tap);
//! Tap::delete(Some(pod_ns.as_fd()), "eth0")?;
//! # Ok(()) }
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::error::{Context, Error, Result};
use crate::netns::NetnsGuard;
use crate::sys;
use crate::sys::tun::{IFNAMSIZ, IfReq};

/// Bytes of the `virtio_net_hdr_v1` in front of every frame (flags,
/// gso_type, hdr_len, gso_size, csum_start, csum_offset, num_buffers),
/// little-endian (`TUNSETVNETLE`).
pub const VNET_HDR_LEN: usize = 12;

/// Largest number of queues a multi-queue TAP takes (the kernel's
/// `MAX_TAP_QUEUES`).
pub const MAX_QUEUES: u16 = 256;

/// The offloads the reader of a TAP accepts (`TUNSETOFFLOAD`): which
/// frames the kernel may hand over unsegmented or with a partial checksum.
/// Frames written into the TAP may use any of them regardless.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TapOffloads(u32);

impl TapOffloads {
    /// None: the kernel segments and checksums everything before the read.
    pub const NONE: TapOffloads = TapOffloads(0);
    /// Partial checksums (`VIRTIO_NET_HDR_F_NEEDS_CSUM`). Every other
    /// offload needs it.
    pub const CSUM: TapOffloads = TapOffloads(libc::TUN_F_CSUM);
    /// TCP segmentation over IPv4.
    pub const TSO4: TapOffloads = TapOffloads(libc::TUN_F_TSO4);
    /// TCP segmentation over IPv6.
    pub const TSO6: TapOffloads = TapOffloads(libc::TUN_F_TSO6);
    /// TSO of segments with ECN's CWR flag.
    pub const TSO_ECN: TapOffloads = TapOffloads(libc::TUN_F_TSO_ECN);
    /// UDP segmentation (`VIRTIO_NET_HDR_GSO_UDP_L4`) over IPv4; the kernel
    /// takes it only together with [`Self::USO6`] (kernel 6.2 and later).
    pub const USO4: TapOffloads = TapOffloads(libc::TUN_F_USO4);
    /// UDP segmentation over IPv6; only together with [`Self::USO4`].
    pub const USO6: TapOffloads = TapOffloads(libc::TUN_F_USO6);
    /// What a pod port asks for: checksum, TSO4/6 with ECN, USO4/6. On a
    /// kernel without USO, [`Tap::create`] and [`Tap::attach`] fall back to
    /// the rest ([`Tap::offloads`] says what was applied).
    pub const POD: TapOffloads = TapOffloads(
        libc::TUN_F_CSUM
            | libc::TUN_F_TSO4
            | libc::TUN_F_TSO6
            | libc::TUN_F_TSO_ECN
            | libc::TUN_F_USO4
            | libc::TUN_F_USO6,
    );
    const USO: TapOffloads = TapOffloads(libc::TUN_F_USO4 | libc::TUN_F_USO6);

    /// The `TUN_F_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every offload of `other` is in `self`.
    pub fn contains(self, other: TapOffloads) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` without the offloads of `other`.
    pub fn without(self, other: TapOffloads) -> TapOffloads {
        TapOffloads(self.0 & !other.0)
    }

    /// The kernel's rules, checked before any syscall: segmentation needs
    /// partial checksums, ECN needs TSO, USO4 and USO6 go together, and
    /// no unknown bits.
    pub fn validate(self) -> Result<()> {
        if self.0 & !Self::POD.0 != 0 {
            return Err(Error::Config("unknown TAP offload bits"));
        }
        let segmenting = Self::TSO4.0 | Self::TSO6.0 | Self::USO.0;
        if self.0 & segmenting != 0 && !self.contains(Self::CSUM) {
            return Err(Error::Config("TSO/USO offloads need CSUM"));
        }
        if self.contains(Self::TSO_ECN) && self.0 & (Self::TSO4.0 | Self::TSO6.0) == 0 {
            return Err(Error::Config("TSO_ECN needs TSO4 or TSO6"));
        }
        let uso = self.0 & Self::USO.0;
        if uso != 0 && uso != Self::USO.0 {
            return Err(Error::Config("USO4 and USO6 must be set together"));
        }
        Ok(())
    }
}

impl std::ops::BitOr for TapOffloads {
    type Output = TapOffloads;
    fn bitor(self, rhs: TapOffloads) -> TapOffloads {
        TapOffloads(self.0 | rhs.0)
    }
}

/// How to create a TAP device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapConfig {
    /// Interface name in its namespace (1 to 15 bytes).
    pub name: String,
    /// Queues opened now (1 to [`MAX_QUEUES`]); more can be attached later.
    pub queues: u16,
    /// Offloads the reader accepts.
    pub offloads: TapOffloads,
    /// `TUNSETPERSIST`: the device outlives its queues.
    pub persist: bool,
    /// MAC address; `None` keeps the kernel's random one.
    pub mac: Option<[u8; 6]>,
    /// MTU; `None` keeps the kernel's 1500.
    pub mtu: Option<u32>,
    /// `IFF_NAPI`: frames written into the TAP go through NAPI and the
    /// kernel's GRO (tests use it as the GRO reference).
    pub napi: bool,
}

impl TapConfig {
    /// A pod port: one queue, [`TapOffloads::POD`], persistent.
    pub fn pod(name: &str) -> TapConfig {
        TapConfig {
            name: name.to_owned(),
            queues: 1,
            offloads: TapOffloads::POD,
            persist: true,
            mac: None,
            mtu: None,
            napi: false,
        }
    }

    /// With this MTU.
    pub fn mtu(mut self, mtu: u32) -> TapConfig {
        self.mtu = Some(mtu);
        self
    }

    /// With this MAC address.
    pub fn mac(mut self, mac: [u8; 6]) -> TapConfig {
        self.mac = Some(mac);
        self
    }

    /// With `n` queues opened now.
    pub fn queues(mut self, n: u16) -> TapConfig {
        self.queues = n;
        self
    }

    /// Checks every field before any syscall.
    pub fn validate(&self) -> Result<()> {
        validate_name(&self.name)?;
        validate_queues(self.queues)?;
        self.offloads.validate()?;
        if let Some(mtu) = self.mtu
            && !(68..=65535).contains(&mtu)
        {
            return Err(Error::Config("TAP MTU must be 68 to 65535"));
        }
        if let Some(mac) = self.mac
            && (mac[0] & 1 == 1 || mac == [0; 6])
        {
            return Err(Error::Config("TAP MAC must be a unicast, non-zero address"));
        }
        Ok(())
    }
}

fn validate_name(name: &str) -> Result<()> {
    // The kernel's dev_valid_name, plus "no NUL" for the C string.
    if name.is_empty()
        || name.len() >= IFNAMSIZ
        || name == "."
        || name == ".."
        || name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(Error::Config(
            "TAP name must be 1 to 15 bytes without '/', ':' or whitespace",
        ));
    }
    Ok(())
}

fn validate_queues(queues: u16) -> Result<()> {
    if queues == 0 || queues > MAX_QUEUES {
        return Err(Error::Config("TAP queues must be 1 to 256"));
    }
    Ok(())
}

/// One queue of a TAP device: a non-blocking descriptor on which every
/// `read` returns one frame and every `write` sends one, each preceded by
/// the [`VNET_HDR_LEN`]-byte virtio-net header.
#[derive(Debug)]
pub struct TapQueue {
    file: File,
}

impl TapQueue {
    /// Reads one frame (header included) into `buf`; `WouldBlock` when the
    /// queue is empty. A frame longer than `buf` is truncated by the
    /// kernel, so `buf` should hold 64 KB + the header.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Reads one frame scattered over `bufs` (e.g. the header and the head
    /// into one buffer, the tail into another).
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&self.file).read_vectored(bufs)
    }

    /// Writes one frame (header included); `WouldBlock` when the device's
    /// queue is full.
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }

    /// Writes one frame gathered from `bufs` (e.g. a header built apart
    /// from the frame, or a head and a tail).
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.file).write_vectored(bufs)
    }

    /// The MAC address of the device this queue is attached to.
    pub fn device_mac(&self) -> Result<[u8; 6]> {
        let mut req = IfReq::default();
        sys::tun::ioctl_ifreq(self.as_fd(), libc::SIOCGIFHWADDR, &mut req)
            .ctx("SIOCGIFHWADDR on a TAP queue")?;
        Ok(req.hwaddr())
    }

    /// A descriptor of the network namespace the device lives in
    /// (`TUNGETDEVNETNS`).
    pub fn device_netns(&self) -> Result<OwnedFd> {
        sys::tun::tun_device_netns(self.as_fd()).ctx("TUNGETDEVNETNS")
    }
}

impl AsFd for TapQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A TAP device and the queues this process holds on it. Dropping it
/// closes the queues; a persistent device stays, any other goes away.
#[derive(Debug)]
pub struct Tap {
    name: String,
    ifindex: u32,
    /// MTU and MAC read when the queues were attached ([`Tap::attach`]).
    mtu: u32,
    mac: [u8; 6],
    offloads: TapOffloads,
    queues: Vec<TapQueue>,
}

const TAP_FLAGS: libc::c_int =
    libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE;

impl Tap {
    /// Creates the TAP `cfg.name` in `netns` (`None`: the caller's
    /// namespace) with `cfg.queues` queues, the virtio-net header, the
    /// offloads (USO dropped on kernels without it), MAC, MTU and
    /// persistence. Fails with [`Error::InterfaceExists`] if the name is
    /// taken there. The link is left down: the caller sets its addresses
    /// and brings it up (rtnetlink), as for any other device.
    pub fn create(netns: Option<BorrowedFd<'_>>, cfg: &TapConfig) -> Result<Tap> {
        cfg.validate()?;
        let _in_netns = NetnsGuard::enter_opt(netns)?;
        if sys::if_nametoindex(&cfg.name).is_ok() {
            return Err(Error::InterfaceExists {
                name: cfg.name.clone(),
            });
        }
        let flags = TAP_FLAGS | if cfg.napi { libc::IFF_NAPI } else { 0 };
        let mut queues = Vec::with_capacity(usize::from(cfg.queues));
        for _ in 0..cfg.queues {
            queues.push(open_queue(&cfg.name, flags)?);
        }
        // Until TUNSETPERSIST, an error below drops the queues and with
        // them the device: nothing is left half made.
        let offloads = configure(&queues[0], cfg.offloads)?;
        let first = queues[0].as_fd();
        if let Some(mac) = cfg.mac {
            let mut req = IfReq::named(&cfg.name);
            req.set_hwaddr(mac);
            sys::tun::ioctl_ifreq(first, libc::SIOCSIFHWADDR, &mut req)
                .ctx("SIOCSIFHWADDR on the new TAP")?;
        }
        if let Some(mtu) = cfg.mtu {
            set_mtu(&cfg.name, mtu)?;
        }
        let ifindex = sys::if_nametoindex(&cfg.name).ctx("if_nametoindex of the new TAP")?;
        let mtu = get_mtu(&cfg.name)?;
        let mac = queues[0].device_mac()?;
        if cfg.persist {
            sys::tun::ioctl_set_value(first, libc::TUNSETPERSIST, 1).ctx("TUNSETPERSIST")?;
        }
        Ok(Tap {
            name: cfg.name.clone(),
            ifindex,
            mtu,
            mac,
            offloads,
            queues,
        })
    }

    /// Attaches `queues` new queues to the existing persistent TAP `name`
    /// in `netns` (what the vrouter does at start and after a restart),
    /// and sets the header size and `offloads` again (the reader decides
    /// what it accepts). Fails with [`Error::NoSuchInterface`] if there is
    /// no such device, and with [`Error::NotPersistentTap`] if it is a TAP
    /// that is not persistent or not multi-queue with a virtio-net header
    /// (EINVAL from the kernel, e.g. a veth of that name).
    pub fn attach(
        netns: Option<BorrowedFd<'_>>,
        name: &str,
        queues: u16,
        offloads: TapOffloads,
    ) -> Result<Tap> {
        validate_name(name)?;
        validate_queues(queues)?;
        offloads.validate()?;
        let _in_netns = NetnsGuard::enter_opt(netns)?;
        let ifindex = sys::if_nametoindex(name).map_err(|source| Error::NoSuchInterface {
            name: name.to_owned(),
            source,
        })?;
        let mut held = Vec::with_capacity(usize::from(queues));
        for _ in 0..queues {
            held.push(
                open_queue(name, TAP_FLAGS).map_err(|e| match e.raw_os_error() {
                    Some(libc::EINVAL) => Error::NotPersistentTap {
                        name: name.to_owned(),
                    },
                    _ => e,
                })?,
            );
        }
        // TUNSETIFF creates a device that is not there: if it vanished
        // between the check above and the attach, ours is new and not
        // persistent, and closing it removes it again.
        let mut req = IfReq::default();
        sys::tun::ioctl_ifreq(held[0].as_fd(), libc::TUNGETIFF, &mut req).ctx("TUNGETIFF")?;
        if i32::from(req.flags()) & libc::IFF_PERSIST == 0 {
            return Err(Error::NotPersistentTap {
                name: name.to_owned(),
            });
        }
        let offloads = configure(&held[0], offloads)?;
        let mtu = get_mtu(name)?;
        let mac = held[0].device_mac()?;
        Ok(Tap {
            name: name.to_owned(),
            ifindex,
            mtu,
            mac,
            offloads,
            queues: held,
        })
    }

    /// Deletes the persistent TAP `name` in `netns`: clears persistence
    /// through a queue of our own and closes it. The device goes at once
    /// if no one else holds a queue, else when the last holder closes its
    /// queues (rtnetlink's RTM_DELLINK removes it at once regardless).
    /// `Ok(false)` if there was no such interface.
    pub fn delete(netns: Option<BorrowedFd<'_>>, name: &str) -> Result<bool> {
        validate_name(name)?;
        let _in_netns = NetnsGuard::enter_opt(netns)?;
        if sys::if_nametoindex(name).is_err() {
            return Ok(false);
        }
        let queue = open_queue(name, TAP_FLAGS).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::NotPersistentTap {
                name: name.to_owned(),
            },
            _ => e,
        })?;
        sys::tun::ioctl_set_value(queue.as_fd(), libc::TUNSETPERSIST, 0)
            .ctx("TUNSETPERSIST off")?;
        drop(queue);
        Ok(true)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interface index in the device's namespace.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The device's MTU when it was opened or attached.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The device's MAC address (the kernel's end: a pod's `eth0`) when it
    /// was opened or attached.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The offloads applied (the ones asked for, without USO on kernels
    /// that lack it).
    pub fn offloads(&self) -> TapOffloads {
        self.offloads
    }

    /// The queues this process holds.
    pub fn queues(&self) -> &[TapQueue] {
        &self.queues
    }

    /// The queues, to hand one to each worker.
    pub fn into_queues(self) -> Vec<TapQueue> {
        self.queues
    }

    /// Turns persistence on or off.
    pub fn set_persist(&self, on: bool) -> Result<()> {
        sys::tun::ioctl_set_value(
            self.queues[0].as_fd(),
            libc::TUNSETPERSIST,
            libc::c_ulong::from(on),
        )
        .ctx("TUNSETPERSIST")
    }
}

/// Opens `/dev/net/tun` (non-blocking) and attaches a queue of `name` to
/// it, creating the device if there is none. Must run in the device's
/// namespace: the device belongs to the namespace that opened the file.
fn open_queue(name: &str, flags: libc::c_int) -> Result<TapQueue> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .ctx("open /dev/net/tun")?;
    let mut req = IfReq::named(name);
    // The flags are a C `short`; every IFF_* bit we pass fits in 16 bits.
    req.set_flags(flags as i16);
    sys::tun::ioctl_ifreq(file.as_fd(), libc::TUNSETIFF, &mut req).ctx("TUNSETIFF")?;
    Ok(TapQueue { file })
}

/// Sets the per-device header size, byte order and offloads through one
/// queue; returns the offloads applied.
fn configure(queue: &TapQueue, offloads: TapOffloads) -> Result<TapOffloads> {
    let fd = queue.as_fd();
    sys::tun::ioctl_set_int(fd, libc::TUNSETVNETHDRSZ, VNET_HDR_LEN as i32)
        .ctx("TUNSETVNETHDRSZ")?;
    // The header's fields are little-endian by virtio 1.0; say so, so the
    // format does not depend on the host's byte order.
    sys::tun::ioctl_set_int(fd, libc::TUNSETVNETLE, 1).ctx("TUNSETVNETLE")?;
    match sys::tun::ioctl_set_value(fd, libc::TUNSETOFFLOAD, offloads.bits().into()) {
        Ok(()) => Ok(offloads),
        // Kernels before 6.2 refuse the USO bits with EINVAL.
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL) && offloads.0 & TapOffloads::USO.0 != 0 =>
        {
            let fallback = offloads.without(TapOffloads::USO);
            tracing::info!(
                "this kernel has no TAP UDP segmentation offload (USO); offloads {:#x} instead of {:#x}",
                fallback.bits(),
                offloads.bits()
            );
            sys::tun::ioctl_set_value(fd, libc::TUNSETOFFLOAD, fallback.bits().into())
                .ctx("TUNSETOFFLOAD")?;
            Ok(fallback)
        }
        Err(e) => Err(e).ctx("TUNSETOFFLOAD"),
    }
}

/// SIOCSIFMTU through a datagram socket of the current namespace (the TAP
/// descriptor does not take it).
/// The MTU of `name` in the caller's namespace (`SIOCGIFMTU`).
fn get_mtu(name: &str) -> Result<u32> {
    let sock = sys::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).ctx("socket for SIOCGIFMTU")?;
    let mut req = IfReq::named(name);
    sys::tun::ioctl_ifreq(sock.as_fd(), libc::SIOCGIFMTU, &mut req).ctx("SIOCGIFMTU")?;
    u32::try_from(req.mtu()).map_err(|_| Error::Config("negative MTU from SIOCGIFMTU"))
}

fn set_mtu(name: &str, mtu: u32) -> Result<()> {
    let sock = sys::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).ctx("socket for SIOCSIFMTU")?;
    let mut req = IfReq::named(name);
    // validate() bounds the MTU to 65535.
    req.set_mtu(mtu as i32);
    sys::tun::ioctl_ifreq(sock.as_fd(), libc::SIOCSIFMTU, &mut req).ctx("SIOCSIFMTU")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_rules_are_the_kernels() {
        assert!(TapOffloads::POD.validate().is_ok());
        assert!(TapOffloads::NONE.validate().is_ok());
        assert!(TapOffloads::CSUM.validate().is_ok());
        assert!((TapOffloads::CSUM | TapOffloads::TSO4).validate().is_ok());
        assert!(TapOffloads::TSO4.validate().is_err(), "TSO without CSUM");
        assert!(
            (TapOffloads::CSUM | TapOffloads::TSO_ECN)
                .validate()
                .is_err(),
            "ECN without TSO"
        );
        assert!(
            (TapOffloads::CSUM | TapOffloads::USO4).validate().is_err(),
            "USO4 alone"
        );
        assert!(TapOffloads(0x8000).validate().is_err());
        assert_eq!(
            TapOffloads::POD.without(TapOffloads::USO).bits(),
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN
        );
    }

    #[test]
    fn config_is_checked_before_any_syscall() {
        assert!(TapConfig::pod("eth0").validate().is_ok());
        for bad in ["", "a-name-too-long!", "a/b", "a b", "a:b", "..", "a\0b"] {
            assert!(TapConfig::pod(bad).validate().is_err(), "{bad:?}");
        }
        assert!(TapConfig::pod("eth0").queues(0).validate().is_err());
        assert!(TapConfig::pod("eth0").queues(257).validate().is_err());
        assert!(TapConfig::pod("eth0").queues(256).validate().is_ok());
        assert!(TapConfig::pod("eth0").mtu(67).validate().is_err());
        assert!(TapConfig::pod("eth0").mtu(65536).validate().is_err());
        assert!(
            TapConfig::pod("eth0")
                .mac([1, 0, 0, 0, 0, 1])
                .validate()
                .is_err()
        );
        assert!(TapConfig::pod("eth0").mac([0; 6]).validate().is_err());
        assert!(
            TapConfig::pod("eth0")
                .mac([2, 0, 0, 0, 0, 1])
                .validate()
                .is_ok()
        );
        // Errors name the field, and no syscall ran: no namespace needed.
        let e = Tap::create(None, &TapConfig::pod("a/b")).unwrap_err();
        assert!(e.to_string().contains("TAP name"), "{e}");
    }
}
