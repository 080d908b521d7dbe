//! The `tap` pod interface (`"interfaceKind": "tap"`): `CNI_IFNAME` is a
//! persistent multi-queue TAP (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR |
//! IFF_MULTI_QUEUE`, offloads on) inside the pod's netns, with the pod's
//! /32 and /128, the route to 169.254.1.1 and the default routes through
//! it, the MTU as for a veth. Nothing of the pod is on the host: the
//! vrouter attaches its queues (one per worker, `tapQueues`) by name and
//! netns, as [`PodInterface::Tap`] in the endpoint tells it.
//!
//! The plugin's own queues close when it exits; the device stays
//! (persistent) with no carrier until the vrouter attaches, and keeps its
//! addresses and routes while the vrouter restarts. DEL removes it
//! (RTM_DELLINK in the pod's netns, with the veth pod end's code); a
//! deleted netns takes it along.

use std::fs::File;
use std::os::fd::AsFd;

use brindle_api::cni::{CniError, CniResult, Interface, Request};
use brindle_api::endpoint::{Deleted, Endpoint, EndpointRequest, PodInterface};
use brindle_xsk::{Tap, TapConfig};
use ipnet::IpNet;
use tracing::{info, warn};

use crate::config::BrindleConfig;
use crate::netlink::{Link, Netlink, NetlinkError, format_mac};
use crate::plugin::{
    CODE_INTERFACE_EXISTS, HOST_MAC, configure_pod, daemon_of, default_routes, key_of, nl,
    pod_ip_configs, pod_ips, pod_ref, register, result_dns,
};
use crate::{delegate, netns};

/// The netlink kind of a TUN/TAP device.
pub const TUN_KIND: &str = "tun";

fn netns_path(req: &Request) -> String {
    req.env
        .netns
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// What the endpoint says of a TAP pod made from `req` and `cfg`.
pub fn interface_of(req: &Request, cfg: &BrindleConfig) -> PodInterface {
    PodInterface::Tap {
        netns: netns_path(req),
        ifname: req.env.ifname.clone(),
        queues: cfg.tap_queues,
    }
}

/// Undoes a half-done ADD when dropped armed: the endpoint (once sent to
/// the daemon), the TAP (once made) and the addresses.
struct Rollback<'a> {
    req: &'a Request,
    cfg: &'a BrindleConfig,
    netns: &'a File,
    tap_made: bool,
    registering: bool,
    armed: bool,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        warn!(ifname = %self.req.env.ifname, "ADD failed; rolling back");
        // The daemon may have programmed the vrouter before its answer was
        // lost (a timeout, TryAgainLater after the port was attached):
        // best effort, so that a retried ADD is a fresh port.
        if self.registering
            && let Err(e) = daemon_of(self.cfg).call::<Deleted>(&EndpointRequest::DeleteEndpoint {
                key: key_of(self.req),
            })
            && !e.is_not_found()
        {
            warn!(error = %e, "rollback: cannot tell the daemon");
        }
        // RTM_DELLINK, as DEL does: clearing TUNSETPERSIST would leave the
        // device while the vrouter holds queues on it, and the retried ADD
        // would find `CNI_IFNAME` taken (code 100) for good.
        if self.tap_made
            && let Err(e) = netns::netlink_in(self.netns).and_then(|mut pod| {
                match pod.link_by_name(&self.req.env.ifname)? {
                    Some(l) if l.kind.as_deref() == Some(TUN_KIND) => pod.delete_link(l.index),
                    _ => Ok(()),
                }
            })
        {
            warn!(error = %e, "rollback: cannot delete the TAP");
        }
        if let Err(e) = delegate::ipam_del(self.req) {
            warn!(error = %e, "rollback: IPAM DEL failed");
        }
    }
}

/// Runs `f` on a short-lived thread: `Tap` enters the pod's netns on the
/// calling thread (and back), and the plugin's main thread never moves.
fn in_thread<T: Send>(f: impl FnOnce() -> brindle_xsk::Result<T> + Send) -> brindle_xsk::Result<T> {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|_| Err(brindle_xsk::Error::Config("the TAP thread panicked")))
    })
}

