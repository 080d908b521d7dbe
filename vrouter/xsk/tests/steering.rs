//! The steering program on an "uplink" and a pod port: the dataplane's
//! traffic lands in the AF_XDP socket, the node's own traffic stays in the
//! kernel, and it keeps working when the socket closes or the process holding
//! the program is killed, with nothing left attached.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use brindle_xsk::{
    Desc, Role, Steering, SteeringConfig, Umem, UmemConfig, XdpMode, XskConfig, XskSocket, ifindex,
};
use common::{Enter, Netns, Seen, classify, mac, mac_str, unique_octet, veth};
use socket2::{Domain, Protocol, Socket, Type};

fn xsk_config() -> XskConfig {
    XskConfig {
        rx_size: 512,
        tx_size: 64,
        fill_size: 512,
        comp_size: 64,
        ..XskConfig::default()
    }
}

/// A node namespace with an uplink veth to a peer namespace.
struct Lab {
    peer: Netns,
    node: Netns,
    node_addr: Ipv4Addr,
    peer_addr: Ipv4Addr,
    o: u8,
}

impl Lab {
    fn new() -> Result<Lab> {
        let peer = Netns::new("sp")?;
        let node = Netns::new("sn")?;
        let o = unique_octet();
        let node_addr = Ipv4Addr::new(10, 205, o, 1);
        let peer_addr = Ipv4Addr::new(10, 205, o, 2);
        veth(
            &peer,
            "vp",
            mac(5, 1),
            Some(&format!("{peer_addr}/24")),
            &node,
            "upl",
            mac(5, 2),
            Some(&format!("{node_addr}/24")),
        )?;
        Ok(Lab {
            peer,
            node,
            node_addr,
            peer_addr,
            o,
        })
    }

    fn pod_net(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 245, self.o, 0)
    }

    /// A pod prefix the peer reaches on-link, so it ARPs for its addresses.
    fn onlink_pod_net(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 246, self.o, 0)
    }

    fn ping_node(&self) -> Result<()> {
        let out = self.peer.exec(&[
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
            &self.node_addr.to_string(),
        ])?;
        ensure!(out.contains("2 received"), "{out}");
        Ok(())
    }

    /// A TCP exchange from the peer to a listener in the node namespace, as
    /// an SSH session or a BGP peering would make.
    fn tcp_to_node(&self, port: u16) -> Result<()> {
        let listener = self
            .node
            .enter(|| TcpListener::bind((self.node_addr, port)))?;
        let server = std::thread::spawn(move || -> Result<()> {
            let (mut s, _) = listener.accept()?;
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
            Ok(())
        });
        let echoed = self.peer.enter(|| -> Result<[u8; 5]> {
            let mut s = TcpStream::connect_timeout(
                &SocketAddrV4::new(self.node_addr, port).into(),
                Duration::from_secs(5),
            )?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"hello")?;
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf)?;
            Ok(buf)
        })?;
        server.join().expect("server panicked")?;
        ensure!(&echoed == b"hello");
        Ok(())
    }

    /// XDP program id on the node's uplink, if one is attached.
    fn uplink_prog_id(&self) -> Result<Option<u32>> {
        let out = self.node.ip(&["-d", "link", "show", "dev", "upl"])?;
        Ok(prog_id(&out))
    }
}

/// The id in `ip -d link` output (`prog/xdp id N`), if any.
fn prog_id(ip_link: &str) -> Option<u32> {
    let at = ip_link.find("prog/xdp id ")?;
    ip_link[at + 12..].split_whitespace().next()?.parse().ok()
}

fn prog_exists(id: u32) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Sets up the steering maps and program on the node's uplink, with a socket.
fn steer_uplink(lab: &Lab) -> Result<(Steering, brindle_xsk::XdpAttachment, Umem, XskSocket)> {
    lab.node.enter(|| -> Result<_> {
        let steering = Steering::new(SteeringConfig::default())?;
        steering.set_node(Some(lab.node_addr), 4789)?;
        steering.add_pod_prefix(lab.pod_net(), 24)?;
        steering.add_pod_prefix(lab.onlink_pod_net(), 24)?;
        let idx = ifindex("upl")?;
        let attach = steering.attach(idx, Role::Uplink, XdpMode::Native)?;
        let umem = Umem::new(UmemConfig {
            frame_count: 1024,
            ..UmemConfig::default()
        })?;
        let mut sock = XskSocket::bind(&umem, idx, 0, &xsk_config())?;
        let addrs: Vec<u64> = (0..512).map(|i| umem.frame_addr(i)).collect();
        ensure!(sock.fill(&addrs) == 512);
        attach.set_socket(&sock)?;
        Ok((steering, attach, umem, sock))
    })
}

