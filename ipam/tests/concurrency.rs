//! Eight simulated nodes allocating in parallel processes (the real binary,
//! `brindle-ipam admin stress`) against one embedded store and one etcd, and
//! the same against a 3-member etcd cluster losing its leader mid-run: zero
//! duplicates, every address accounted for, all free again after release.
//!
//! `BRINDLE_IPAM_STRESS_COUNT` sets the allocations per node (default 200).
//! The embedded store opened by every process itself (standalone plugins)
//! costs one open-commit-close (several fsyncs) per operation, so that variant
//! runs `BRINDLE_IPAM_STRESS_COUNT_SHARED` per node (default 50); through the
//! daemon's socket the store is open once and commits in groups, and runs the
//! full count.

mod common;

use std::collections::BTreeSet;
use std::io::BufReader;
use std::net::IpAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use brindle_ipam::Ipam;
use brindle_ipam::model::Pool;
use brindle_ipam::server::serve_connection;
use brindle_ipam::store::{Datastore, EmbeddedMode, EmbeddedStore};
use common::etcd::EtcdCluster;

const BIN: &str = env!("CARGO_BIN_EXE_brindle-ipam");
const NODES: usize = 8;

fn per_node() -> u32 {
    std::env::var("BRINDLE_IPAM_STRESS_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn per_node_shared() -> u32 {
    std::env::var("BRINDLE_IPAM_STRESS_COUNT_SHARED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

/// Kills the stress processes if the test fails half-way.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_all(store_args: &[String], count: u32, release: bool) -> Procs {
    Procs(
        (0..NODES)
            .map(|n| {
                let mut cmd = Command::new(BIN);
                cmd.arg("admin").args(store_args);
                cmd.args([
                    "stress",
                    "--node",
                    &format!("node{n}"),
                    "--tag",
                    &format!("node{n}"),
                ]);
                cmd.args(["--count", &count.to_string()]);
                if release {
                    cmd.arg("--release");
                }
                cmd.env("BRINDLE_LOG", "error")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn brindle-ipam")
            })
            .collect(),
    )
}

fn collect(mut procs: Procs) -> Vec<Vec<IpAddr>> {
    let children = std::mem::take(&mut procs.0);
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "a stress process failed");
            serde_json::from_slice(&o.stdout).expect("stress output")
        })
        .collect()
}

/// Checks the allocations and the store, releases everything through the
/// processes again and checks that every address came back.
fn check_then_release<S: Datastore>(
    per_proc: Vec<Vec<IpAddr>>,
    ipam: &Ipam<S>,
    store_args: &[String],
    count: u32,
) {
    let n = count as usize;
    let all: Vec<IpAddr> = per_proc.iter().flatten().copied().collect();
    assert!(
        per_proc.iter().all(|p| p.len() == n),
        "every node got all its addresses"
    );
    let unique: BTreeSet<IpAddr> = all.iter().copied().collect();
    assert_eq!(unique.len(), NODES * n, "an address was handed out twice");
    assert_eq!(ipam.audit().unwrap(), Vec::<String>::new());
    let held: BTreeSet<IpAddr> = ipam
        .handles()
        .unwrap()
        .into_iter()
        .flat_map(|h| h.addresses)
        .collect();
    assert_eq!(held, unique, "every address is accounted for by its handle");
    // /26 blocks: each node claimed exactly the blocks its addresses need.
    let needed = n.div_ceil(64);
    assert_eq!(
        blocks_per_node(ipam),
        vec![needed; NODES],
        "blocks affine to each node"
    );

    let released: BTreeSet<IpAddr> = collect(spawn_all(store_args, count, true))
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(
        released, unique,
        "release returned exactly what was allocated"
    );
    assert!(ipam.handles().unwrap().is_empty());
    assert!(ipam.blocks().unwrap().iter().all(|b| b.allocated == 0));
    assert_eq!(
        blocks_per_node(ipam),
        vec![1; NODES],
        "every node keeps its first block and releases the others"
    );
    assert_eq!(ipam.audit().unwrap(), Vec::<String>::new());
}

/// How many blocks each stress node (node0..) holds affinity for.
fn blocks_per_node<S: Datastore>(ipam: &Ipam<S>) -> Vec<usize> {
    let blocks = ipam.blocks().unwrap();
    (0..NODES)
        .map(|n| {
            let node = format!("node{n}");
            blocks
                .iter()
                .filter(|b| b.affinity.as_deref() == Some(node.as_str()))
                .count()
        })
        .collect()
}

fn pool() -> Pool {
    Pool::new("stress", "10.64.0.0/16".parse().unwrap())
}

