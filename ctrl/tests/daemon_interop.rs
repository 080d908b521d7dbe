//! The whole daemon against BIRD 2 in network namespaces: the real
//! `brindle-ctrl` binary (its vrouter is the test's fake, which applies
//! what it is sent and answers `DumpRoutes` from it) peers as a
//! route-reflector client of BIRD over a TCP-MD5 session. A pod address
//! allocated over ctrl.sock gives the node a block, which BIRD must hold
//! with the node as next hop; BIRD's static route must reach our RIB and
//! the vrouter; the service prefixes of the config are announced and one
//! dropped by a SIGHUP reload is withdrawn; the uplink's kernel neighbours
//! reach the vrouter as `SetNeighbors`; SIGTERM withdraws everything.
//! A second test peers the daemon with GoBGP over eBGP, recording its BGP
//! inputs (`--record-bgp`), and replays the recording to the same RIB.

mod common;
mod daemon_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use brindle_api::framing::Client;
use brindle_api::vrouter::Encap;
use brindle_api::vrouter::{Mac, Neighbor, Route, RouteTarget, VrouterRequest};
use brindle_ctrl::bgp::record::Replay;
use common::*;
use daemon_support::{Daemon, FakeVrouter, wait_for};
use ipnet::IpNet;
use serde_json::Value;

struct Bird {
    _daemon: common::Daemon,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Bird {
    fn start(ns: &Netns, config: &str) -> Bird {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bird.conf");
        let socket = dir.path().join("bird.ctl");
        std::fs::write(&conf, config).unwrap();
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
        )
        .unwrap();
        Bird {
            _daemon: daemon,
            socket,
            _dir: dir,
        }
    }

    fn birdc(&self, ns: &Netns, cmd: &[&str]) -> String {
        let mut v = vec!["birdc", "-s", self.socket.to_str().unwrap()];
        v.extend_from_slice(cmd);
        ns.exec(&v).unwrap_or_default()
    }

    /// The `show route PREFIX all` entry, if BIRD has one.
    fn route(&self, ns: &Netns, prefix: &str) -> Option<String> {
        let out = self.birdc(ns, &["show", "route", prefix, "all"]);
        out.contains(&format!("{prefix} ")).then_some(out)
    }
}

