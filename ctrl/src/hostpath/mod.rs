//! The host path in the node's kernel (issue 14): what the kernel must hold
//! so that the node, kube-proxy's DNAT and the outside reach pods through
//! the vrouter's host port, and pods reach them back.
//!
//! The vrouter owns a persistent TAP (`brindle0`, `[vrouter] host_port`) in
//! the node's network namespace; the node daemon programs the kernel's side
//! of it:
//! - the link up, with the pod MTU;
//! - one route per pod prefix (our blocks, every remote block and borrowed
//!   /32 inside a pool) `via 169.254.1.1 dev brindle0 onlink`, IPv6 ones
//!   `via fe80::ecee:eeff:feee:eeee dev brindle0`, marked with our own route
//!   protocol ([`ROUTE_PROTOCOL`], as Calico's Felix and BIRD mark theirs):
//!   every route of that protocol that is not wanted is removed, so a
//!   withdrawn block and the leftovers of a previous run go;
//! - `ip_forward` on, `rp_filter` off on the host port: the vrouter checks
//!   every pod's source (anti-spoofing) before a frame reaches the port,
//!   and the kernel's "loose" mode is no looser than strict on an interface
//!   without an address (`brindle0` has none: the kernel's
//!   `fib_validate_source` drops any source not routed via it), which
//!   dropped a reply from a veth pod whose `/32 dev <veth>` route (no
//!   `hostPort` in the conflist) is not `brindle0`;
//! - natOutgoing: one nftables table of ours, `inet brindle` ([`nft`]),
//!   replaced atomically by one `nft -f` transaction, never touching another
//!   table.
//!
//! Pure parts: [`HostState`] (what is wanted, computed by the owner loop),
//! [`nft::ruleset`], and [`HostProgrammer`], which converges a [`Kernel`]
//! to a state; the real kernel is [`netlink::NetlinkKernel`], the test one
//! [`RecordingKernel`]. [`spawn`] runs the programmer on a thread of its
//! own: the owner's `Effect::Host` values go there, and the thread checks
//! the kernel again every [`RECHECK`] (every [`RETRY`] while the port is
//! missing or a call failed), so a vrouter that recreates `brindle0` gets
//! its routes back.

pub mod netlink;
pub mod nft;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::mpsc;
use std::time::Duration;

use ipnet::IpNet;
use tracing::{debug, info, warn};

/// The route protocol number of the routes this daemon puts in the kernel
/// (`ip route show proto 73`): ours to remove when not wanted, nobody
/// else's ever touched.
pub const ROUTE_PROTOCOL: u8 = 73;

/// The IPv4 next hop of the kernel's routes into the host port: the
/// vrouter answers ARP for it there, as it does for pods.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The IPv6 next hop: the link-local address of the vrouter's gateway MAC
/// `ee:ee:ee:ee:ee:ee` (EUI-64), the one pods use too.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// How often a kernel in sync is checked again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// How soon a kernel out of sync (port missing, a call failed) is tried
/// again.
pub const RETRY: Duration = Duration::from_secs(1);

/// The pools as natOutgoing needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatPools {
    /// Pools with natOutgoing: their traffic to a destination outside
    /// every pool leaves with the node's address.
    pub masquerade: BTreeSet<IpNet>,
    /// Every pool.
    pub pools: BTreeSet<IpNet>,
}

/// What the node's kernel should hold for the host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    /// The host port's interface name (`brindle0`).
    pub port: String,
    /// Its MTU (the pods').
    pub mtu: u32,
    /// Prefixes routed into the host port.
    pub routes: BTreeSet<IpNet>,
    /// natOutgoing.
    pub nat: NatPools,
}

impl HostState {
    /// Whether anything is IPv6 (then IPv6 forwarding is turned on too).
    fn has_v6(&self) -> bool {
        self.routes
            .iter()
            .chain(&self.nat.pools)
            .any(|p| matches!(p, IpNet::V6(_)))
    }
}

/// A route of ours in the kernel: a prefix into an interface (the next hop
/// follows from the family: [`GATEWAY_V4`] onlink or [`GATEWAY_V6`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelRoute {
    /// The destination.
    pub prefix: IpNet,
    /// The output interface's index.
    pub ifindex: u32,
}

impl KernelRoute {
    /// The next hop of this route.
    pub fn gateway(&self) -> IpAddr {
        match self.prefix {
            IpNet::V4(_) => IpAddr::V4(GATEWAY_V4),
            IpNet::V6(_) => IpAddr::V6(GATEWAY_V6),
        }
    }
}

