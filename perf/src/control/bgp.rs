//! BGP learning time into the real FIB: GoBGP (Debian's gobgpd, in the
//! upstream namespace) is loaded with N IPv4 /24s from an MRT file before
//! our daemon exists; then `brindle-ctrl` starts with GoBGP as an explicit
//! eBGP peer, learns the table and programs it into the real
//! `brindle-vrouter serve`, and we poll the vrouter's route count over its
//! socket until every route is in the FIB.
//!
//! Beside it, a probe of the programming API alone (no BGP): the cost of
//! one-route `AddRoutes` requests on an empty and on a loaded FIB, and of
//! batched ones, which is what tells where the time goes.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brindle_api::framing::Client;
use brindle_api::vrouter::{Changed, Route, RouteTarget, VrouterRequest};
use ipnet::{IpNet, Ipv4Net};
use serde::Serialize;
use serde_json::{Value, json};

use super::cni::Check;
use super::mrt;
use super::node::{self, NODE_ADDR, NODE_AS, Node, NodeOptions, UPSTREAM_ADDR, wait_for};
use crate::report::task_cpu_s;
use crate::topo::{self, Netns};

/// GoBGP's gRPC port inside its namespace.
const GOBGP_API: &str = "50051";

/// One learning run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LearnRun {
    /// Routes asked for (the table, padding excluded).
    pub routes_requested: u32,
    /// Routes GoBGP held and announced (table plus the padding that
    /// arrived).
    pub routes_announced: u64,
    /// Seconds GoBGP took to load the MRT file (not part of the timing).
    pub gobgp_load_s: f64,
    /// Seconds from starting `brindle-ctrl` (the peer is added at start)
    /// to the session's Established.
    pub start_to_established_s: Option<f64>,
    /// Seconds from Established until the daemon's Adj-RIB-In held every
    /// announced route (its `prefixes_in`, polled every 250 ms).
    pub established_to_all_in_rib_s: Option<f64>,
    /// Seconds from Established to the first learned route in the FIB.
    pub established_to_first_in_fib_s: Option<f64>,
    /// Seconds from Established until the FIB held every route.
    pub established_to_all_in_fib_s: Option<f64>,
    /// Seconds from starting the daemon until the FIB held every route.
    pub start_to_all_in_fib_s: Option<f64>,
    /// Learned routes in the FIB at the end (or at the timeout).
    pub routes_in_fib: u64,
    /// Whether every announced route reached the FIB before the timeout.
    pub complete: bool,
    /// Routes per second into the FIB, Established → last (or → timeout).
    pub routes_per_s: f64,
    /// UPDATEs received by the daemon from GoBGP.
    pub updates_in: u64,
    /// UPDATEs per second, Established → last.
    pub updates_per_s: f64,
    /// Requests the daemon sent to the vrouter (its
    /// `brindle_ctrl_programming_seconds` count).
    pub vrouter_requests: Option<u64>,
    /// Mean seconds per vrouter request, as the daemon measured them.
    pub vrouter_request_mean_s: Option<f64>,
    /// CPU seconds of `brindle-ctrl` from its start to the end.
    pub ctrl_cpu_s: Option<f64>,
    /// CPU seconds of `brindle-vrouter` over the same time.
    pub vrouter_cpu_s: Option<f64>,
    /// Routes per second into the FIB over each tenth of the routes that
    /// reached it: a falling rate as the FIB grows means a per-route cost
    /// that grows with the table.
    pub rate_by_tenth: Vec<f64>,
    /// The harness's checks.
    pub checks: Vec<Check>,
}

/// Probe of the programming API alone.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeRun {
    /// Routes in the FIB before the loaded-table sample.
    pub loaded_fib_routes: u32,
    /// Mean ms of a one-route `AddRoutes` on an (almost) empty FIB.
    pub single_route_request_empty_ms: f64,
    /// Mean ms of a one-route `AddRoutes` on the loaded FIB.
    pub single_route_request_loaded_ms: f64,
    /// Routes per second when loading in batches.
    pub batched_routes_per_s: f64,
    /// Routes per `AddRoutes` when loading.
    pub batch_size: u32,
    /// Mean ms of one `GetStats` on the loaded FIB (the API's floor).
    pub get_stats_loaded_ms: f64,
}

fn gobgp_conf() -> String {
    format!(
        "[global.config]\n  as = {asn}\n  router-id = \"{up}\"\n  port = 179\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{node}\"\n    peer-as = {nas}\n\
         [neighbors.transport.config]\n    passive-mode = true\n\
         [[neighbors.afi-safis]]\n  [neighbors.afi-safis.config]\n    afi-safi-name = \"ipv4-unicast\"\n",
        asn = mrt::ORIGIN_AS,
        up = UPSTREAM_ADDR,
        node = NODE_ADDR,
        nas = NODE_AS,
    )
}

