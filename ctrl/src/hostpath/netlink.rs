//! The real [`Kernel`]: rtnetlink for the link and the routes (on a
//! runtime of the host path's own thread), `/proc/sys` for the sysctls,
//! `nft -f -` for the table. Every call works in the network namespace of
//! the thread that made the kernel.

use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType,
};
use rtnetlink::{LinkUnspec, RouteMessageBuilder};

use super::{HostError, Kernel, KernelRoute, ROUTE_PROTOCOL};

/// How long one netlink request or `nft` run may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The node's kernel over rtnetlink, sysctl files and `nft`.
pub struct NetlinkKernel {
    rt: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
    /// The `nft` program (`nft` on `PATH` unless told otherwise).
    nft: String,
}

fn nl(e: impl std::fmt::Display) -> HostError {
    HostError::Netlink(e.to_string())
}

impl NetlinkKernel {
    /// Opens a netlink connection in the calling thread's network
    /// namespace, driven by a runtime of its own.
    pub fn open() -> Result<Self, HostError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(nl)?;
        let (conn, handle, _) = {
            let _guard = rt.enter();
            rtnetlink::new_connection().map_err(nl)?
        };
        rt.spawn(conn);
        Ok(NetlinkKernel {
            rt,
            handle,
            nft: "nft".into(),
        })
    }

    fn block_on<T>(&self, f: impl Future<Output = Result<T, HostError>>) -> Result<T, HostError> {
        self.rt.block_on(async {
            tokio::time::timeout(TIMEOUT, f)
                .await
                .map_err(|_| HostError::Netlink("no answer within 10 s".into()))?
        })
    }

    fn message(route: &KernelRoute) -> Result<RouteMessage, HostError> {
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.prefix.addr(), route.prefix.prefix_len())
            .map_err(nl)?
            .gateway(route.gateway())
            .map_err(nl)?
            .output_interface(route.ifindex)
            .protocol(RouteProtocol::from(ROUTE_PROTOCOL))
            .table_id(u32::from(RouteHeader::RT_TABLE_MAIN))
            .kind(RouteType::Unicast);
        if route.prefix.addr().is_ipv4() {
            b = b.onlink();
        }
        Ok(b.build())
    }
}

/// Our route in a dumped message, if it is one (our protocol, the main
/// table, unicast, with a destination and an output interface).
fn ours(m: &RouteMessage) -> Option<KernelRoute> {
    if u8::from(m.header.protocol) != ROUTE_PROTOCOL || m.header.kind != RouteType::Unicast {
        return None;
    }
    let table = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    let len = m.header.destination_prefix_length;
    let addr = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
            RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
            _ => None,
        })
        .or(match m.header.address_family {
            AddressFamily::Inet if len == 0 => Some(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            AddressFamily::Inet6 if len == 0 => Some(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
            _ => None,
        })?;
    let ifindex = m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })?;
    Some(KernelRoute {
        prefix: ipnet::IpNet::new(addr, len).ok()?,
        ifindex,
    })
}

impl Kernel for NetlinkKernel {
    fn ifindex(&mut self, name: &str) -> Option<u32> {
        nix::net::if_::if_nametoindex(name).ok()
    }

    fn set_link(&mut self, ifindex: u32, mtu: u32) -> Result<(), HostError> {
        let handle = self.handle.clone();
        self.block_on(async move {
            handle
                .link()
                .set(LinkUnspec::new_with_index(ifindex).up().mtu(mtu).build())
                .execute()
                .await
                .map_err(nl)
        })
    }

    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), HostError> {
        let path = format!("/proc/sys/{key}");
        std::fs::write(&path, value).map_err(|e| HostError::Sysctl {
            key: key.into(),
            message: e.to_string(),
        })
    }

    fn our_routes(&mut self) -> Result<Vec<KernelRoute>, HostError> {
        let handle = self.handle.clone();
        self.block_on(async move {
            let mut out = Vec::new();
            for family in [AddressFamily::Inet, AddressFamily::Inet6] {
                let mut req = RouteMessageBuilder::<IpAddr>::new().build();
                req.header.address_family = family;
                let mut dump = handle.route().get(req).execute();
                while let Some(m) = dump.next().await {
                    if let Some(r) = ours(&m.map_err(nl)?) {
                        out.push(r);
                    }
                }
            }
            Ok(out)
        })
    }

    fn add_route(&mut self, route: &KernelRoute) -> Result<(), HostError> {
        let msg = Self::message(route)?;
        let handle = self.handle.clone();
        let what = *route;
        self.block_on(async move {
            handle
                .route()
                .add(msg)
                .replace()
                .execute()
                .await
                .map_err(|e| HostError::Netlink(format!("adding {}: {e}", what.prefix)))
        })
    }

    fn del_route(&mut self, route: &KernelRoute) -> Result<(), HostError> {
        let msg = Self::message(route)?;
        let handle = self.handle.clone();
        let what = *route;
        self.block_on(async move {
            match handle.route().del(msg).execute().await {
                Ok(()) => Ok(()),
                // Gone already (its interface went): what we wanted.
                Err(rtnetlink::Error::NetlinkError(e))
                    if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENODEV =>
                {
                    Ok(())
                }
                Err(e) => Err(HostError::Netlink(format!("deleting {}: {e}", what.prefix))),
            }
        })
    }

    fn nft(&mut self, ruleset: &str) -> Result<(), HostError> {
        let mut child = Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| HostError::Nft(format!("running {}: {e}", self.nft)))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(ruleset.as_bytes())
                .map_err(|e| HostError::Nft(e.to_string()))?;
        }
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| HostError::Nft(e.to_string()))?
            {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return if status.success() {
                    Ok(())
                } else {
                    Err(HostError::Nft(format!("{status}: {}", err.trim())))
                };
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HostError::Nft("no exit within 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
