//! Pipeline throughput per core on in-memory ports, 60-byte frames (64 on
//! the wire with the FCS): pod -> pod, pod -> remote pod over IPIP and
//! VXLAN, remote pod -> pod from IPIP and VXLAN.
//!
//! The ingress port is a `ReplayPort`: every `rx_burst` re-copies a template
//! into free chunks, and egress ports free what they are given, so the port
//! costs a 60-byte copy per frame. One iteration is one `poll_once` of the
//! worker: one burst of 64 frames through the whole pipeline.
//!
//! The machine this runs on is shared (other builds, other benchmarks), so
//! time is measured as the benchmark thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time: time the thread spends
//! preempted does not count, and the result is Mpps per core.
//!
//! `pipeline_policy_60B`: pod -> remote pod over IPIP with the Calico-shaped
//! rule set of `brindle-perf`'s kernel-calico scenario as policies
//! (brindle-policy's bench shape: 50 endpoints, 23 rules per direction,
//! 500 sets of 8 addresses; the pod is one of the endpoints, its flows
//! allowed by the last egress rule), against the same frames without
//! policy: established flows (one flow per burst: the first frame looks
//! the flow up, the next 63 pass on the batch's last flow; and 64 flows per
//! burst: one table lookup per frame), new flows (64
//! distinct flows per burst, all expired again by the next burst: each
//! frame classified through 23 rules and inserted), denied flows (a port
//! no rule allows: classified, dropped).
//!
//! Run: `cargo bench -p brindle-vrouter --bench pipeline -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brindle_vrouter::counters::DropReason;
use brindle_vrouter::demo::addr::*;
use brindle_vrouter::demo::frames::{ipip_frame, udp_frame, udp_packet, vxlan_frame};
use brindle_vrouter::demo::{MTU, VNI};
use brindle_vrouter::endpoint::{Endpoint, GATEWAY_MAC};
use brindle_vrouter::fib::{Encap, Fib, NextHop};
use brindle_vrouter::frame::FrameArena;
use brindle_vrouter::pipeline::{BURST, PipelineConfig, vtep_mac};
use brindle_vrouter::policy::PolicyView;
use brindle_vrouter::port::ReplayPort;
use brindle_vrouter::worker::Worker;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nix::time::{ClockId, clock_gettime};

const PAYLOAD: [u8; 18] = [0x42; 18];

/// Frames a replay port cycles through.
type Templates = Vec<Vec<u8>>;

/// The demo node's layout with replay ports: pod A replays `from_pod`, the
/// uplink replays `from_uplink`.
fn worker(from_pod: Vec<Vec<u8>>, from_uplink: Vec<Vec<u8>>) -> Worker {
    let (mut fib, reader) = Fib::new();
    fib.insert("10.65.0.2/32".parse().unwrap(), NextHop::Local { port: 0 });
    fib.insert("10.65.0.3/32".parse().unwrap(), NextHop::Local { port: 1 });
    fib.insert(
        "10.65.1.0/26".parse().unwrap(),
        NextHop::Encap {
            encap: Encap::Ipip,
            remote: REMOTE_IPIP,
        },
    );
    fib.insert(
        "10.65.2.0/26".parse().unwrap(),
        NextHop::Encap {
            encap: Encap::Vxlan { vni: VNI },
            remote: REMOTE_VXLAN,
        },
    );
    // A default route, so lookups walk more than one prefix length.
    fib.insert("0.0.0.0/0".parse().unwrap(), NextHop::Blackhole);
    let mut w = Worker::new(
        FrameArena::new_heap(4 * BURST as u32, 2048),
        PipelineConfig::new(NODE, 24),
        reader,
    );
    let pod = |name: &str, templates| Box::new(ReplayPort::new(name, GATEWAY_MAC, MTU, templates));
    w.add_port(
        pod("pod-a", from_pod),
        Endpoint::pod(vec![POD_A.into()], Some(POD_A_MAC), MTU),
    );
    w.add_port(
        pod("pod-b", Vec::new()),
        Endpoint::pod(vec![POD_B.into()], Some(POD_B_MAC), MTU),
    );
    w.add_port(
        Box::new(ReplayPort::new("uplink", UPLINK_MAC, MTU, from_uplink)),
        Endpoint::uplink(UPLINK_MAC, MTU),
    );
    let n = w.pipeline_mut().neigh_mut();
    n.insert(2, REMOTE_IPIP.into(), REMOTE_IPIP_MAC);
    n.insert(2, REMOTE_VXLAN.into(), REMOTE_VXLAN_MAC);
    std::mem::forget(fib); // keep the routes published for the bench's life
    w
}

/// The calling thread's CPU time, in nanoseconds.
struct ThreadCpuTime;

fn thread_cpu_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, like wall time's.
        WALL.formatter()
    }
}

fn bench_pipeline(c: &mut Criterion<ThreadCpuTime>) {
    let to = |dst| vec![udp_frame(POD_A_MAC, GATEWAY_MAC, POD_A, dst, 64, &PAYLOAD)];
    let ipip_in = vec![ipip_frame(
        REMOTE_IPIP_MAC,
        UPLINK_MAC,
        REMOTE_IPIP,
        NODE,
        &udp_packet(REMOTE_POD_IPIP, POD_A, 64, &PAYLOAD),
    )];
    let vxlan_in = vec![vxlan_frame(
        REMOTE_VXLAN_MAC,
        UPLINK_MAC,
        REMOTE_VXLAN,
        NODE,
        50000,
        VNI,
        &udp_frame(
            vtep_mac(REMOTE_VXLAN),
            vtep_mac(NODE),
            REMOTE_POD_VXLAN,
            POD_A,
            64,
            &PAYLOAD,
        ),
        1,
    )];
    let cases: [(&str, Templates, Templates); 5] = [
        ("pod_to_pod", to(POD_B), Vec::new()),
        ("encap_ipip", to(REMOTE_POD_IPIP), Vec::new()),
        ("encap_vxlan", to(REMOTE_POD_VXLAN), Vec::new()),
        ("decap_ipip", Vec::new(), ipip_in),
        ("decap_vxlan", Vec::new(), vxlan_in),
    ];
    let mut g = c.benchmark_group("pipeline_60B");
    g.throughput(Throughput::Elements(BURST as u64));
    for (name, from_pod, from_uplink) in cases {
        let mut w = worker(from_pod, from_uplink);
        let now = Instant::now();
        // Sanity: the burst is forwarded, not dropped.
        w.poll_once(now);
        let c = w.counters();
        assert_eq!(c.forwarded, BURST as u64, "{name}: {c:?}");
        g.bench_function(name, |b| b.iter(|| black_box(w.poll_once(now))));
    }
    g.finish();
}

