//! The `brindle` plugin: what each verb does. See `cni/README.md`.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use brindle_api::cni::{
    CniError, CniResult, Command, Dns, ErrorCode, Interface, IpConfig, Plugin, Request, Route,
};
use brindle_api::endpoint::{
    DaemonStatus, Deleted, Endpoint, EndpointKey, EndpointRequest, GcReport, PodInterface, PodRef,
};
use brindle_api::framing::PROTOCOL_VERSION;
use ipnet::IpNet;
use rtnetlink::packet_route::route::RouteScope;
use tracing::{debug, info, info_span, warn};

use crate::config::{BrindleConfig, InterfaceKind};
use crate::daemon::{Daemon, DaemonError};
use crate::delegate;
use crate::ifname::{host_ifname, is_host_ifname};
use crate::mac::requested_mac;
use crate::netlink::{Link, Netlink, NetlinkError, format_mac};
use crate::netns;

/// The pod's IPv4 gateway: answered by the vrouter's proxy ARP, never
/// assigned anywhere (as in Calico).
pub const GATEWAY_V4: Ipv4Addr = brindle_api::POD_GATEWAY_V4;
/// The pod's IPv6 gateway: the link-local address derived from the host
/// end's MAC `ee:ee:ee:ee:ee:ee`.
pub const GATEWAY_V6: Ipv6Addr = brindle_api::POD_GATEWAY_V6;
/// MAC of every host end.
pub const HOST_MAC: [u8; 6] = brindle_api::POD_GATEWAY_MAC;
/// MTU when neither `mtu` nor an uplink says otherwise.
pub const FALLBACK_UPLINK_MTU: u32 = 1500;

/// Plugin-specific error: `CNI_IFNAME` already exists in the pod (the spec
/// requires an error and names no code).
pub const CODE_INTERFACE_EXISTS: ErrorCode = ErrorCode(100);
/// Plugin-specific error: CHECK found the attachment differs from
/// `prevResult` or from the daemon's record.
pub const CODE_CHECK_FAILED: ErrorCode = ErrorCode(101);

/// The plugin. Stateless: everything it needs is in the request, the kernel
/// and the node daemon.
#[derive(Debug, Default)]
pub struct Brindle;

pub(crate) fn nl(what: &str) -> impl Fn(NetlinkError) -> CniError + '_ {
    move |e| CniError::io(what.to_string(), e)
}

pub(crate) fn key_of(req: &Request) -> EndpointKey {
    EndpointKey {
        network: req.conf.name.clone(),
        container_id: req.env.container_id.clone(),
        ifname: req.env.ifname.clone(),
    }
}

pub(crate) fn pod_ref(req: &Request) -> PodRef {
    let a = &req.env.args;
    PodRef {
        namespace: a.pod_namespace().unwrap_or_default().to_string(),
        name: a.pod_name().unwrap_or_default().to_string(),
        uid: a.pod_uid().unwrap_or_default().to_string(),
        infra_container_id: a.pod_infra_container_id().unwrap_or_default().to_string(),
    }
}

pub(crate) fn daemon_of(cfg: &BrindleConfig) -> Daemon {
    Daemon::new(cfg.ctrl_socket.clone(), cfg.daemon_timeout())
}