/// Everything the socket received so far (waits up to `ms` for the first).
fn drain(umem: &Umem, sock: &mut XskSocket, ms: i32) -> Result<Vec<Seen>> {
    let mut seen = Vec::new();
    let mut descs = [Desc::default(); 64];
    for round in 0..20 {
        if sock.fill_needs_wakeup() {
            sock.wake_rx()?;
        }
        sock.poll_rx(if round == 0 { ms } else { 50 })?;
        let n = sock.rx_burst(&mut descs);
        for d in &descs[..n] {
            seen.push(classify(
                umem.data(*d).context("descriptor outside the UMEM")?,
            ));
        }
        let addrs: Vec<u64> = descs[..n].iter().map(|d| umem.chunk_of(d.addr)).collect();
        ensure!(sock.fill(&addrs) == n);
        if n == 0 && round > 0 {
            break;
        }
    }
    Ok(seen)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn uplink_steers_dataplane_traffic_to_the_socket_and_passes_the_nodes_own() -> Result<()> {
    let lab = Lab::new()?;
    let (steering, attach, umem, mut sock) = steer_uplink(&lab)?;
    assert_eq!(attach.mode(), XdpMode::Native);

    // The node's own traffic: ARP for the node, ping, TCP, DNS-like UDP.
    lab.ping_node()?;
    lab.tcp_to_node(2222)?;
    let dns = lab.node.enter(|| UdpSocket::bind((lab.node_addr, 5353)))?;
    dns.set_read_timeout(Some(Duration::from_secs(5)))?;
    lab.peer
        .enter(|| UdpSocket::bind((lab.peer_addr, 0))?.send_to(b"query", (lab.node_addr, 5353)))?;
    let mut buf = [0u8; 16];
    let (n, _) = dns
        .recv_from(&mut buf)
        .context("UDP to the node did not reach its socket")?;
    assert_eq!(&buf[..n], b"query");

    // The dataplane's traffic: VXLAN and IPIP to the node, a frame to a pod
    // address (routed via the node), ARP for a pod address.
    lab.peer.ip(&[
        "route",
        "add",
        &format!("{}/24", lab.pod_net()),
        "via",
        &lab.node_addr.to_string(),
    ])?;
    lab.peer.ip(&[
        "route",
        "add",
        &format!("{}/24", lab.onlink_pod_net()),
        "dev",
        "vp",
    ])?;
    let pod = Ipv4Addr::new(10, 245, lab.o, 7);
    let onlink_pod = Ipv4Addr::new(10, 246, lab.o, 9);
    lab.peer.enter(|| -> Result<()> {
        let udp = UdpSocket::bind((lab.peer_addr, 0))?;
        udp.send_to(b"vxlan", (lab.node_addr, 4789))?;
        udp.send_to(b"to-pod", (pod, 6000))?;
        // Unanswered ARP: the send itself is queued behind resolution.
        udp.send_to(b"arp-me", (onlink_pod, 6000))?;
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(4)))?;
        raw.send_to(&[0x45u8; 28], &SocketAddrV4::new(lab.node_addr, 0).into())?;
        Ok(())
    })?;
    let mut seen = Vec::new();
    let wanted = |seen: &[Seen]| {
        let vxlan = seen
            .iter()
            .any(|s| matches!(s, Seen::Udp { dport: 4789, payload, .. } if payload == b"vxlan"));
        let ipip = seen
            .iter()
            .any(|s| matches!(s, Seen::Ipip { dst } if *dst == lab.node_addr));
        let to_pod = seen
            .iter()
            .any(|s| matches!(s, Seen::Udp { dst, .. } if *dst == pod));
        let arp = seen
            .iter()
            .any(|s| matches!(s, Seen::Arp { target } if *target == onlink_pod));
        [vxlan, ipip, to_pod, arp]
    };
    for _ in 0..10 {
        seen.extend(drain(&umem, &mut sock, 200)?);
        if wanted(&seen).iter().all(|&w| w) {
            break;
        }
    }
    assert_eq!(
        wanted(&seen),
        [true; 4],
        "vxlan, ipip, to-pod, arp-for-pod; saw {seen:?}"
    );
    for s in &seen {
        let own = match s {
            Seen::Tcp { .. } | Seen::Icmp { .. } => true,
            Seen::Arp { target } => *target == lab.node_addr,
            Seen::Udp { dport, .. } => *dport == 5353,
            _ => false,
        };
        assert!(!own, "node traffic entered userspace: {s:?}");
    }

    // Fail-open: with the socket closed, the program passes what it would
    // have redirected, so VXLAN to the node now reaches the kernel.
    let id = lab
        .uplink_prog_id()?
        .context("no XDP program on the uplink")?;
    assert!(prog_exists(id));
    drop(sock);
    let vxlan_sink = lab.node.enter(|| UdpSocket::bind((lab.node_addr, 4789)))?;
    vxlan_sink.set_read_timeout(Some(Duration::from_secs(5)))?;
    lab.peer
        .enter(|| UdpSocket::bind((lab.peer_addr, 0))?.send_to(b"vxlan2", (lab.node_addr, 4789)))?;
    let (n, _) = vxlan_sink
        .recv_from(&mut buf)
        .context("VXLAN not passed to the kernel once the socket closed")?;
    assert_eq!(&buf[..n], b"vxlan2");
    lab.ping_node()?;

    // Map updates are idempotent and observable.
    assert!(steering.has_pod_prefix(pod, 24)?);
    assert!(steering.remove_pod_prefix(pod, 24)?);
    assert!(!steering.remove_pod_prefix(pod, 24)?);

    // Explicit detach: nothing stays attached, the program is gone.
    attach.detach()?;
    ensure!(lab.uplink_prog_id()?.is_none(), "XDP still attached");
    let link = lab.node.ip(&["link", "show", "dev", "upl"])?;
    ensure!(!link.contains("xdp"), "{link}");
    ensure!(!prog_exists(id), "program {id} left behind");
    lab.tcp_to_node(2223)?;
    Ok(())
}

