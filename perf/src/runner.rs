//! Scenarios and trials: each scenario builds its topology, sets up what
//! forwards, runs its trials back to back and tears everything down.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::calico;
use crate::calico_policy;
use crate::forwarder::{Availability, Forwarder};
use crate::frame::{FlowSpec, FrameSize, WIRE_OVERHEAD};
use crate::report::{
    CoreTime, ScenarioResult, Status, Trial, TrialKind, cpu_shares, cpu_times, softirq_seconds,
    task_cpu_s,
};
use crate::search::ZeroLossSearch;
use crate::topo::{self, Shape, TopoError, Topology, Underlay};
use crate::traffic::{
    GeneratorConfig, GeneratorKind, GeneratorResult, Rate, Sink, SinkConfig, ThreadCpu,
    TrafficError, spawn_generator,
};

/// Online CPUs.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// generator — veth — sink, no router: the generator's own ceiling.
    Generator,
    /// The same with the AF_XDP TX generator, whatever `--generator` says:
    /// the old generator's ceiling beside the new one's, in the same run.
    GeneratorAfxdp,
    /// generator — router (kernel IPv4 forwarding) — sink.
    Kernel,
    /// The same with conntrack and a Calico-style iptables rule set.
    KernelCalico,
    /// generator — node A — VXLAN over an underlay veth — node B — sink.
    KernelVxlan,
    /// The same two nodes with IP-in-IP.
    KernelIpip,
    /// The same two nodes with plain routes (no encapsulation).
    KernelNative,
    /// The router's forwarding done by the null AF_XDP forwarder.
    NullAfxdp,
    /// The router's forwarding done by brindle-vrouter.
    Brindle,
    /// The two nodes' forwarding done by one brindle-vrouter each, over
    /// VXLAN: the comparison for kernel-vxlan.
    BrindleVxlan,
    /// brindle-vrouter as the node daemon (`serve`), both router ports
    /// pods with workloads, programmed over its socket, no policy: the
    /// reference for the policy scenarios.
    BrindleDaemon,
    /// The same with kernel-calico's rule set as Calico policies
    /// ([`crate::calico_policy`]) in one `ApplyPolicy`: established flows.
    BrindlePolicy,
    /// The same with 10,000 flows (source ports), each new to the flow
    /// table on its first frame.
    BrindlePolicyNew,
}

/// Flows of the `brindle-policy-new` scenario.
pub const NEW_FLOWS: u16 = 10_000;

impl Scenario {
    /// Every scenario, in run order.
    pub const ALL: [Scenario; 13] = [
        Scenario::Generator,
        Scenario::GeneratorAfxdp,
        Scenario::Kernel,
        Scenario::KernelCalico,
        Scenario::KernelVxlan,
        Scenario::KernelIpip,
        Scenario::KernelNative,
        Scenario::NullAfxdp,
        Scenario::Brindle,
        Scenario::BrindleVxlan,
        Scenario::BrindleDaemon,
        Scenario::BrindlePolicy,
        Scenario::BrindlePolicyNew,
    ];

