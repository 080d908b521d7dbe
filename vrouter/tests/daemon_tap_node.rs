//! Issue 13, item 2: what works for veth pods keeps working for TAP pods
//! (the conflist's default), through `brindle-vrouter serve`: proxy ARP,
//! anti-spoofing, TTL expiry and "fragmentation needed" for packets without
//! GSO (TCP super-packets follow the MSS and never meet the MTU drop),
//! per-port metrics; and between two nodes: the node stays reachable when
//! its vrouter is killed, the pods keep their TAP, MAC and address, and a
//! restarted vrouter carries the first packet again.
//!
//! Root only: `cargo test -p brindle-vrouter --test daemon_tap_node --
//! --include-ignored`.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use brindle_api::framing::{Client, PROTOCOL_VERSION};
use brindle_api::vrouter::{
    Changed, Encap, Hello, Neighbor, NodeConfig, PortDevice, PortKind, PortSpec, Route,
    RouteTarget, Stats, VrouterRequest, VxlanConfig,
};
use common::{Netns, Vrouter, in_netns, tap_pod, tcp_exchange, unique};

/// The metrics endpoint, in each node's own namespace.
const METRICS: &str = "127.0.0.1:9092";

fn tap_port(name: &str, ns: &Netns, addr: &str, mac: Option<&str>) -> PortSpec {
    PortSpec {
        name: name.to_owned(),
        kind: PortKind::Pod,
        addresses: vec![addr.parse().unwrap()],
        peer_mac: mac.map(|m| m.parse().unwrap()),
        endpoint: None,
        device: PortDevice::Tap {
            netns: Some(ns.path()),
            ifname: "eth0".into(),
            queues: 1,
        },
        workload: None,
    }
}

fn local(prefix: &str, port: &str) -> Route {
    Route {
        prefix: prefix.parse().unwrap(),
        target: RouteTarget::Local {
            port: port.to_owned(),
        },
    }
}

fn node_config(me: &str, subnet: &str, peers: &[&str]) -> Result<NodeConfig> {
    Ok(NodeConfig {
        address_v4: Some(me.parse()?),
        address_v6: None,
        underlay_subnet: Some(subnet.parse()?),
        underlay_gateway: None,
        vxlan: VxlanConfig::default(),
        tunnel_peers: peers.iter().map(|p| p.parse()).collect::<Result<_, _>>()?,
    })
}

fn serve(node: &Netns, socket: &Path, metrics: &str) -> Result<(Vrouter, Client)> {
    let v = Vrouter::start(
        node,
        &[
            "serve",
            "--socket",
            socket.to_str().context("path")?,
            "--metrics",
            metrics,
        ],
    )?;
    let mut c = Client::connect(socket, Duration::from_secs(10))?;
    let hello: Hello = c.call(&VrouterRequest::Hello {
        version: PROTOCOL_VERSION,
    })?;
    assert_eq!(hello.version, PROTOCOL_VERSION);
    Ok((v, c))
}

/// The workers' drops for `reason`, summed.
fn drops(c: &mut Client, reason: &str) -> Result<u64> {
    let stats: Stats = c.call(&VrouterRequest::GetStats)?;
    Ok(stats
        .workers
        .iter()
        .filter_map(|w| w.drops.get(reason))
        .sum())
}

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

