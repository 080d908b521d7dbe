//! Interop in network namespaces: our speaker against BIRD 2 and GoBGP
//! (started by the tests with generated configs), with TCP-MD5, as a
//! route-reflector client of BIRD, and three of our speakers in a full mesh.
//! Every namespace and daemon is removed by a Drop guard, also on failure.

mod common;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use brindle_ctrl::bgp::fsm::State;
use brindle_ctrl::bgp::rib::{RouteChange, RouteEntry, Source};
use brindle_ctrl::bgp::speaker::*;
use common::*;
use ipnet::IpNet;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn speaker_config(asn: u32, id: &str) -> SpeakerConfig {
    let mut c = SpeakerConfig::new(asn, id.parse().unwrap());
    c.listen = Some(format!("{id}:179").parse().unwrap());
    c
}

fn peer(addr: &str, asn: u32, local: &str) -> PeerConfig {
    let mut p = PeerConfig::new(ip(addr), asn);
    p.local_address = Some(ip(local));
    p.connect_retry = 2;
    p.hold_time = 9;
    p
}

/// Polls until `check` passes; the bound only turns a hang into a failure.
async fn eventually<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let mut last = None;
    for _ in 0..150 {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("timed out waiting for {what} (last error: {last:?})")
}

async fn established(s: &Speaker, peer: &str) -> Result<bool> {
    Ok(s.peers()
        .await?
        .iter()
        .any(|p| p.address == ip(peer) && p.state == State::Established))
}

