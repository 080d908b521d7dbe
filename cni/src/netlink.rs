//! A small blocking rtnetlink client: netlink-packet-route messages over a
//! `netlink_sys::Socket`.
//!
//! Why blocking and not rtnetlink's async `Handle`: the plugin is a
//! short-lived process that does a dozen requests in sequence; a tokio
//! runtime would cost more than the work. The socket stays bound to the netns
//! it was opened in (see [`crate::netns`]), so the same client type works on
//! the host and inside a pod.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;

use ipnet::IpNet;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::tc::{TcAttribute, TcHandle, TcMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};

/// Receive buffer: large enough for one dump datagram of the kernel.
const RECV_BUFFER_BYTES: usize = 64 * 1024;

/// A netlink failure.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket failed.
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
    /// The kernel refused the request.
    #[error("{op}: {}", io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// What we asked for.
        op: &'static str,
        /// The positive errno.
        errno: i32,
    },
    /// The kernel's answer did not decode.
    #[error("{op}: cannot decode the kernel's answer: {detail}")]
    Decode {
        /// What we asked for.
        op: &'static str,
        /// The decoder's complaint.
        detail: String,
    },
}

impl NetlinkError {
    /// Whether the thing asked about does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetlinkError::Kernel { errno, .. }
            if *errno == libc::ENODEV || *errno == libc::ENOENT || *errno == libc::ESRCH)
    }

    /// Whether the thing to create already exists.
    pub fn is_exists(&self) -> bool {
        matches!(self, NetlinkError::Kernel { errno, .. } if *errno == libc::EEXIST)
    }
}

/// What the plugin needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// ifindex.
    pub index: u32,
    /// Name.
    pub name: String,
    /// MTU.
    pub mtu: u32,
    /// MAC address (empty when the link has none).
    pub mac: Vec<u8>,
    /// Administratively up.
    pub up: bool,
    /// Kind from IFLA_INFO_KIND (`veth`, ...), when the kernel says.
    pub kind: Option<String>,
    /// IFLA_IFALIAS, when set.
    pub alias: Option<String>,
}

/// What the plugin needs to know about a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// Destination prefix.
    pub dst: IpNet,
    /// Gateway, if any.
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: Option<u32>,
    /// Scope (RT_SCOPE_*).
    pub scope: u8,
    /// Table.
    pub table: u32,
}

/// A blocking rtnetlink connection.
pub struct Netlink {
    socket: Socket,
    seq: u32,
    rx: Vec<u8>,
    tx: Vec<u8>,
}

impl Netlink {
    /// Opens a socket in the calling thread's netns.
    pub fn open() -> Result<Netlink, NetlinkError> {
        Self::from_socket(Socket::new(NETLINK_ROUTE)?)
    }

    /// Wraps a socket (possibly opened in another netns).
    pub fn from_socket(mut socket: Socket) -> Result<Netlink, NetlinkError> {
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Best effort: the kernel then reports which attribute it refused.
        let _ = socket.set_ext_ack(true);
        Ok(Netlink {
            socket,
            seq: 0,
            rx: Vec::with_capacity(RECV_BUFFER_BYTES),
            tx: Vec::with_capacity(4096),
        })
    }

