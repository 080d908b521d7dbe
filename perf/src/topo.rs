//! Topologies in network namespaces: names unique to the process, removed
//! by Drop guards, and by the Ctrl-C watcher if the main thread is stuck.
//!
//! Every interface lives inside a namespace of ours; the host namespace is
//! never touched.

use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use brindle_wire::MacAddr;
use nix::sched::{CloneFlags, setns};

/// Set when the user asked to stop (SIGINT/SIGTERM): every loop checks it.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Namespaces alive now, for the signal watcher's last-resort cleanup.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Errors of topology setup.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// A command could not be started.
    #[error("spawn {cmd}: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("{cmd} failed: {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Its standard error.
        stderr: String,
    },
    /// Entering a namespace failed.
    #[error("enter namespace {ns}: {source}")]
    Enter {
        /// The namespace.
        ns: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs a command, feeding `stdin` if given; fails with its stderr.
pub fn run_with_input(args: &[&str], stdin: Option<&str>) -> Result<String, TopoError> {
    let cmd = args.join(" ");
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| TopoError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A command that stops reading early (it found an error) breaks the
        // pipe: its exit status and stderr below say why, not the EPIPE.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|source| TopoError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(TopoError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command; fails with its stderr.
pub fn run(args: &[&str]) -> Result<String, TopoError> {
    run_with_input(args, None)
}

/// `bp<role>`, the role cut to 3 letters or digits so that the names the
/// shared helpers make from it (`<prefix><pid>x<n>`) stay within 15 bytes.
fn prefix(role: &str) -> String {
    let role: String = role
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(3)
        .collect();
    format!("bp{role}")
}

/// A name unique to this process and call, `bp<role><pid>x<n>`
/// (`brindle_testkit::netns::unique`).
pub fn unique(role: &str) -> String {
    brindle_testkit::netns::unique(&prefix(role))
}

/// A failure of the shared helpers, with the command that failed.
fn failed(cmd: &[&str], e: anyhow::Error) -> TopoError {
    TopoError::Failed {
        cmd: cmd.join(" "),
        stderr: format!("{e:#}"),
    }
}

/// A network namespace, deleted on drop with everything inside it
/// (veths, routes, iptables rules, ipsets, conntrack entries). The
/// namespace itself is `brindle_testkit::netns::Netns`; this adds the
/// registry the Ctrl-C watcher cleans up from, and typed errors.
pub struct Netns {
    /// Its name under /var/run/netns.
    pub name: String,
    /// Deletes the namespace when dropped (after `Drop for Netns` took the
    /// name off the registry).
    inner: brindle_testkit::netns::Netns,
}

impl std::fmt::Debug for Netns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netns").field("name", &self.name).finish()
    }
}

impl Netns {
    /// Creates `bp<role><pid>x<n>` with loopback up.
    pub fn new(role: &str) -> Result<Netns, TopoError> {
        let prefix = prefix(role);
        let inner = brindle_testkit::netns::Netns::new(&prefix)
            .map_err(|e| failed(&["ip", "netns", "add", &prefix], e))?;
        let name = inner.name.clone();
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.clone());
        Ok(Netns { name, inner })
    }

    /// `ip -n <ns> args...`
    pub fn ip(&self, args: &[&str]) -> Result<String, TopoError> {
        self.inner.ip(args).map_err(|e| {
            let mut cmd = vec!["ip", "-n", &self.name];
            cmd.extend_from_slice(args);
            failed(&cmd, e)
        })
    }

    /// `ip netns exec <ns> args...`
    pub fn exec(&self, args: &[&str]) -> Result<String, TopoError> {
        self.inner.exec(args).map_err(|e| {
            let mut cmd = vec!["ip", "netns", "exec", &self.name];
            cmd.extend_from_slice(args);
            failed(&cmd, e)
        })
    }

    /// `ip netns exec <ns> args...` with `stdin`.
    pub fn exec_with_input(&self, args: &[&str], stdin: Option<&str>) -> Result<String, TopoError> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run_with_input(&full, stdin)
    }

    /// Sets sysctls (`key=value`) inside the namespace.
    pub fn sysctl(&self, settings: &[&str]) -> Result<(), TopoError> {
        for s in settings {
            self.exec(&["sysctl", "-qw", s])?;
        }
        Ok(())
    }

    /// Moves the calling thread into this namespace. Only threads spawned
    /// for that purpose call it: a thread never comes back.
    pub fn enter_current_thread(&self) -> Result<(), TopoError> {
        enter(&self.name)
    }

    /// A counter of an interface inside the namespace.
    pub fn link_stat(&self, dev: &str, stat: &str) -> Result<u64, TopoError> {
        let out = self.exec(&["cat", &format!("/sys/class/net/{dev}/statistics/{stat}")])?;
        out.trim().parse().map_err(|_| TopoError::Failed {
            cmd: format!("read {dev} {stat}"),
            stderr: out,
        })
    }
}

