//! TAP pod ports through `brindle-vrouter serve`: two pods whose `eth0` is a
//! persistent multi-queue TAP with the virtio-net header and offloads on
//! (made as the CNI plugin makes it), attached by namespace and name; a
//! ping, a TCP transfer whose bytes are checked (the pods' kernels send
//! TSO super-packets and partial checksums: the port cuts and completes
//! them), and a restart of the vrouter with the pods keeping their TAP and
//! address.
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::vrouter::{
    Changed, Hello, PortKind, PortSpec, PortStatus, Route, RouteTarget, VrouterRequest,
};
use brindle_xsk::{Tap, TapConfig};
use common::{Netns, Vrouter, in_netns, serve, tap_port, unique};

/// A TAP pod: `eth0` a persistent TAP made in the pod's namespace (no queue
/// of ours left open), its /32, the routes via 169.254.1.1.
fn tap_pod(addr: &str, mac: &str) -> Result<Netns> {
    let ns = Netns::new("tp")?;
    let file = std::fs::File::open(ns.path())?;
    let mac: brindle_api::vrouter::Mac = mac.parse().map_err(anyhow::Error::msg)?;
    let tap = Tap::create(
        Some(file.as_fd()),
        &TapConfig::pod("eth0").mtu(1500).mac(mac.0),
    )?;
    drop(tap);
    ns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&[
        "route",
        "add",
        "169.254.1.1",
        "dev",
        "eth0",
        "scope",
        "link",
    ])?;
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
        "onlink",
    ])?;
    Ok(ns)
}

fn local(prefix: &str, port: &str) -> Route {
    Route {
        prefix: prefix.parse().unwrap(),
        target: RouteTarget::Local {
            port: port.to_owned(),
        },
    }
}

/// Sends `len` pseudo-random bytes from `client` to a listener on `addr`
/// in `server`, which sends back their count and a checksum; both must
/// match what was sent.
fn transfer(server: &Netns, client: &Netns, addr: &str, len: usize) -> Result<()> {
    let data: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let sum = |b: &[u8]| {
        b.iter()
            .fold(0u64, |a, &x| a.wrapping_mul(31).wrapping_add(u64::from(x)))
    };
    let want = (len as u64, sum(&data));
    let (tx, rx) = mpsc::channel();
    let bind = if addr.contains(':') {
        format!("[{addr}]:0")
    } else {
        format!("{addr}:0")
    };
    let srv = in_netns(server, move || {
        let l = TcpListener::bind(&bind)?;
        tx.send(l.local_addr()?)?;
        let (mut s, _) = l.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        Ok((got.len() as u64, sum(&got)))
    });
    let to = rx
        .recv_timeout(Duration::from_secs(5))
        .context("listener did not start")?;
    let cli = in_netns(client, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(&data)?;
        s.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    });
    let sent = cli.join().map_err(|_| anyhow::anyhow!("client panicked"))?;
    if sent.is_err() {
        let _ = TcpStream::connect_timeout(&to, Duration::from_millis(100));
    }
    sent?;
    let got = srv
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    anyhow::ensure!(got == want, "received (len, sum) {got:?}, sent {want:?}");
    Ok(())
}

/// The metrics endpoint in the node's namespace.
const METRICS: &str = "127.0.0.1:9092";