    /// Sends one request and collects the kernel's answers until the ACK
    /// (or DONE for dumps).
    fn request(
        &mut self,
        op: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        self.tx.clear();
        self.tx.resize(packet.buffer_len(), 0);
        packet.serialize(&mut self.tx);
        self.socket.send(&self.tx, 0)?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut answers = Vec::new();
        loop {
            self.rx.clear();
            let n = self.socket.recv(&mut self.rx, 0)?;
            let mut offset = 0;
            while offset < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.rx[offset..n])
                    .map_err(|e| NetlinkError::Decode {
                        op,
                        detail: e.to_string(),
                    })?;
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None if !dump => Ok(answers),
                            None => continue,
                            Some(code) => Err(NetlinkError::Kernel {
                                op,
                                errno: -code.get(),
                            }),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::InnerMessage(m) => answers.push(m),
                    _ => {}
                }
            }
        }
    }

    // ===== links =====

    /// The link named `name`, or `None`.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.one_link("get link by name", msg)
    }

    /// The link with index `index`, or `None`.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.one_link("get link by index", msg)
    }

    fn one_link(
        &mut self,
        op: &'static str,
        msg: LinkMessage,
    ) -> Result<Option<Link>, NetlinkError> {
        match self.request(op, RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(answers) => Ok(answers.into_iter().find_map(link_from)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every link.
    pub fn links(&mut self) -> Result<Vec<Link>, NetlinkError> {
        let answers = self.request(
            "dump links",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers.into_iter().filter_map(link_from).collect())
    }

    /// Creates a veth pair: `name` here with `mac`, its peer `peer_name` in
    /// the netns `peer_netns` (an open netns file), both with `mtu`. The
    /// kernel creates the peer directly in the target netns under its final
    /// name, so there is no window where the pod end sits in the host under a
    /// temporary name, and a name already taken in the pod fails with EEXIST.
    pub fn add_veth(
        &mut self,
        name: &str,
        mac: [u8; 6],
        mtu: u32,
        peer_name: &str,
        peer_netns: RawFd,
    ) -> Result<(), NetlinkError> {
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_string()));
        peer.attributes.push(LinkAttribute::Mtu(mtu));
        peer.attributes.push(LinkAttribute::NetNsFd(peer_netns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        self.request(
            "create veth",
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Sets link `index` administratively up.
    pub fn set_up(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request("set link up", RouteNetlinkMessage::SetLink(msg), 0)?;
        Ok(())
    }

    /// Makes `noqueue` link `index`'s root qdisc, while the link is down:
    /// bringing it up then attaches no default qdisc. A multi-queue TAP
    /// has 256 transmit queues, and its default `mq` makes a `pfifo_fast`
    /// with three rings of `txqueuelen` for each of them under the RTNL
    /// lock: about a third of the machine's CPU in 110 parallel TAP ADDs
    /// went there and into other ADDs spinning on that lock. The TAP never asks its qdisc to
    /// queue (a full queue drops in the driver), so `noqueue` loses
    /// nothing, as on a veth.
    pub fn set_noqueue(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = TcMessage::default();
        msg.header.index = i32::try_from(index).unwrap_or(i32::MAX);
        msg.header.parent = TcHandle::ROOT;
        msg.attributes.push(TcAttribute::Kind("noqueue".into()));
        self.request(
            "set the noqueue qdisc",
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Sets link `index`'s MAC address (IFLA_ADDRESS).
    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.request("set link address", RouteNetlinkMessage::SetLink(msg), 0)?;
        Ok(())
    }

    /// Sets link `index`'s alias (IFLA_IFALIAS).
    pub fn set_alias(&mut self, index: u32, alias: &str) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        self.request("set link alias", RouteNetlinkMessage::SetLink(msg), 0)?;
        Ok(())
    }

    /// Deletes link `index` (a veth takes its peer with it). A link that is
    /// already gone is success.
    pub fn delete_link(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request("delete link", RouteNetlinkMessage::DelLink(msg), 0) {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes the link named `name`; returns whether it existed.
    pub fn delete_link_by_name(&mut self, name: &str) -> Result<bool, NetlinkError> {
        match self.link_by_name(name)? {
            Some(link) => self.delete_link(link.index).map(|()| true),
            None => Ok(false),
        }
    }

    // ===== addresses =====

    /// Adds `addr` to link `index`; IPv6 addresses skip duplicate address
    /// detection (a /128 on a point-to-point veth cannot collide, and DAD
    /// would leave it tentative for a second).
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> Result<(), NetlinkError> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix_len();
        msg.header.scope = AddressScope::Universe;
        match addr.addr() {
            IpAddr::V4(_) => msg.header.family = AddressFamily::Inet,
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                msg.header.flags = AddressHeaderFlags::Nodad;
                msg.attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
        }
        msg.attributes.push(AddressAttribute::Local(addr.addr()));
        msg.attributes.push(AddressAttribute::Address(addr.addr()));
        self.request(
            "add address",
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// The addresses on link `index` (both families, link-local included).
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpNet>, NetlinkError> {
        let answers = self.request(
            "dump addresses",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in answers {
            if let RouteNetlinkMessage::NewAddress(a) = m {
                if a.header.index != index {
                    continue;
                }
                let ip = a.attributes.iter().find_map(|at| match at {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                });
                if let Some(ip) = ip
                    && let Ok(net) = IpNet::new(ip, a.header.prefix_len)
                {
                    out.push(net);
                }
            }
        }
        Ok(out)
    }

    // ===== routes =====

    /// Adds a route in the main table: to `dst` out of `oif`, via `gw` when
    /// given, with `scope`.
    pub fn add_route(
        &mut self,
        dst: IpNet,
        gw: Option<IpAddr>,
        oif: u32,
        scope: RouteScope,
    ) -> Result<(), NetlinkError> {
        self.route(dst, gw, oif, scope, NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Adds or replaces the route to `dst` in the main table (as `ip route
    /// replace`).
    pub fn replace_route(
        &mut self,
        dst: IpNet,
        gw: Option<IpAddr>,
        oif: u32,
        scope: RouteScope,
    ) -> Result<(), NetlinkError> {
        self.route(dst, gw, oif, scope, NLM_F_CREATE | NLM_F_REPLACE)
    }

    fn route(
        &mut self,
        dst: IpNet,
        gw: Option<IpAddr>,
        oif: u32,
        scope: RouteScope,
        flags: u16,
    ) -> Result<(), NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = match dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        msg.header.destination_prefix_length = dst.prefix_len();
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = scope;
        msg.header.kind = RouteType::Unicast;
        if dst.prefix_len() > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(dst.addr())));
        }
        if let Some(gw) = gw {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.request("add route", RouteNetlinkMessage::NewRoute(msg), flags)?;
        Ok(())
    }

    // ===== neighbours =====

    /// Adds or replaces a permanent neighbour entry: `ip` is at `mac` on
    /// `ifindex` (as `ip neigh replace IP lladdr MAC dev IF nud permanent`).
    pub fn replace_permanent_neighbour(
        &mut self,
        ifindex: u32,
        ip: IpAddr,
        mac: &[u8],
    ) -> Result<(), NetlinkError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.ifindex = ifindex;
        msg.header.state = NeighbourState::Permanent;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::from(ip)));
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.request(
            "add neighbour",
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Every route of `family` in every table.
    pub fn routes(&mut self, v6: bool) -> Result<Vec<RouteEntry>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let answers = self.request(
            "dump routes",
            RouteNetlinkMessage::GetRoute(msg),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => route_from(&r),
                _ => None,
            })
            .collect())
    }

    /// The ifindex of the IPv4 default route in the main table, if any.
    pub fn default_route_oif(&mut self) -> Result<Option<u32>, NetlinkError> {
        Ok(self
            .routes(false)?
            .into_iter()
            .find(|r| r.dst.prefix_len() == 0 && r.table == u32::from(RouteHeader::RT_TABLE_MAIN))
            .and_then(|r| r.oif))
    }
}

fn link_from(m: RouteNetlinkMessage) -> Option<Link> {
    let RouteNetlinkMessage::NewLink(l) = m else {
        return None;
    };
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mtu: 0,
        mac: Vec::new(),
        up: l.header.flags.contains(LinkFlags::Up),
        kind: None,
        alias: None,
    };
    for a in l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Mtu(m) => link.mtu = m,
            LinkAttribute::Address(mac) => link.mac = mac,
            LinkAttribute::IfAlias(a) => link.alias = Some(a),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        link.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    Some(link)
}

fn route_from(r: &RouteMessage) -> Option<RouteEntry> {
    let v6 = r.header.address_family == AddressFamily::Inet6;
    let mut dst: IpAddr = if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let mut gw = None;
    let mut oif = None;
    let mut table = u32::from(r.header.table);
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(addr) => dst = route_ip(addr)?,
            RouteAttribute::Gateway(addr) => gw = route_ip(addr),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    Some(RouteEntry {
        dst: IpNet::new(dst, r.header.destination_prefix_length).ok()?,
        gw,
        oif,
        scope: u8::from(r.header.scope),
        table,
    })
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