fn gobgp_count(ns: &Netns) -> Result<u64> {
    let out = ns.exec(&[
        "gobgp", "-p", GOBGP_API, "global", "rib", "summary", "-a", "ipv4",
    ])?;
    // "Table ipv4-unicast\nDestination: N, Path: N"
    Ok(out
        .split("Destination:")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0))
}

/// Starts gobgpd in `ns` and loads `n` routes (plus what of the padding
/// arrives); the daemon, the routes it holds, the seconds it took.
fn start_gobgp(ns: &Netns, dir: &Path, n: u32) -> Result<(node::Daemon, u64, f64)> {
    let conf = dir.join("gobgpd.toml");
    std::fs::write(&conf, gobgp_conf())?;
    let conf = conf.display().to_string();
    let mut gobgpd = node::Daemon::spawn(
        ns,
        "gobgpd",
        Path::new("gobgpd"),
        &[
            "-f",
            &conf,
            "--api-hosts",
            &format!("127.0.0.1:{GOBGP_API}"),
            "--pprof-disable",
        ],
        &[],
        &dir.join("gobgpd.log"),
    )?;
    let mrt_file = dir.join("table.mrt");
    mrt::write_table_dump(&mrt_file, n).context("write the MRT file")?;
    let mrt_file = mrt_file.display().to_string();
    let started = Instant::now();
    wait_for("gobgpd's API", Duration::from_secs(20), || {
        gobgpd.check_alive()?;
        Ok(ns.exec(&["gobgp", "-p", GOBGP_API, "global"]).is_ok())
    })?;
    // `gobgp mrt inject` returns before the server has taken the tail of
    // the stream, and that tail is lost: inject again from where GoBGP's
    // table ends until the whole table (not all the padding) is in.
    loop {
        let have = gobgp_count(ns)?;
        if have >= u64::from(n) {
            break;
        }
        if started.elapsed() > Duration::from_secs(600)
            || topo::STOP.load(std::sync::atomic::Ordering::Relaxed)
        {
            bail!("GoBGP took only {have} of {n} routes");
        }
        let count = (u64::from(n + mrt::PADDING) - have).to_string();
        let skip = have.to_string();
        ns.exec(&[
            "timeout", "600", "gobgp", "-p", GOBGP_API, "mrt", "inject", "global", &mrt_file,
            &count, &skip,
        ])?;
        std::thread::sleep(Duration::from_millis(500));
    }
    // Let the last injected paths settle.
    let mut total = gobgp_count(ns)?;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = gobgp_count(ns)?;
        if now == total {
            break;
        }
        total = now;
    }
    let _ = std::fs::remove_file(&mrt_file);
    Ok((gobgpd, total, started.elapsed().as_secs_f64()))
}

/// `GET /metrics` of the daemon inside the node namespace.
fn ctrl_metrics(node: &Node) -> Option<String> {
    let ns = node.ns.name.clone();
    std::thread::spawn(move || -> Option<String> {
        topo::enter(&ns).ok()?;
        let mut s = std::net::TcpStream::connect("127.0.0.1:9091").ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    })
    .join()
    .ok()
    .flatten()
}

/// The value of the first sample line starting with `name` (and a space
/// or `{`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// The daemon's view of its one peer: (state, updates in, prefixes in).
fn peer_state(node: &Node) -> Option<(String, u64, u64)> {
    let mut c = Client::connect(node.ctrl_socket(), Duration::from_millis(500)).ok()?;
    let peers: Value = c.call(&json!({"op": "ctrl_bgp_peers"})).ok()?;
    let p = peers.as_array()?.first()?;
    Some((
        p["state"].as_str().unwrap_or("").to_owned(),
        p["updates_in"].as_u64().unwrap_or(0),
        p["prefixes_in"].as_u64().unwrap_or(0),
    ))
}