/// Why a kernel call failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A netlink request failed.
    #[error("netlink: {0}")]
    Netlink(String),
    /// A sysctl could not be written.
    #[error("sysctl {key}: {message}")]
    Sysctl {
        /// The key (`net/ipv4/ip_forward`).
        key: String,
        /// Why.
        message: String,
    },
    /// `nft -f` refused the ruleset or could not run.
    #[error("nft: {0}")]
    Nft(String),
}

/// The node's kernel as the host path programs it.
pub trait Kernel {
    /// The index of interface `name`, `None` when it does not exist.
    fn ifindex(&mut self, name: &str) -> Option<u32>;
    /// Sets the interface up with this MTU.
    fn set_link(&mut self, ifindex: u32, mtu: u32) -> Result<(), HostError>;
    /// Writes `value` to `/proc/sys/<key>`.
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), HostError>;
    /// Every route of [`ROUTE_PROTOCOL`] in the main table, IPv4 and IPv6.
    fn our_routes(&mut self) -> Result<Vec<KernelRoute>, HostError>;
    /// Adds (or replaces) a route of ours.
    fn add_route(&mut self, route: &KernelRoute) -> Result<(), HostError>;
    /// Deletes a route of ours.
    fn del_route(&mut self, route: &KernelRoute) -> Result<(), HostError>;
    /// Applies an nftables ruleset in one transaction (`nft -f`).
    fn nft(&mut self, ruleset: &str) -> Result<(), HostError>;
}

/// Converges a [`Kernel`] to the last [`HostState`] it was given.
pub struct HostProgrammer<K> {
    kernel: K,
    desired: Option<HostState>,
    /// The ruleset last applied (applied again only when it changes).
    nft_applied: Option<String>,
    /// The link (index, MTU) last set up.
    link_set: Option<(u32, u32)>,
    in_sync: bool,
    /// The port was missing at the last attempt (logged once).
    port_missing: bool,
}

impl<K: Kernel> HostProgrammer<K> {
    /// A programmer that has done nothing yet.
    pub fn new(kernel: K) -> Self {
        HostProgrammer {
            kernel,
            desired: None,
            nft_applied: None,
            link_set: None,
            in_sync: false,
            port_missing: false,
        }
    }

    /// The kernel (tests read the recording).
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The kernel holds the desired state as of the last attempt.
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    /// A new desired state, applied at once.
    pub fn set(&mut self, state: HostState) {
        if self.desired.as_ref() != Some(&state) {
            self.desired = Some(state);
            self.in_sync = false;
        }
        self.reconcile();
    }

    /// Converges the kernel to the desired state (nothing without one):
    /// the nftables table first (it needs no port), then forwarding, the
    /// link, and the routes of our protocol (unwanted ones removed, missing
    /// ones added). A missing port or a failed call leaves it out of sync,
    /// to be tried again.
    pub fn reconcile(&mut self) {
        let Some(want) = self.desired.clone() else {
            return;
        };
        self.in_sync = match self.converge(&want) {
            Ok(done) => done,
            Err(e) => {
                warn!(error = %e, "programming the host path in the kernel");
                // Re-apply everything next time.
                self.nft_applied = None;
                self.link_set = None;
                false
            }
        };
    }

    fn converge(&mut self, want: &HostState) -> Result<bool, HostError> {
        let ruleset = nft::ruleset(&want.nat);
        if self.nft_applied.as_ref() != Some(&ruleset) {
            self.kernel.nft(&ruleset)?;
            info!(
                masquerade = ?want.nat.masquerade,
                "natOutgoing: nftables table inet {} replaced",
                nft::TABLE
            );
            self.nft_applied = Some(ruleset);
        }
        self.kernel.sysctl("net/ipv4/ip_forward", "1")?;
        if want.has_v6() {
            self.kernel.sysctl("net/ipv6/conf/all/forwarding", "1")?;
        }
        let Some(ifindex) = self.kernel.ifindex(&want.port) else {
            if !self.port_missing {
                info!(port = %want.port, "host port not there yet (the vrouter makes it): waiting");
                self.port_missing = true;
            }
            self.link_set = None;
            return Ok(false);
        };
        if std::mem::take(&mut self.port_missing) {
            info!(port = %want.port, ifindex, "host port appeared");
        }
        if self.link_set != Some((ifindex, want.mtu)) {
            self.kernel.set_link(ifindex, want.mtu)?;
            self.kernel
                .sysctl(&format!("net/ipv4/conf/{}/rp_filter", want.port), "0")?;
            self.link_set = Some((ifindex, want.mtu));
        }
        let have: BTreeSet<KernelRoute> = self.kernel.our_routes()?.into_iter().collect();
        let wanted: BTreeSet<KernelRoute> = want
            .routes
            .iter()
            .map(|p| KernelRoute {
                prefix: p.trunc(),
                ifindex,
            })
            .collect();
        let (mut added, mut removed) = (0, 0);
        for r in have.difference(&wanted) {
            self.kernel.del_route(r)?;
            removed += 1;
        }
        for r in wanted.difference(&have) {
            self.kernel.add_route(r)?;
            added += 1;
        }
        if added + removed > 0 {
            info!(added, removed, routes = wanted.len(), port = %want.port, "kernel routes into the host port");
        } else {
            debug!(routes = wanted.len(), "kernel routes in sync");
        }
        Ok(true)
    }
}