/// The sum of the `brindle_vrouter_<series>` samples whose line holds every
/// one of `with`.
fn sum(metrics: &str, series: &str, with: &[&str]) -> u64 {
    let prefix = format!("brindle_vrouter_{series}{{");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `len` bytes over TCP from `client` to a listener on `addr` in `server`;
/// the server's count and checksum must match what was sent.
fn transfer(server: &Netns, client: &Netns, addr: &str, len: usize) -> Result<()> {
    let data: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let digest = |b: &[u8]| {
        b.iter()
            .fold(0u64, |a, &x| a.wrapping_mul(31).wrapping_add(u64::from(x)))
    };
    let want = (len as u64, digest(&data));
    let (tx, rx) = mpsc::channel();
    let bind = format!("{addr}:0");
    let srv = in_netns(server, move || {
        let l = TcpListener::bind(&bind)?;
        tx.send(l.local_addr()?)?;
        let (mut s, _) = l.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        Ok((got.len() as u64, digest(&got)))
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
    ensure!(got == want, "received (len, sum) {got:?}, sent {want:?}");
    Ok(())
}

/// One node, two TAP pods: A with MTU 1500, B with 1400.
#[test]
#[ignore = "requires root and network namespaces"]
fn tap_pods_get_proxy_arp_anti_spoofing_ttl_and_mtu_as_veth_pods_do() -> Result<()> {
    let node = Netns::new("tn")?;
    let pod_a = tap_pod("10.67.1.2", "02:b5:00:00:00:02")?;
    let pod_b = tap_pod("10.67.1.3", "02:b5:00:00:00:03")?;
    // Pod B's TAP carries at most 1400-byte packets; A may use an address
    // that is not its own.
    pod_b.ip(&["link", "set", "eth0", "mtu", "1400"])?;
    pod_a.ip(&["addr", "add", "10.67.9.9/32", "dev", "eth0"])?;
    let (pa, pb) = (unique("ta"), unique("tb"));
    let dir = tempfile::tempdir()?;
    let (vrouter, mut c) = serve(&node, &dir.path().join("vrouter.sock"), METRICS)?;
    let _: Changed = c.call(&VrouterRequest::SetNode {
        node: node_config("192.168.0.1", "192.168.0.0/24", &[])?,
    })?;
    let _: Changed = c.call(&VrouterRequest::AddPorts {
        ports: vec![
            tap_port(&pa, &pod_a, "10.67.1.2", None),
            tap_port(&pb, &pod_b, "10.67.1.3", None),
        ],
    })?;
    let _: Changed = c.call(&VrouterRequest::AddRoutes {
        routes: vec![local("10.67.1.2/32", &pa), local("10.67.1.3/32", &pb)],
    })?;

    // Proxy ARP: the pod's gateway is the vrouter's ee:ee:ee:ee:ee:ee.
    let out = pod_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.67.1.3"])?;
    assert!(out.contains("3 received"), "{out}");
    let neigh = pod_a.ip(&["neigh", "show", "169.254.1.1", "dev", "eth0"])?;
    assert!(neigh.contains("lladdr ee:ee:ee:ee:ee:ee"), "{neigh}");

    // Anti-spoofing: a source that is not the port's is dropped, counted.
    let before = drops(&mut c, "spoofed")?;
    let spoofed = pod_a.exec(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "1",
        "-I",
        "10.67.9.9",
        "10.67.1.3",
    ]);
    assert!(
        spoofed.is_err(),
        "a spoofed source got through: {spoofed:?}"
    );
    assert!(drops(&mut c, "spoofed")? >= before + 2);

    // TTL 1: "time exceeded" from the node's address.
    let ttl = format!(
        "{:?}",
        pod_a.exec(&["ping", "-c", "1", "-W", "2", "-t", "1", "10.67.1.3"])
    );
    assert!(
        ttl.contains("From 192.168.0.1") && ttl.contains("Time to live exceeded"),
        "{ttl}"
    );
    // A DF packet without GSO larger than B's TAP: "fragmentation needed"
    // with B's MTU; one that fits passes.
    let big = format!(
        "{:?}",
        pod_a.exec(&[
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            "-M",
            "do",
            "-s",
            "1450",
            "10.67.1.3",
        ])
    );
    assert!(big.contains("mtu = 1400"), "{big}");
    let ok = pod_a.exec(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "2",
        "-s",
        "1300",
        "10.67.1.3",
    ])?;
    assert!(ok.contains("2 received"), "{ok}");
    // TCP from the 1500 pod to the 1400 one: its super-packets' segments
    // follow B's MSS, so none meets the MTU check.
    let mtu_before = drops(&mut c, "mtu")?;
    transfer(&pod_b, &pod_a, "10.67.1.3", 1 << 20)?;
    transfer(&pod_a, &pod_b, "10.67.1.2", 1 << 20)?;
    assert_eq!(drops(&mut c, "mtu")?, mtu_before);

    // Per-port metrics of TAP ports, by name and backend.
    let m = metrics(&node)?;
    let port_a = format!("port=\"{pa}\"");
    let port_b = format!("port=\"{pb}\"");
    assert!(
        sum(&m, "port_rx_packets_total", &[&port_a, "backend=\"tap\""]) >= 5,
        "{m}"
    );
    assert!(
        sum(&m, "port_tx_packets_total", &[&port_b, "backend=\"tap\""]) >= 5,
        "{m}"
    );
    assert!(sum(&m, "port_rx_bytes_total", &[&port_b]) > 1 << 20, "{m}");
    assert!(sum(&m, "port_tap_rx_whole_total", &[&port_a]) > 0, "{m}");
    drop(c);
    vrouter.stop()?;
    Ok(())
}

/// One node of the two-node test: its namespace, uplink and TAP pod.
struct Node {
    ns: Netns,
    uplink: String,
    addr: &'static str,
    pod: Netns,
    pod_addr: &'static str,
    pod_mac: &'static str,
    port: String,
}

impl Node {
    /// Programs `c` as ctrl does: the node, the uplink, the pod's TAP port
    /// with the pod's MAC, its /32, the other node's block over IPIP, and
    /// the other node's MAC as the kernel resolved it.
    fn program(&self, c: &mut Client, peer: &Node, peer_block: &str) -> Result<()> {
        let _: Changed = c.call(&VrouterRequest::SetNode {
            node: node_config(self.addr, "192.168.81.0/24", &[peer.addr])?,
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
        let pod = tap_port(&self.port, &self.pod, self.pod_addr, Some(self.pod_mac));
        let _: Changed = c.call(&VrouterRequest::AddPorts {
            ports: vec![uplink, pod],
        })?;
        let _: Changed = c.call(&VrouterRequest::AddRoutes {
            routes: vec![
                local(&format!("{}/32", self.pod_addr), &self.port),
                Route {
                    prefix: peer_block.parse()?,
                    target: RouteTarget::Encap {
                        encap: Encap::Ipip,
                        remote: peer.addr.parse()?,
                    },
                },
            ],
        })?;
        // The kernel resolves the peer (the nodes' own ping); ctrl hands
        // the vrouter the kernel's entry.
        self.ns
            .exec(&["ping", "-c", "1", "-W", "2", peer.addr])
            .context("the nodes reach each other")?;
        let out = self
            .ns
            .ip(&["neigh", "show", peer.addr, "dev", &self.uplink])?;
        let mac = out
            .split_whitespace()
            .skip_while(|w| *w != "lladdr")
            .nth(1)
            .with_context(|| format!("no kernel neighbour for {}: {out}", peer.addr))?;
        let _: Changed = c.call(&VrouterRequest::SetNeighbors {
            neighbors: vec![Neighbor {
                port: self.uplink.clone(),
                ip: peer.addr.parse()?,
                mac: mac.parse().map_err(anyhow::Error::msg)?,
            }],
        })?;
        Ok(())
    }

    /// What identifies the pod's `eth0` (index, MAC, TUN/TAP kind and
    /// flags, MTU) and its global addresses; carrier and queue counts
    /// change with the attached queues, these must not.
    fn pod_eth0(&self) -> Result<String> {
        let link = &self.pod.ip_json(&["-d", "link", "show", "eth0"])?[0];
        let info = &link["linkinfo"];
        let addrs = &self
            .pod
            .ip_json(&["addr", "show", "eth0", "scope", "global"])?[0];
        let addrs: Vec<String> = addrs["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| format!("{}/{}", a["local"], a["prefixlen"]))
            .collect();
        Ok(format!(
            "ifindex {} mac {} mtu {} {} type {} persist {} vnet_hdr {} multi_queue {} addrs {addrs:?}",
            link["ifindex"],
            link["address"],
            link["mtu"],
            info["info_kind"],
            info["info_data"]["type"],
            info["info_data"]["persist"],
            info["info_data"]["vnet_hdr"],
            info["info_data"]["multi_queue"],
        ))
    }
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_tap_pods_node_survives_its_vrouters_death_and_a_restart_carries_the_first_packet() -> Result<()>
{
    let (ns1, ns2) = (Netns::new("tn")?, Netns::new("tn")?);
    let (u1, u2) = (unique("u"), unique("u"));
    ns1.ip(&[
        "link", "add", &u1, "type", "veth", "peer", "name", &u2, "netns", &ns2.name,
    ])?;
    ns1.ip(&["addr", "add", "192.168.81.1/24", "dev", &u1])?;
    ns2.ip(&["addr", "add", "192.168.81.2/24", "dev", &u2])?;
    ns1.ip(&["link", "set", &u1, "up"])?;
    ns2.ip(&["link", "set", &u2, "up"])?;
    let n1 = Node {
        ns: ns1,
        uplink: u1,
        addr: "192.168.81.1",
        pod: tap_pod("10.67.11.2", "02:b5:00:00:01:02")?,
        pod_addr: "10.67.11.2",
        pod_mac: "02:b5:00:00:01:02",
        port: unique("ta"),
    };
    let n2 = Node {
        ns: ns2,
        uplink: u2,
        addr: "192.168.81.2",
        pod: tap_pod("10.67.12.2", "02:b5:00:00:02:02")?,
        pod_addr: "10.67.12.2",
        pod_mac: "02:b5:00:00:02:02",
        port: unique("tb"),
    };
    // IPIP's 20 bytes, as the CNI plugin derives the pods' MTU.
    n1.pod.ip(&["link", "set", "eth0", "mtu", "1480"])?;
    n2.pod.ip(&["link", "set", "eth0", "mtu", "1480"])?;
    let dir = tempfile::tempdir()?;
    let (s1, s2) = (dir.path().join("n1.sock"), dir.path().join("n2.sock"));
    let (v1, mut c1) = serve(&n1.ns, &s1, "")?;
    let (v2, mut c2) = serve(&n2.ns, &s2, "")?;
    n1.program(&mut c1, &n2, "10.67.12.0/24")?;
    n2.program(&mut c2, &n1, "10.67.11.0/24")?;
    let out = n1
        .pod
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", n2.pod_addr])?;
    assert!(out.contains("3 received"), "pod A -> pod B: {out}");
    transfer(&n2.pod, &n1.pod, n2.pod_addr, 1 << 20)?;
    let before = n2.pod_eth0()?;

    // SIGKILL node 2's vrouter: the node stays reachable (its own traffic
    // never entered the vrouter; the kernel drops the program with the
    // process), and pod B keeps its TAP, MAC and address.
    v2.kill()?;
    drop(c2);
    let link = n2.ns.ip(&["link", "show", &n2.uplink])?;
    assert!(!link.contains("xdp"), "{link}");
    let own = n1
        .ns
        .exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", n2.addr])?;
    assert!(own.contains("2 received"), "node 2 after SIGKILL: {own}");
    tcp_exchange(&n2.ns, &n1.ns, n2.addr)?;
    assert_eq!(n2.pod_eth0()?, before, "pod B's eth0 while no vrouter runs");
    assert!(
        n1.pod
            .exec(&["ping", "-c", "1", "-W", "1", n2.pod_addr])
            .is_err(),
        "pod B answered with no vrouter on its node"
    );

    // A new vrouter, programmed as ctrl does on reconnecting: the first
    // echo after the programming is answered (no warm-up ping), and the
    // pod's interface is the same device with the same address.
    let restart = Instant::now();
    let (v2, mut c2) = serve(&n2.ns, &s2, "")?;
    n2.program(&mut c2, &n1, "10.67.11.0/24")?;
    let first = n1.pod.exec(&["ping", "-c", "1", "-W", "5", n2.pod_addr])?;
    let back = restart.elapsed();
    assert!(first.contains("1 received"), "the first echo: {first}");
    eprintln!("pod A -> pod B answered {back:?} after node 2's vrouter was started again");
    assert_eq!(n2.pod_eth0()?, before, "pod B's eth0 after the restart");
    let out = n2
        .pod
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", n1.pod_addr])?;
    assert!(out.contains("3 received"), "pod B -> pod A: {out}");
    transfer(&n1.pod, &n2.pod, n1.pod_addr, 1 << 20)?;
    tcp_exchange(&n2.ns, &n1.ns, n2.addr)?;
    drop((c1, c2));
    v1.stop()?;
    v2.stop()?;
    Ok(())
}
