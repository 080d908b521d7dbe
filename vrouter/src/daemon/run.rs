//! `brindle-vrouter run`: the static appliance mode. One worker per core of
//! `--cpu` (one unpinned worker without it), over one shared UMEM; each
//! port's queues are spread over the workers (a one-queue port goes to the
//! next worker in turn) and frames for another worker's port are handed
//! over by descriptor. The FIB, neighbours and ports come from the command
//! line or a config file and do not change while it runs.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use brindle_xsk::{BusyPoll, Role, Steering, SteeringConfig, Umem, UmemConfig};

use crate::counters::{Counters, DropReason};
use crate::daemon::engine::{Arenas, WorkerHandle, WorkerSnapshot, spawn_all};
use crate::daemon::spec::{IoMode, NeighSpec, Polling, PortSpec, RouteSpec, RouteTarget};
use crate::endpoint::{Endpoint, PortKind};
use crate::fib::{Encap, Fib, NextHop};
use crate::frame::{Port, PortId};
use crate::pipeline::PipelineConfig;
use crate::port::packet::PacketPort;
use crate::port::xdp::{LinkInfo, XdpPort, XdpPortConfig};
use crate::worker::Worker;

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Ports, in worker order.
    pub ports: Vec<PortSpec>,
    /// Static routes.
    pub routes: Vec<RouteSpec>,
    /// Static neighbours.
    pub neighbors: Vec<NeighSpec>,
    /// The node's underlay address (tunnel endpoint, ICMP source); without
    /// one, IPIP/VXLAN are not steered to the vrouter.
    pub node: Option<Ipv4Addr>,
    /// Prefix length of the underlay subnet.
    pub underlay_prefix_len: u8,
    /// VXLAN VNI.
    pub vxlan_vni: u32,
    /// VXLAN UDP port.
    pub vxlan_port: u16,
    /// Cores of the workers, one worker each; empty: one unpinned worker.
    pub cores: Vec<usize>,
    /// Polling policy.
    pub polling: Polling,
    /// Socket kind.
    pub io: IoMode,
    /// UMEM frames (2048 B each).
    pub umem_frames: u32,
}

/// Preferred busy polling's socket settings (`--polling busy-poll`): 20 µs
/// of busy polling per call, up to 64 frames per round.
pub const BUSY_POLL: BusyPoll = BusyPoll {
    usecs: 20,
    budget: 64,
};

/// Built workers and the things that must live as long as them.
pub struct Dataplane {
    /// The workers, one per core (their slots name the same ports).
    pub workers: Vec<Worker>,
    /// The FIB writer (kept so the reader stays valid).
    pub fib: Fib,
    /// The steering maps, when any port uses AF_XDP.
    pub steering: Option<Steering>,
    /// Port names, by id.
    pub port_names: Vec<String>,
}

fn open_umem(frames: u32) -> anyhow::Result<Umem> {
    let config = UmemConfig {
        frame_count: frames,
        ..UmemConfig::default()
    };
    // The mmap happens here; the RLIMIT_MEMLOCK check happens at the first
    // bind (XDP_UMEM_REG), whose error names the limit.
    Umem::new(config)
        .with_context(|| format!("UMEM of {frames} x 2048 B ({} KiB)", u64::from(frames) * 2))
}

