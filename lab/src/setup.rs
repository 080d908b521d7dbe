//! The lab's namespaces and daemons: the underlay router with etcd, and
//! each node's `brindle-vrouter serve` and `brindle-ctrl`.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::config::encap_key;
use crate::exec::{in_ns, ip, sh, succeeds_within, wait_for};
use crate::inspect::brindlectl;
use crate::teardown::spawn_daemon;
use crate::{
    ETCD_ADDR, LabConfig, PREFIX, STATE_DIR, UNDERLAY_NS, hostpath, node_dir, node_ns, step,
};

/// The router namespace with one bridge per subnet, and etcd on it.
pub(crate) fn underlay(cfg: &LabConfig) -> Result<()> {
    step(&format!(
        "underlay: {} subnet(s), the router namespace {UNDERLAY_NS}, etcd on {ETCD_ADDR}:2379",
        cfg.subnets
    ));
    ip(&["netns", "add", UNDERLAY_NS])?;
    ip(&["-n", UNDERLAY_NS, "link", "set", "lo", "up"])?;
    // The kernel routes between the subnets' bridges.
    sh(in_ns(UNDERLAY_NS, "sysctl").args(["-qw", "net.ipv4.ip_forward=1"]))?;
    for s in 0..cfg.subnets {
        let br = format!("br{s}");
        ip(&["-n", UNDERLAY_NS, "link", "add", &br, "type", "bridge"])?;
        ip(&[
            "-n",
            UNDERLAY_NS,
            "addr",
            "add",
            &format!("10.99.{s}.254/24"),
            "dev",
            &br,
        ])?;
        ip(&["-n", UNDERLAY_NS, "link", "set", &br, "up"])?;
    }
    let etcd_url = format!("http://{ETCD_ADDR}:2379");
    let peer_url = "http://127.0.0.1:2380".to_string();
    spawn_daemon(
        UNDERLAY_NS,
        "etcd",
        Path::new("etcd"),
        &[
            "--name=lab".into(),
            format!("--data-dir={STATE_DIR}/etcd"),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=lab={peer_url}"),
        ],
        &[],
    )?;
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        let s = cfg.subnet_of(n);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let port = format!("n{n}");
        ip(&[
            "-n",
            UNDERLAY_NS,
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &ns,
        ])?;
        ip(&[
            "-n",
            UNDERLAY_NS,
            "link",
            "set",
            &port,
            "master",
            &format!("br{s}"),
            "up",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", cfg.node_addr(n)),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        // The router on the node's subnet reaches the other subnet (and
        // etcd), as a node's default gateway does.
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &format!("10.99.{s}.254"),
        ])?;
        // The pods' replies to 169.254.1.1 and forwarding between veths.
        sh(in_ns(&ns, "sysctl").args(["-qw", "net.ipv4.ip_forward=1"]))?;
        eprintln!(
            "{ns}: eth0 {}/24 on br{s}, default via 10.99.{s}.254",
            cfg.node_addr(n)
        );
    }
    wait_for("etcd", Duration::from_secs(20), || {
        succeeds_within(
            in_ns(&node_ns(1), "bash").args(["-c", &format!("exec 3<>/dev/tcp/{ETCD_ADDR}/2379")]),
            Duration::from_secs(5),
        )
    })
}

/// `brindle-vrouter serve` and `brindle-ctrl` in each node namespace.
pub(crate) fn nodes(cfg: &LabConfig) -> Result<()> {
    step("nodes: brindle-vrouter serve and brindle-ctrl in each node namespace");
    let encap = encap_key(&cfg.encap)?;
    let etcd_url = format!("http://{ETCD_ADDR}:2379");
    for n in 1..=cfg.nodes {
        let ns = node_ns(n);
        let dir = node_dir(n);
        fs::create_dir_all(&dir)?;
        let vrouter_toml = dir.join("vrouter.toml");
        fs::write(
            &vrouter_toml,
            format!(
                "uplink = \"eth0\"\ncores = \"{cores}\"\nadaptive_polling = true\n\
                 [api]\nsocket = \"{d}/vrouter.sock\"\n[metrics]\nlisten = \"127.0.0.1:9092\"\n\
                 [xdp]\nmode = \"native\"\nbind = \"copy\"\nbpffs = \"/sys/fs/bpf/{PREFIX}n{n}\"\n",
                cores = cfg.vrouter_cores(n),
                d = dir.display()
            ),
        )?;
        spawn_daemon(
            &ns,
            &format!("n{n}-vrouter"),
            &cfg.bin_dir.join("brindle-vrouter"),
            &[
                "serve".into(),
                "--config".into(),
                vrouter_toml.display().to_string(),
            ],
            &[],
        )?;
        let node_toml = dir.join("node.toml");
        fs::write(&node_toml, "# the lab sets every key by environment\n")?;
        let env: Vec<(String, String)> = [
            ("BRINDLE_CONFIG", node_toml.display().to_string()),
            ("BRINDLE_NODE_NAME", node_ns(n)),
            ("BRINDLE_NODE_ADDRESS", cfg.node_addr(n).to_string()),
            (
                "BRINDLE_API_SOCKET",
                dir.join("ctrl.sock").display().to_string(),
            ),
            (
                "BRINDLE_VROUTER_SOCKET",
                dir.join("vrouter.sock").display().to_string(),
            ),
            ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
            ("BRINDLE_DATASTORE_TYPE", "etcd".into()),
            ("BRINDLE_DATASTORE_ENDPOINTS", etcd_url.clone()),
            ("BRINDLE_BGP_AS_NUMBER", "64512".into()),
            ("BRINDLE_BGP_NODE_TO_NODE_MESH", "true".into()),
            ("BRINDLE_IPAM_DEFAULT_POOL_CIDR", "10.244.0.0/16".into()),
            ("BRINDLE_IPAM_BLOCK_SIZE", "26".into()),
            ("BRINDLE_IPAM_ENCAPSULATION", encap.into()),
            ("BRINDLE_METRICS_LISTEN", "127.0.0.1:9091".into()),
        ]
        .into_iter()
        .chain(cfg.host_port.then(hostpath::ctrl_env).into_iter().flatten())
        .chain(
            cfg.borrow
                .then(crate::borrow::ctrl_env)
                .into_iter()
                .flatten(),
        )
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        spawn_daemon(
            &ns,
            &format!("n{n}-ctrl"),
            &cfg.bin_dir.join("brindle-ctrl"),
            &[],
            &env,
        )?;
        // Node 1 creates the pool; the others start once it is there.
        wait_for(
            &format!("node {n} ready (brindlectl node status)"),
            Duration::from_secs(30),
            || brindlectl(cfg, n, &["node", "status"]).is_ok(),
        )?;
    }
    Ok(())
}