    /// Its name in tables and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Generator => "generator",
            Scenario::GeneratorAfxdp => "generator-afxdp",
            Scenario::Kernel => "kernel",
            Scenario::KernelCalico => "kernel-calico",
            Scenario::KernelVxlan => "kernel-vxlan",
            Scenario::KernelIpip => "kernel-ipip",
            Scenario::KernelNative => "kernel-native",
            Scenario::NullAfxdp => "null-afxdp",
            Scenario::Brindle => "brindle",
            Scenario::BrindleVxlan => "brindle-vxlan",
            Scenario::BrindleDaemon => "brindle-daemon",
            Scenario::BrindlePolicy => "brindle-policy",
            Scenario::BrindlePolicyNew => "brindle-policy-new",
        }
    }

    /// One line on what it measures.
    pub fn description(&self) -> &'static str {
        match self {
            Scenario::Generator => {
                "generator -> veth -> sink, no router: the generator's own ceiling"
            }
            Scenario::GeneratorAfxdp => {
                "the same with the AF_XDP copy-mode TX generator: its ceiling, for comparison"
            }
            Scenario::Kernel => {
                "kernel IPv4 forwarding between two veths (Calico's standard dataplane without policy)"
            }
            Scenario::KernelCalico => {
                "kernel forwarding + conntrack + Calico-style iptables (50 endpoints)"
            }
            Scenario::KernelVxlan => {
                "two nodes, kernel VXLAN encapsulation and decapsulation over an underlay veth"
            }
            Scenario::KernelIpip => {
                "two nodes, kernel IP-in-IP encapsulation and decapsulation over an underlay veth"
            }
            Scenario::KernelNative => {
                "two nodes, kernel routing over an underlay veth without encapsulation"
            }
            Scenario::NullAfxdp => {
                "null AF_XDP forwarder (MAC + TTL rewrite, shared UMEM, one pinned core): the copy-mode ceiling on veth"
            }
            Scenario::Brindle => "brindle-vrouter in static `run` mode between the router's veths",
            Scenario::BrindleVxlan => {
                "two nodes, a brindle-vrouter on each: VXLAN encapsulation on A, decapsulation on B"
            }
            Scenario::BrindleDaemon => {
                "brindle-vrouter serve, the router's ports as pods with workloads (ctrl's programming over the socket), no policy"
            }
            Scenario::BrindlePolicy => {
                "brindle-daemon + kernel-calico's rule set as Calico policies (50 endpoints) in one ApplyPolicy; established flows"
            }
            Scenario::BrindlePolicyNew => {
                "brindle-policy with 10,000 flows, each new to the flow table on its first frame"
            }
        }
    }

    /// Whether it runs with `workers` forwarding cores: the kernel's
    /// forwarding (one NAPI thread per RX queue: RSS), brindle (`--cpu`
    /// with several cores) and the generator's own ceiling. The null
    /// forwarder is one thread, and the two-node paths keep one queue.
    pub fn supports_workers(&self, workers: usize) -> bool {
        workers <= 1
            || matches!(
                self,
                Scenario::Generator
                    | Scenario::Kernel
                    | Scenario::KernelCalico
                    | Scenario::Brindle
                    | Scenario::BrindleDaemon
                    | Scenario::BrindlePolicy
                    | Scenario::BrindlePolicyNew
            )
    }

    fn shape(&self) -> Shape {
        match self {
            Scenario::Generator | Scenario::GeneratorAfxdp => Shape::Direct,
            Scenario::KernelVxlan => Shape::TwoNode(Underlay::Vxlan),
            Scenario::KernelIpip => Shape::TwoNode(Underlay::Ipip),
            Scenario::KernelNative | Scenario::BrindleVxlan => Shape::TwoNode(Underlay::Native),
            _ => Shape::Routed,
        }
    }
}

/// Options of a run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// Frame sizes.
    pub sizes: Vec<FrameSize>,
    /// Seconds per trial.
    pub duration: Duration,
    /// Flows.
    pub flows: u16,
    /// Rate of the throughput trial.
    pub rate: Rate,
    /// Run the zero-loss search too.
    pub zero_loss: bool,
    /// Loss a zero-loss trial may have (fraction).
    pub loss_tolerance: f64,
    /// Trials of the zero-loss search, at most.
    pub zero_loss_trials: u32,
    /// Latency trial at this fraction of the measured maximum.
    pub latency_fraction: Option<f64>,
    /// Whose maximum the latency fraction is of: this scenario's, when it
    /// ran earlier in the run (the kernel's by default, so every path is
    /// measured at the same offered load), else each scenario's own.
    pub latency_reference: Option<Scenario>,
    /// Generator CPU.
    pub gen_cpu: usize,
    /// Forwarder CPU.
    pub fwd_cpu: usize,
    /// How the generator sends (every scenario but `generator-afxdp`).
    pub generator: GeneratorKind,
    /// brindle-vrouter binary for the brindle scenario.
    pub brindle_binary: PathBuf,
    /// Calico endpoints.
    pub calico_endpoints: usize,
    /// Put the receive work of the first hop in a NAPI thread on `fwd_cpu`,
    /// so every forwarder (kernel or AF_XDP) gets the same one core and the
    /// generator's core only generates.
    pub threaded_napi: bool,
    /// Worker core counts to run each scenario with (`--workers 1,2`).
    pub workers: Vec<usize>,
}

