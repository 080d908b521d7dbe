//! `brindle-vrouter run`: the static appliance mode. One worker, pinned to
//! `cpu`, owns every port; the FIB, neighbours and ports come from the
//! command line or a config file and do not change while it runs.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use brindle_xsk::{Role, Steering, SteeringConfig, Umem, UmemConfig, UmemHandle};

use crate::counters::{Counters, DropReason};
use crate::daemon::spec::{IoMode, NeighSpec, Polling, PortSpec, RouteSpec, RouteTarget};
use crate::endpoint::{Endpoint, PortKind};
use crate::fib::{Encap, Fib, NextHop};
use crate::frame::{FrameArena, Port, PortId};
use crate::pipeline::PipelineConfig;
use crate::port::packet::PacketPort;
use crate::port::xdp::{LinkInfo, XdpPort, XdpPortConfig, umem_arena};
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
    /// Core to pin the worker to.
    pub cpu: Option<usize>,
    /// Polling policy.
    pub polling: Polling,
    /// Socket kind.
    pub io: IoMode,
    /// UMEM frames (2048 B each).
    pub umem_frames: u32,
}

/// A built worker and the things that must live as long as it.
pub struct Dataplane {
    /// The worker.
    pub worker: Worker,
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

    let mut umem_handle: Option<UmemHandle> = None;
    let mut steering = None;
    let arena = match cfg.io {
        IoMode::Packet => FrameArena::new_heap(cfg.umem_frames, 2048),
        IoMode::Xdp | IoMode::Auto => match open_umem(cfg.umem_frames) {
            Ok(umem) => {
                let (arena, handle) = umem_arena(umem);
                umem_handle = Some(handle);
                steering = Some(
                    Steering::new(SteeringConfig::default()).context("create the steering maps")?,
                );
                arena
            }
            Err(e) if cfg.io == IoMode::Auto => {
                tracing::warn!(error = %format!("{e:#}"), "AF_XDP unavailable: every port uses AF_PACKET (one copy per frame)");
                FrameArena::new_heap(cfg.umem_frames, 2048)
            }
            Err(e) => return Err(e),
        },
    };
    let mut worker = Worker::new(arena, pipeline, reader);

    // Steering: pod prefixes are the prefixes routed to ports and to tunnels
    // (what the vrouter must see); the node address turns on IPIP/VXLAN.
    if let Some(s) = &steering {
        s.set_node(cfg.node, cfg.vxlan_port)
            .context("set the node address in the steering map")?;
        let mut pod_prefixes: Vec<(Ipv4Addr, u8)> = cfg
            .routes
            .iter()
            .filter(|r| {
                matches!(
                    r.target,
                    RouteTarget::Port(_) | RouteTarget::Ipip(_) | RouteTarget::Vxlan(_)
                )
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

    let xdp_config = XdpPortConfig {
        umem_frames: worker.arena().frames(),
        frame_size: worker.arena().frame_size(),
        ..XdpPortConfig::default()
    };
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
        let port: Box<dyn Port> = match (&umem_handle, &steering) {
            (Some(handle), Some(s)) => {
                match XdpPort::open(handle, s, &spec.name, role, link, &xdp_config) {
                    Ok(p) => Box::new(p),
                    Err(e) if cfg.io == IoMode::Auto => {
                        tracing::warn!(port = %spec.name, error = %e, "AF_XDP cannot be opened: falling back to AF_PACKET (one copy per frame)");
                        Box::new(PacketPort::open(&spec.name, link)?)
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e))
                            .with_context(|| format!("AF_XDP port {}", spec.name));
                    }
                }
            }
            _ => Box::new(
                PacketPort::open(&spec.name, link)
                    .with_context(|| format!("AF_PACKET port {}", spec.name))?,
            ),
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
        let id = worker.add_port(port, endpoint);
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
            worker.pipeline_mut().neigh_mut().insert(id, n.addr, n.mac);
            if covering == Some(id)
                && let Some(ep) = worker.pipeline_mut().ports_mut().get_mut(id)
            {
                ep.peer_mac = Some(n.mac);
            }
        }
    }

    Ok(Dataplane {
        worker,
        fib,
        steering,
        port_names,
    })
}

/// Polls until `stop` is set (the same loop as `serve`'s worker, with no
/// commands); returns the worker's counters.
pub fn run_worker(dp: &mut Dataplane, polling: Polling, stop: &AtomicBool) -> Counters {
    let loops = std::sync::atomic::AtomicU64::new(0);
    crate::daemon::engine::poll_loop(
        &mut dp.worker,
        &crossbeam_channel::never(),
        polling,
        stop,
        &loops,
    );
    dp.worker.counters()
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

/// The whole static mode: build, pin, poll until a signal, stop cleanly
/// (dropping the ports detaches the programs and closes the sockets), and
/// print the counters.
pub fn run(cfg: &RunConfig) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let mut dp = build(cfg)?;
    if let Some(cpu) = cfg.cpu {
        let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
        if !pinned {
            tracing::warn!(cpu, "could not pin the worker to the core");
        }
    }
    println!(
        "running: {} port(s) [{}], {} route(s), polling {:?}",
        dp.port_names.len(),
        dp.port_names.join(", "),
        dp.fib.len(),
        cfg.polling
    );
    let counters = run_worker(&mut dp, cfg.polling, &stop);
    // Graceful stop: sockets close and programs detach here.
    drop(dp);
    println!("stopped: {}", format_counters(&counters));
    Ok(())
}