/// The vrouter's metrics text, read in `node`.
fn metrics(node: &Netns) -> Result<String> {
    in_netns(node, || -> Result<String> {
        let mut s = TcpStream::connect(METRICS)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("metrics thread panicked"))?
}

/// The sum over workers of the series `brindle_vrouter_<series>` lines
/// that contain `with`.
fn sum(metrics: &str, series: &str, with: &str) -> u64 {
    let prefix = format!("brindle_vrouter_{series}");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn program(c: &mut Client, ports: &[PortSpec], routes: &[Route]) -> Result<()> {
    let hello: Hello = c.call(&VrouterRequest::Hello {
        version: PROTOCOL_VERSION,
    })?;
    assert_eq!(hello.version, PROTOCOL_VERSION);
    let n: Changed = c.call(&VrouterRequest::AddPorts {
        ports: ports.to_vec(),
    })?;
    assert_eq!(n.changed, ports.len() as u64);
    let n: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: routes.to_vec(),
    })?;
    assert_eq!(n.changed, routes.len() as u64);
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn tap_pods_ping_transfer_and_survive_a_vrouter_restart() -> Result<()> {
    let node = Netns::new("tn")?;
    let pod_a = tap_pod("10.66.1.2", "02:b4:00:00:00:02")?;
    let pod_b = tap_pod("10.66.1.3", "02:b4:00:00:00:03")?;
    let (pa, pb) = (unique("ta"), unique("tb"));
    let ports = vec![
        tap_port(&pa, &pod_a, "10.66.1.2"),
        tap_port(&pb, &pod_b, "10.66.1.3"),
    ];
    let routes = vec![local("10.66.1.2/32", &pa), local("10.66.1.3/32", &pb)];
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let args = [
        "serve",
        "--socket",
        socket.to_str().context("path")?,
        "--metrics",
        METRICS,
    ];

    let vrouter = Vrouter::start(&node, &args)?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    program(&mut c, &ports, &routes)?;
    let status: Vec<PortStatus> = c.call(&VrouterRequest::DumpPorts)?;
    assert_eq!(status.len(), 2);
    assert!(status.iter().all(|p| p.backend == "tap"), "{status:?}");

    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.3"])?;
    assert!(out.contains("3 received"), "{out}");
    // 4 MiB each way: the senders' kernels hand over TSO super-packets.
    transfer(&pod_b, &pod_a, "10.66.1.3", 4 << 20)?;
    transfer(&pod_a, &pod_b, "10.66.1.2", 4 << 20)?;
    // The senders' TSO super-packets went through whole (one read, one
    // write each): none cut in the pipeline.
    let m = metrics(&node)?;
    assert_eq!(
        sum(&m, "worker_drops_total{", "reason=\"parse_error\""),
        0,
        "{m}"
    );
    assert!(sum(&m, "worker_super_whole_total{", "") > 0, "{m}");
    assert_eq!(sum(&m, "worker_super_cut_total{", ""), 0, "{m}");
    // The TAP ports' own counters: read whole, written whole.
    let with = format!("port=\"{pb}\"");
    assert!(sum(&m, "port_tap_rx_whole_total{", &with) > 0, "{m}");
    assert!(sum(&m, "port_tap_tx_super_total{", &with) > 0, "{m}");
    drop(c);
    vrouter.stop()?;

    // The pods keep their TAP and address while no vrouter runs.
    for pod in [&pod_a, &pod_b] {
        let link = pod.ip(&["-d", "link", "show", "eth0"])?;
        assert!(link.contains("tun type tap"), "{link}");
        assert!(link.contains("persist"), "{link}");
    }
    assert!(
        pod_a
            .ip(&["addr", "show", "eth0"])?
            .contains("10.66.1.2/32")
    );

    // A new vrouter re-attaches by namespace and name.
    let vrouter = Vrouter::start(&node, &args)?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    program(&mut c, &ports, &routes)?;
    let out = pod_b.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.2"])?;
    assert!(out.contains("3 received"), "{out}");
    transfer(&pod_a, &pod_b, "10.66.1.2", 1 << 20)?;
    // Pod B's MAC changes (issue 14, item 7): once B speaks from the new
    // one, both directions reach it, whichever worker reads or writes its
    // queues (a TAP pod has one on every worker).
    pod_b.ip(&["link", "set", "eth0", "address", "02:b4:00:00:00:33"])?;
    let _ = pod_b.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "1", "10.66.1.2"]);
    let out = pod_b.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.2"])?;
    assert!(out.contains("3 received"), "B -> A, B's MAC changed: {out}");
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.1.3"])?;
    assert!(out.contains("3 received"), "A -> B, B's MAC changed: {out}");
    transfer(&pod_a, &pod_b, "10.66.1.2", 1 << 20)?;
    transfer(&pod_b, &pod_a, "10.66.1.3", 1 << 20)?;
    drop(c);
    vrouter.stop()?;
    Ok(())
}

/// Gives a TAP pod an IPv6 /128 and the default route via the vrouter's
/// link-local gateway (proxy NDP answers it), without DAD.
fn add_v6(pod: &Netns, addr: &str) -> Result<()> {
    pod.exec(&["sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"])?;
    pod.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{addr}/128"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    pod.ip(&[
        "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
    ])?;
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn tap_pods_carry_tcp_v6_super_packets_whole() -> Result<()> {
    let node = Netns::new("tn")?;
    let pod_a = tap_pod("10.66.2.2", "02:b4:00:00:01:02")?;
    let pod_b = tap_pod("10.66.2.3", "02:b4:00:00:01:03")?;
    add_v6(&pod_a, "fd00:66::2")?;
    add_v6(&pod_b, "fd00:66::3")?;
    let (pa, pb) = (unique("ta"), unique("tb"));
    let mut ports = vec![
        tap_port(&pa, &pod_a, "10.66.2.2"),
        tap_port(&pb, &pod_b, "10.66.2.3"),
    ];
    ports[0].addresses.push("fd00:66::2".parse().unwrap());
    ports[1].addresses.push("fd00:66::3".parse().unwrap());
    let routes = vec![local("fd00:66::2/128", &pa), local("fd00:66::3/128", &pb)];
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let args = [
        "serve",
        "--socket",
        socket.to_str().context("path")?,
        "--metrics",
        METRICS,
    ];
    let vrouter = Vrouter::start(&node, &args)?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    program(&mut c, &ports, &routes)?;
    transfer(&pod_b, &pod_a, "fd00:66::3", 4 << 20)?;
    transfer(&pod_a, &pod_b, "fd00:66::2", 4 << 20)?;
    let m = metrics(&node)?;
    assert_eq!(
        sum(&m, "worker_drops_total{", "reason=\"parse_error\""),
        0,
        "{m}"
    );
    assert!(sum(&m, "worker_super_whole_total{", "") > 0, "{m}");
    assert_eq!(sum(&m, "worker_super_cut_total{", ""), 0, "{m}");
    drop(c);
    vrouter.stop()?;
    Ok(())
}

