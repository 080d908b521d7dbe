//! The harness on real veths (root): exact counts, detected loss, sane
//! latency, every scenario producing figures, and nothing left behind,
//! Ctrl-C included. Every namespace is removed by Drop guards, also when an
//! assertion fails.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brindle_perf::frame::FrameSize;
use brindle_perf::report::{ScenarioResult, Status, TrialKind};
use brindle_perf::runner::{RunOptions, Scenario, run_scenario, run_scenario_with};
use brindle_perf::selftest;
use brindle_perf::traffic::{GeneratorKind, Rate};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The root tests pin generator and forwarding threads to the same two
/// CPUs: run concurrently they would measure each other. One at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    // A failed test poisons the lock; the next one still runs.
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Namespaces of process `pid`: `bp<role><pid>x<n>`.
fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let mark = format!("{}x", pid % 100_000);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        // bp, the role letters, then <pid>x: 123x must not match 1123x.
        .filter(|n| {
            n.strip_prefix("bp").is_some_and(|rest| {
                rest.trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .starts_with(&mark)
            })
        })
        .map(str::to_owned)
        .collect()
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_sink_counts_exactly_what_the_live_generator_sent_on_a_plain_veth() {
    let _serial = one_at_a_time();
    exact_count(GeneratorKind::Live);
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_sink_counts_exactly_what_the_afxdp_generator_sent_on_a_plain_veth() {
    let _serial = one_at_a_time();
    exact_count(GeneratorKind::Afxdp);
}

/// Whether `err` is the kernel refusing BPF_PROG_TEST_RUN in live-frames
/// mode with EPERM. Seen on 2026-12-06 on a 6.18.44 machine where the same
/// code ran before and the AF_XDP generator still worked: the live
/// generator cannot run at all there, a limit of the machine, not of the
/// harness. Its tests then say so on stderr and the AF_XDP generator's
/// tests (and every scenario, with that generator) still run and assert.
fn live_frames_refused(err: &dyn std::fmt::Debug) -> bool {
    let text = format!("{err:?}");
    text.contains("BPF_PROG_TEST_RUN (live frames)") && text.contains("PermissionDenied")
}

/// The live generator, or the AF_XDP one where the kernel refuses live
/// frames (see [`live_frames_refused`]): one probe run decides.
fn generator_this_kernel_runs() -> GeneratorKind {
    match selftest::exact_count_on_a_plain_veth(GeneratorKind::Live) {
        Err(e) if live_frames_refused(&e) => {
            eprintln!("the AF_XDP generator: this kernel refuses live frames: {e:?}");
            GeneratorKind::Afxdp
        }
        _ => GeneratorKind::Live,
    }
}

fn exact_count(kind: GeneratorKind) {
    let (checks, sent, seen) = match selftest::exact_count_on_a_plain_veth(kind) {
        Err(e) if kind == GeneratorKind::Live && live_frames_refused(&e) => {
            eprintln!("NOT RUN: this kernel refuses BPF_PROG_TEST_RUN live frames: {e:?}");
            return;
        }
        r => r.unwrap(),
    };
    for c in &checks {
        assert!(c.passed, "{}: {}", c.name, c.detail);
    }
    // 2000 pps for 0.5 s: pacing must never exceed that. How far below it a
    // busy machine stays is timing, not correctness, so the floor only shows
    // that the generator really ran.
    assert!((100..=1001).contains(&sent.sent), "sent {}", sent.sent);
    assert_eq!(seen.counter.received, sent.sent);
    assert_eq!(seen.per_flow, sent.per_flow);
    assert!(
        sent.per_flow.iter().all(|&n| n > 0),
        "every flow sent: {:?}",
        sent.per_flow
    );
    let l = seen.counter.latency_summary().unwrap();
    assert!(l.min_ns > 0 && l.p50_ns <= l.p99_ns && l.p99_ns <= l.max_ns);
}

#[test]
#[ignore = "requires root and network namespaces"]
fn frames_dropped_on_purpose_for_one_flow_are_counted_as_lost() {
    let _serial = one_at_a_time();
    let (checks, sent, seen) = match selftest::loss_of_one_dropped_flow_is_counted() {
        Err(e) if live_frames_refused(&e) => {
            eprintln!("NOT RUN: this kernel refuses BPF_PROG_TEST_RUN live frames: {e:?}");
            return;
        }
        r => r.unwrap(),
    };
    for c in &checks {
        assert!(c.passed, "{}: {}", c.name, c.detail);
    }
    let dropped = sent.per_flow[2];
    assert!(dropped > 0);
    assert_eq!(seen.counter.lost(sent.sent), dropped);
    assert_eq!(seen.per_flow[2], 0);
}

#[test]
#[ignore = "requires root and network namespaces"]
fn every_scenario_runs_and_produces_figures_and_brindle_is_not_available() {
    let _serial = one_at_a_time();
    let generator = generator_this_kernel_runs();
    let options = RunOptions {
        generator,
        sizes: vec![FrameSize::Fixed(64)],
        duration: Duration::from_millis(600),
        flows: 4,
        // A low fixed rate: the test checks the plumbing, not the speed.
        // The live generator's frames have no back-pressure at the first
        // hop's 256-slot veth ring: at 3 kpps its NAPI thread may stall for
        // 85 ms (a loaded shared machine: load 10 on 2 cores lost half the
        // frames at 10 kpps) before a frame is lost.
        rate: Rate::Pps(3_000.0),
        latency_fraction: Some(0.5),
        brindle_binary: "/nonexistent/brindle-vrouter".into(),
        ..RunOptions::default()
    };
    let mut done: Vec<ScenarioResult> = Vec::new();
    for scenario in Scenario::ALL {
        let r = run_scenario(scenario, &options, &done, &mut |_| {});
        if matches!(
            scenario,
            Scenario::Brindle
                | Scenario::BrindleVxlan
                | Scenario::BrindleDaemon
                | Scenario::BrindlePolicy
                | Scenario::BrindlePolicyNew
        ) {
            assert!(
                matches!(r.status, Status::NotAvailable(_)),
                "{:?}",
                r.status
            );
            assert!(r.trials.is_empty());
            continue;
        }
        if scenario == Scenario::KernelIpip
            && let Status::NotAvailable(why) = &r.status
        {
            // Kernels without CONFIG_NET_IPIP (like this machine's).
            assert!(why.contains("IPIP"), "{why}");
            continue;
        }
        assert!(
            matches!(r.status, Status::Ran),
            "{}: {:?}",
            r.scenario,
            r.status
        );
        let t = r.throughput("64").unwrap();
        assert_eq!(t.kind, TrialKind::Throughput);
        assert!(t.sent > 900, "{}: sent {}", r.scenario, t.sent);
        // At 3 kpps nothing on this path should lose more than a few frames.
        assert!(
            t.received * 100 >= t.sent * 95,
            "{}: {} of {}",
            r.scenario,
            t.received,
            t.sent
        );
        let l = t.latency.as_ref().unwrap();
        assert!(l.min_ns > 0 && l.p50_ns <= l.p99_ns && l.p99_ns <= l.max_ns);
        match scenario {
            Scenario::KernelCalico => {
                let note = r.notes.iter().find(|n| n.starts_with("iptables:")).unwrap();
                let installed: usize = note
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                assert!((2_100..=2_500).contains(&installed), "{note}");
            }
            Scenario::NullAfxdp => {
                let f = t.forwarder.as_ref().unwrap();
                assert!(
                    f.forwarded >= t.received,
                    "forwarded {} received {}",
                    f.forwarded,
                    t.received
                );
            }
            _ => assert!(t.forwarder.is_none()),
        }
        // Latency trials after the kernel's run at half the kernel's
        // maximum (the same offered load); the generator's at half its own.
        let reference = done
            .iter()
            .find(|d| d.scenario == "kernel")
            .and_then(|k| k.throughput("64"))
            .map_or(t.rx_pps, |k| k.rx_pps);
        let target = r.latency("64").unwrap().target_pps.unwrap();
        assert!(
            (target - reference * 0.5).abs() <= 1e-9 * reference,
            "{}: latency target {target}, reference {reference}",
            r.scenario
        );
        done.push(r);
    }
    assert!(brindle_perf::topo::none_left());
}

#[test]
#[ignore = "requires root and network namespaces"]
fn ctrl_c_during_a_run_removes_every_namespace() {
    let _serial = one_at_a_time();
    let mut child = Command::new(env!("CARGO_BIN_EXE_brindle-perf"))
        .args([
            "run",
            "--scenario",
            "kernel",
            "--duration",
            "20",
            "--rate",
            "10000",
            "--frame-size",
            "64",
        ])
        .args([
            "--out",
            &std::env::temp_dir()
                .join("brindle-perf-ctrl-c")
                .display()
                .to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until its topology exists.
    let start = Instant::now();
    while namespaces_of(child.id()).len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "topology never appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            panic!("brindle-perf did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "an interrupted run reports failure");
    assert_eq!(namespaces_of(child.id()), Vec::<String>::new());
}

#[test]
#[ignore = "requires root and network namespaces"]
fn two_workers_spread_over_two_queues_and_the_sink_counts_every_frame() {
    let _serial = one_at_a_time();
    let generator = generator_this_kernel_runs();
    let options = RunOptions {
        generator,
        sizes: vec![FrameSize::Fixed(64), FrameSize::Imix],
        duration: Duration::from_millis(500),
        flows: 4,
        rate: Rate::Pps(4_000.0),
        latency_fraction: None,
        workers: vec![2],
        ..RunOptions::default()
    };
    // No router: two generator threads (CPUs 0 and 1, TX queues 0 and 1)
    // into a two-queue veth, one sink socket per queue.
    let r = run_scenario_with(Scenario::Generator, 2, &options, &[], &mut |_| {});
    assert!(matches!(r.status, Status::Ran), "{:?}", r.status);
    assert_eq!(r.workers, 2);
    for size in ["64", "imix"] {
        let t = r.throughput(size).unwrap();
        assert_eq!(t.workers, 2);
        assert_eq!(t.generator, "afxdp");
        assert!(t.sent > 500, "{size}: sent {}", t.sent);
        assert_eq!(t.received, t.sent, "{size}: every frame of both threads");
        assert_eq!(t.reordered, 0, "{size}: order holds within each flow");
    }
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("2 RX queue(s)") && n.contains("CPU(s) [1, 0]")),
        "{:?}",
        r.notes
    );
    // The kernel with one NAPI thread per queue forwards both threads'
    // flows; its 2-worker latency reference would be its own run.
    let k = run_scenario_with(Scenario::Kernel, 2, &options, &[], &mut |_| {});
    assert!(matches!(k.status, Status::Ran), "{:?}", k.status);
    let t = k.throughput("64").unwrap();
    assert!(
        t.received * 100 >= t.sent * 95,
        "{} of {}",
        t.received,
        t.sent
    );
    // One NAPI thread per queue (CPU time in 10 ms ticks is too coarse
    // for this short trial: count the threads instead).
    let napi = k
        .notes
        .iter()
        .find(|n| n.contains("NAPI thread(s)"))
        .unwrap();
    assert!(napi.contains("2 RX queue(s)"), "{napi}");
    assert_eq!(
        napi.split_once("NAPI thread(s) [").map(|(_, rest)| rest
            .split(']')
            .next()
            .unwrap_or("")
            .split(',')
            .count()),
        Some(2),
        "{napi}"
    );
    assert!(brindle_perf::topo::none_left());
}