/// The address as the pod holds it: a host prefix (/32 or /128).
pub(crate) fn host_prefix(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn open_pod_netns(req: &Request) -> Result<File, CniError> {
    let path = req.env.netns.clone().unwrap_or_default();
    netns::open_netns(&path).map_err(|e| {
        CniError::new(
            ErrorCode::UNKNOWN_CONTAINER,
            format!("cannot open the netns {}", path.display()),
        )
        .with_details(e.to_string())
    })
}

/// The uplink's MTU: the configured interface, else the one holding the
/// IPv4 default route, else [`FALLBACK_UPLINK_MTU`].
fn uplink_mtu(host: &mut Netlink, cfg: &BrindleConfig) -> Result<u32, CniError> {
    if let Some(name) = &cfg.uplink_interface {
        return host
            .link_by_name(name)
            .map_err(nl("looking up the uplink"))?
            .map(|l| l.mtu)
            .ok_or_else(|| {
                CniError::invalid_config(format!("uplinkInterface {name:?} not found"))
            });
    }
    let oif = host
        .default_route_oif()
        .map_err(nl("looking up the default route"))?;
    Ok(match oif {
        Some(i) => host
            .link_by_index(i)
            .map_err(nl("looking up the uplink"))?
            .map(|l| l.mtu)
            .unwrap_or(FALLBACK_UPLINK_MTU),
        None => FALLBACK_UPLINK_MTU,
    })
}

/// Undoes a half-done ADD when dropped armed: deletes the veth pair (the
/// pod end goes with the host end) and releases the addresses. A guard, so
/// that every early return and even a panic rolls back.
struct Rollback<'a> {
    req: &'a Request,
    host_name: &'a str,
    armed: bool,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        warn!(host_ifname = self.host_name, "ADD failed; rolling back");
        match Netlink::open().and_then(|mut h| h.delete_link_by_name(self.host_name)) {
            Ok(_) => {}
            Err(e) => warn!(error = %e, "rollback: cannot delete the host veth"),
        }
        if let Err(e) = delegate::ipam_del(self.req) {
            warn!(error = %e, "rollback: IPAM DEL failed");
        }
    }
}

/// What ADD built, for the result and the daemon.
struct Built {
    host: Link,
    pod: Link,
    ips: Vec<IpNet>,
    gateways: Vec<IpAddr>,
    mtu: u32,
}

/// The pod's addresses from the IPAM result, as host prefixes.
pub(crate) fn pod_ips(ipam: &CniResult) -> Vec<IpNet> {
    ipam.ips
        .iter()
        .map(|c| host_prefix(c.address.addr()))
        .collect()
}

/// The pod side, whatever the interface kind: the addresses on
/// `pod_link`, the link up, the route to 169.254.1.1 and the default
/// routes through the gateways. Returns the gateways.
pub(crate) fn configure_pod(
    pod: &mut Netlink,
    pod_link: &Link,
    ips: &[IpNet],
) -> Result<Vec<IpAddr>, CniError> {
    for ip in ips {
        pod.add_address(pod_link.index, *ip)
            .map_err(nl("adding the pod address"))?;
    }
    pod.set_up(pod_link.index)
        .map_err(nl("bringing the pod interface up"))?;
    let mut gateways = Vec::new();
    if ips.iter().any(|i| i.addr().is_ipv4()) {
        pod.add_route(
            host_prefix(GATEWAY_V4.into()),
            None,
            pod_link.index,
            RouteScope::Link,
        )
        .map_err(nl("adding the gateway route"))?;
        pod.add_route(
            "0.0.0.0/0".parse().unwrap_or_default(),
            Some(GATEWAY_V4.into()),
            pod_link.index,
            RouteScope::Universe,
        )
        .map_err(nl("adding the default route"))?;
        gateways.push(IpAddr::V4(GATEWAY_V4));
    }
    if ips.iter().any(|i| i.addr().is_ipv6()) {
        pod.add_route(
            IpNet::V6(Default::default()),
            Some(GATEWAY_V6.into()),
            pod_link.index,
            RouteScope::Universe,
        )
        .map_err(nl("adding the IPv6 default route"))?;
        gateways.push(IpAddr::V6(GATEWAY_V6));
    }
    Ok(gateways)
}

/// Tells the daemon the endpoint (ADD); unreachable is an error unless
/// `requireDaemon` is false.
pub(crate) fn register(cfg: &BrindleConfig, endpoint: Endpoint) -> Result<(), CniError> {
    match daemon_of(cfg).call::<Endpoint>(&EndpointRequest::AddEndpoint {
        endpoint: Box::new(endpoint),
    }) {
        Ok(_) => Ok(()),
        Err(e @ DaemonError::Unreachable { .. }) if !cfg.require_daemon => {
            warn!(error = %e, "node daemon unreachable; endpoint not registered (requireDaemon=false)");
            Ok(())
        }
        Err(e) => Err(e.to_cni()),
    }
}