/// Moves the calling thread into namespace `name`.
pub fn enter(name: &str) -> Result<(), TopoError> {
    let path = format!("/var/run/netns/{name}");
    let file = File::open(&path).map_err(|source| TopoError::Enter {
        ns: name.to_owned(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| TopoError::Enter {
        ns: name.to_owned(),
        source: e.into(),
    })
}

impl Drop for Netns {
    fn drop(&mut self) {
        // `inner` deletes the namespace right after this.
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|n| n != &self.name);
    }
}

/// Deletes every namespace still alive: the signal watcher's last resort.
pub fn delete_all_live() {
    let names: Vec<String> = LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for n in names {
        let _ = Command::new("ip").args(["netns", "del", &n]).output();
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread it
/// spawns later) and starts a thread that waits for them: the first sets
/// [`STOP`], so the run ends at the next check and the Drop guards clean
/// up; a second one, or a main thread that does not finish within 10 s,
/// deletes the namespaces and exits. Call first thing in `main`.
pub fn install_signal_watcher() -> nix::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if set.wait().is_err() {
                return;
            }
            eprintln!("\nbrindle-perf: stopping, removing namespaces (again to force)");
            STOP.store(true, Ordering::SeqCst);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(10));
                delete_all_live();
                std::process::exit(130);
            });
            let _ = set.wait();
            delete_all_live();
            std::process::exit(130);
        })
        .map(|_| ())
        .map_err(|_| nix::Error::EAGAIN)
}

/// One end of the probe path: an interface in a namespace.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The namespace's name.
    pub ns: String,
    /// Interface name inside it.
    pub ifname: String,
    /// Its MAC.
    pub mac: MacAddr,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
}

/// The router's two ports, for forwarders that take over its forwarding.
#[derive(Clone, Debug)]
pub struct RouterPorts {
    /// The namespace.
    pub ns: String,
    /// Port facing the generator.
    pub ingress: String,
    /// Port facing the sink.
    pub egress: String,
    /// MAC of the egress port (source MAC of forwarded frames).
    pub egress_mac: MacAddr,
    /// MAC of the sink (destination MAC of forwarded frames).
    pub sink_mac: MacAddr,
}

/// The two-node shape's facts for forwarders that take over both nodes.
#[derive(Clone, Debug)]
pub struct TwoNodePorts {
    /// Node A's namespace (`pod0` faces the generator, `ul0` node B).
    pub a_ns: String,
    /// Node B's namespace (`ul0` faces node A, `pod0` the sink).
    pub b_ns: String,
    /// MAC of node A's `ul0`.
    pub a_ul_mac: MacAddr,
    /// MAC of node B's `ul0`.
    pub b_ul_mac: MacAddr,
    /// The generator's MAC (the pod on node A).
    pub gen_mac: MacAddr,
    /// The sink's MAC (the pod on node B).
    pub sink_mac: MacAddr,
}

/// How node A reaches node B's pod block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Underlay {
    /// VXLAN (VNI 4096, UDP 4789), as Calico's VXLAN mode.
    Vxlan,
    /// IP in IP, as Calico's IPIP mode.
    Ipip,
    /// Plain routes via the remote node, as Calico's BGP mode without
    /// encapsulation.
    Native,
}

