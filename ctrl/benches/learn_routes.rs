//! How fast our speaker learns a full table from GoBGP: N IPv4 routes are
//! injected into GoBGP (from a generated MRT TABLE_DUMP_V2 file) before our
//! session exists; then we add the peer and time until every route has come
//! out of the RIB as a `RouteChange` and been put into a map standing in
//! for the FIB. Needs root (network namespaces); run with
//! `cargo bench -p brindle-ctrl --bench learn_routes [-- 100000 1000000]`.

#[path = "../tests/common/netns.rs"]
mod netns;

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use brindle_ctrl::bgp::rib::RouteChange;
use brindle_ctrl::bgp::speaker::{PeerConfig, SpeakerConfig};
use ipnet::IpNet;
use netns::*;

/// Entries after the table proper: `gobgp mrt inject` loses the tail of
/// what it streams, so the tail is padding.
const PADDING: u32 = 5000;

/// The i-th /24: the table from 20.0.0.0 upwards, padding in 100.64.0.0/10.
fn prefix(i: u32, n: u32) -> [u8; 3] {
    let a = if i < n {
        (20u32 << 16) + i
    } else {
        (100u32 << 16) + (64 << 8) + (i - n)
    };
    [(a >> 16) as u8, (a >> 8) as u8, a as u8]
}

/// An MRT TABLE_DUMP_V2 file (RFC 6396): a peer index table and one
/// RIB_IPV4_UNICAST record per prefix.
fn write_mrt(path: &std::path::Path, n: u32) -> Result<()> {
    let entries = n + PADDING;
    fn record(out: &mut Vec<u8>, subtype: u16, body: &[u8]) {
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&13u16.to_be_bytes());
        out.extend_from_slice(&subtype.to_be_bytes());
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(body);
    }
    let mut out = Vec::with_capacity(n as usize * 48);
    let mut pit = Vec::new();
    pit.extend_from_slice(&[10, 0, 0, 1]); // collector
    pit.extend_from_slice(&0u16.to_be_bytes()); // view name
    pit.extend_from_slice(&1u16.to_be_bytes());
    pit.push(0x02); // IPv4 address, 4-octet AS
    pit.extend_from_slice(&[10, 0, 0, 1]);
    pit.extend_from_slice(&[10, 0, 0, 1]);
    pit.extend_from_slice(&65010u32.to_be_bytes());
    record(&mut out, 1, &pit);
    // ORIGIN IGP, AS_PATH [65010] (4-octet), NEXT_HOP 10.0.0.1.
    let attrs: &[u8] = &[
        0x40, 1, 1, 0, 0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xf2, 0x40, 3, 4, 10, 0, 0, 1,
    ];
    for i in 0..entries {
        let mut e = Vec::with_capacity(48);
        e.extend_from_slice(&i.to_be_bytes());
        e.push(24);
        e.extend_from_slice(&prefix(i, n));
        e.extend_from_slice(&1u16.to_be_bytes());
        e.extend_from_slice(&0u16.to_be_bytes());
        e.extend_from_slice(&0u32.to_be_bytes());
        e.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        e.extend_from_slice(attrs);
        record(&mut out, 2, &e);
    }
    std::fs::File::create(path)?.write_all(&out)?;
    Ok(())
}

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
    let t = tag();
    let ours = Netns::new(format!("bgpb-{t}-us"))?;
    let g = Netns::new(format!("bgpb-{t}-gobgp"))?;
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
    let _gobgpd = g.spawn(&[
        "gobgpd",
        "-f",
        conf.to_str().unwrap(),
        "--api-hosts",
        "127.0.0.1:50051",
        "--pprof-disable",
    ])?;
    let mrt = dir.path().join("table.mrt");
    write_mrt(&mrt, n)?;
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
            (u64::from(n + PADDING) - have).to_string(),
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
            mrt.to_str().unwrap(),
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