/// Builds the worker: ports (AF_XDP, or AF_PACKET when asked or when AF_XDP
/// cannot be opened), routes, neighbours, steering maps.
pub fn build(cfg: &RunConfig) -> anyhow::Result<Dataplane> {
    if cfg.ports.is_empty() {
        bail!("no ports: give at least one --port");
    }
    let mut pipeline = PipelineConfig::new(
        cfg.node.unwrap_or(Ipv4Addr::UNSPECIFIED),
        cfg.underlay_prefix_len,
    );
    pipeline.vxlan_vni = cfg.vxlan_vni;
    pipeline.vxlan_port = cfg.vxlan_port;
    let (mut fib, reader) = Fib::new();

    let wanted_workers = cfg.cores.len().max(1);
    let mut steering = None;
    let heap = |why: &str| -> anyhow::Result<Arenas> {
        if wanted_workers > 1 {
            tracing::warn!(
                cores = ?cfg.cores,
                "{why}: one worker (AF_PACKET frames live in a heap arena that workers cannot share)"
            );
        }
        Ok(Arenas::heap(cfg.umem_frames)?)
    };
    let arenas = match cfg.io {
        IoMode::Packet => heap("--io packet")?,
        IoMode::Xdp | IoMode::Auto => match open_umem(cfg.umem_frames) {
            Ok(umem) => {
                steering = Some(
                    Steering::new(SteeringConfig::default()).context("create the steering maps")?,
                );
                Arenas::shared_umem(umem, wanted_workers)?
            }
            Err(e) if cfg.io == IoMode::Auto => {
                tracing::warn!(error = %format!("{e:#}"), "AF_XDP unavailable: every port uses AF_PACKET (one copy per frame)");
                heap("AF_XDP unavailable")?
            }
            Err(e) => return Err(e),
        },
    };
    let umem_handle = arenas.umem.clone();
    let homes = arenas.homes.clone();
    let mut workers = arenas.into_workers(&pipeline, &fib);
    drop(reader);
    let n_workers = workers.len();

    // Steering: pod prefixes are the prefixes routed to ports, to tunnels
    // and natively via a gateway (what the vrouter must see), as `serve`
    // does; a default route stays out, it would pull in all the node's
    // traffic. The node address turns on IPIP/VXLAN.
    if let Some(s) = &steering {
        s.set_node(cfg.node, cfg.vxlan_port)
            .context("set the node address in the steering map")?;
        let mut pod_prefixes: Vec<(Ipv4Addr, u8)> = cfg
            .routes
            .iter()
            .filter(|r| match r.target {
                RouteTarget::Port(_) | RouteTarget::Ipip(_) | RouteTarget::Vxlan(_) => true,
                RouteTarget::Via(..) => r.prefix.prefix_len() > 0,
                _ => false,
            })
            .filter_map(|r| match r.prefix {
                ipnet::IpNet::V4(n) => Some((n.network(), n.prefix_len())),
                ipnet::IpNet::V6(_) => None,
            })
            .collect();
        for p in &cfg.ports {
            for a in &p.addrs {
                if let IpAddr::V4(v4) = a {
                    pod_prefixes.push((*v4, 32));
                }
            }
        }
        for (addr, len) in pod_prefixes {
            s.add_pod_prefix(addr, len)
                .with_context(|| format!("add {addr}/{len} to the steering map"))?;
        }
    }

    let mut xdp_config = XdpPortConfig {
        umem_frames: workers[0].arena().frames(),
        frame_size: workers[0].arena().frame_size(),
        ..XdpPortConfig::default()
    };
    if cfg.polling == Polling::BusyPoll {
        xdp_config.socket.busy_poll = Some(BUSY_POLL);
    }
    // One-queue ports go to the workers in turn; a port's queues are
    // spread starting at the next worker.
    let mut next_worker = 0usize;
    let mut ids: HashMap<String, PortId> = HashMap::new();
    let mut port_routes: Vec<(ipnet::IpNet, PortId)> = Vec::new();
    let mut port_names = Vec::new();
    for spec in &cfg.ports {
        if ids.contains_key(&spec.name) {
            bail!("port {} given twice", spec.name);
        }
        let link = LinkInfo::read(&spec.name).with_context(|| format!("port {}", spec.name))?;
        let role = match (spec.appliance, spec.kind) {
            (true, _) => Role::All,
            (false, PortKind::Pod) => Role::Pod,
            (false, _) => Role::Uplink,
        };
        let first = next_worker % n_workers;
        let parts: Vec<(usize, Box<dyn Port>)> = match (&umem_handle, &steering) {
            (Some(handle), Some(s)) => {
                match XdpPort::open(handle, s, &spec.name, role, link, &xdp_config) {
                    Ok(p) => {
                        let parts = p.split(n_workers, first);
                        next_worker += parts.len();
                        parts
                            .into_iter()
                            .map(|(w, mut part)| {
                                part.set_home(homes.home(w));
                                (w, Box::new(part) as Box<dyn Port>)
                            })
                            .collect()
                    }
                    Err(e) if cfg.io == IoMode::Auto => {
                        tracing::warn!(port = %spec.name, error = %e, "AF_XDP cannot be opened: falling back to AF_PACKET (one copy per frame)");
                        let mut p = PacketPort::open(&spec.name, link)?;
                        p.set_home(homes.home(first));
                        next_worker += 1;
                        vec![(first, Box::new(p))]
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e))
                            .with_context(|| format!("AF_XDP port {}", spec.name));
                    }
                }
            }
            _ => {
                let mut p = PacketPort::open(&spec.name, link)
                    .with_context(|| format!("AF_PACKET port {}", spec.name))?;
                p.set_home(homes.home(first));
                next_worker += 1;
                vec![(first, Box::new(p))]
            }
        };
        let endpoint = match spec.kind {
            PortKind::Pod => Endpoint::pod(spec.addrs.clone(), None, link.mtu),
            PortKind::Uplink => Endpoint::uplink(link.mac, link.mtu),
            PortKind::Host => Endpoint {
                kind: PortKind::Host,
                mac: link.mac,
                mtu: link.mtu,
                addrs: Vec::new(),
                peer_mac: None,
            },
        };
        let id = workers[0].port_slots() as PortId;
        let placed = homes.place_port(parts, &spec.name, link.mac, link.mtu, id);
        for (worker, (port, remote)) in workers.iter_mut().zip(placed) {
            worker.set_port_remote(id, port, endpoint.clone(), remote);
        }
        ids.insert(spec.name.clone(), id);
        port_names.push(spec.name.clone());
        for a in &spec.addrs {
            let prefix = ipnet::IpNet::from(*a);
            port_routes.push((prefix, id));
            fib.try_insert(prefix, NextHop::Local { port: id })
                .map_err(|e| anyhow::anyhow!("route {prefix}: {e:?}"))?;
        }
    }

    let port_of = |name: &str| -> anyhow::Result<PortId> {
        ids.get(name)
            .copied()
            .with_context(|| format!("no port named {name}"))
    };
    for r in &cfg.routes {
        let nh = match &r.target {
            RouteTarget::Port(p) => {
                let port = port_of(p)?;
                port_routes.push((r.prefix, port));
                NextHop::Local { port }
            }
            RouteTarget::Ipip(remote) => NextHop::Encap {
                encap: Encap::Ipip,
                remote: *remote,
            },
            RouteTarget::Vxlan(remote) => NextHop::Encap {
                encap: Encap::Vxlan { vni: cfg.vxlan_vni },
                remote: *remote,
            },
            RouteTarget::Via(gw, p) => NextHop::Gateway {
                via: *gw,
                port: port_of(p)?,
            },
            RouteTarget::Blackhole => NextHop::Blackhole,
            RouteTarget::Host => NextHop::Host,
        };
        fib.try_insert(r.prefix, nh)
            .map_err(|e| anyhow::anyhow!("route {}: {e:?}", r.prefix))?;
    }

    for n in &cfg.neighbors {
        // A neighbour inside a prefix routed to a port is that port's peer
        // (the sink of the appliance mode, a pod whose MAC is known).
        let covering = port_routes
            .iter()
            .filter(|(p, _)| p.contains(&n.addr))
            .max_by_key(|(p, _)| p.prefix_len())
            .map(|&(_, id)| id);
        let port = match &n.port {
            Some(p) => Some(port_of(p)?),
            None => covering,
        };
        let ports: Vec<PortId> = match port {
            Some(id) => vec![id],
            None => (0..port_names.len() as PortId).collect(),
        };
        for id in ports {
            for worker in &mut workers {
                worker.pipeline_mut().neigh_mut().insert(id, n.addr, n.mac);
                if covering == Some(id)
                    && let Some(ep) = worker.pipeline_mut().ports_mut().get_mut(id)
                {
                    ep.peer_mac = Some(n.mac);
                }
            }
        }
    }

    Ok(Dataplane {
        workers,
        fib,
        steering,
        port_names,
    })
}