/// Which shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// generator — sink (the generator's own ceiling).
    Direct,
    /// generator — router — sink.
    Routed,
    /// generator — node A — underlay — node B — sink.
    TwoNode(Underlay),
}

/// A built topology; dropping it deletes every namespace.
#[derive(Debug)]
pub struct Topology {
    /// Its shape.
    pub shape: Shape,
    /// Where frames start.
    pub generator: Endpoint,
    /// Where they are counted.
    pub sink: Endpoint,
    /// The MAC the generator sends to.
    pub next_hop_mac: MacAddr,
    /// The router, in the routed shape.
    pub router: Option<RouterPorts>,
    /// Both nodes, in the two-node shape.
    pub two_node: Option<TwoNodePorts>,
    /// The first interface that receives the generator's frames, as
    /// (namespace, interface): where the measured receive work starts.
    pub first_rx: (String, String),
    /// Namespaces in creation order; the router (or node A) is `nodes[0]`.
    pub nodes: Vec<Netns>,
    /// TX and RX queues of the generator's and the sink's veth pairs (and
    /// the router's ports): one per worker core. A veth delivers a frame
    /// on the receiver's queue of the sending CPU (XDP frames) or of the
    /// sender's TX queue (skbs), so generator threads on several CPUs
    /// spread over the queues, as RSS spreads flows on a NIC.
    pub queues: u32,
    /// The generator's and the sink's namespaces.
    pub ends: Vec<Netns>,
}

const fn mac(i: u8) -> MacAddr {
    MacAddr([0x02, 0xb7, 0x00, 0x00, 0x00, i])
}

/// Addresses shared by every shape: generator 10.201.1.2, sink 10.201.2.2.
pub const GEN_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
/// The sink's address.
pub const SINK_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 2, 2);
/// Name of the router port facing the generator: a Calico workload name,
/// so the Calico rule set dispatches on it.
pub const ROUTER_IN: &str = "cali0ge0000001";
/// Name of the router port facing the sink.
pub const ROUTER_OUT: &str = "cali0si0000002";

fn mac_str(m: MacAddr) -> String {
    m.to_string()
}

/// `ip link add a type veth peer b`, a in `ns_a`, b in `ns_b`, MACs set,
/// `queues` TX and RX queues on both ends, both up.
fn veth(
    ns_a: &Netns,
    a: &str,
    mac_a: MacAddr,
    ns_b: &Netns,
    b: &str,
    mac_b: MacAddr,
    queues: u32,
) -> Result<(), TopoError> {
    let q = queues.max(1).to_string();
    ns_a.ip(&[
        "link",
        "add",
        a,
        "address",
        &mac_str(mac_a),
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        b,
        "netns",
        &ns_b.name,
        "address",
        &mac_str(mac_b),
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
    ])?;
    ns_a.ip(&["link", "set", "dev", a, "up"])?;
    ns_b.ip(&["link", "set", "dev", b, "up"])?;
    Ok(())
}

const ROUTER_SYSCTLS: [&str; 4] = [
    "net.ipv4.ip_forward=1",
    "net.ipv4.conf.all.rp_filter=0",
    "net.ipv4.conf.default.rp_filter=0",
    "net.ipv4.conf.all.accept_local=1",
];

impl Topology {
    /// Builds a topology of `shape` with single-queue veths.
    pub fn build(shape: Shape) -> Result<Topology, TopoError> {
        Topology::build_with_queues(shape, 1)
    }