/// ADD for a TAP pod, after the checks every kind shares (the interface
/// is not in the pod yet, the MTU).
pub(crate) fn add(
    req: &Request,
    cfg: &BrindleConfig,
    netns: &File,
    pod: &mut Netlink,
    mtu: u32,
) -> Result<CniResult, CniError> {
    let ifname = &req.env.ifname;
    let mut rollback = Rollback {
        req,
        cfg,
        netns,
        tap_made: false,
        registering: false,
        armed: true,
    };
    let ipam = delegate::ipam_add(req)?;
    let tap_cfg = TapConfig::pod(ifname).mtu(mtu).queues(cfg.tap_queues);
    // Our queues close at the end of this statement: the device stays.
    in_thread(|| Tap::create(Some(netns.as_fd()), &tap_cfg).map(drop)).map_err(|e| match e {
        brindle_xsk::Error::InterfaceExists { .. } => CniError::new(
            CODE_INTERFACE_EXISTS,
            format!("interface {ifname} already exists in the pod"),
        ),
        e => CniError::io("creating the TAP", e),
    })?;
    rollback.tap_made = true;
    let mut link = pod
        .link_by_name(ifname)
        .map_err(nl("reading the pod TAP"))?
        .ok_or_else(|| CniError::io("reading the pod TAP", "not in the pod netns"))?;
    if let Some(mac) = crate::mac::requested_mac(req)? {
        link = crate::plugin::set_pod_mac(pod, &link, mac)?;
    }
    pod.set_noqueue(link.index)
        .map_err(nl("setting the pod TAP's qdisc"))?;
    let ips = pod_ips(&ipam);
    let gateways = configure_pod(pod, &link, &ips)?;
    let key = key_of(req);
    let endpoint = Endpoint {
        key: key.clone(),
        pod: pod_ref(req),
        netns: netns_path(req),
        host_ifname: String::new(),
        host_ifindex: 0,
        host_mac: format_mac(&HOST_MAC),
        pod_mac: format_mac(&link.mac),
        ips: ips.clone(),
        gateways: gateways.clone(),
        mtu,
        interface: interface_of(req, cfg),
    };
    rollback.registering = true;
    register(cfg, endpoint)?;
    rollback.armed = false;
    info!(handle = %key.handle(), ?ips, mtu, queues = cfg.tap_queues, "ADD done (tap)");
    Ok(result_of(req, &link, &ips, &gateways, mtu, &ipam))
}

/// The result: one interface, in the sandbox.
fn result_of(
    req: &Request,
    link: &Link,
    ips: &[IpNet],
    gateways: &[std::net::IpAddr],
    mtu: u32,
    ipam: &CniResult,
) -> CniResult {
    CniResult {
        interfaces: vec![Interface {
            name: req.env.ifname.clone(),
            mac: format_mac(&link.mac),
            mtu: Some(mtu),
            sandbox: netns_path(req),
            ..Default::default()
        }],
        ips: pod_ip_configs(ips, 0),
        routes: default_routes(gateways),
        dns: result_dns(req, ipam),
    }
}

/// CHECK's link part for a TAP pod: the pod's interface is a TUN/TAP
/// device, and the host has no veth for the attachment.
pub(crate) fn check_links(
    host: &mut Netlink,
    host_name: &str,
    pod_link: Option<&Link>,
    ifname: &str,
    diffs: &mut Vec<String>,
) -> Result<(), NetlinkError> {
    if let Some(link) = pod_link
        && link.kind.as_deref() != Some(TUN_KIND)
    {
        diffs.push(format!(
            "{ifname} is a {}, expected a TAP",
            link.kind.as_deref().unwrap_or("device of no kind")
        ));
    }
    if host.link_by_name(host_name)?.is_some() {
        diffs.push(format!("host veth {host_name} exists for a TAP pod"));
    }
    Ok(())
}