/// Gives the pod's interface the MAC the runtime asked for (before it is
/// up) and reads it back.
pub(crate) fn set_pod_mac(pod: &mut Netlink, link: &Link, mac: [u8; 6]) -> Result<Link, CniError> {
    pod.set_mac(link.index, mac)
        .map_err(nl("setting the pod interface's MAC"))?;
    pod.link_by_name(&link.name)
        .map_err(nl("reading the pod interface"))?
        .ok_or_else(|| CniError::io("reading the pod interface", "vanished"))
}

/// The netlink part of ADD, after IPAM.
fn build(
    req: &Request,
    host: &mut Netlink,
    pod: &mut Netlink,
    netns: &File,
    host_name: &str,
    ipam: &CniResult,
    mtu: u32,
) -> Result<Built, CniError> {
    let ifname = &req.env.ifname;
    // A host end with our name is a leftover of an earlier attempt for
    // this very attachment (the name is the handle's hash).
    if host
        .delete_link_by_name(host_name)
        .map_err(nl("removing a stale host veth"))?
    {
        warn!(host_ifname = host_name, "removed a stale host veth");
    }
    host.add_veth(host_name, HOST_MAC, mtu, ifname, netns.as_raw_fd())
        .map_err(|e| {
            if e.is_exists() {
                CniError::new(
                    CODE_INTERFACE_EXISTS,
                    format!("interface {ifname} already exists in the pod"),
                )
            } else {
                CniError::io("creating the veth pair", e)
            }
        })?;
    let host_link = host
        .link_by_name(host_name)
        .map_err(nl("reading the host veth"))?
        .ok_or_else(|| CniError::io("reading the host veth", "vanished after creation"))?;
    host.set_alias(host_link.index, &key_of(req).handle())
        .map_err(nl("labelling the host veth"))?;
    host.set_up(host_link.index)
        .map_err(nl("bringing the host veth up"))?;

    let mut pod_link = pod
        .link_by_name(ifname)
        .map_err(nl("reading the pod interface"))?
        .ok_or_else(|| CniError::io("reading the pod interface", "not in the pod netns"))?;
    if let Some(mac) = requested_mac(req)? {
        pod_link = set_pod_mac(pod, &pod_link, mac)?;
    }
    let ips = pod_ips(ipam);
    let gateways = configure_pod(pod, &pod_link, &ips)?;
    // With a host port the node reaches the pod through the vrouter
    // (ctrl's routes via brindle0), never by the veth.
    let host_route = !BrindleConfig::from_conf(&req.conf)?.host_port;
    for ip in &ips {
        // Replace, not add: a released address can be handed out again
        // while the veth of its previous pod is still being torn down; the
        // new route wins, and removing the old veth only flushes routes
        // through the old veth.
        if host_route {
            host.replace_route(*ip, None, host_link.index, RouteScope::Link)
                .map_err(nl("adding the host route to the pod"))?;
        }
        // The pod-role steering program hands every frame from the pod,
        // ARP replies included, to the vrouter, so the node's kernel never
        // learns the pod's MAC by itself; without this entry the node
        // (kubelet probes, hostNetwork pods) could not reach the pod.
        if !pod_link.mac.is_empty() {
            host.replace_permanent_neighbour(host_link.index, ip.addr(), &pod_link.mac)
                .map_err(nl("adding the neighbour entry for the pod"))?;
        }
    }
    Ok(Built {
        host: host_link,
        pod: pod_link,
        ips,
        gateways,
        mtu,
    })
}

fn result_of(req: &Request, built: &Built, ipam: &CniResult) -> CniResult {
    let netns = req
        .env
        .netns
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let ips = pod_ip_configs(&built.ips, 1);
    let routes = default_routes(&built.gateways);
    let dns = result_dns(req, ipam);
    CniResult {
        interfaces: vec![
            Interface {
                name: built.host.name.clone(),
                mac: format_mac(&HOST_MAC),
                mtu: Some(built.mtu),
                ..Default::default()
            },
            Interface {
                name: req.env.ifname.clone(),
                mac: format_mac(&built.pod.mac),
                mtu: Some(built.mtu),
                sandbox: netns,
                ..Default::default()
            },
        ],
        ips,
        routes,
        dns,
    }
}

