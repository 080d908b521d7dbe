//! The TUN/TAP ioctls and `setns(2)`: the unsafe half of `crate::tap` and
//! `crate::netns`. Each function is one syscall on a descriptor the caller
//! owns, with its argument laid out here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::cvt;

/// `IFNAMSIZ`: an interface name with its terminating NUL.
pub(crate) const IFNAMSIZ: usize = 16;

/// `struct ifreq`: the name, then a 24-byte union of which we use the
/// `short` flags (TUNSETIFF, TUNGETIFF), the `int` MTU (SIOCSIFMTU) and a
/// `struct sockaddr` (SIOCSIFHWADDR: family, then the MAC).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IfReq {
    pub name: [u8; IFNAMSIZ],
    pub data: [u8; 24],
}

impl IfReq {
    /// A request for interface `name` (at most 15 bytes, no NUL; checked by
    /// the caller).
    pub(crate) fn named(name: &str) -> IfReq {
        let mut req = IfReq::default();
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req
    }

    /// The union as `short ifr_flags`.
    pub(crate) fn flags(&self) -> i16 {
        i16::from_ne_bytes([self.data[0], self.data[1]])
    }

    pub(crate) fn set_flags(&mut self, flags: i16) {
        self.data[..2].copy_from_slice(&flags.to_ne_bytes());
    }

    /// The union as `int ifr_mtu`.
    pub(crate) fn set_mtu(&mut self, mtu: i32) {
        self.data[..4].copy_from_slice(&mtu.to_ne_bytes());
    }

    /// The union as `int ifr_mtu` (SIOCGIFMTU's answer).
    pub(crate) fn mtu(&self) -> i32 {
        i32::from_ne_bytes([self.data[0], self.data[1], self.data[2], self.data[3]])
    }

    /// The union as `struct sockaddr ifr_hwaddr` (ARPHRD_ETHER).
    pub(crate) fn set_hwaddr(&mut self, mac: [u8; 6]) {
        self.data[..2].copy_from_slice(&libc::ARPHRD_ETHER.to_ne_bytes());
        self.data[2..8].copy_from_slice(&mac);
    }

    pub(crate) fn hwaddr(&self) -> [u8; 6] {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.data[2..8]);
        mac
    }
}

/// `ioctl(fd, request, &mut req)` for an `ifreq` the kernel reads and may
/// write back (TUNSETIFF writes the final name, TUNGETIFF the flags,
/// SIOCGIFHWADDR the address).
pub(crate) fn ioctl_ifreq(
    fd: BorrowedFd<'_>,
    request: libc::Ioctl,
    req: &mut IfReq,
) -> io::Result<()> {
    // SAFETY: `req` is a valid, writable `struct ifreq` (40 bytes, the
    // kernel's layout) alive for the call; the kernel reads and writes at
    // most that much.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, req as *mut IfReq) }).map(drop)
}

/// `ioctl(fd, request, &value)` for the requests that take a pointer to an
/// `int` (TUNSETVNETHDRSZ, TUNSETVNETLE, TUNSETCARRIER).
pub(crate) fn ioctl_set_int(
    fd: BorrowedFd<'_>,
    request: libc::Ioctl,
    value: i32,
) -> io::Result<()> {
    // SAFETY: the pointer is to `value`, an `int` alive for the call, which
    // the kernel only reads.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, &value as *const i32) }).map(drop)
}

/// `ioctl(fd, request, value)` for the requests that take their argument
/// by value, not through a pointer (TUNSETOFFLOAD, TUNSETPERSIST).
pub(crate) fn ioctl_set_value(
    fd: BorrowedFd<'_>,
    request: libc::Ioctl,
    value: libc::c_ulong,
) -> io::Result<()> {
    // SAFETY: the argument is a plain integer, not a pointer; the kernel
    // dereferences nothing of ours.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, value) }).map(drop)
}

/// `ioctl(fd, TUNGETDEVNETNS)`: a new descriptor for the network namespace
/// of the device a TUN/TAP queue is attached to.
pub(crate) fn tun_device_netns(fd: BorrowedFd<'_>) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: TUNGETDEVNETNS takes no argument and returns a new descriptor.
    let ns = cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETDEVNETNS) })?;
    // SAFETY: `ns` is a fresh descriptor owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(ns) })
}

/// `setns(fd, CLONE_NEWNET)`: moves the calling thread into the network
/// namespace `fd` refers to.
pub(crate) fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and a flag; it changes only the
    // calling thread's network namespace and touches no memory of ours.
    cvt(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_has_the_kernels_size_and_field_offsets() {
        assert_eq!(
            std::mem::size_of::<IfReq>(),
            std::mem::size_of::<libc::ifreq>()
        );
        let mut r = IfReq::named("eth0");
        r.set_flags(0x5002);
        assert_eq!(&r.name[..5], b"eth0\0");
        assert_eq!(r.flags(), 0x5002);
        r.set_hwaddr([2, 0, 0, 0, 0, 9]);
        assert_eq!(r.hwaddr(), [2, 0, 0, 0, 0, 9]);
        assert_eq!(
            u16::from_ne_bytes([r.data[0], r.data[1]]),
            libc::ARPHRD_ETHER
        );
    }
}
