//! A served node's uplink to one peer that is Calico's kernel VXLAN path
//! (VNI 4096, port 4789, the VTEP MACs Brindle derives from the node
//! addresses) with a "remote pod" address, and the vrouter's metrics text:
//! for the root tests of flows that cross workers (several uplink queues).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result};
use brindle_api::framing::Client;
use brindle_api::vrouter::{
    Changed, Encap, Neighbor, NodeConfig, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
    VxlanConfig,
};
use brindle_testkit::netns::{Netns, in_netns, unique};

/// The node's underlay address (on `uplink`).
pub const NODE: &str = "192.168.78.1";
/// The peer's underlay address.
pub const PEER: &str = "192.168.78.2";
/// The node's pod block, routed by the peer into its VXLAN device.
pub const BLOCK: &str = "10.66.6.0/24";
/// The peer's pod block, and the "remote pod" address in it.
pub const REMOTE_BLOCK: &str = "10.66.9.0/24";
pub const REMOTE_POD: &str = "10.66.9.1";

/// The peer and the veth between it and the node.
pub struct VxlanPeer {
    pub peer: Netns,
    /// The node's end (the vrouter's uplink), `NODE/24`.
    pub uplink: String,
    /// The peer's end, `PEER/24`.
    pub peer_if: String,
}

/// Makes the peer, the veth (two queues on both ends: queue `q` on worker
/// `q`), and the peer's kernel VXLAN to the node's block.
pub fn vxlan_peer(node: &Netns) -> Result<VxlanPeer> {
    let peer = Netns::new("tk")?;
    let (u1, u2) = (unique("u"), unique("u"));
    node.ip(&[
        "link",
        "add",
        &u1,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        &u2,
        "netns",
        &peer.name,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
    ])?;
    node.ip(&["addr", "add", &format!("{NODE}/24"), "dev", &u1])?;
    peer.ip(&["addr", "add", &format!("{PEER}/24"), "dev", &u2])?;
    node.ip(&["link", "set", &u1, "up"])?;
    peer.ip(&["link", "set", &u2, "up"])?;
    peer.ip(&[
        "link",
        "add",
        "vxc",
        "address",
        "02:b1:c0:a8:4e:02",
        "type",
        "vxlan",
        "id",
        "4096",
        "dstport",
        "4789",
        "local",
        PEER,
        "dev",
        &u2,
        "nolearning",
    ])?;
    peer.ip(&["addr", "add", &format!("{REMOTE_POD}/32"), "dev", "vxc"])?;
    peer.ip(&["link", "set", "vxc", "up"])?;
    peer.exec(&["ethtool", "-K", "vxc", "tx", "off"])?;
    peer.ip(&[
        "neigh",
        "add",
        "10.66.6.0",
        "lladdr",
        "02:b1:c0:a8:4e:01",
        "dev",
        "vxc",
    ])?;
    peer.exec(&[
        "bridge",
        "fdb",
        "add",
        "02:b1:c0:a8:4e:01",
        "dev",
        "vxc",
        "dst",
        NODE,
    ])?;
    peer.ip(&[
        "route",
        "add",
        BLOCK,
        "via",
        "10.66.6.0",
        "dev",
        "vxc",
        "onlink",
        "src",
        REMOTE_POD,
    ])?;
    Ok(VxlanPeer {
        peer,
        uplink: u1,
        peer_if: u2,
    })
}

impl VxlanPeer {
    /// Programs the vrouter of `node` (at `c`) as ctrl does for this
    /// underlay: the node (tunnels from the peer only), the uplink port,
    /// the peer's block over VXLAN, and the peer's MAC as the kernel
    /// resolved it.
    pub fn serve(&self, node: &Netns, c: &mut Client) -> Result<()> {
        let _: Changed = c.call(&VrouterRequest::SetNode {
            node: NodeConfig {
                address_v4: Some(NODE.parse()?),
                address_v6: None,
                underlay_subnet: Some("192.168.78.0/24".parse()?),
                underlay_gateway: None,
                vxlan: VxlanConfig::default(),
                tunnel_peers: vec![PEER.parse()?],
            },
        })?;
        let uplink = PortSpec {
            name: self.uplink.clone(),
            kind: PortKind::Uplink,
            addresses: vec![],
            peer_mac: None,
            endpoint: None,
            device: Default::default(),
            workload: None,
        };
        let _: Changed = c.call(&VrouterRequest::AddPorts {
            ports: vec![uplink],
        })?;
        let _: Changed = c.call(&VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: REMOTE_BLOCK.parse()?,
                target: RouteTarget::Encap {
                    encap: Encap::Vxlan,
                    remote: PEER.parse()?,
                },
            }],
        })?;
        let _ = node.exec(&["ping", "-c", "1", "-W", "1", PEER]);
        let out = self.peer.ip(&["link", "show", &self.peer_if])?;
        let mac = out
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .context("peer MAC")?
            .to_owned();
        let _: Changed = c.call(&VrouterRequest::SetNeighbors {
            neighbors: vec![Neighbor {
                port: self.uplink.clone(),
                ip: PEER.parse()?,
                mac: mac.parse().map_err(anyhow::Error::msg)?,
            }],
        })?;
        Ok(())
    }
}

/// The vrouter's metrics text from `addr`, read in `node`.
pub fn metrics(node: &Netns, addr: &'static str) -> Result<String> {
    in_netns(node, move || -> Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("metrics thread panicked"))?
}

/// The sum of a metric series (`series` with its `{`) over the lines
/// that contain `with`.
pub fn metric_sum(metrics: &str, series: &str, with: &str) -> u64 {
    let prefix = format!("brindle_vrouter_{series}");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