    /// Builds a topology of `shape`; the direct and routed shapes' veths
    /// get `queues` queues (the two-node shape always one).
    pub fn build_with_queues(shape: Shape, queues: u32) -> Result<Topology, TopoError> {
        let queues = match shape {
            Shape::TwoNode(_) => 1,
            _ => queues.max(1),
        };
        let gen_ns = Netns::new("g")?;
        let sink_ns = Netns::new("s")?;
        let gen_mac = mac(1);
        let sink_mac = mac(2);
        let gen_if = "gen0";
        let sink_if = "sink0";
        let mut nodes = Vec::new();
        let mut first_rx = (sink_ns.name.clone(), sink_if.to_owned());
        let mut two_node = None;
        let (next_hop_mac, router) = match shape {
            Shape::Direct => {
                veth(
                    &gen_ns, gen_if, gen_mac, &sink_ns, sink_if, sink_mac, queues,
                )?;
                gen_ns.ip(&["addr", "add", "10.201.1.2/16", "dev", gen_if])?;
                sink_ns.ip(&["addr", "add", "10.201.2.2/16", "dev", sink_if])?;
                (sink_mac, None)
            }
            Shape::Routed => {
                let r = Netns::new("r")?;
                let (r_in, r_out) = (mac(3), mac(4));
                veth(&gen_ns, gen_if, gen_mac, &r, ROUTER_IN, r_in, queues)?;
                veth(&sink_ns, sink_if, sink_mac, &r, ROUTER_OUT, r_out, queues)?;
                gen_ns.ip(&["addr", "add", "10.201.1.2/24", "dev", gen_if])?;
                sink_ns.ip(&["addr", "add", "10.201.2.2/24", "dev", sink_if])?;
                r.ip(&["addr", "add", "10.201.1.1/24", "dev", ROUTER_IN])?;
                r.ip(&["addr", "add", "10.201.2.1/24", "dev", ROUTER_OUT])?;
                r.sysctl(&ROUTER_SYSCTLS)?;
                // Static neighbours: no ARP in the measured path.
                r.ip(&[
                    "neigh",
                    "replace",
                    "10.201.2.2",
                    "lladdr",
                    &mac_str(sink_mac),
                    "dev",
                    ROUTER_OUT,
                    "nud",
                    "permanent",
                ])?;
                r.ip(&[
                    "neigh",
                    "replace",
                    "10.201.1.2",
                    "lladdr",
                    &mac_str(gen_mac),
                    "dev",
                    ROUTER_IN,
                    "nud",
                    "permanent",
                ])?;
                let ports = RouterPorts {
                    ns: r.name.clone(),
                    ingress: ROUTER_IN.into(),
                    egress: ROUTER_OUT.into(),
                    egress_mac: r_out,
                    sink_mac,
                };
                first_rx = (r.name.clone(), ROUTER_IN.to_owned());
                nodes.push(r);
                (r_in, Some(ports))
            }
            Shape::TwoNode(underlay) => {
                let a = Netns::new("a")?;
                let b = Netns::new("b")?;
                let (a_in, a_ul, b_ul, b_out) = (mac(3), mac(5), mac(6), mac(4));
                veth(&gen_ns, gen_if, gen_mac, &a, "pod0", a_in, 1)?;
                veth(&a, "ul0", a_ul, &b, "ul0", b_ul, 1)?;
                veth(&sink_ns, sink_if, sink_mac, &b, "pod0", b_out, 1)?;
                gen_ns.ip(&["addr", "add", "10.201.1.2/24", "dev", gen_if])?;
                sink_ns.ip(&["addr", "add", "10.201.2.2/24", "dev", sink_if])?;
                a.ip(&["addr", "add", "10.201.1.1/24", "dev", "pod0"])?;
                b.ip(&["addr", "add", "10.201.2.1/24", "dev", "pod0"])?;
                a.ip(&["addr", "add", "192.168.201.1/24", "dev", "ul0"])?;
                b.ip(&["addr", "add", "192.168.201.2/24", "dev", "ul0"])?;
                // The underlay: MTU 1600 so 1518-byte frames fit after the
                // encapsulation (a jumbo-frame underlay), static neighbours.
                for (n, remote, remote_mac) in
                    [(&a, "192.168.201.2", b_ul), (&b, "192.168.201.1", a_ul)]
                {
                    n.ip(&["link", "set", "ul0", "mtu", "1600"])?;
                    n.ip(&[
                        "neigh",
                        "replace",
                        remote,
                        "lladdr",
                        &mac_str(remote_mac),
                        "dev",
                        "ul0",
                        "nud",
                        "permanent",
                    ])?;
                    n.sysctl(&ROUTER_SYSCTLS)?;
                }
                match underlay {
                    Underlay::Vxlan => {
                        // Calico's VXLAN device: one VNI, learning off, static
                        // neighbour and FDB for the remote VTEP.
                        let (va, vb) = (mac(7), mac(8));
                        for (n, local, remote, own, peer) in [
                            (&a, "192.168.201.1", "192.168.201.2", va, vb),
                            (&b, "192.168.201.2", "192.168.201.1", vb, va),
                        ] {
                            n.ip(&[
                                "link",
                                "add",
                                "vxlan.calico",
                                "address",
                                &mac_str(own),
                                "type",
                                "vxlan",
                                "id",
                                "4096",
                                "local",
                                local,
                                "dstport",
                                "4789",
                                "dev",
                                "ul0",
                                "nolearning",
                            ])?;
                            n.ip(&["link", "set", "vxlan.calico", "mtu", "1500", "up"])?;
                            n.exec(&[
                                "bridge",
                                "fdb",
                                "append",
                                &mac_str(peer),
                                "dev",
                                "vxlan.calico",
                                "dst",
                                remote,
                            ])?;
                        }
                        a.ip(&["addr", "add", "10.201.255.1/32", "dev", "vxlan.calico"])?;
                        b.ip(&["addr", "add", "10.201.255.2/32", "dev", "vxlan.calico"])?;
                        a.ip(&[
                            "neigh",
                            "replace",
                            "10.201.255.2",
                            "lladdr",
                            &mac_str(vb),
                            "dev",
                            "vxlan.calico",
                            "nud",
                            "permanent",
                        ])?;
                        b.ip(&[
                            "neigh",
                            "replace",
                            "10.201.255.1",
                            "lladdr",
                            &mac_str(va),
                            "dev",
                            "vxlan.calico",
                            "nud",
                            "permanent",
                        ])?;
                        a.ip(&[
                            "route",
                            "add",
                            "10.201.2.0/24",
                            "via",
                            "10.201.255.2",
                            "dev",
                            "vxlan.calico",
                            "onlink",
                        ])?;
                        b.ip(&[
                            "route",
                            "add",
                            "10.201.1.0/24",
                            "via",
                            "10.201.255.1",
                            "dev",
                            "vxlan.calico",
                            "onlink",
                        ])?;
                    }
                    Underlay::Ipip => {
                        // Calico's IPIP: a tunnel device, routes to the
                        // remote block via the remote node's address onlink.
                        for (n, local, remote, route) in [
                            (&a, "192.168.201.1", "192.168.201.2", "10.201.2.0/24"),
                            (&b, "192.168.201.2", "192.168.201.1", "10.201.1.0/24"),
                        ] {
                            n.ip(&[
                                "link",
                                "add",
                                "tunl.calico",
                                "type",
                                "ipip",
                                "local",
                                local,
                                "remote",
                                remote,
                                "dev",
                                "ul0",
                            ])?;
                            n.ip(&["link", "set", "tunl.calico", "mtu", "1500", "up"])?;
                            n.ip(&["route", "add", route, "dev", "tunl.calico"])?;
                        }
                    }
                    Underlay::Native => {
                        // Calico's BGP mode without encapsulation: the
                        // remote block is routed via the remote node.
                        a.ip(&[
                            "route",
                            "add",
                            "10.201.2.0/24",
                            "via",
                            "192.168.201.2",
                            "dev",
                            "ul0",
                        ])?;
                        b.ip(&[
                            "route",
                            "add",
                            "10.201.1.0/24",
                            "via",
                            "192.168.201.1",
                            "dev",
                            "ul0",
                        ])?;
                    }
                }
                b.ip(&[
                    "neigh",
                    "replace",
                    "10.201.2.2",
                    "lladdr",
                    &mac_str(sink_mac),
                    "dev",
                    "pod0",
                    "nud",
                    "permanent",
                ])?;
                a.ip(&[
                    "neigh",
                    "replace",
                    "10.201.1.2",
                    "lladdr",
                    &mac_str(gen_mac),
                    "dev",
                    "pod0",
                    "nud",
                    "permanent",
                ])?;
                first_rx = (a.name.clone(), "pod0".to_owned());
                two_node = Some(TwoNodePorts {
                    a_ns: a.name.clone(),
                    b_ns: b.name.clone(),
                    a_ul_mac: a_ul,
                    b_ul_mac: b_ul,
                    gen_mac,
                    sink_mac,
                });
                nodes.push(a);
                nodes.push(b);
                (a_in, None)
            }
        };
        // The live-frames generator's frames enter the first hop's veth by
        // ndo_xdp_xmit, which drops them unless that veth has NAPI: GRO
        // gives it one (an XDP program there would too, as the sink has).
        if let Some(n) = nodes
            .iter()
            .chain([&gen_ns, &sink_ns])
            .find(|n| n.name == first_rx.0)
        {
            n.exec(&["ethtool", "-K", &first_rx.1, "gro", "on"])?;
        }
        Ok(Topology {
            shape,
            generator: Endpoint {
                ns: gen_ns.name.clone(),
                ifname: gen_if.into(),
                mac: gen_mac,
                ip: GEN_IP,
            },
            sink: Endpoint {
                ns: sink_ns.name.clone(),
                ifname: sink_if.into(),
                mac: sink_mac,
                ip: SINK_IP,
            },
            next_hop_mac,
            router,
            two_node,
            first_rx,
            nodes,
            queues,
            ends: vec![gen_ns, sink_ns],
        })
    }