/// Where a trial's threads run for `workers` forwarding cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Forwarding cores: NAPI thread of RX queue n on `fwd_cpus[n]`, and
    /// brindle's `--cpu` list.
    pub fwd_cpus: Vec<usize>,
    /// Generator threads, one per queue: a veth puts an XDP frame on the
    /// receiver's queue of the sending CPU, so the n-th thread runs on the
    /// n-th CPU to reach queue n.
    pub gen_cpus: Vec<usize>,
}

impl Placement {
    /// One worker: the generator on `gen_cpu`, forwarding on `fwd_cpu`.
    /// Several: as many queues, generator threads on CPUs 0.. and the
    /// forwarding of queue n on CPU n (shared with a generator thread:
    /// this machine has no third core).
    pub fn new(options: &RunOptions, workers: usize, cores: usize) -> Placement {
        let cores = cores.max(1);
        if workers <= 1 {
            return Placement {
                fwd_cpus: vec![options.fwd_cpu],
                gen_cpus: vec![options.gen_cpu],
            };
        }
        Placement {
            fwd_cpus: (0..workers)
                .map(|i| (options.fwd_cpu + i) % cores)
                .collect(),
            gen_cpus: (0..workers)
                .map(|i| (options.gen_cpu + i) % cores)
                .collect(),
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            scenarios: Scenario::ALL.to_vec(),
            sizes: vec![FrameSize::Fixed(64), FrameSize::Fixed(1500)],
            duration: Duration::from_secs(2),
            flows: 16,
            rate: Rate::Max,
            zero_loss: false,
            loss_tolerance: 0.0,
            zero_loss_trials: 8,
            latency_fraction: Some(0.5),
            latency_reference: Some(Scenario::Kernel),
            gen_cpu: 0,
            fwd_cpu: 1,
            generator: GeneratorKind::Live,
            brindle_binary: PathBuf::from("brindle-vrouter"),
            calico_endpoints: 50,
            threaded_napi: true,
            workers: vec![1],
        }
    }
}

/// Errors of a scenario.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Topology or rule setup.
    #[error(transparent)]
    Topo(#[from] TopoError),
    /// Generator, sink or forwarder.
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// The user pressed Ctrl-C.
    #[error("interrupted")]
    Interrupted,
}

static TAG: AtomicU16 = AtomicU16::new(1);

/// Flow addresses for a topology.
pub fn flow_spec(t: &Topology) -> FlowSpec {
    FlowSpec {
        dst_mac: t.next_hop_mac,
        src_mac: t.generator.mac,
        src_ip: t.generator.ip,
        dst_ip: t.sink.ip,
        base_src_port: 10_000,
        dst_port: 9,
    }
}