/// Starts the workers, waits for `stop`, and returns each worker's last
/// counters (in worker order) once they have stopped and released their
/// ports.
pub fn run_workers(
    workers: Vec<Worker>,
    cores: &[usize],
    polling: Polling,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<WorkerSnapshot>> {
    let mut handles = spawn_all(workers, cores, polling, stop).context("start the workers")?;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(stop_and_collect(&mut handles))
}

/// Each worker's counters as they were when it stopped polling (it then
/// released its ports).
fn stop_and_collect(handles: &mut [WorkerHandle]) -> Vec<WorkerSnapshot> {
    handles
        .iter_mut()
        .map(|h| h.join().unwrap_or_default())
        .collect()
}

/// The counters of several workers added up.
pub fn sum_counters(snaps: &[WorkerSnapshot]) -> Counters {
    let mut t = Counters::default();
    for s in snaps {
        let c = &s.counters;
        t.rx_packets += c.rx_packets;
        t.rx_bytes += c.rx_bytes;
        t.tx_packets += c.tx_packets;
        t.tx_bytes += c.tx_bytes;
        t.forwarded += c.forwarded;
        t.arp_replies += c.arp_replies;
        t.nd_adverts += c.nd_adverts;
        t.arp_requests += c.arp_requests;
        t.arp_learned += c.arp_learned;
        t.icmp_generated += c.icmp_generated;
        t.encap_ipip += c.encap_ipip;
        t.encap_vxlan += c.encap_vxlan;
        t.decap_ipip += c.decap_ipip;
        t.decap_vxlan += c.decap_vxlan;
        t.generated += c.generated;
        t.consumed += c.consumed;
        t.neighbor_held += c.neighbor_held;
        t.neighbor_released += c.neighbor_released;
        for (sum, d) in t.drops.iter_mut().zip(c.drops) {
            *sum += d;
        }
    }
    t
}

/// Formats the counters as `key=value` pairs, non-zero drops by reason.
pub fn format_counters(c: &Counters) -> String {
    let mut s = format!(
        "rx_packets={} rx_bytes={} tx_packets={} tx_bytes={} forwarded={} arp_replies={} icmp_generated={} encap_ipip={} encap_vxlan={} decap_ipip={} decap_vxlan={}",
        c.rx_packets,
        c.rx_bytes,
        c.tx_packets,
        c.tx_bytes,
        c.forwarded,
        c.arp_replies,
        c.icmp_generated,
        c.encap_ipip,
        c.encap_vxlan,
        c.decap_ipip,
        c.decap_vxlan
    );
    for r in DropReason::ALL {
        let n = c.drops_for(r);
        if n > 0 {
            s.push_str(&format!(" drop_{}={n}", r.name()));
        }
    }
    s
}

/// Sets `stop` on SIGINT or SIGTERM, from a small thread of its own.
pub fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    let flag = stop.clone();
    // Registering here, before the thread starts, means a signal that
    // arrives right after `run` prints "running" is not lost.
    let (mut term, mut int) = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            });
            flag.store(true, Ordering::Relaxed);
        })
        .context("signal thread")?;
    Ok(stop)
}

