//! Working on a pod's network namespace from the host.
//!
//! The plugin never moves its own thread into another netns. A netlink
//! socket belongs to the netns it was created in, so a dedicated, short-lived
//! thread enters the pod's netns, opens the socket and ends; the main thread
//! then drives that socket from the host. The thread that changed netns is
//! gone before anything else runs, so no code ever runs in the wrong netns by
//! accident and there is no "switch back" step that an early return could
//! skip.

use std::fs::File;
use std::io;
use std::path::Path;

use nix::sched::{CloneFlags, setns};
use rtnetlink::sys::Socket;
use rtnetlink::sys::protocols::NETLINK_ROUTE;

use crate::netlink::{Netlink, NetlinkError};

/// Opens the netns file at `path` (e.g. `/var/run/netns/x` or
/// `/proc/PID/ns/net`).
pub fn open_netns(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Opens an rtnetlink socket inside the netns `netns` and returns a client
/// for it, usable from the calling (host) thread.
pub fn netlink_in(netns: &File) -> Result<Netlink, NetlinkError> {
    let socket = std::thread::scope(|scope| {
        scope
            .spawn(|| -> io::Result<Socket> {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                Socket::new(NETLINK_ROUTE)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
    })?;
    Netlink::from_socket(socket)
}