/// One trial in a built topology: the sink starts, the forwarder (if any)
/// starts, the generator threads send for `duration`, 200 ms drain, counts.
pub fn run_trial(
    topology: &Topology,
    prepared: &Prepared,
    options: &RunOptions,
    size: FrameSize,
    rate: Rate,
    kind: TrialKind,
) -> Result<Trial, RunError> {
    if topo::STOP.load(Ordering::Relaxed) {
        return Err(RunError::Interrupted);
    }
    let tag = TAG.fetch_add(1, Ordering::Relaxed);
    let spec = flow_spec(topology);
    let sink = Sink::start(SinkConfig {
        endpoint: topology.sink.clone(),
        tag,
        base_src_port: spec.base_src_port,
        flows: prepared.flows,
        frames: 2048,
        queues: topology.queues,
    })?;
    let running = match (&prepared.forwarder, &topology.router, &topology.two_node) {
        (Forwarder::BrindleVxlan { .. }, _, Some(nodes)) => prepared.forwarder.start_pair(nodes)?,
        (Forwarder::BrindleVxlan { .. }, _, None) | (_, None, _) => Default::default(),
        (_, Some(ports), _) => prepared.forwarder.start(ports)?,
    };
    let napi_cpu = |pids: &[i32]| pids.iter().filter_map(|&p| task_cpu_s(p)).sum::<f64>();
    let napi_before = napi_cpu(&prepared.napi_threads);
    let cpu_before = cpu_times();
    let process_before = running.process_cpu();
    // IMIX interleaves its sizes frame by frame only from the AF_XDP
    // generator (its UMEM chunks hold the 12-frame cycle); the live
    // generator sends one frame per kernel call, so one size at a time.
    //
    // Several generator threads (one per worker core, each on its own
    // queue) also use the AF_XDP generator: two concurrent live-frames
    // calls on two CPUs into a two-queue veth lost 40-70 % of the frames
    // here and delayed others by the whole trial, while AF_XDP TX threads
    // bound to queues 0 and 1 deliver every frame.
    let threads = prepared.placement.gen_cpus.len().max(1);
    let generator_kind = match size {
        FrameSize::Imix => GeneratorKind::Afxdp,
        FrameSize::Fixed(_) if threads > 1 => GeneratorKind::Afxdp,
        FrameSize::Fixed(_) => prepared.generator,
    };
    let flows = prepared.flows.max(threads as u16);
    let per_thread = flows / threads as u16;
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = prepared
        .placement
        .gen_cpus
        .iter()
        .enumerate()
        .map(|(i, &cpu)| {
            let first_flow = per_thread * i as u16;
            let thread_flows = if i + 1 == threads {
                flows - first_flow
            } else {
                per_thread
            };
            spawn_generator(
                GeneratorConfig {
                    kind: generator_kind,
                    endpoint: topology.generator.clone(),
                    flow: FlowSpec {
                        base_src_port: spec.base_src_port + first_flow,
                        ..spec
                    },
                    flows: thread_flows,
                    size,
                    rate: match rate {
                        Rate::Max => Rate::Max,
                        Rate::Pps(p) => Rate::Pps(p / threads as f64),
                    },
                    duration: options.duration,
                    tag,
                    cpu: Some(cpu),
                    frames: 2048,
                    queue: i as u32 % topology.queues.max(1),
                    stream: i as u64,
                },
                stop.clone(),
            )
        })
        .collect();
    let mut generator = GeneratorResult::default();
    let mut failure = None;
    for h in handles {
        match h.join().map_err(|_| TrafficError::Thread("generator")) {
            Ok(Ok(g)) => {
                generator.sent += g.sent;
                generator.bytes += g.bytes;
                generator.per_flow.extend(g.per_flow);
                generator.elapsed_s = generator.elapsed_s.max(g.elapsed_s);
                generator.cpu.user_s += g.cpu.user_s;
                generator.cpu.system_s += g.cpu.system_s;
            }
            Ok(Err(e)) | Err(e) => failure = Some(e),
        }
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    // Frames in flight when the generators stop still count: the sink
    // stops once 200 ms pass without one (at most 2 s). A fixed 200 ms
    // counted a starved softirq's late frames as lost (1,214-1,548 of
    // 1,998 received in a 2-worker trial with the cores busy elsewhere).
    sink.drain(Duration::from_millis(200), Duration::from_secs(2));
    let cpu_after = cpu_times();
    let cpus = cpu_shares(&cpu_before, &cpu_after);
    let softirq_s = softirq_seconds(&cpu_before, &cpu_after, &prepared.placement.fwd_cpus);
    let napi_cpu_s = napi_cpu(&prepared.napi_threads) - napi_before;
    let process_cpu = match (process_before, running.process_cpu()) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        _ => None,
    };
    let forwarder_stats = running.finish()?.map(|mut f| {
        // A forwarder process (brindle): its CPU over the trial's window.
        if let Some(c) = process_cpu {
            f.cpu = c;
        }
        f
    });
    let seen = sink.finish()?;
    if topo::STOP.load(Ordering::Relaxed) {
        return Err(RunError::Interrupted);
    }
    let elapsed = generator.elapsed_s.max(1e-9);
    let received = seen.counter.received;
    let lost = seen.counter.lost(generator.sent);
    let wire_bits = (seen.counter.bytes + received * u64::from(4 + WIRE_OVERHEAD)) as f64 * 8.0;
    let forwarder_cpu = forwarder_stats
        .as_ref()
        .map_or(ThreadCpu::default(), |f| f.cpu);
    let forwarding_cpu_s = napi_cpu_s + forwarder_cpu.user_s + forwarder_cpu.system_s;
    let per_frame =
        |cpu: f64, frames: u64| (frames > 0 && cpu > 0.0).then(|| cpu * 1e9 / frames as f64);
    Ok(Trial {
        forwarding_ns_per_frame: per_frame(forwarding_cpu_s, received),
        generator_ns_per_frame: per_frame(
            generator.cpu.user_s + generator.cpu.system_s,
            generator.sent,
        ),
        napi_cpu_s,
        forwarding_cpu_s,
        core_time: CoreTime {
            user_s: forwarder_cpu.user_s,
            system_s: forwarder_cpu.system_s,
            napi_s: napi_cpu_s,
            softirq_s,
        },
        workers: prepared.workers,
        generator: generator_kind.name().into(),
        kind,
        frame_size: size.label(),
        mean_wire_size: size.mean_wire_size(),
        target_pps: match rate {
            Rate::Max => None,
            Rate::Pps(p) => Some(p),
        },
        sent: generator.sent,
        received,
        offered_pps: generator.sent as f64 / elapsed,
        rx_pps: received as f64 / elapsed,
        rx_wire_gbps: wire_bits / elapsed / 1e9,
        lost,
        loss_ratio: if generator.sent > 0 {
            lost as f64 / generator.sent as f64
        } else {
            0.0
        },
        reordered: seen.counter.reordered,
        foreign: seen.foreign,
        sink_drops: seen.xdp.rx_dropped + seen.xdp.rx_ring_full,
        latency: seen.counter.latency_summary(),
        elapsed_s: elapsed,
        generator_cpu: generator.cpu,
        forwarder: forwarder_stats,
        cpus,
    })
}