/// The whole static mode: build, start the pinned workers, poll until a
/// signal, stop cleanly (ports release their frames, programs detach,
/// sockets close), and print the counters: the sum, then one line per
/// worker with its hand-off counts.
pub fn run(cfg: &RunConfig) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let dp = build(cfg)?;
    println!(
        "running: {} port(s) [{}], {} route(s), polling {:?}, {} worker(s) on cores {:?}",
        dp.port_names.len(),
        dp.port_names.join(", "),
        dp.fib.len(),
        cfg.polling,
        dp.workers.len(),
        cfg.cores
    );
    let Dataplane {
        workers,
        fib,
        steering,
        port_names,
    } = dp;
    let snaps = run_workers(workers, &cfg.cores, cfg.polling, &stop)?;
    // The workers have released their ports; the maps and FIB go last.
    drop((fib, steering, port_names));
    println!("stopped: {}", format_counters(&sum_counters(&snaps)));
    for (i, s) in snaps.iter().enumerate() {
        let line = format!(
            "worker {i}: {} busy_polls={} idle_polls={} handoff_out={} handoff_in={} handoff_drops={} cpu_user_ms={} cpu_system_ms={}",
            format_counters(&s.counters),
            s.busy_polls,
            s.idle_polls,
            s.handoff.out,
            s.handoff.r#in,
            s.handoff.drops,
            s.cpu_user_us / 1000,
            s.cpu_system_us / 1000
        );
        // Also on stderr, for harnesses that keep only the first stdout line.
        tracing::info!("{line}");
        println!("{line}");
    }
    Ok(())
}