/// Runs one learning measurement of `n` routes.
pub fn learn(
    bin_dir: &Path,
    n: u32,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<LearnRun> {
    let opts = NodeOptions {
        bin_dir: bin_dir.to_path_buf(),
        bgp_peers: vec![(UPSTREAM_ADDR, mrt::ORIGIN_AS)],
        ctrl: true,
    };
    progress(&format!("BGP {n}: loading GoBGP"));
    let mut run = LearnRun {
        routes_requested: n,
        ..LearnRun::default()
    };
    let (mut node, gobgp) = Node::start(&opts, |upstream, dir| {
        let (d, total, secs) = start_gobgp(upstream, dir, n)?;
        Ok((d, total, secs))
    })?;
    let (_gobgpd, announced, load_s) = gobgp;
    run.routes_announced = announced;
    run.gobgp_load_s = load_s;
    progress(&format!(
        "BGP {n}: GoBGP holds {announced} routes ({load_s:.1} s); brindle-ctrl started, polling the FIB"
    ));
    let vsock = node.vrouter_socket();
    let t0 = node.ctrl_started;
    let mut established: Option<f64> = None;
    let mut all_in_rib: Option<f64> = None;
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut updates = 0;
    let mut last_peer_poll = Instant::now() - Duration::from_secs(1);
    let mut stable_since: Option<(u64, Instant)> = None;
    let mut last_print = Instant::now();
    loop {
        if let Some(ctrl) = node.ctrl.as_mut() {
            ctrl.check_alive().with_context(|| node.logs())?;
        }
        if topo::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted");
        }
        let now = t0.elapsed().as_secs_f64();
        if let Ok(s) = node::vrouter_stats(&vsock) {
            samples.push((t0.elapsed().as_secs_f64(), s.routes));
        }
        // The peer's state: often until Established, then now and then.
        let every = match (established, all_in_rib) {
            (None, _) => 0,
            (Some(_), None) => 250,
            (Some(_), Some(_)) => 2000,
        };
        if last_peer_poll.elapsed() >= Duration::from_millis(every) {
            last_peer_poll = Instant::now();
            if let Some((state, u, prefixes)) = peer_state(&node) {
                updates = u;
                if state == "Established" && established.is_none() {
                    established = Some(t0.elapsed().as_secs_f64());
                }
                if prefixes >= announced && all_in_rib.is_none() {
                    all_in_rib = Some(t0.elapsed().as_secs_f64());
                }
            }
        }
        let routes = samples.last().map_or(0, |s| s.1);
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            progress(&format!(
                "BGP {n}: {routes} routes in the FIB after {now:.0} s"
            ));
        }
        if routes >= announced {
            match stable_since {
                Some((r, since)) if r == routes => {
                    if since.elapsed() >= Duration::from_secs(1) {
                        run.complete = true;
                        break;
                    }
                }
                _ => stable_since = Some((routes, Instant::now())),
            }
        }
        if t0.elapsed() > timeout {
            break;
        }
        // GetStats holds the vrouter's control lock while it asks the
        // workers for counters (about 1.5 ms here): every 100 ms keeps the
        // probe's share of that lock near 1 %.
        std::thread::sleep(Duration::from_millis(100));
    }
    let end = t0.elapsed().as_secs_f64();
    run.ctrl_cpu_s = node.ctrl.as_ref().and_then(|c| task_cpu_s(c.pid() as i32));
    run.vrouter_cpu_s = task_cpu_s(node.vrouter.pid() as i32);
    if let Some((_, u, _)) = peer_state(&node) {
        updates = u;
    }
    run.updates_in = updates;
    let final_routes = samples.last().map_or(0, |s| s.1);
    let baseline = samples.first().map_or(0, |s| s.1).min(final_routes);
    // Routes that are not GoBGP's (the daemon's own, if any) count in
    // `GetStats`; the exact count of GoBGP's is checked below when the
    // dump fits a message, here the total minus what was there before.
    run.routes_in_fib = final_routes - baseline;
    run.start_to_established_s = established;
    let first = samples.iter().find(|s| s.1 > baseline).map(|s| s.0);
    let all = run
        .complete
        .then(|| samples.iter().find(|s| s.1 >= final_routes).map(|s| s.0))
        .flatten();
    run.start_to_all_in_fib_s = all;
    if let Some(e) = established {
        run.established_to_first_in_fib_s = first.map(|f| f - e);
        run.established_to_all_in_rib_s = all_in_rib.map(|r| r - e);
        run.established_to_all_in_fib_s = all.map(|a| a - e);
        let span = all.unwrap_or(end) - e;
        if span > 0.0 {
            run.routes_per_s = run.routes_in_fib as f64 / span;
            run.updates_per_s = updates as f64 / span;
        }
    }
    // Rate over each tenth of what reached the FIB (all of the table, or
    // what a timed-out run got to).
    let tenth = (run.routes_in_fib / 10).max(1);
    let mut prev = (first.unwrap_or(0.0), baseline);
    for k in 1..=10u64 {
        let target = baseline + tenth * k;
        let Some(&(t, r)) = samples.iter().find(|s| s.1 >= target) else {
            break;
        };
        if t > prev.0 {
            run.rate_by_tenth.push((r - prev.1) as f64 / (t - prev.0));
        }
        prev = (t, r);
    }
    if let Some(m) = ctrl_metrics(&node) {
        let count = metric(&m, "brindle_ctrl_programming_seconds_count");
        let sum = metric(&m, "brindle_ctrl_programming_seconds_sum");
        run.vrouter_requests = count.map(|c| c as u64);
        if let (Some(c), Some(s)) = (count, sum)
            && c > 0.0
        {
            run.vrouter_request_mean_s = Some(s / c);
        }
    }
    run.checks.push(Check::new(
        format!("BGP {n}: routes in the FIB == routes announced"),
        run.routes_in_fib == announced,
        format!(
            "{} in the FIB (of {} before), {announced} announced{}",
            run.routes_in_fib,
            baseline,
            if run.complete { "" } else { ", timed out" }
        ),
    ));
    // The exact set, when the dump fits one message (64 MiB).
    if announced <= 200_000 && run.complete {
        let routes: Vec<Route> = node::vrouter_call(&vsock, &VrouterRequest::DumpRoutes)?;
        let learned: Vec<&Route> = routes
            .iter()
            .filter(|r| match r.prefix {
                IpNet::V4(p) => p.prefix_len() == 24 && mrt::is_table_prefix(p.network(), n),
                IpNet::V6(_) => false,
            })
            .collect();
        let via_gobgp = learned
            .iter()
            .filter(|r| match &r.target {
                RouteTarget::Gateway { via, .. } => *via == IpAddr::V4(UPSTREAM_ADDR),
                RouteTarget::Encap { remote, .. } => *remote == IpAddr::V4(UPSTREAM_ADDR),
                _ => false,
            })
            .count();
        run.checks.push(Check::new(
            format!("BGP {n}: every announced prefix is in the FIB via GoBGP"),
            learned.len() as u64 == announced && via_gobgp == learned.len(),
            format!(
                "{} table prefixes in the dump, {via_gobgp} via {UPSTREAM_ADDR}, {announced} announced",
                learned.len()
            ),
        ));
    }
    Ok(run)
}