/// The result's `ips`: each pod address with the link-local gateway of its
/// family, on the result's interface number `interface` (the pod's).
pub(crate) fn pod_ip_configs(ips: &[IpNet], interface: usize) -> Vec<IpConfig> {
    ips.iter()
        .map(|ip| IpConfig {
            address: *ip,
            gateway: Some(if ip.addr().is_ipv4() {
                IpAddr::V4(GATEWAY_V4)
            } else {
                IpAddr::V6(GATEWAY_V6)
            }),
            interface: Some(interface),
        })
        .collect()
}

/// The result's `routes`: a default route per family through its gateway.
pub(crate) fn default_routes(gateways: &[IpAddr]) -> Vec<Route> {
    gateways
        .iter()
        .map(|gw| Route {
            dst: if gw.is_ipv4() {
                IpNet::V4(Default::default())
            } else {
                IpNet::V6(Default::default())
            },
            gw: Some(*gw),
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        })
        .collect()
}

/// The result's DNS: what IPAM returned, else the network config's.
pub(crate) fn result_dns(req: &Request, ipam: &CniResult) -> Dns {
    if ipam.dns.is_empty() {
        req.conf.dns.clone().unwrap_or_default()
    } else {
        ipam.dns.clone()
    }
}

/// The first of `errors` with every message in its details, or `Ok`.
fn collect(errors: Vec<CniError>) -> Result<(), CniError> {
    let mut iter = errors.into_iter();
    let Some(first) = iter.next() else {
        return Ok(());
    };
    let rest: Vec<String> = iter.map(|e| e.to_string()).collect();
    if rest.is_empty() {
        return Err(first);
    }
    let details = format!("{}; also: {}", first.details, rest.join("; "));
    Err(first.with_details(details))
}

/// DEL's daemon and kernel part; returns the failures.
fn del_links_and_endpoint(
    req: &Request,
    cfg: &BrindleConfig,
    key: &EndpointKey,
    host_name: &str,
) -> Vec<CniError> {
    let mut errors = Vec::new();
    match daemon_of(cfg).call::<Deleted>(&EndpointRequest::DeleteEndpoint { key: key.clone() }) {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e @ DaemonError::Unreachable { .. }) => {
            debug!(error = %e, "node daemon unreachable on DEL; nothing to tell it");
        }
        Err(e) => errors.push(e.to_cni()),
    }
    match Netlink::open().and_then(|mut h| h.delete_link_by_name(host_name)) {
        Ok(_) => {}
        Err(e) => errors.push(CniError::io("deleting the host veth", e)),
    }
    // A pod end left without its host end (e.g. the host end was
    // removed by hand) is removed from inside the pod; a missing netns
    // means there is nothing left there.
    if let Some(path) = &req.env.netns
        && let Ok(ns) = netns::open_netns(path)
    {
        let removed =
            netns::netlink_in(&ns).and_then(|mut p| match p.link_by_name(&req.env.ifname)? {
                Some(l) if matches!(l.kind.as_deref(), Some("veth" | "tun")) => {
                    p.delete_link(l.index)
                }
                _ => Ok(()),
            });
        if let Err(e) = removed {
            errors.push(CniError::io("deleting the pod interface", e));
        }
    }
    errors
}