#[allow(dead_code)]
#[path = "../../policy/benches/shape.rs"]
mod shape;

/// Pod A is endpoint `ep25` of the shape (its address, its program);
/// 172.16.0.0/12 (the shape's set addresses) is a remote block over IPIP.
fn policy_worker(from_pod: Templates, view: Option<Arc<PolicyView>>, capacity: usize) -> Worker {
    let (mut fib, reader) = Fib::new();
    fib.insert(
        "172.16.0.0/12".parse().unwrap(),
        NextHop::Encap {
            encap: Encap::Ipip,
            remote: REMOTE_IPIP,
        },
    );
    fib.insert("0.0.0.0/0".parse().unwrap(), NextHop::Blackhole);
    let mut w = Worker::new(
        FrameArena::new_heap(4 * BURST as u32, 2048),
        PipelineConfig::new(NODE, 24),
        reader,
    );
    w.add_port(
        Box::new(ReplayPort::new("pod-a", GATEWAY_MAC, MTU, from_pod)),
        Endpoint::pod(vec![shape::endpoint_addr(25)], Some(POD_A_MAC), MTU),
    );
    w.add_port(
        Box::new(ReplayPort::new("uplink", UPLINK_MAC, MTU, Vec::new())),
        Endpoint::uplink(UPLINK_MAC, MTU),
    );
    w.pipeline_mut()
        .neigh_mut()
        .insert(1, REMOTE_IPIP.into(), REMOTE_IPIP_MAC);
    let flows = w.pipeline_mut().flows_mut();
    flows.set_capacity(capacity);
    if let Some(v) = view {
        flows.set_view(v);
    }
    std::mem::forget(fib);
    w
}

fn bench_policy(c: &mut Criterion<ThreadCpuTime>) {
    let compiler = shape::compiled();
    let view = PolicyView::new()
        .with_workload(
            0,
            Some(brindle_policy::program::EndpointKey::new("bench", "ep25")),
        )
        .with_snapshot(&compiler.snapshot())
        .expect("the shape applies");
    let view = Arc::new(view);
    let last = shape::RULES_PER_DIRECTION - 1;
    let set = 25 * shape::SETS_PER_ENDPOINT + last % shape::SETS_PER_ENDPOINT;
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (shape::endpoint_addr(25), shape::set_addr(set, 7))
    else {
        unreachable!("the shape is IPv4")
    };
    let frame = |sport: u16, dport: u16| {
        let b = etherparse::PacketBuilder::ethernet2(POD_A_MAC, GATEWAY_MAC)
            .ipv4(src.octets(), dst.octets(), 64)
            .udp(sport, dport);
        let mut out = Vec::new();
        b.write(&mut out, &PAYLOAD).expect("writes");
        out
    };
    let allowed_port = 1000 + last as u16;
    let one = vec![frame(40000, allowed_port)];
    let many: Templates = (0..BURST as u16)
        .map(|i| frame(40000 + i, allowed_port))
        .collect();
    let denied = vec![frame(40000, 999)];
    let mut g = c.benchmark_group("pipeline_policy_60B");
    g.throughput(Throughput::Elements(BURST as u64));
    let cases: [(&str, Templates, Option<Arc<PolicyView>>, bool); 6] = [
        ("no_policy", one.clone(), None, false),
        ("no_policy_64_flows", many.clone(), None, false),
        ("established", one, Some(view.clone()), false),
        (
            "established_64_flows",
            many.clone(),
            Some(view.clone()),
            false,
        ),
        ("new_flows", many, Some(view.clone()), true),
        ("denied", denied, Some(view), false),
    ];
    for (name, templates, view, expire) in cases {
        let policed = view.is_some();
        let mut w = policy_worker(templates, view, 4 * BURST);
        let mut now = Instant::now();
        w.poll_once(now);
        let c = w.counters();
        if name == "denied" {
            assert_eq!(
                c.drops_for(DropReason::PolicyDenied),
                BURST as u64,
                "{name}: {c:?}"
            );
        } else {
            assert_eq!(c.forwarded, BURST as u64, "{name}: {c:?}");
        }
        assert_eq!(
            w.pipeline().flows().stats().flows > 0,
            policed && name != "denied"
        );
        // New flows: every UDP entry (30 s) has expired by the next burst.
        let step = if expire {
            Duration::from_secs(31)
        } else {
            Duration::ZERO
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                now += step;
                black_box(w.poll_once(now))
            })
        });
        if expire {
            let s = w.pipeline().flows().stats();
            // The warm-up burst and at least one measured one (`cargo
            // test --benches` runs a bench once): without expiry the
            // measured bursts would add no new flow.
            assert!(s.table.new >= 2 * BURST as u64, "flows were not new: {s:?}");
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench_pipeline, bench_policy
}
criterion_main!(benches);