/// Starts the host path's thread: it takes each new [`HostState`] (the
/// newest of those queued) and checks the kernel again every [`RECHECK`],
/// or every [`RETRY`] while out of sync. It ends when the sender is gone.
/// `kernel` is made on the thread (the netlink one owns a runtime).
pub fn spawn<K, F>(make: F) -> std::io::Result<mpsc::Sender<HostState>>
where
    K: Kernel,
    F: FnOnce() -> Result<K, HostError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<HostState>();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("host-path".into())
        .spawn(move || {
            let _span = span.enter();
            let kernel = match make() {
                Ok(k) => k,
                Err(e) => {
                    warn!(error = %e, "no host path: cannot open the kernel's netlink");
                    return;
                }
            };
            let mut programmer = HostProgrammer::new(kernel);
            loop {
                let wait = if programmer.in_sync() { RECHECK } else { RETRY };
                match rx.recv_timeout(wait) {
                    Ok(first) => {
                        let newest = rx.try_iter().last().unwrap_or(first);
                        programmer.set(newest);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => programmer.reconcile(),
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
    Ok(tx)
}

/// A kernel in memory that records what was done to it.
#[derive(Debug, Default)]
pub struct RecordingKernel {
    /// Interfaces by name: (index, MTU, up).
    pub links: BTreeMap<String, (u32, u32, bool)>,
    /// Sysctls written.
    pub sysctls: BTreeMap<String, String>,
    /// Routes of our protocol.
    pub routes: BTreeSet<KernelRoute>,
    /// The nftables rulesets applied, in order.
    pub nft: Vec<String>,
    /// Route additions and deletions, in order (`+prefix@ifindex`,
    /// `-prefix@ifindex`).
    pub route_calls: Vec<String>,
    /// Make the next `nft` call fail.
    pub fail_nft: bool,
}

impl Kernel for RecordingKernel {
    fn ifindex(&mut self, name: &str) -> Option<u32> {
        self.links.get(name).map(|l| l.0)
    }

    fn set_link(&mut self, ifindex: u32, mtu: u32) -> Result<(), HostError> {
        let link = self
            .links
            .values_mut()
            .find(|l| l.0 == ifindex)
            .ok_or_else(|| HostError::Netlink(format!("no link {ifindex}")))?;
        link.1 = mtu;
        link.2 = true;
        Ok(())
    }

    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), HostError> {
        self.sysctls.insert(key.into(), value.into());
        Ok(())
    }

    fn our_routes(&mut self) -> Result<Vec<KernelRoute>, HostError> {
        Ok(self.routes.iter().copied().collect())
    }

    fn add_route(&mut self, route: &KernelRoute) -> Result<(), HostError> {
        self.route_calls
            .push(format!("+{}@{}", route.prefix, route.ifindex));
        self.routes.insert(*route);
        Ok(())
    }

    fn del_route(&mut self, route: &KernelRoute) -> Result<(), HostError> {
        self.route_calls
            .push(format!("-{}@{}", route.prefix, route.ifindex));
        self.routes.remove(route);
        Ok(())
    }

    fn nft(&mut self, ruleset: &str) -> Result<(), HostError> {
        if std::mem::take(&mut self.fail_nft) {
            return Err(HostError::Nft("refused".into()));
        }
        self.nft.push(ruleset.into());
        Ok(())
    }
}

#[cfg(test)]
mod tests;