fn brindlectl(socket_flag: &str, socket: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_brindlectl"))
        .arg(socket_flag)
        .arg(socket)
        .args(["-o", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "brindlectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn node_toml(dir: &Path, services_external: &str) -> String {
    format!(
        "node_name = \"n1\"\n\
         node_address = \"10.0.0.2\"\n\
         [api]\nsocket = \"{d}/ctrl.sock\"\n\
         [vrouter]\nsocket = \"{d}/vrouter.sock\"\n\
         [metrics]\nlisten = \"127.0.0.1:9091\"\n\
         [datastore]\npath = \"{d}/data\"\n\
         [bgp]\nas_number = 64512\nhold_time_secs = 9\n\
         service_cluster_ips = [\"10.96.0.0/12\"]\n\
         service_external_ips = [{services_external}]\n\
         [[bgp.peers]]\naddress = \"10.0.0.1\"\nas_number = 64512\npassword = \"s3cret-md5\"\n",
        d = dir.display()
    )
}

fn mac_of(ns: &Netns, dev: &str) -> Mac {
    let out = ns.ip(&["-j", "link", "show", dev]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().parse().unwrap()
}

fn neighbors_sent(vrouter: &FakeVrouter) -> Vec<Neighbor> {
    vrouter
        .requests()
        .into_iter()
        .flat_map(|r| match r {
            VrouterRequest::SetNeighbors { neighbors } => neighbors,
            _ => Vec::new(),
        })
        .collect()
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_daemon_as_an_md5_route_reflector_client_of_bird_exchanges_blocks_services_and_withdraws_on_sigterm()
 {
    let ours = Netns::new("bdus").unwrap();
    let bird_ns = Netns::new("bdbird").unwrap();
    let uplink = link(&ours, "10.0.0.2/24", &bird_ns, "10.0.0.1/24").unwrap();
    let bird_dev = bird_ns
        .ip(&["-o", "link", "show", "type", "veth"])
        .unwrap()
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .split('@')
        .next()
        .unwrap()
        .to_owned();
    let bird = Bird::start(
        &bird_ns,
        "router id 10.0.0.1;\n\
         protocol device { scan time 1; }\n\
         protocol direct { ipv4; interface \"*\"; }\n\
         protocol static { ipv4; route 198.51.100.0/24 blackhole; }\n\
         protocol bgp ours {\n\
           local 10.0.0.1 as 64512;\n\
           neighbor 10.0.0.2 as 64512;\n\
           rr client; rr cluster id 1.1.1.1; direct;\n\
           password \"s3cret-md5\";\n\
           connect delay time 1; connect retry time 2; error wait time 1, 2;\n\
           hold time 9;\n\
           ipv4 { import all; export all; };\n\
         }\n",
    );

    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("node.toml");
    std::fs::write(&conf, node_toml(dir.path(), "\"192.0.2.0/28\"")).unwrap();
    let vrouter = FakeVrouter::start_stateful(&dir.path().join("vrouter.sock"), "boot-1");
    let socket = dir.path().join("ctrl.sock");
    let mut daemon = Daemon::start_in(
        Some(&ours.name),
        &[("BRINDLE_CONFIG".into(), conf.display().to_string())],
        &[],
        &socket,
        &dir.path().join("log"),
    );
    let fail = |what: &str| -> String {
        format!(
            "{what}\n--- daemon log ---\n{}\n--- bird ---\n{}",
            daemon_log(dir.path()),
            bird.birdc(&bird_ns, &["show", "protocols", "all", "ours"])
        )
    };

    // A pod address: the node's first block gets affinity.
    let mut c = Client::connect(&socket, Duration::from_secs(10)).unwrap();
    let r: Value = c
        .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
            "handle":{"network":"k8s-pod-network","container_id":"c1","ifname":"eth0"},
            "node":"n1","attrs":{},"ipv4":true,"ipv6":false}))
        .unwrap();
    let pod: IpNet = r["addresses"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let block = IpNet::new(pod.addr(), 26).unwrap().trunc().to_string();

    // BIRD holds our block, and the service prefixes, via the node.
    for prefix in [block.as_str(), "10.96.0.0/12", "192.0.2.0/28"] {
        wait_for(
            &format!("{prefix} in BIRD"),
            Duration::from_secs(40),
            || {
                bird.route(&bird_ns, prefix)
                    .is_some_and(|r| r.contains("via 10.0.0.2"))
            },
        )
        .unwrap_or_else(|e| panic!("{}", fail(&e)));
    }
    let entry = bird.route(&bird_ns, &block).unwrap();
    // iBGP from a client: no AS prepended, learned over the MD5 session.
    assert!(
        entry.contains("BGP.as_path: \n") || entry.contains("BGP.as_path:\n"),
        "{entry}"
    );
    assert!(entry.contains("[ours "), "{entry}");

    // BIRD's static route in our RIB, best, via BIRD.
    wait_for("BIRD's route in our RIB", Duration::from_secs(20), || {
        let routes = brindlectl("--ctrl-socket", &socket, &["bgp", "routes"]);
        routes.as_array().unwrap().iter().any(|r| {
            r["prefix"] == "198.51.100.0/24" && r["next_hop"] == "10.0.0.1" && r["best"] == true
        })
    })
    .unwrap_or_else(|e| panic!("{}", fail(&e)));

    // ... and in the vrouter: outside every pool, so routed natively via
    // BIRD on the uplink; our block is a blackhole, the pod a local route.
    let vrouter_socket = dir.path().join("vrouter.sock");
    wait_for(
        "BIRD's route in the vrouter",
        Duration::from_secs(20),
        || {
            let v = brindlectl("--vrouter-socket", &vrouter_socket, &["vrouter", "routes"]);
            let routes: Vec<Route> = serde_json::from_value(v).unwrap();
            routes.contains(&Route {
                prefix: "198.51.100.0/24".parse().unwrap(),
                target: RouteTarget::Gateway {
                    via: "10.0.0.1".parse().unwrap(),
                    port: uplink.clone(),
                },
            }) && routes.contains(&Route {
                prefix: block.parse().unwrap(),
                target: RouteTarget::Blackhole,
            })
        },
    )
    .unwrap_or_else(|e| panic!("{}", fail(&e)));
    let status = brindlectl("--ctrl-socket", &socket, &["node", "status"]);
    assert_eq!(
        status["announced_services"],
        serde_json::json!(["10.96.0.0/12", "192.0.2.0/28"])
    );

    // Neighbours: BIRD's address, resolved by the kernel for the session,
    // and a permanent entry we add, reach the vrouter with their MACs.
    let bird_mac = mac_of(&bird_ns, &bird_dev);
    ours.ip(&[
        "neigh",
        "replace",
        "10.0.0.77",
        "lladdr",
        "02:00:00:00:00:77",
        "dev",
        &uplink,
        "nud",
        "permanent",
    ])
    .unwrap();
    let want_bird = Neighbor {
        port: uplink.clone(),
        ip: "10.0.0.1".parse().unwrap(),
        mac: bird_mac,
    };
    let want_static = Neighbor {
        port: uplink.clone(),
        ip: "10.0.0.77".parse().unwrap(),
        mac: "02:00:00:00:00:77".parse().unwrap(),
    };
    wait_for(
        "the neighbours in the vrouter",
        Duration::from_secs(10),
        || {
            let sent = neighbors_sent(&vrouter);
            sent.contains(&want_bird) && sent.contains(&want_static)
        },
    )
    .unwrap_or_else(|e| panic!("{}: {:?}", fail(&e), neighbors_sent(&vrouter)));
    // Deleted from the kernel: the vrouter converges without it.
    ours.ip(&["neigh", "del", "10.0.0.77", "dev", &uplink])
        .unwrap();
    wait_for(
        "the neighbour removed by a Sync",
        Duration::from_secs(10),
        || {
            vrouter.requests().iter().rev().any(|r| match r {
                VrouterRequest::Sync { state } => {
                    !state.neighbors.contains(&want_static) && state.neighbors.contains(&want_bird)
                }
                _ => false,
            })
        },
    )
    .unwrap_or_else(|e| panic!("{}", fail(&e)));

    // Reload without the external IPs: withdrawn, the cluster IPs stay.
    std::fs::write(&conf, node_toml(dir.path(), "")).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for(
        "192.0.2.0/28 withdrawn after SIGHUP",
        Duration::from_secs(20),
        || bird.route(&bird_ns, "192.0.2.0/28").is_none(),
    )
    .unwrap_or_else(|e| panic!("{}", fail(&e)));
    assert!(bird.route(&bird_ns, "10.96.0.0/12").is_some());
    assert!(bird.route(&bird_ns, &block).is_some());

    // SIGTERM: Cease, and BIRD forgets everything we announced.
    daemon.stop();
    for prefix in [block.as_str(), "10.96.0.0/12"] {
        wait_for(
            &format!("{prefix} withdrawn"),
            Duration::from_secs(20),
            || bird.route(&bird_ns, prefix).is_none(),
        )
        .unwrap_or_else(|e| panic!("{}", fail(&e)));
    }
    let proto = bird.birdc(&bird_ns, &["show", "protocols", "all", "ours"]);
    assert!(proto.contains("Administrative shutdown"), "{proto}");
    let _: IpAddr = pod.addr();
}

fn daemon_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default()
}

fn gobgp(ns: &Netns, args: &[&str]) -> String {
    let mut v = vec!["gobgp", "-p", "50051"];
    v.extend_from_slice(args);
    ns.exec(&v).unwrap_or_default()
}

fn allocate(socket: &Path) -> String {
    let mut c = Client::connect(socket, Duration::from_secs(10)).unwrap();
    let r: Value = c
        .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
            "handle":{"network":"k8s-pod-network","container_id":"c1","ifname":"eth0"},
            "node":"n1","attrs":{},"ipv4":true,"ipv6":false}))
        .unwrap();
    let pod: IpNet = r["addresses"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    IpNet::new(pod.addr(), 26).unwrap().trunc().to_string()
}

