//! Real etcd servers (Debian's `/usr/bin/etcd`) on loopback with random free
//! ports and temporary data directories, stopped by Drop guards.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brindle_ipam::store::{Datastore, EtcdStore};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One etcd member.
pub struct Member {
    pub name: String,
    pub client_url: String,
    child: Option<Child>,
}

impl Member {
    /// Kills the member (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of `n` members; the data directories go with it.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let tag = format!("{}", std::process::id());
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}-{tag}=http://127.0.0.1:{peer}"))
            .collect();
        let initial = initial.join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}-{tag}");
            let data = dir.path().join(&name);
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = Command::new("/usr/bin/etcd")
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(&data)
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &format!("brindle-test-{tag}")])
                .args(["--log-level", "error", "--logger", "zap"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn /usr/bin/etcd");
            members.push(Member {
                name,
                client_url,
                child: Some(child),
            });
        }
        let cluster = EtcdCluster { members, _dir: dir };
        cluster.wait_ready();
        cluster
    }

    /// The client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in &self.members {
            loop {
                let ready =
                    EtcdStore::connect(std::slice::from_ref(&m.client_url), Duration::from_secs(2))
                        .and_then(|s| s.get("/ready-probe"))
                        .is_ok();
                if ready {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} never became ready",
                    m.name
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// A store connected to every member.
    pub fn store(&self) -> EtcdStore {
        EtcdStore::connect(&self.endpoints(), Duration::from_secs(5)).expect("connect to etcd")
    }
}