    /// The router (routed shape) or node A (two-node shape).
    pub fn first_node(&self) -> Option<&Netns> {
        self.nodes.first()
    }

    /// The sink's namespace.
    pub fn sink_ns(&self) -> &Netns {
        &self.ends[1]
    }

    /// The namespace guard of `name`.
    pub fn netns(&self, name: &str) -> Option<&Netns> {
        self.nodes.iter().chain(&self.ends).find(|n| n.name == name)
    }
}

/// Pids of the kernel's threaded-NAPI threads (comm `napi/...`).
fn napi_threads() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("napi/"))
        })
        .collect()
}

/// Moves the receive processing of `dev` (in `ns`) into a NAPI kernel
/// thread pinned to `cpu`: GRO on (which gives a veth its own NAPI), then
/// `threaded`. Without this, a veth's receive work (and so the kernel's
/// forwarding) runs in the softirq of the CPU that transmitted into it,
/// i.e. on the generator's core. Returns the threads pinned.
pub fn thread_napi(ns: &Netns, dev: &str, cpu: usize) -> Result<Vec<i32>, TopoError> {
    thread_napi_on(ns, dev, &[cpu])
}

/// The same for a device with several RX queues: one NAPI thread per
/// queue, the n-th (in creation order, i.e. queue order) pinned to
/// `cpus[n % cpus.len()]`.
pub fn thread_napi_on(ns: &Netns, dev: &str, cpus: &[usize]) -> Result<Vec<i32>, TopoError> {
    let before = napi_threads();
    ns.exec(&["ethtool", "-K", dev, "gro", "on"])?;
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{dev}/threaded"),
    ])?;
    let mut new: Vec<i32> = napi_threads()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    // Created queue by queue: pid order is queue order.
    new.sort_unstable();
    for (n, &pid) in new.iter().enumerate() {
        let cpu = cpus.get(n % cpus.len().max(1)).copied().unwrap_or(0);
        let failed = |e: nix::Error| TopoError::Failed {
            cmd: format!("pin NAPI thread {pid} of {dev} to CPU {cpu}"),
            stderr: e.to_string(),
        };
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).map_err(failed)?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid), &set).map_err(failed)?;
    }
    if new.is_empty() {
        return Err(TopoError::Failed {
            cmd: format!("threaded NAPI on {dev}"),
            stderr: "no napi/ kernel thread appeared".into(),
        });
    }
    Ok(new)
}

/// Whether the names of every namespace this process made are gone.
pub fn none_left() -> bool {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
}