/// Rows of a route list as sorted JSON texts.
fn sorted_rows(v: &Value) -> Vec<String> {
    let mut rows: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.to_string())
        .collect();
    rows.sort();
    rows
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_daemon_exchanges_routes_with_gobgp_and_its_recorded_session_replays_to_the_same_rib() {
    let ours = Netns::new("bdus").unwrap();
    let g_ns = Netns::new("bdgob").unwrap();
    let uplink = link(&ours, "10.0.0.2/24", &g_ns, "10.0.0.1/24").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gconf = dir.path().join("gobgpd.toml");
    std::fs::write(
        &gconf,
        "[global.config]\n  as = 65001\n  router-id = \"10.0.0.1\"\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"10.0.0.2\"\n    peer-as = 64512\n\
         [neighbors.timers.config]\n    connect-retry = 2\n    hold-time = 9\n    keepalive-interval = 3\n",
    )
    .unwrap();
    let _gobgpd = spawn(
        &g_ns,
        &[
            "gobgpd",
            "-f",
            gconf.to_str().unwrap(),
            "--api-hosts",
            "127.0.0.1:50051",
            "--pprof-disable",
        ],
    )
    .unwrap();

    let conf = dir.path().join("node.toml");
    std::fs::write(
        &conf,
        format!(
            "node_name = \"n1\"\nnode_address = \"10.0.0.2\"\n\
             [api]\nsocket = \"{d}/ctrl.sock\"\n\
             [vrouter]\nsocket = \"{d}/vrouter.sock\"\n\
             [metrics]\nlisten = \"127.0.0.1:9091\"\n\
             [datastore]\npath = \"{d}/data\"\n\
             [bgp]\nas_number = 64512\nhold_time_secs = 9\n\
             service_loadbalancer_ips = [\"192.0.2.64/26\"]\n\
             [[bgp.peers]]\naddress = \"10.0.0.1\"\nas_number = 65001\n",
            d = dir.path().display()
        ),
    )
    .unwrap();
    let record = dir.path().join("bgp.jsonl");
    let vrouter = FakeVrouter::start_stateful(&dir.path().join("vrouter.sock"), "boot-1");
    let socket = dir.path().join("ctrl.sock");
    let mut daemon = Daemon::start_in(
        Some(&ours.name),
        &[("BRINDLE_CONFIG".into(), conf.display().to_string())],
        &["--record-bgp", record.to_str().unwrap()],
        &socket,
        &dir.path().join("log"),
    );
    let fail = |what: &str| -> String {
        format!(
            "{what}\n--- daemon log ---\n{}\n--- gobgp ---\n{}",
            daemon_log(dir.path()),
            gobgp(&g_ns, &["neighbor"])
        )
    };
    let block = allocate(&socket);

    // GoBGP learns our block and the load-balancer range, via us, AS 64512.
    wait_for("our prefixes in GoBGP", Duration::from_secs(40), || {
        let rib = gobgp(&g_ns, &["global", "rib", "-a", "ipv4"]);
        [block.as_str(), "192.0.2.64/26"].iter().all(|p| {
            rib.lines()
                .any(|l| l.contains(p) && l.contains("10.0.0.2") && l.contains("64512"))
        })
    })
    .unwrap_or_else(|e| panic!("{}", fail(&e)));

    // GoBGP's routes: one outside the pools, one inside (another node's
    // block as far as we can tell).
    gobgp(
        &g_ns,
        &["global", "rib", "add", "203.0.113.0/24", "-a", "ipv4"],
    );
    gobgp(
        &g_ns,
        &["global", "rib", "add", "10.244.200.0/26", "-a", "ipv4"],
    );
    let vrouter_socket = dir.path().join("vrouter.sock");
    wait_for(
        "GoBGP's routes in the vrouter",
        Duration::from_secs(20),
        || {
            let v = brindlectl("--vrouter-socket", &vrouter_socket, &["vrouter", "routes"]);
            let routes: Vec<Route> = serde_json::from_value(v).unwrap();
            routes.contains(&Route {
                prefix: "203.0.113.0/24".parse().unwrap(),
                target: RouteTarget::Gateway {
                    via: "10.0.0.1".parse().unwrap(),
                    port: uplink.clone(),
                },
            }) && routes.contains(&Route {
                prefix: "10.244.200.0/26".parse().unwrap(),
                target: RouteTarget::Encap {
                    encap: Encap::Ipip,
                    remote: "10.0.0.1".parse().unwrap(),
                },
            })
        },
    )
    .unwrap_or_else(|e| panic!("{}", fail(&e)));
    let live = brindlectl("--ctrl-socket", &socket, &["bgp", "routes"]);
    assert!(
        live.as_array()
            .unwrap()
            .iter()
            .any(|r| r["prefix"] == "203.0.113.0/24"
                && r["as_path"] == serde_json::json!([65001])
                && r["best"] == true),
        "{live}"
    );

    // The recording replays to exactly the RIB the daemon shows.
    let text = std::fs::read_to_string(&record).unwrap();
    let replay = Replay::from_text(&text).unwrap();
    let replayed = serde_json::to_value(replay.routes()).unwrap();
    assert_eq!(sorted_rows(&replayed), sorted_rows(&live));
    assert!(
        text.contains("\"event\":\"frame\""),
        "received messages recorded"
    );

    // SIGTERM: GoBGP loses our prefixes.
    daemon.stop();
    wait_for(
        "our prefixes withdrawn from GoBGP",
        Duration::from_secs(20),
        || {
            let rib = gobgp(&g_ns, &["global", "rib", "-a", "ipv4"]);
            !rib.contains(&block) && !rib.contains("192.0.2.64/26")
        },
    )
    .unwrap_or_else(|e| panic!("{}", fail(&e)));
    assert!(!vrouter.requests().is_empty());
}