fn probe_route(i: u32) -> Route {
    // 30.0.0.0/24 upwards: apart from anything a node holds.
    let net = Ipv4Addr::from(((30u32 << 16) + i) << 8);
    Route {
        prefix: IpNet::V4(Ipv4Net::new(net, 24).expect("/24 is valid")),
        target: RouteTarget::Blackhole,
    }
}

fn single_route_requests(c: &mut Client, from: u32, count: u32) -> Result<f64> {
    let start = Instant::now();
    for i in from..from + count {
        let _: Changed = c.call(&VrouterRequest::AddRoutes {
            routes: vec![probe_route(i)],
        })?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e3 / f64::from(count.max(1)))
}

/// The programming API alone: a vrouter without the daemon, `sample`
/// one-route requests on an empty FIB, `load` routes in batches of
/// `batch`, `sample` one-route requests on top.
pub fn probe(bin_dir: &Path, load: u32, sample: u32, batch: u32) -> Result<ProbeRun> {
    let opts = NodeOptions {
        bin_dir: bin_dir.to_path_buf(),
        bgp_peers: Vec::new(),
        ctrl: false,
    };
    let (node, ()) = Node::start(&opts, |_, _| Ok(()))?;
    let mut c = Client::connect(node.vrouter_socket(), Duration::from_secs(600))?;
    let mut run = ProbeRun {
        loaded_fib_routes: load + sample,
        batch_size: batch,
        ..ProbeRun::default()
    };
    run.single_route_request_empty_ms = single_route_requests(&mut c, 0, sample)?;
    let start = Instant::now();
    let mut i = sample;
    while i < sample + load {
        let end = (i + batch).min(sample + load);
        let _: Changed = c.call(&VrouterRequest::AddRoutes {
            routes: (i..end).map(probe_route).collect(),
        })?;
        i = end;
    }
    run.batched_routes_per_s = f64::from(load) / start.elapsed().as_secs_f64();
    run.single_route_request_loaded_ms = single_route_requests(&mut c, sample + load, sample)?;
    let start = Instant::now();
    for _ in 0..sample {
        let _: brindle_api::vrouter::Stats = c.call(&VrouterRequest::GetStats)?;
    }
    run.get_stats_loaded_ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(sample.max(1));
    drop(c);
    drop(node);
    Ok(run)
}

/// Where the binaries are by default: beside this executable (a release
/// build puts them all in one directory).
pub fn default_bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}