/// A veth pod (its frames reach the vrouter MTU-sized: no GSO towards an
/// XDP program) and a TAP pod: towards the TAP pod the frames of one batch
/// are coalesced by userspace GRO (what the uplink's frames get too: the
/// same TAP transmit); from it, its super-packets are cut for the veth pod.
#[test]
#[ignore = "requires root and network namespaces"]
fn gro_into_a_tap_pod_and_super_packets_cut_for_a_veth_pod() -> Result<()> {
    let node = Netns::new("tn")?;
    let veth = unique("hv");
    let mac_a = "02:b4:00:00:02:02";
    let pod_a = common::pod(&node, &veth, "10.66.3.2", mac_a)?;
    let pod_b = tap_pod("10.66.3.3", "02:b4:00:00:02:03")?;
    let pb = unique("tb");
    let ports = vec![
        PortSpec {
            name: veth.clone(),
            kind: PortKind::Pod,
            addresses: vec!["10.66.3.2".parse().unwrap()],
            peer_mac: Some(mac_a.parse().unwrap()),
            endpoint: None,
            device: Default::default(),
            workload: None,
        },
        tap_port(&pb, &pod_b, "10.66.3.3"),
    ];
    let routes = vec![local("10.66.3.2/32", &veth), local("10.66.3.3/32", &pb)];
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("vrouter.sock");
    let args = [
        "serve",
        "--socket",
        socket.to_str().context("path")?,
        "--metrics",
        METRICS,
    ];
    let vrouter = Vrouter::start(&node, &args)?;
    let mut c = Client::connect(&socket, Duration::from_secs(10))?;
    program(&mut c, &ports, &routes)?;
    transfer(&pod_b, &pod_a, "10.66.3.3", 4 << 20)?;
    transfer(&pod_a, &pod_b, "10.66.3.2", 4 << 20)?;
    let m = metrics(&node)?;
    assert_eq!(
        sum(&m, "worker_drops_total{", "reason=\"parse_error\""),
        0,
        "{m}"
    );
    let (gro, merged) = (
        sum(&m, "worker_gro_super_total{", ""),
        sum(&m, "worker_gro_segments_total{", ""),
    );
    assert!(gro > 0 && merged >= 2 * gro, "gro {gro} {merged}\n{m}");
    let with = format!("port=\"{pb}\"");
    assert_eq!(sum(&m, "port_tap_tx_gro_super_total{", &with), gro, "{m}");
    assert!(sum(&m, "worker_super_cut_total{", "") > 0, "{m}");
    assert_eq!(
        sum(&m, "worker_drops_total{", "reason=\"tx_ring_full\""),
        0,
        "{m}"
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}

/// A TAP pod on a served node and a "remote pod" address behind the
/// kernel's VXLAN on another node (Calico's kernel path as the peer), joined
/// by an underlay veth: from the peer, segments arrive MTU-sized on the
/// uplink (no GSO towards an XDP program), are decapsulated and coalesced
/// by GRO into the TAP pod; from the pod, its super-packets are cut and
/// encapsulated to the uplink in batches.
#[test]
#[ignore = "requires root and network namespaces"]
fn uplink_to_a_tap_pod_is_coalesced_and_its_super_packets_are_cut_and_encapsulated() -> Result<()> {
    use brindle_api::vrouter::{Encap, Neighbor, NodeConfig, VxlanConfig};
    // (the kernel here has no IPIP module: VXLAN it is)
    let (node, peer) = (Netns::new("tn")?, Netns::new("tk")?);
    let (u1, u2) = (unique("u"), unique("u"));
    node.ip(&[
        "link", "add", &u1, "type", "veth", "peer", "name", &u2, "netns", &peer.name,
    ])?;
    node.ip(&["addr", "add", "192.168.79.1/24", "dev", &u1])?;
    peer.ip(&["addr", "add", "192.168.79.2/24", "dev", &u2])?;
    node.ip(&["link", "set", &u1, "up"])?;
    peer.ip(&["link", "set", &u2, "up"])?;
    // The peer: the kernel's VXLAN (Calico's vxlan.calico: VNI 4096, port
    // 4789) with the VTEP MACs Brindle derives from the node addresses, the
    // remote pod's address on it.
    peer.ip(&[
        "link",
        "add",
        "vxc",
        "address",
        "02:b1:c0:a8:4f:02",
        "type",
        "vxlan",
        "id",
        "4096",
        "dstport",
        "4789",
        "local",
        "192.168.79.2",
        "dev",
        &u2,
        "nolearning",
    ])?;
    peer.ip(&["addr", "add", "10.66.9.1/32", "dev", "vxc"])?;
    peer.ip(&["link", "set", "vxc", "up"])?;
    // Checksums complete on the wire, as a NIC leaves them: a veth would
    // carry the kernel's partial inner checksums to the uplink instead.
    peer.exec(&["ethtool", "-K", "vxc", "tx", "off"])?;
    peer.ip(&[
        "neigh",
        "add",
        "10.66.5.0",
        "lladdr",
        "02:b1:c0:a8:4f:01",
        "dev",
        "vxc",
    ])?;
    peer.exec(&[
        "bridge",
        "fdb",
        "add",
        "02:b1:c0:a8:4f:01",
        "dev",
        "vxc",
        "dst",
        "192.168.79.1",
    ])?;
    peer.ip(&[
        "route",
        "add",
        "10.66.5.0/24",
        "via",
        "10.66.5.0",
        "dev",
        "vxc",
        "onlink",
        "src",
        "10.66.9.1",
    ])?;
    // Calico's VXLAN pod MTU: 1500 less the outer headers.
    let pod = tap_pod("10.66.5.2", "02:b4:00:00:03:02")?;
    pod.ip(&["link", "set", "eth0", "mtu", "1450"])?;
    let pp = unique("tp");

    let (_dir, vrouter, mut c) = serve(&node, &["--metrics", METRICS])?;
    let _: Changed = c.call(&VrouterRequest::SetNode {
        node: NodeConfig {
            address_v4: Some("192.168.79.1".parse()?),
            address_v6: None,
            underlay_subnet: Some("192.168.79.0/24".parse()?),
            underlay_gateway: None,
            vxlan: VxlanConfig::default(),
            tunnel_peers: vec!["192.168.79.2".parse()?],
        },
    })?;
    let uplink = PortSpec {
        name: u1.clone(),
        kind: PortKind::Uplink,
        addresses: vec![],
        peer_mac: None,
        endpoint: None,
        device: Default::default(),
        workload: None,
    };
    let _: Changed = c.call(&VrouterRequest::AddPorts {
        ports: vec![uplink, tap_port(&pp, &pod, "10.66.5.2")],
    })?;
    let _: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: vec![
            local("10.66.5.2/32", &pp),
            Route {
                prefix: "10.66.9.0/24".parse()?,
                target: RouteTarget::Encap {
                    encap: Encap::Vxlan,
                    remote: "192.168.79.2".parse()?,
                },
            },
        ],
    })?;
    // The peer's MAC as ctrl hands it over from the kernel's table.
    let _ = node.exec(&["ping", "-c", "1", "-W", "1", "192.168.79.2"]);
    let out = peer.ip(&["link", "show", &u2])?;
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("peer MAC")?
        .to_owned();
    let _: Changed = c.call(&VrouterRequest::SetNeighbors {
        neighbors: vec![Neighbor {
            port: u1.clone(),
            ip: "192.168.79.2".parse()?,
            mac: mac.parse().map_err(anyhow::Error::msg)?,
        }],
    })?;
    let out = pod.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.9.1"])?;
    assert!(out.contains("3 received"), "{out}");
    transfer(&pod, &peer, "10.66.5.2", 4 << 20)?;
    transfer(&peer, &pod, "10.66.9.1", 4 << 20)?;

    let m = metrics(&node)?;
    for bad in ["parse_error", "tx_ring_full", "mtu", "no_room"] {
        let with = format!("reason=\"{bad}\"");
        assert_eq!(sum(&m, "worker_drops_total{", &with), 0, "{bad}\n{m}");
    }
    let (gro, merged) = (
        sum(&m, "worker_gro_super_total{", ""),
        sum(&m, "worker_gro_segments_total{", ""),
    );
    assert!(gro > 0 && merged >= 2 * gro, "gro {gro} {merged}\n{m}");
    assert!(sum(&m, "worker_super_cut_total{", "") > 0, "{m}");
    assert!(sum(&m, "worker_encap_vxlan_total{", "") > 0, "{m}");
    assert!(sum(&m, "worker_decap_vxlan_total{", "") > 0, "{m}");
    eprintln!(
        "uplink gro_super {gro} gro_segments {merged} super_cut {}",
        sum(&m, "worker_super_cut_total{", "")
    );
    drop(c);
    vrouter.stop()?;
    Ok(())
}