/// Environment variable that turns the helper test into the child process
/// of the SIGKILL test; its value is the node namespace.
const KILL_CHILD: &str = "BRINDLE_XSK_STEER_CHILD_NETNS";

#[test]
#[ignore = "requires root and network namespaces"]
fn node_traffic_survives_sigkill_of_the_process_holding_the_program() -> Result<()> {
    let lab = Lab::new()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "helper_process_holds_the_uplink_program",
            "--include-ignored",
            "--nocapture",
        ])
        .env(KILL_CHILD, &lab.node.name)
        .env("BRINDLE_XSK_NODE_ADDR", lab.node_addr.to_string())
        .stdout(Stdio::piped())
        .spawn()?;
    // Kill the child on every exit path, including a failed assertion.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().context("child stdout")?;
    let mut child = Reap(child);
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        match lines.next() {
            Some(line) => {
                let line = line?;
                if line.starts_with("READY") {
                    break line;
                }
            }
            None => bail!("child exited before attaching"),
        }
    };
    let id = lab
        .uplink_prog_id()?
        .with_context(|| format!("child said {ready} but no program is attached"))?;
    lab.ping_node()?;
    lab.tcp_to_node(2224)?;

    // SIGKILL: no destructor runs in the child.
    child.0.kill()?;
    child.0.wait()?;
    lab.ping_node()?;
    lab.tcp_to_node(2225)?;
    ensure!(
        lab.uplink_prog_id()?.is_none(),
        "XDP left attached after SIGKILL"
    );
    // The kernel frees the program once the last reference (the link) goes.
    for _ in 0..50 {
        if !prog_exists(id) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("program {id} left behind after SIGKILL")
}