/// Sets a scenario up in its topology; returns notes for the report and
/// the forwarder to use.
/// A scenario set up in its topology.
pub struct Prepared {
    /// What forwards.
    pub forwarder: Forwarder,
    /// Facts for the report.
    pub notes: Vec<String>,
    /// The first hop's NAPI threads, whose CPU time is forwarding work.
    pub napi_threads: Vec<i32>,
    /// The generator the trials use.
    pub generator: GeneratorKind,
    /// Forwarding cores.
    pub workers: usize,
    /// Where the threads run.
    pub placement: Placement,
    /// Flows of its trials (`--flows`, or the scenario's own).
    pub flows: u16,
}

fn prepare(
    scenario: Scenario,
    topology: &Topology,
    options: &RunOptions,
    workers: usize,
) -> Result<Prepared, RunError> {
    let placement = Placement::new(options, workers, online_cpus());
    let generator = match scenario {
        Scenario::GeneratorAfxdp => GeneratorKind::Afxdp,
        _ => options.generator,
    };
    let mut notes = vec![format!(
        "generator: {} on CPU(s) {:?}; IMIX, and several generator threads, from the AF_XDP generator (interleaved sizes, one TX queue per thread)",
        match generator {
            GeneratorKind::Live => "BPF_PROG_TEST_RUN live frames (XDP stamp + redirect)",
            GeneratorKind::Afxdp => "AF_XDP TX, copy mode",
        },
        placement.gen_cpus
    )];
    let mut napi_threads = Vec::new();
    if options.threaded_napi {
        // veth hands an skb to the peer's NAPI only if the sender has no
        // TSO (or the peer runs XDP): turn it off on the generator's end,
        // which sends by XDP or AF_XDP and has no use for it.
        if let Some(g) = topology.netns(&topology.generator.ns) {
            g.exec(&["ethtool", "-K", &topology.generator.ifname, "tso", "off"])?;
        }
        let (ns, dev) = &topology.first_rx;
        if let Some(n) = topology.netns(ns) {
            let pids = topo::thread_napi_on(n, dev, &placement.fwd_cpus)?;
            napi_threads.clone_from(&pids);
            notes.push(format!(
                "{workers} worker core(s): receive work of {dev} ({} RX queue(s)) in NAPI thread(s) {pids:?} pinned to CPU(s) {:?}",
                topology.queues, placement.fwd_cpus
            ));
        }
    }
    let forwarder = match scenario {
        Scenario::NullAfxdp => Forwarder::NullXsk {
            cpu: options.fwd_cpu,
        },
        Scenario::Brindle => Forwarder::Brindle {
            binary: options.brindle_binary.clone(),
            cpus: placement.fwd_cpus.clone(),
        },
        Scenario::BrindleVxlan => Forwarder::BrindleVxlan {
            binary: options.brindle_binary.clone(),
            cpu: options.fwd_cpu,
        },
        Scenario::BrindleDaemon | Scenario::BrindlePolicy | Scenario::BrindlePolicyNew => {
            let set =
                calico_policy::policy_set(options.calico_endpoints, topo::GEN_IP, topo::SINK_IP)
                    .map_err(|e| TrafficError::Vrouter(format!("the policy set: {e}")))?;
            let policy = (scenario != Scenario::BrindleDaemon).then(|| {
                notes.push(set.summary());
                Box::new(set.update.clone())
            });
            Forwarder::BrindleDaemon {
                binary: options.brindle_binary.clone(),
                cpus: placement.fwd_cpus.clone(),
                workloads: (set.src, set.dst),
                policy,
            }
        }
        _ => Forwarder::Kernel,
    };
    let flows = if scenario == Scenario::BrindlePolicyNew {
        NEW_FLOWS
    } else {
        options.flows
    };
    if matches!(forwarder, Forwarder::BrindleVxlan { .. }) {
        // Only the vrouters forward (the kernel's routes via the underlay
        // stay, as on a node where the vrouter took over).
        for n in &topology.nodes {
            n.sysctl(&["net.ipv4.ip_forward=0"])?;
        }
    }
    if let (
        Forwarder::NullXsk { .. } | Forwarder::Brindle { .. } | Forwarder::BrindleDaemon { .. },
        Some(router),
    ) = (&forwarder, topology.first_node())
    {
        // The kernel must not forward what reaches it (frames the XDP
        // program passes): the forwarder is the only path.
        router.sysctl(&["net.ipv4.ip_forward=0"])?;
    }
    if scenario == Scenario::KernelCalico
        && let Some(router) = topology.first_node()
    {
        let set = calico::rule_set(
            options.calico_endpoints,
            topo::ROUTER_IN,
            topo::ROUTER_OUT,
            topo::GEN_IP,
            topo::SINK_IP,
        );
        router.exec_with_input(&["ipset", "restore"], Some(&set.ipsets))?;
        router.exec_with_input(&["iptables-restore", "--noflush"], Some(&set.iptables))?;
        let mut count = 0;
        let mut per_table = Vec::new();
        for (table, _) in &set.per_table {
            let installed = router.exec(&["iptables-save", "-t", table])?;
            let n = installed.lines().filter(|l| l.starts_with("-A ")).count();
            count += n;
            per_table.push(format!("{table} {n}"));
        }
        let line = format!(
            "iptables: {count} rules installed ({}; generated {}: {}), {} ipsets, a probe frame is matched against about {} rules; conntrack on (one-way UDP stays NEW)",
            per_table.join(", "),
            set.rules,
            set.per_table_summary(),
            set.sets,
            set.walked
        );
        notes.push(line);
    }
    Ok(Prepared {
        forwarder,
        notes,
        napi_threads,
        generator,
        workers,
        placement,
        flows,
    })
}