async fn route_via(
    s: &Speaker,
    prefix: &str,
    next_hop: &str,
    from: &str,
) -> Result<Option<RouteEntry>> {
    Ok(s.routes().await?.into_iter().find(|r| {
        r.prefix == net(prefix)
            && r.best
            && r.next_hop == ip(next_hop)
            && r.source == Source::Peer(ip(from))
    }))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn bird_config(router_id: &str, protocols: &str) -> String {
    format!(
        "router id {router_id};\n\
         protocol device {{ scan time 1; }}\n\
         protocol direct {{ ipv4; interface \"*\"; }}\n\
         protocol static {{ ipv4; route 198.51.100.0/24 blackhole; }}\n\
         {protocols}"
    )
}

struct Bird {
    _daemon: Daemon,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Bird {
    fn start(ns: &Netns, config: &str) -> Result<Bird> {
        let dir = tempfile::tempdir()?;
        let conf = dir.path().join("bird.conf");
        let socket = dir.path().join("bird.ctl");
        std::fs::write(&conf, config)?;
        let daemon = spawn(
            ns,
            &[
                "bird",
                "-f",
                "-c",
                conf.to_str().unwrap(),
                "-s",
                socket.to_str().unwrap(),
            ],
        )?;
        Ok(Bird {
            _daemon: daemon,
            socket,
            _dir: dir,
        })
    }
    fn birdc(&self, ns: &Netns, cmd: &[&str]) -> Result<String> {
        let mut v = vec!["birdc", "-s", self.socket.to_str().unwrap()];
        v.extend_from_slice(cmd);
        ns.exec(&v)
    }
}

fn bird_bgp(
    name: &str,
    local: &str,
    local_as: u32,
    neighbor: &str,
    remote_as: u32,
    extra: &str,
) -> String {
    format!(
        "protocol bgp {name} {{\n\
           local {local} as {local_as};\n\
           neighbor {neighbor} as {remote_as};\n\
           connect delay time 1; connect retry time 2; error wait time 1, 2;\n\
           hold time 9;\n\
           {extra}\n\
           ipv4 {{ import all; export all; }};\n\
         }}\n"
    )
}

#[test]
#[ignore = "requires root and network namespaces"]
fn exchanges_routes_with_bird_both_ways_and_withdraws_on_shutdown() -> Result<()> {
    let ours = Netns::new("bus")?;
    let bird_ns = Netns::new("bbir")?;
    link(&ours, "10.0.0.2/24", &bird_ns, "10.0.0.1/24")?;
    let bird = Bird::start(
        &bird_ns,
        &bird_config(
            "10.0.0.1",
            &bird_bgp("ours", "10.0.0.1", 65001, "10.0.0.2", 65002, ""),
        ),
    )?;
    let (mut us, mut changes) = NsSpeaker::start(&ours, speaker_config(65002, "10.0.0.2"))?;
    runtime().block_on(async {
        us.api()
            .add_peer(peer("10.0.0.1", 65001, "10.0.0.2"))
            .await?;
        us.api().announce(net("10.244.1.0/26"), ip("10.0.0.2"))?;
        eventually("session with BIRD", || established(us.api(), "10.0.0.1")).await?;
        // BIRD -> us: its static route, via BIRD.
        eventually("BIRD's route in our RIB", || async {
            Ok(
                route_via(us.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1")
                    .await?
                    .is_some(),
            )
        })
        .await?;
        let r = route_via(us.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1")
            .await?
            .unwrap();
        assert_eq!(r.as_path, vec![65001]);
        match changes.recv().await {
            Some(RouteChange::Added(b)) => {
                assert_eq!(
                    (b.prefix, b.next_hop, b.peer),
                    (net("198.51.100.0/24"), ip("10.0.0.1"), ip("10.0.0.1"))
                )
            }
            other => bail!("expected the route change, got {other:?}"),
        }
        // us -> BIRD: our block, via us, with our AS.
        eventually("our block in BIRD", || async {
            let out = bird.birdc(&bird_ns, &["show", "route", "10.244.1.0/26", "all"])?;
            Ok(out.contains("10.244.1.0/26")
                && out.contains("via 10.0.0.2")
                && out.contains("BGP.as_path: 65002"))
        })
        .await?;
        us.shutdown().await;
        eventually("BIRD forgets our block after our Cease", || async {
            let out = bird.birdc(&bird_ns, &["show", "route"])?;
            Ok(!out.contains("10.244.1.0/26"))
        })
        .await?;
        let proto = bird.birdc(&bird_ns, &["show", "protocols", "all", "ours"])?;
        assert!(proto.contains("Administrative shutdown"), "{proto}");
        Ok(())
    })
}

#[test]
#[ignore = "requires root and network namespaces"]
fn md5_protected_session_with_bird_comes_up_only_with_the_right_password() -> Result<()> {
    let ours = Netns::new("bus")?;
    let bird_ns = Netns::new("bbir")?;
    link(&ours, "10.0.0.2/24", &bird_ns, "10.0.0.1/24")?;
    let bird = Bird::start(
        &bird_ns,
        &bird_config(
            "10.0.0.1",
            &bird_bgp(
                "ours",
                "10.0.0.1",
                65001,
                "10.0.0.2",
                65002,
                "password \"s3cret-md5\";",
            ),
        ),
    )?;
    let (us, _changes) = NsSpeaker::start(&ours, speaker_config(65002, "10.0.0.2"))?;
    runtime().block_on(async {
        let mut p = peer("10.0.0.1", 65001, "10.0.0.2");
        p.password = Some("s3cret-md5".into());
        us.api().add_peer(p).await?;
        us.api().announce(net("10.244.3.0/26"), ip("10.0.0.2"))?;
        eventually("MD5 session with BIRD", || {
            established(us.api(), "10.0.0.1")
        })
        .await?;
        eventually("our block in BIRD", || async {
            Ok(bird
                .birdc(&bird_ns, &["show", "route", "10.244.3.0/26"])?
                .contains("10.244.3.0/26"))
        })
        .await?;
        // With the wrong password the segments are dropped by the kernel.
        us.api().remove_peer(ip("10.0.0.1")).await?;
        let mut wrong = peer("10.0.0.1", 65001, "10.0.0.2");
        wrong.password = Some("wrong".into());
        us.api().add_peer(wrong).await?;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!established(us.api(), "10.0.0.1").await?);
        Ok(())
    })
}

#[test]
#[ignore = "requires root and network namespaces"]
fn route_reflector_clients_of_bird_learn_each_others_routes() -> Result<()> {
    let ours = Netns::new("bus")?;
    let bird_ns = Netns::new("brr")?;
    let dev = link(&ours, "10.0.0.2/24", &bird_ns, "10.0.0.1/24")?;
    ours.ip(&["addr", "add", "10.0.0.3/24", "dev", &dev])?;
    let rr = "direct;\n rr client;\n rr cluster id 1.1.1.1;";
    let protocols = bird_bgp("a", "10.0.0.1", 64512, "10.0.0.2", 64512, rr)
        + &bird_bgp("b", "10.0.0.1", 64512, "10.0.0.3", 64512, rr);
    let bird = Bird::start(&bird_ns, &bird_config("10.0.0.1", &protocols))?;
    let (a, _) = NsSpeaker::start(&ours, speaker_config(64512, "10.0.0.2"))?;
    let (b, _) = NsSpeaker::start(&ours, speaker_config(64512, "10.0.0.3"))?;
    runtime().block_on(async {
        a.api()
            .add_peer(peer("10.0.0.1", 64512, "10.0.0.2"))
            .await?;
        b.api()
            .add_peer(peer("10.0.0.1", 64512, "10.0.0.3"))
            .await?;
        a.api().announce(net("10.244.10.0/26"), ip("10.0.0.2"))?;
        b.api().announce(net("10.244.11.0/26"), ip("10.0.0.3"))?;
        // Reflected by BIRD with the next hop of the originating client.
        eventually(
            "a's block at b via a, learned from the reflector",
            || async {
                Ok(route_via(b.api(), "10.244.10.0/26", "10.0.0.2", "10.0.0.1")
                    .await?
                    .is_some())
            },
        )
        .await?;
        eventually("b's block at a via b", || async {
            Ok(route_via(a.api(), "10.244.11.0/26", "10.0.0.3", "10.0.0.1")
                .await?
                .is_some())
        })
        .await?;
        // BIRD itself sees both, and its static route reaches both clients.
        let out = bird.birdc(&bird_ns, &["show", "route", "all"])?;
        assert!(
            out.contains("10.244.10.0/26") && out.contains("10.244.11.0/26"),
            "{out}"
        );
        eventually("BIRD's route at a", || async {
            Ok(
                route_via(a.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1")
                    .await?
                    .is_some(),
            )
        })
        .await?;
        Ok(())
    })
}

struct Gobgp {
    _daemon: Daemon,
    _dir: tempfile::TempDir,
}

impl Gobgp {
    fn cli(ns: &Netns, args: &[&str]) -> Result<String> {
        let mut v = vec!["gobgp", "-p", "50051"];
        v.extend_from_slice(args);
        ns.exec(&v)
    }
}

#[test]
#[ignore = "requires root and network namespaces"]
fn exchanges_ipv4_and_ipv6_routes_with_gobgp_and_withdraws_on_shutdown() -> Result<()> {
    let ours = Netns::new("bus")?;
    let g_ns = Netns::new("bgob")?;
    link(&ours, "10.0.0.2/24", &g_ns, "10.0.0.1/24")?;
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("gobgpd.toml");
    std::fs::write(
        &conf,
        "[global.config]\n  as = 4200000001\n  router-id = \"10.0.0.1\"\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"10.0.0.2\"\n    peer-as = 65002\n\
         [neighbors.timers.config]\n    connect-retry = 2\n    hold-time = 9\n    keepalive-interval = 3\n\
         [[neighbors.afi-safis]]\n  [neighbors.afi-safis.config]\n    afi-safi-name = \"ipv4-unicast\"\n\
         [[neighbors.afi-safis]]\n  [neighbors.afi-safis.config]\n    afi-safi-name = \"ipv6-unicast\"\n",
    )?;
    let gobgp = Gobgp {
        _daemon: spawn(
            &g_ns,
            &[
                "gobgpd",
                "-f",
                conf.to_str().unwrap(),
                "--api-hosts",
                "127.0.0.1:50051",
                "--pprof-disable",
            ],
        )?,
        _dir: dir,
    };
    let mut cfg = speaker_config(65002, "10.0.0.2");
    cfg.ipv6_next_hop = Some("fd00::2".parse().unwrap());
    let (mut us, _changes) = NsSpeaker::start(&ours, cfg)?;
    runtime().block_on(async {
        us.api()
            .add_peer(peer("10.0.0.1", 4_200_000_001, "10.0.0.2"))
            .await?;
        us.api().announce(net("10.244.2.0/26"), ip("10.0.0.2"))?;
        us.api().announce(net("fd00:244::/64"), ip("fd00::2"))?;
        eventually("session with GoBGP", || established(us.api(), "10.0.0.1")).await?;
        eventually("GoBGP's API", || async {
            Ok(Gobgp::cli(&g_ns, &["global"]).is_ok())
        })
        .await?;
        Gobgp::cli(
            &g_ns,
            &["global", "rib", "add", "203.0.113.0/24", "-a", "ipv4"],
        )?;
        Gobgp::cli(
            &g_ns,
            &[
                "global",
                "rib",
                "add",
                "2001:db8:9::/48",
                "nexthop",
                "fd00::1",
                "-a",
                "ipv6",
            ],
        )?;
        eventually("GoBGP's IPv4 route in our RIB", || async {
            Ok(
                route_via(us.api(), "203.0.113.0/24", "10.0.0.1", "10.0.0.1")
                    .await?
                    .is_some_and(|r| r.as_path == vec![4_200_000_001]),
            )
        })
        .await?;
        eventually("GoBGP's IPv6 route in our RIB", || async {
            Ok(
                route_via(us.api(), "2001:db8:9::/48", "fd00::1", "10.0.0.1")
                    .await?
                    .is_some(),
            )
        })
        .await?;
        eventually("our blocks in GoBGP", || async {
            let v4 = Gobgp::cli(&g_ns, &["global", "rib", "-a", "ipv4"])?;
            let v6 = Gobgp::cli(&g_ns, &["global", "rib", "-a", "ipv6"])?;
            Ok(v4.lines().any(|l| {
                l.contains("10.244.2.0/26") && l.contains("10.0.0.2") && l.contains("65002")
            }) && v6
                .lines()
                .any(|l| l.contains("fd00:244::/64") && l.contains("fd00::2")))
        })
        .await?;
        us.shutdown().await;
        eventually("GoBGP forgets our blocks", || async {
            let v4 = Gobgp::cli(&g_ns, &["global", "rib", "-a", "ipv4"])?;
            Ok(!v4.contains("10.244.2.0/26"))
        })
        .await?;
        drop(gobgp);
        Ok(())
    })
}

#[test]
#[ignore = "requires root and network namespaces"]
fn three_speakers_in_a_full_mesh_each_learn_the_other_two_blocks() -> Result<()> {
    let hub = Netns::new("bhub")?;
    hub.ip(&["link", "add", "br0", "type", "bridge"])?;
    hub.ip(&["link", "set", "br0", "up"])?;
    let mut nodes = Vec::new();
    for i in 1..=3u8 {
        let ns = Netns::new(&format!("bn{i}"))?;
        let (a, b) = (unique("vn"), unique("vh"));
        run(&[
            "ip", "link", "add", &a, "netns", &ns.name, "type", "veth", "peer", "name", &b,
            "netns", &hub.name,
        ])?;
        ns.ip(&["addr", "add", &format!("10.0.0.{i}/24"), "dev", &a])?;
        ns.ip(&["link", "set", &a, "up"])?;
        hub.ip(&["link", "set", &b, "master", "br0", "up"])?;
        nodes.push(ns);
    }
    let mut speakers = Vec::new();
    for (i, ns) in nodes.iter().enumerate() {
        let me = format!("10.0.0.{}", i + 1);
        speakers.push(NsSpeaker::start(ns, speaker_config(64512, &me))?);
    }
    runtime().block_on(async {
        for (i, (s, _)) in speakers.iter().enumerate() {
            let me = format!("10.0.0.{}", i + 1);
            for j in 0..3 {
                if j != i {
                    s.api()
                        .add_peer(peer(&format!("10.0.0.{}", j + 1), 64512, &me))
                        .await?;
                }
            }
            s.api()
                .announce(net(&format!("10.244.{}.0/26", 100 + i)), ip(&me))?;
        }
        for (i, (s, _)) in speakers.iter().enumerate() {
            for j in (0..3).filter(|j| *j != i) {
                let owner = format!("10.0.0.{}", j + 1);
                let block = format!("10.244.{}.0/26", 100 + j);
                eventually(&format!("node {} learns {block}", i + 1), || async {
                    Ok(route_via(s.api(), &block, &owner, &owner).await?.is_some())
                })
                .await?;
            }
            // iBGP split horizon: nothing learned twice.
            let routes = s.api().routes().await?;
            assert_eq!(routes.len(), 3, "{routes:?}");
        }
        // The route changes for the dataplane: two blocks per node.
        for (i, (_, rx)) in speakers.iter_mut().enumerate() {
            let mut learned = Vec::new();
            while let Ok(c) = rx.try_recv() {
                if let RouteChange::Added(r) = c {
                    learned.push(r.prefix);
                }
            }
            learned.sort();
            let want: Vec<IpNet> = (0..3)
                .filter(|j| *j != i)
                .map(|j| net(&format!("10.244.{}.0/26", 100 + j)))
                .collect();
            assert_eq!(learned, want, "node {}", i + 1);
        }
        Ok(())
    })
}

#[test]
#[ignore = "requires root and network namespaces"]
fn routes_of_a_killed_bird_with_graceful_restart_are_held_until_it_is_back() -> Result<()> {
    let ours = Netns::new("bus")?;
    let bird_ns = Netns::new("bbir")?;
    link(&ours, "10.0.0.2/24", &bird_ns, "10.0.0.1/24")?;
    let config = bird_config(
        "10.0.0.1",
        &bird_bgp(
            "ours",
            "10.0.0.1",
            65001,
            "10.0.0.2",
            65002,
            "graceful restart on;\n graceful restart time 60;",
        ),
    );
    let bird = Bird::start(&bird_ns, &config)?;
    let (us, mut changes) = NsSpeaker::start(&ours, speaker_config(65002, "10.0.0.2"))?;
    runtime().block_on(async {
        us.api()
            .add_peer(peer("10.0.0.1", 65001, "10.0.0.2"))
            .await?;
        eventually("BIRD's route", || async {
            Ok(
                route_via(us.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1")
                    .await?
                    .is_some_and(|r| !r.stale),
            )
        })
        .await?;
        assert!(matches!(changes.recv().await, Some(RouteChange::Added(_))));

        // BIRD dies without a NOTIFICATION: its route stays, stale, and the
        // dataplane is not told to remove it.
        drop(bird);
        eventually("session down", || async {
            Ok(!established(us.api(), "10.0.0.1").await?)
        })
        .await?;
        let r = route_via(us.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1").await?;
        assert!(r.is_some_and(|r| r.stale), "route held as stale");

        // BIRD comes back, re-sends its table and End-of-RIB: fresh again.
        let _bird = Bird::start(&bird_ns, &config)?;
        eventually("session back and route refreshed", || async {
            Ok(established(us.api(), "10.0.0.1").await?
                && route_via(us.api(), "198.51.100.0/24", "10.0.0.1", "10.0.0.1")
                    .await?
                    .is_some_and(|r| !r.stale))
        })
        .await?;
        while let Ok(c) = changes.try_recv() {
            assert!(
                !matches!(c, RouteChange::Removed { .. }),
                "the route was never withdrawn: {c:?}"
            );
        }
        Ok(())
    })
}