impl Plugin for Brindle {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let cfg = BrindleConfig::from_conf(&req.conf)?;
        let key = key_of(req);
        let host_name = host_ifname(&key.handle());
        let _span =
            info_span!("attachment", handle = %key.handle(), verb = req.env.command.as_str())
                .entered();
        // A MAC the pod cannot have fails before anything is made.
        requested_mac(req)?;
        let netns = open_pod_netns(req)?;
        let mut pod = netns::netlink_in(&netns).map_err(nl("opening netlink in the pod netns"))?;
        // Before IPAM: an existing interface belongs to an earlier ADD, and
        // rolling back would tear down that attachment.
        if pod
            .link_by_name(&req.env.ifname)
            .map_err(nl("reading the pod interfaces"))?
            .is_some()
        {
            return Err(CniError::new(
                CODE_INTERFACE_EXISTS,
                format!("interface {} already exists in the pod", req.env.ifname),
            ));
        }
        let mut host = Netlink::open().map_err(nl("opening netlink"))?;
        let mtu = match cfg.explicit_mtu() {
            Some(m) => m,
            None => cfg.derived_mtu(uplink_mtu(&mut host, &cfg)?),
        };
        if cfg.interface_kind == InterfaceKind::Tap {
            return crate::tap::add(req, &cfg, &netns, &mut pod, mtu);
        }
        // Armed before IPAM: an IPAM plugin that allocated but answered
        // something we cannot use must still release (IPAM DEL is
        // idempotent, and a host end with our name can only be ours).
        let mut rollback = Rollback {
            req,
            host_name: &host_name,
            armed: true,
        };
        let ipam = delegate::ipam_add(req)?;
        let built = build(req, &mut host, &mut pod, &netns, &host_name, &ipam, mtu)?;
        let endpoint = Endpoint {
            key: key.clone(),
            pod: pod_ref(req),
            netns: req
                .env
                .netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            host_ifname: host_name.clone(),
            host_ifindex: built.host.index,
            host_mac: format_mac(&HOST_MAC),
            pod_mac: format_mac(&built.pod.mac),
            ips: built.ips.clone(),
            gateways: built.gateways.clone(),
            mtu,
            interface: PodInterface::Veth,
        };
        register(&cfg, endpoint)?;
        rollback.armed = false;
        info!(handle = %key.handle(), host_ifname = %host_name, ips = ?built.ips, mtu, "ADD done");
        Ok(result_of(req, &built, &ipam))
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        // DEL must work even with a config this version cannot fully use.
        let cfg: BrindleConfig = req.conf.plugin_config().unwrap_or_default();
        let key = key_of(req);
        let host_name = host_ifname(&key.handle());
        let _span =
            info_span!("attachment", handle = %key.handle(), verb = req.env.command.as_str())
                .entered();
        // IPAM DEL runs while the kernel tears the veth down (unregistering
        // a netdev waits for RCU grace periods, tens of ms): DEL takes the
        // longer of the two, not their sum. The host route of a released
        // address is replaced, not added, by the next ADD, so handing the
        // address out again before the old veth is gone is harmless.
        std::thread::scope(|scope| {
            let ipam = req
                .conf
                .ipam
                .is_some()
                .then(|| scope.spawn(|| delegate::ipam_del(req)));
            let mut errors = del_links_and_endpoint(req, &cfg, &key, &host_name);
            if let Some(ipam) = ipam {
                match ipam.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(e),
                    Err(_) => errors.push(CniError::io("IPAM DEL", "thread panicked")),
                }
            }
            info!(handle = %key.handle(), errors = errors.len(), "DEL done");
            collect(errors)
        })
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let cfg = BrindleConfig::from_conf(&req.conf)?;
        let prev = req.conf.prev_result.as_ref().ok_or_else(|| {
            CniError::invalid_config("CHECK needs prevResult in the network config")
        })?;
        let (_, prev) = CniResult::from_json(prev)?;
        let key = key_of(req);
        let host_name = host_ifname(&key.handle());
        let _span =
            info_span!("attachment", handle = %key.handle(), verb = req.env.command.as_str())
                .entered();
        let netns = open_pod_netns(req)?;
        let mut pod = netns::netlink_in(&netns).map_err(nl("opening netlink in the pod netns"))?;
        let mut host = Netlink::open().map_err(nl("opening netlink"))?;
        let mut diffs: Vec<String> = Vec::new();

        let ifname = &req.env.ifname;
        let prev_index = prev
            .interfaces
            .iter()
            .position(|i| &i.name == ifname && !i.sandbox.is_empty());
        let expected_ips: BTreeSet<IpNet> = prev
            .ips
            .iter()
            .filter(|c| c.interface.is_none() || c.interface == prev_index)
            .map(|c| c.address)
            .collect();
        let expected_mtu = match prev_index.and_then(|i| prev.interfaces[i].mtu) {
            Some(m) => m,
            None => match cfg.explicit_mtu() {
                Some(m) => m,
                None => cfg.derived_mtu(uplink_mtu(&mut host, &cfg)?),
            },
        };

        let pod_link = pod
            .link_by_name(ifname)
            .map_err(nl("reading the pod interface"))?;
        match &pod_link {
            None => diffs.push(format!("interface {ifname} is missing in the pod")),
            Some(link) => {
                if prev_index.is_none() {
                    diffs.push(format!("prevResult has no interface {ifname} in a sandbox"));
                }
                if !link.up {
                    diffs.push(format!("{ifname} is down"));
                }
                if link.mtu != expected_mtu {
                    diffs.push(format!(
                        "{ifname} MTU is {}, expected {expected_mtu}",
                        link.mtu
                    ));
                }
                if let Some(i) = prev_index {
                    let want = prev.interfaces[i].mac.to_ascii_lowercase();
                    if !want.is_empty() && want != format_mac(&link.mac) {
                        diffs.push(format!(
                            "{ifname} MAC is {}, expected {want}",
                            format_mac(&link.mac)
                        ));
                    }
                }
                let have: BTreeSet<IpNet> = pod
                    .addresses(link.index)
                    .map_err(nl("reading the pod addresses"))?
                    .into_iter()
                    .collect();
                for ip in &expected_ips {
                    if !have.contains(ip) {
                        diffs.push(format!("address {ip} is missing on {ifname}"));
                    }
                }
                let mut routes = pod.routes(false).map_err(nl("reading the pod routes"))?;
                routes.extend(pod.routes(true).map_err(nl("reading the pod routes"))?);
                let has_route = |dst: IpNet, gw: Option<IpAddr>| {
                    routes
                        .iter()
                        .any(|r| r.dst == dst && r.gw == gw && r.oif == Some(link.index))
                };
                if expected_ips.iter().any(|i| i.addr().is_ipv4())
                    && !has_route(host_prefix(GATEWAY_V4.into()), None)
                {
                    diffs.push(format!("route {GATEWAY_V4}/32 dev {ifname} is missing"));
                }
                for r in &prev.routes {
                    if !has_route(r.dst, r.gw) {
                        diffs.push(format!(
                            "route {} via {} is missing",
                            r.dst,
                            r.gw.map(|g| g.to_string()).unwrap_or_else(|| "-".into())
                        ));
                    }
                }
            }
        }

        let tap = cfg.interface_kind == InterfaceKind::Tap;
        if tap {
            crate::tap::check_links(&mut host, &host_name, pod_link.as_ref(), ifname, &mut diffs)
                .map_err(nl("reading the links"))?;
        } else {
            match host
                .link_by_name(&host_name)
                .map_err(nl("reading the host veth"))?
            {
                None => diffs.push(format!("host veth {host_name} is missing")),
                Some(h) => {
                    if !h.up {
                        diffs.push(format!("host veth {host_name} is down"));
                    }
                    let mut routes = host.routes(false).map_err(nl("reading host routes"))?;
                    routes.extend(host.routes(true).map_err(nl("reading host routes"))?);
                    for ip in expected_ips.iter().filter(|_| !cfg.host_port) {
                        let host_route = host_prefix(ip.addr());
                        if !routes
                            .iter()
                            .any(|r| r.dst == host_route && r.oif == Some(h.index))
                        {
                            diffs.push(format!(
                                "host route {host_route} dev {host_name} is missing"
                            ));
                        }
                    }
                }
            }
        }

        match daemon_of(&cfg).call::<Endpoint>(&EndpointRequest::GetEndpoint { key: key.clone() }) {
            Ok(ep) => {
                let recorded: BTreeSet<IpNet> = ep.ips.iter().copied().collect();
                if recorded != expected_ips {
                    diffs.push(format!(
                        "node daemon records addresses {recorded:?}, prevResult has {expected_ips:?}"
                    ));
                }
                let expected = if tap {
                    crate::tap::interface_of(req, &cfg)
                } else {
                    PodInterface::Veth
                };
                if ep.interface != expected {
                    diffs.push(format!(
                        "node daemon records interface {:?}, expected {expected:?}",
                        ep.interface
                    ));
                }
                if !tap && ep.host_ifname != host_name {
                    diffs.push(format!(
                        "node daemon records host veth {}, expected {host_name}",
                        ep.host_ifname
                    ));
                }
                if let Some(link) = &pod_link
                    && ep.mtu != link.mtu
                {
                    diffs.push(format!(
                        "node daemon records MTU {}, the pod has {}",
                        ep.mtu, link.mtu
                    ));
                }
            }
            Err(e) if e.is_not_found() => {
                diffs.push("node daemon has no record of the endpoint".into())
            }
            Err(e @ DaemonError::Unreachable { .. }) => {
                debug!(error = %e, "node daemon unreachable; CHECK skips its record");
            }
            Err(e) => return Err(e.to_cni()),
        }

        // The IPAM plugin checks its own allocation.
        delegate::ipam_call(req, Command::Check)?;

        if diffs.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                CODE_CHECK_FAILED,
                format!("attachment {} differs from what was set up", key.handle()),
            )
            .with_details(diffs.join("; ")))
        }
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let cfg: BrindleConfig = req.conf.plugin_config().unwrap_or_default();
        let valid = req.conf.gc_valid_attachments().ok_or_else(|| {
            CniError::invalid_config(
                "GC needs cni.dev/valid-attachments (releasing everything is never implied)",
            )
        })?;
        let network = req.conf.name.clone();
        let valid_keys: Vec<EndpointKey> = valid
            .iter()
            .map(|a| EndpointKey {
                network: network.clone(),
                container_id: a.container_id.clone(),
                ifname: a.ifname.clone(),
            })
            .collect();
        let valid_handles: BTreeSet<String> = valid_keys.iter().map(EndpointKey::handle).collect();
        let mut errors = Vec::new();

        // Host ends carry their handle as alias, so GC needs no daemon to
        // find this network's leftovers.
        let prefix = format!("{network}/");
        match Netlink::open().and_then(|mut h| {
            let mut removed = 0;
            for link in h.links()? {
                let Some(alias) = &link.alias else { continue };
                if is_host_ifname(&link.name)
                    && alias.starts_with(&prefix)
                    && !valid_handles.contains(alias)
                {
                    h.delete_link(link.index)?;
                    removed += 1;
                }
            }
            Ok(removed)
        }) {
            Ok(n) => info!(network = %network, removed = n, "GC removed stale veths"),
            Err(e) => errors.push(CniError::io("GC of host veths", e)),
        }
        match daemon_of(&cfg).call::<GcReport>(&EndpointRequest::GcEndpoints {
            network: network.clone(),
            valid: valid_keys,
        }) {
            Ok(r) => info!(
                removed = r.removed.len(),
                "GC: node daemon released endpoints"
            ),
            Err(e @ DaemonError::Unreachable { .. }) => {
                debug!(error = %e, "node daemon unreachable on GC");
            }
            Err(e) => errors.push(e.to_cni()),
        }
        if req.conf.ipam.is_some()
            && let Err(e) = delegate::ipam_call(req, Command::Gc)
        {
            errors.push(e);
        }
        collect(errors)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let cfg: BrindleConfig = req.conf.plugin_config().unwrap_or_default();
        let not_available = |msg: String| CniError::new(ErrorCode::PLUGIN_NOT_AVAILABLE, msg);
        if cfg.require_daemon {
            match daemon_of(&cfg).call::<DaemonStatus>(&EndpointRequest::Status) {
                Ok(s) if s.ready => {
                    if s.protocol_version != PROTOCOL_VERSION {
                        warn!(
                            daemon = s.protocol_version,
                            ours = PROTOCOL_VERSION,
                            "protocol versions differ"
                        );
                    }
                }
                Ok(s) => {
                    return Err(not_available(format!(
                        "node daemon not ready: {}",
                        s.message
                    )));
                }
                Err(e) => return Err(not_available(e.to_string())),
            }
        }
        match delegate::ipam_call(req, Command::Status) {
            Ok(()) => Ok(()),
            Err(e)
                if e.code == ErrorCode::PLUGIN_NOT_AVAILABLE
                    || e.code == ErrorCode::PLUGIN_NOT_AVAILABLE_LIMITED =>
            {
                Err(e)
            }
            // An IPAM plugin older than 1.1.0 has no STATUS: it answers when
            // it runs and reports its versions.
            Err(e)
                if e.code == ErrorCode::INCOMPATIBLE_VERSION
                    || e.code == ErrorCode::INVALID_ENVIRONMENT =>
            {
                delegate::ipam_version(req)
                    .map(|_| ())
                    .map_err(|e| not_available(format!("IPAM plugin not answering: {e}")))
            }
            Err(e) => Err(not_available(format!("IPAM plugin not ready: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use brindle_api::cni::{CniEnv, NetConf};

    use super::*;

    fn request(version: &str) -> Request {
        let vars = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/p"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            (
                "CNI_ARGS",
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1",
            ),
        ];
        let env = CniEnv::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        let stdin = format!(
            r#"{{"cniVersion":"{version}","name":"net","type":"brindle","ipam":{{"type":"host-local"}},"dns":{{"nameservers":["10.96.0.10"]}}}}"#
        );
        let conf = NetConf::parse(stdin.as_bytes()).unwrap();
        Request {
            version: conf.version().unwrap(),
            env,
            conf,
            stdin: stdin.into_bytes(),
        }
    }

    fn built() -> Built {
        let link = |index, name: &str, mac: Vec<u8>| Link {
            index,
            name: name.into(),
            mtu: 1480,
            mac,
            up: true,
            kind: Some("veth".into()),
            alias: None,
        };
        Built {
            host: link(7, "bri0123456789a", HOST_MAC.to_vec()),
            pod: link(2, "eth0", vec![2, 0, 0, 0, 0, 1]),
            ips: vec![
                "10.1.0.5/32".parse().unwrap(),
                "fd00::5/128".parse().unwrap(),
            ],
            gateways: vec![GATEWAY_V4.into(), GATEWAY_V6.into()],
            mtu: 1480,
        }
    }

    #[test]
    fn the_result_names_both_ends_and_points_ips_at_the_pod_end() {
        let req = request("1.1.0");
        let r = result_of(&req, &built(), &CniResult::default());
        assert_eq!(r.interfaces[0].name, "bri0123456789a");
        assert_eq!(r.interfaces[0].mac, "ee:ee:ee:ee:ee:ee");
        assert!(r.interfaces[0].sandbox.is_empty());
        assert_eq!(r.interfaces[1].name, "eth0");
        assert_eq!(r.interfaces[1].mac, "02:00:00:00:00:01");
        assert_eq!(r.interfaces[1].sandbox, "/var/run/netns/p");
        assert!(r.ips.iter().all(|i| i.interface == Some(1)));
        assert_eq!(r.ips[0].gateway, Some(IpAddr::V4(GATEWAY_V4)));
        assert_eq!(r.ips[1].gateway, Some(IpAddr::V6(GATEWAY_V6)));
        let dsts: Vec<String> = r.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["0.0.0.0/0", "::/0"]);
        // No DNS from IPAM: the config's is passed on.
        assert_eq!(r.dns.nameservers, ["10.96.0.10"]);
    }

    #[test]
    fn the_ipv6_gateway_is_the_link_local_of_the_host_mac() {
        // EUI-64 of ee:ee:ee:ee:ee:ee: flip the U/L bit (0xee -> 0xec),
        // insert ff:fe in the middle.
        assert_eq!(GATEWAY_V6.to_string(), "fe80::ecee:eeff:feee:eeee");
    }

    #[test]
    fn collected_errors_keep_the_first_code_and_list_the_rest() {
        assert!(collect(Vec::new()).is_ok());
        let e = collect(vec![
            CniError::try_again_later("daemon").with_details("refused"),
            CniError::io("veth", "EBUSY"),
        ])
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::TRY_AGAIN_LATER);
        assert!(e.details.starts_with("refused; also: "), "{}", e.details);
        assert!(e.details.contains("EBUSY"));
    }

    #[test]
    fn the_daemon_hears_the_pod_identity_from_cni_args() {
        let p = pod_ref(&request("1.0.0"));
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
            ("ns", "web", "u1")
        );
        assert_eq!(key_of(&request("1.0.0")).handle(), "net/c1/eth0");
    }
}
