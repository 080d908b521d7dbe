//! How fast our speaker learns a full table from GoBGP: N IPv4 routes are
//! injected into GoBGP (from a generated MRT TABLE_DUMP_V2 file) before our
//! session exists; then we add the peer and time until every route has come
//! out of the RIB as a `RouteChange` and been put into a map standing in
//! for the FIB. Needs root (network namespaces); run with
//! `cargo bench -p brindle-ctrl --bench learn_routes [-- 100000 1000000]`.
//!
//! The MRT writer is `perf/src/control/mrt.rs`, included by path: one copy
//! for this benchmark and `brindle-perf control` (which measures the same
//! learning with the real daemon programming the real vrouter).

#[path = "../tests/common/mod.rs"]
mod common;
// The file serves brindle-perf too; its unit tests run there.
#[allow(dead_code, unused_imports)]
#[path = "../../perf/src/control/mrt.rs"]
mod mrt;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use brindle_ctrl::bgp::rib::RouteChange;
use brindle_ctrl::bgp::speaker::{PeerConfig, SpeakerConfig};
use common::*;
use ipnet::IpNet;

fn gobgp_count(ns: &Netns) -> Result<u64> {
    let out = ns.exec(&[
        "gobgp", "-p", "50051", "global", "rib", "summary", "-a", "ipv4",
    ])?;
    // "Table ipv4-unicast\nDestination: N, Path: N"
    let n = out
        .split("Destination:")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    Ok(n)
}

fn run_one(n: u32) -> Result<()> {
    let ours = Netns::new("bgpbu")?;
    let g = Netns::new("bgpbg")?;
    link(&ours, "10.0.0.2/24", &g, "10.0.0.1/24")?;
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("gobgpd.toml");
    std::fs::write(
        &conf,
        "[global.config]\n  as = 65010\n  router-id = \"10.0.0.1\"\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"10.0.0.2\"\n    peer-as = 65002\n\
         [neighbors.transport.config]\n    passive-mode = true\n\
         [[neighbors.afi-safis]]\n  [neighbors.afi-safis.config]\n    afi-safi-name = \"ipv4-unicast\"\n",
    )?;
    let _gobgpd = spawn(
        &g,
        &[
            "gobgpd",
            "-f",
            conf.to_str().unwrap(),
            "--api-hosts",
            "127.0.0.1:50051",
            "--pprof-disable",
        ],
    )?;
    let mrt_file = dir.path().join("table.mrt");
    mrt::write_table_dump(&mrt_file, n)?;
    let started = Instant::now();
    for _ in 0..100 {
        if g.exec(&["gobgp", "-p", "50051", "global"]).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // `gobgp mrt inject` returns before the server has taken the tail of
    // the stream, and that tail is lost: inject again from where GoBGP's
    // table ends until the whole table (not all the padding) is in.
    loop {
        let have = gobgp_count(&g)?;
        if have >= u64::from(n) {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("GoBGP took only {have} of {n} routes");
        }
        let (count, skip) = (
            (u64::from(n + mrt::PADDING) - have).to_string(),
            have.to_string(),
        );
        g.exec(&[
            "timeout",
            "300",
            "gobgp",
            "-p",
            "50051",
            "mrt",
            "inject",
            "global",
            mrt_file.to_str().unwrap(),
            &count,
            &skip,
        ])?;
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(1));
    let total = gobgp_count(&g)? as usize;
    let injected = started.elapsed();

    let mut cfg = SpeakerConfig::new(65002, "10.0.0.2".parse()?);
    cfg.listen = Some("10.0.0.2:179".parse()?);
    let (us, mut changes) = NsSpeaker::start(&ours, cfg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut p = PeerConfig::new("10.0.0.1".parse()?, 65010);
        p.local_address = Some("10.0.0.2".parse()?);
        let t0 = Instant::now();
        us.api().add_peer(p).await?;
        // The stand-in for the FIB: what the daemon would program.
        let mut fib: HashMap<IpNet, IpAddr> = HashMap::with_capacity(total);
        let mut first = None;
        while fib.len() < total {
            match tokio::time::timeout(Duration::from_secs(120), changes.recv()).await {
                Ok(Some(RouteChange::Added(r) | RouteChange::Changed(r))) => {
                    first.get_or_insert_with(Instant::now);
                    fib.insert(r.prefix, r.next_hop);
                }
                Ok(Some(RouteChange::Removed { prefix })) => {
                    fib.remove(&prefix);
                }
                _ => bail!("stalled at {} routes", fib.len()),
            }
        }
        let since_add = t0.elapsed();
        let learning = first.map(|f| f.elapsed()).unwrap_or_default();
        let peers = us.api().peers().await?;
        let updates = peers[0].updates_in;
        assert_eq!(fib.get(&IpNet::V4(ipnet::Ipv4Net::new(Ipv4Addr::new(20, 0, 0, 0), 24)?)), Some(&"10.0.0.1".parse::<IpAddr>()?));
        println!(
            "routes={total} gobgp_inject={:.1}s session_to_all_in_fib={:.2}s first_to_last={:.2}s routes_per_s={:.0} updates={updates} updates_per_s={:.0}",
            injected.as_secs_f64(),
            since_add.as_secs_f64(),
            learning.as_secs_f64(),
            total as f64 / learning.as_secs_f64(),
            updates as f64 / learning.as_secs_f64(),
        );
        Ok(())
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --benches` runs this without `--bench`: nothing to do.
        return Ok(());
    }
    if !nix::unistd::Uid::effective().is_root() {
        println!("learn_routes: skipped, needs root for network namespaces");
        return Ok(());
    }
    let sizes: Vec<u32> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![100_000, 1_000_000]
    } else {
        sizes
    };
    for n in sizes {
        run_one(n)?;
    }
    Ok(())
}
