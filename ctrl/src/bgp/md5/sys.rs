//! The `setsockopt(TCP_MD5SIG)` system call: the only `unsafe` of this
//! crate (see docs/DESIGN.md, "unsafe").
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Sets `TCP_MD5SIG` on the socket to `sig`, a whole `struct tcp_md5sig`.
pub(super) fn set_tcp_md5sig(
    socket: BorrowedFd<'_>,
    sig: &[u8; super::TCP_MD5SIG_LEN],
) -> io::Result<()> {
    // SAFETY: the fd is a live socket borrowed for the call; the kernel
    // reads exactly `sig.len()` bytes from `sig`, which is valid for reads
    // of that length for the whole call and is not retained after it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            sig.as_ptr().cast::<libc::c_void>(),
            sig.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