/// Child of the test above (does nothing unless started by it): attaches
/// the uplink program with a socket in the given namespace and waits.
#[test]
#[ignore = "requires root and network namespaces"]
fn helper_process_holds_the_uplink_program() -> Result<()> {
    let Ok(ns) = std::env::var(KILL_CHILD) else {
        return Ok(());
    };
    let node_addr: Ipv4Addr = std::env::var("BRINDLE_XSK_NODE_ADDR")?.parse()?;
    let ns = Netns { name: ns };
    let held = ns.enter(|| -> Result<_> {
        let steering = Steering::new(SteeringConfig::default())?;
        steering.set_node(Some(node_addr), 4789)?;
        let idx = ifindex("upl")?;
        let attach = steering.attach(idx, Role::Uplink, XdpMode::Native)?;
        let umem = Umem::new(UmemConfig {
            frame_count: 256,
            ..UmemConfig::default()
        })?;
        let mut sock = XskSocket::bind(&umem, idx, 0, &xsk_config())?;
        let addrs: Vec<u64> = (0..256).map(|i| umem.frame_addr(i)).collect();
        sock.fill(&addrs);
        attach.set_socket(&sock)?;
        Ok((steering, attach, umem, sock))
    });
    std::mem::forget(ns);
    let _held = held?;
    println!("READY");
    std::io::stdout().flush()?;
    // The parent kills us long before this ends.
    std::thread::sleep(Duration::from_secs(60));
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn pod_port_steers_arp_and_pod_traffic_and_passes_traffic_to_the_node() -> Result<()> {
    let pod_ns = Netns::new("pp")?;
    let node = Netns::new("pn")?;
    let o = unique_octet();
    let pod_addr = Ipv4Addr::new(10, 247, o, 5);
    let other_pod = Ipv4Addr::new(10, 247, o, 6);
    let node_addr = Ipv4Addr::new(10, 206, o, 1);
    // Calico's shape: the pod has a /32 and a default route via 169.254.1.1
    // on its only interface; the host end has no address.
    veth(
        &pod_ns,
        "eth0",
        mac(6, 1),
        Some(&format!("{pod_addr}/32")),
        &node,
        "cali",
        mac(6, 2),
        None,
    )?;
    pod_ns.ip(&[
        "route",
        "add",
        "169.254.1.1",
        "dev",
        "eth0",
        "scope",
        "link",
    ])?;
    pod_ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ])?;
    node.ip(&["addr", "add", &format!("{node_addr}/32"), "dev", "lo"])?;
    node.ip(&["route", "add", &format!("{pod_addr}/32"), "dev", "cali"])?;
    node.ip(&[
        "neigh",
        "add",
        &pod_addr.to_string(),
        "lladdr",
        &mac_str(mac(6, 1)),
        "dev",
        "cali",
    ])?;

    let (steering, attach, umem, mut sock) = node.enter(|| -> Result<_> {
        let steering = Steering::new(SteeringConfig::default())?;
        steering.add_pod_prefix(Ipv4Addr::new(10, 247, o, 0), 24)?;
        let idx = ifindex("cali")?;
        let attach = steering.attach(idx, Role::Pod, XdpMode::Auto)?;
        let umem = Umem::new(UmemConfig {
            frame_count: 512,
            ..UmemConfig::default()
        })?;
        let mut sock = XskSocket::bind(&umem, idx, 0, &xsk_config())?;
        let addrs: Vec<u64> = (0..256).map(|i| umem.frame_addr(i)).collect();
        ensure!(sock.fill(&addrs) == 256);
        attach.set_socket(&sock)?;
        Ok((steering, attach, umem, sock))
    })?;

    // The pod ARPs for its gateway: the vrouter's to answer, so it arrives
    // in the socket (and nobody answers here).
    let _ = pod_ns.exec(&["ping", "-c", "1", "-W", "1", &node_addr.to_string()]);
    let seen = drain(&umem, &mut sock, 500)?;
    ensure!(
        seen.iter()
            .any(|s| matches!(s, Seen::Arp { target } if *target == Ipv4Addr::new(169, 254, 1, 1))),
        "no ARP for the gateway in the socket: {seen:?}"
    );

    // Resolved gateway: traffic to the node's own address goes to the kernel
    // (the ping is answered), traffic to another pod to the socket.
    pod_ns.ip(&[
        "neigh",
        "replace",
        "169.254.1.1",
        "lladdr",
        &mac_str(mac(6, 2)),
        "dev",
        "eth0",
    ])?;
    let ping = pod_ns.exec(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "2",
        &node_addr.to_string(),
    ])?;
    ensure!(ping.contains("2 received"), "{ping}");
    pod_ns.enter(|| UdpSocket::bind((pod_addr, 0))?.send_to(b"pod-to-pod", (other_pod, 7000)))?;
    let seen = drain(&umem, &mut sock, 500)?;
    ensure!(
        seen.iter().any(|s| matches!(s, Seen::Udp { dst, payload, .. } if *dst == other_pod && payload == b"pod-to-pod")),
        "pod-to-pod frame not in the socket: {seen:?}"
    );
    ensure!(
        !seen
            .iter()
            .any(|s| matches!(s, Seen::Icmp { dst } if *dst == node_addr)),
        "traffic to the node entered userspace: {seen:?}"
    );
    drop((attach, steering));
    Ok(())
}