/// Runs one scenario; `progress` gets a line per trial.
pub fn run_scenario(
    scenario: Scenario,
    options: &RunOptions,
    earlier: &[ScenarioResult],
    progress: &mut dyn FnMut(&str),
) -> ScenarioResult {
    run_scenario_with(scenario, 1, options, earlier, progress)
}

/// Runs one scenario with `workers` forwarding cores.
pub fn run_scenario_with(
    scenario: Scenario,
    workers: usize,
    options: &RunOptions,
    earlier: &[ScenarioResult],
    progress: &mut dyn FnMut(&str),
) -> ScenarioResult {
    let mut result = ScenarioResult {
        scenario: scenario.name().into(),
        workers,
        description: scenario.description().into(),
        status: Status::Ran,
        trials: Vec::new(),
        zero_loss_pps: Vec::new(),
        notes: Vec::new(),
    };
    if matches!(
        scenario,
        Scenario::Brindle
            | Scenario::BrindleVxlan
            | Scenario::BrindleDaemon
            | Scenario::BrindlePolicy
            | Scenario::BrindlePolicyNew
    ) {
        let f = Forwarder::Brindle {
            binary: options.brindle_binary.clone(),
            cpus: Placement::new(options, workers, online_cpus()).fwd_cpus,
        };
        if let Availability::NotAvailable(why) = f.availability() {
            progress(&format!("{}: not available ({why})", scenario.name()));
            result.status = Status::NotAvailable(why);
            return result;
        }
    }
    match scenario_trials(scenario, workers, options, earlier, progress, &mut result) {
        Ok(()) => {}
        // A kernel built without the IPIP driver (CONFIG_NET_IPIP) cannot
        // have this path at all: not available, not a failure.
        Err(RunError::Topo(TopoError::Failed { cmd, stderr }))
            if cmd.contains("type ipip") && stderr.contains("Unknown device type") =>
        {
            let why =
                "this kernel has no IPIP tunnel driver (CONFIG_NET_IPIP is not set)".to_owned();
            progress(&format!("{}: not available ({why})", scenario.name()));
            result.status = Status::NotAvailable(why);
        }
        Err(e) => {
            progress(&format!("{}: failed: {e}", scenario.name()));
            result.status = Status::Failed(e.to_string());
        }
    }
    result
}