#[test]
fn eight_nodes_in_parallel_processes_opening_one_embedded_store_never_collide() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let open =
        |p: &Path| EmbeddedStore::open(p, EmbeddedMode::Shared, Duration::from_secs(60)).unwrap();
    let ipam = Ipam::new(open(&db), "/brindle/ipam");
    ipam.put_pool(&pool()).unwrap();
    let args = vec![
        "--mode".to_owned(),
        "standalone".to_owned(),
        "--embedded-path".to_owned(),
        db.display().to_string(),
    ];
    let n = per_node_shared();
    let per_proc = collect(spawn_all(&args, n, false));
    check_then_release(per_proc, &ipam, &args, n);
}

/// A stand-in for the node daemon: the library's server on a Unix socket,
/// one thread per connection, over an exclusively held embedded store.
struct TestDaemon {
    socket: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl TestDaemon {
    fn start(socket: &Path, ipam: Arc<Ipam<EmbeddedStore>>) -> Self {
        let listener = UnixListener::bind(socket).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let ipam = ipam.clone();
                std::thread::spawn(move || {
                    let reader = BufReader::new(conn.try_clone().unwrap());
                    let _ = serve_connection(&*ipam, reader, conn);
                });
            }
        });
        TestDaemon {
            socket: socket.to_path_buf(),
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn eight_nodes_in_parallel_processes_through_the_daemon_socket_never_collide() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(
        dir.path().join("ipam.redb"),
        EmbeddedMode::Exclusive,
        Duration::from_secs(5),
    )
    .unwrap();
    let ipam = Arc::new(Ipam::new(store, "/brindle/ipam"));
    ipam.put_pool(&pool()).unwrap();
    let socket = dir.path().join("ctrl.sock");
    let _daemon = TestDaemon::start(&socket, ipam.clone());
    let args = vec![
        "--mode".to_owned(),
        "daemon".to_owned(),
        "--socket".to_owned(),
        socket.display().to_string(),
    ];
    let per_proc = collect(spawn_all(&args, per_node(), false));
    check_then_release(per_proc, &*ipam, &args, per_node());
}

#[test]
fn eight_nodes_in_parallel_processes_on_one_etcd_never_collide() {
    let etcd = EtcdCluster::start(1);
    let prefix = common::unique_prefix("stress");
    let ipam = Ipam::new(etcd.store(), &prefix);
    ipam.put_pool(&pool()).unwrap();
    let args = vec![
        "--mode".to_owned(),
        "standalone".to_owned(),
        "--store".to_owned(),
        "etcd".to_owned(),
        "--etcd-endpoints".to_owned(),
        etcd.endpoints().join(","),
        "--prefix".to_owned(),
        prefix,
    ];
    let per_proc = collect(spawn_all(&args, per_node(), false));
    check_then_release(per_proc, &ipam, &args, per_node());
}

/// The member that currently leads the cluster.
fn leader(cluster: &EtcdCluster) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (i, m) in cluster.members.iter().enumerate() {
            let mut c = etcd_client::Client::connect([m.client_url.as_str()], None)
                .await
                .unwrap();
            let s = c.status().await.unwrap();
            if s.header().map(|h| h.member_id()) == Some(s.leader()) {
                return i;
            }
        }
        0
    })
}

#[test]
fn losing_the_etcd_leader_mid_run_neither_stops_nor_duplicates_allocations() {
    let mut cluster = EtcdCluster::start(3);
    let prefix = common::unique_prefix("fault");
    let ipam = Ipam::new(cluster.store(), &prefix);
    ipam.put_pool(&pool()).unwrap();
    let args = vec![
        "--mode".to_owned(),
        "standalone".to_owned(),
        "--store".to_owned(),
        "etcd".to_owned(),
        "--etcd-endpoints".to_owned(),
        cluster.endpoints().join(","),
        "--prefix".to_owned(),
        prefix.clone(),
    ];
    let procs = spawn_all(&args, per_node(), false);
    // Kill the leader once allocations are under way (whatever the timing,
    // the run must finish with every address unique).
    let target = (per_node() as usize * NODES / 4).max(1);
    while ipam.handles().map(|h| h.len()).unwrap_or(0) < target {
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = leader(&cluster);
    cluster.members[victim].kill();
    eprintln!(
        "killed leader {} after {target} allocations",
        cluster.members[victim].name
    );
    let per_proc = collect(procs);
    // The survivors serve the check and the release.
    let survivors: Vec<String> = cluster
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, m)| m.client_url.clone())
        .collect();
    let ipam = Ipam::new(
        brindle_ipam::store::EtcdStore::connect(&survivors, Duration::from_secs(5)).unwrap(),
        &prefix,
    );
    let args = vec![
        "--mode".to_owned(),
        "standalone".to_owned(),
        "--store".to_owned(),
        "etcd".to_owned(),
        "--etcd-endpoints".to_owned(),
        survivors.join(","),
        "--prefix".to_owned(),
        prefix,
    ];
    check_then_release(per_proc, &ipam, &args, per_node());
}
