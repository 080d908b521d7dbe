//! TCP-MD5 signatures (RFC 2385) via `setsockopt(TCP_MD5SIG)`: the one
//! syscall of this crate that neither nix nor socket2 wraps.
#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Linux's `TCP_MD5SIG_MAXKEYLEN`.
pub const MAX_KEY_LEN: usize = 80;

/// `struct tcp_md5sig` from `<linux/tcp.h>`; libc does not define it.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: libc::c_int,
    key: [u8; MAX_KEY_LEN],
}

/// Installs (or with `None` removes) the MD5 key for segments to and from
/// `peer` on `socket`. On a listening socket this covers the connections it
/// accepts from `peer`. `v6_socket`: the socket is AF_INET6, so an IPv4 peer
/// is written as a v4-mapped address.
pub fn set_md5_key(
    socket: BorrowedFd<'_>,
    peer: IpAddr,
    key: Option<&[u8]>,
    v6_socket: bool,
) -> io::Result<()> {
    let key = key.unwrap_or_default();
    if key.len() > MAX_KEY_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TCP-MD5 key longer than 80 bytes",
        ));
    }
    let peer = match (peer, v6_socket) {
        (IpAddr::V4(a), true) => IpAddr::V6(a.to_ipv6_mapped()),
        (p, _) => p,
    };
    let sockaddr = socket2::SockAddr::from(SocketAddr::new(peer, 0));
    let mut sig = TcpMd5Sig {
        // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid
        // (AF_UNSPEC) value, overwritten just below.
        addr: unsafe { std::mem::zeroed() },
        flags: 0,
        prefixlen: 0,
        keylen: key.len() as u16,
        ifindex: 0,
        key: [0; MAX_KEY_LEN],
    };
    let len = (sockaddr.len() as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: both pointers are valid for `len` bytes (`len` is capped at
    // the destination's size) and the regions do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sockaddr.as_ptr().cast::<u8>(),
            (&raw mut sig.addr).cast::<u8>(),
            len,
        );
    }
    sig.key[..key.len()].copy_from_slice(key);
    // SAFETY: the fd is a live socket borrowed for the call; `sig` is a
    // fully initialised `struct tcp_md5sig` whose size we pass.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            (&raw const sig).cast::<libc::c_void>(),
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
