//! Entering a network namespace for a few syscalls, with an RAII guard.
//!
//! A TAP device belongs to the network namespace of the thread that opens
//! `/dev/net/tun`, and an interface name or index means something only in
//! one namespace. [`NetnsGuard::enter`] moves the calling thread into a
//! namespace and its `Drop` moves it back, so an early return or `?` cannot
//! leave the thread behind (the failure mode of a macro that switches back
//! at its end). The guard is neither `Send` nor `Sync`: the namespace is a
//! property of the thread, so the guard must be dropped on the thread that
//! made it.

use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{Context, Result};
use crate::sys::tun as sys;

/// The calling thread's network namespace, as a descriptor.
pub fn current_netns() -> Result<OwnedFd> {
    File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .ctx("open /proc/thread-self/ns/net")
}

/// While alive, the calling thread is in another network namespace; on
/// drop it is back in the one it came from.
pub struct NetnsGuard {
    home: OwnedFd,
    // The namespace is the thread's: the guard stays on it.
    _thread_bound: PhantomData<*const ()>,
}

impl NetnsGuard {
    /// Moves the calling thread into `netns` (a descriptor of
    /// `/var/run/netns/NAME` or `/proc/PID/ns/net`).
    pub fn enter(netns: BorrowedFd<'_>) -> Result<NetnsGuard> {
        let home = current_netns()?;
        sys::setns_net(netns).ctx("setns(CLONE_NEWNET) into the target namespace")?;
        Ok(NetnsGuard {
            home,
            _thread_bound: PhantomData,
        })
    }

    /// Enters `netns` if given; `None` stays where the thread is (and the
    /// guard does nothing).
    pub fn enter_opt(netns: Option<BorrowedFd<'_>>) -> Result<Option<NetnsGuard>> {
        netns.map(NetnsGuard::enter).transpose()
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = sys::setns_net(self.home.as_fd()) {
            // A thread that cannot get back would create sockets and devices
            // in the wrong namespace from now on, silently. setns into a
            // namespace we were just in fails only if the kernel is out of
            // memory; stopping is the only safe answer.
            eprintln!("brindle-xsk: cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}