fn scenario_trials(
    scenario: Scenario,
    workers: usize,
    options: &RunOptions,
    earlier: &[ScenarioResult],
    progress: &mut dyn FnMut(&str),
    result: &mut ScenarioResult,
) -> Result<(), RunError> {
    let topology = Topology::build_with_queues(scenario.shape(), workers as u32)?;
    let prepared = prepare(scenario, &topology, options, workers)?;
    result.notes.clone_from(&prepared.notes);
    for n in prepared.notes.iter().filter(|n| n.starts_with("iptables:")) {
        progress(&format!("{}: {n}", scenario.name()));
    }
    for &size in &options.sizes {
        progress(&format!(
            "{} {size} ×{workers}: throughput ...",
            scenario.name()
        ));
        let t = run_trial(
            &topology,
            &prepared,
            options,
            size,
            options.rate,
            TrialKind::Throughput,
        )?;
        progress(&format!(
            "{} {size} ×{workers}: offered {:.3} Mpps, received {:.3} Mpps, loss {:.2} %",
            scenario.name(),
            t.offered_pps / 1e6,
            t.rx_pps / 1e6,
            100.0 * t.loss_ratio
        ));
        let max_rx = t.rx_pps;
        result.trials.push(t);
        if let Some(fraction) = options.latency_fraction
            && max_rx > 0.0
        {
            // The same offered load for every scenario: a fraction of the
            // reference scenario's maximum when it ran before at this size.
            let reference = options
                .latency_reference
                .and_then(|r| {
                    earlier
                        .iter()
                        .find(|e| e.scenario == r.name() && e.workers == workers)
                })
                .and_then(|e| e.throughput(&size.label()))
                .map(|t| t.rx_pps);
            let (base, of_what) = match reference {
                Some(pps) if pps > 0.0 => {
                    (pps, options.latency_reference.map_or("own", |r| r.name()))
                }
                _ => (max_rx, "own"),
            };
            let rate = Rate::Pps(base * fraction);
            let t = run_trial(
                &topology,
                &prepared,
                options,
                size,
                rate,
                TrialKind::Latency,
            )?;
            if let Some(l) = &t.latency {
                progress(&format!(
                    "{} {size} ×{workers}: latency at {:.0} % of the {of_what} maximum: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
                    scenario.name(),
                    fraction * 100.0,
                    l.p50_ns as f64 / 1e3,
                    l.p99_ns as f64 / 1e3,
                    l.p999_ns as f64 / 1e3
                ));
            }
            result.trials.push(t);
        }
        if options.zero_loss && max_rx > 0.0 {
            let upper = result
                .throughput(&size.label())
                .map_or(max_rx, |t| t.offered_pps);
            let mut search = ZeroLossSearch::new(upper, 0.02, options.zero_loss_trials);
            while let Some(rate) = search.next_rate() {
                let t = run_trial(
                    &topology,
                    &prepared,
                    options,
                    size,
                    Rate::Pps(rate),
                    TrialKind::ZeroLossStep,
                )?;
                let pass = ZeroLossSearch::passes(t.sent, t.lost, options.loss_tolerance);
                search.record(rate, pass);
                result.trials.push(t);
            }
            progress(&format!(
                "{} {size}: zero-loss {:.3} Mpps",
                scenario.name(),
                search.result() / 1e6
            ));
            result.zero_loss_pps.push((size.label(), search.result()));
        }
    }
    Ok(())
}
