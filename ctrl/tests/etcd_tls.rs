//! The daemon on an etcd that requires TLS and client certificates
//! (`datastore.etcd_ca_file`, `etcd_cert_file`, `etcd_key_file`): the
//! certificates are made by the test with the openssl CLI. With the right
//! files the daemon starts and its IPAM writes reach etcd; with a CA that
//! did not sign etcd's certificate it refuses to start and says why. No
//! root; needs etcd-server and openssl.

mod daemon_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use brindle_api::framing::Client;
use brindle_testkit::tls_etcd::TlsEtcd;
use daemon_support::{Daemon, FakeVrouter, free_port};
use serde_json::Value;

fn env(dir: &Path, url: &str, ca: &str) -> Vec<(String, String)> {
    let d = dir.display();
    [
        ("BRINDLE_NODE_NAME", "tls-node".to_owned()),
        ("BRINDLE_NODE_ADDRESS", "127.0.0.1".to_owned()),
        ("BRINDLE_API_SOCKET", format!("{d}/ctrl.sock")),
        ("BRINDLE_VROUTER_SOCKET", format!("{d}/vrouter.sock")),
        ("BRINDLE_BGP_LISTEN_PORT", free_port().to_string()),
        (
            "BRINDLE_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("BRINDLE_DATASTORE_TYPE", "etcd".to_owned()),
        ("BRINDLE_DATASTORE_ENDPOINTS", url.to_owned()),
        ("BRINDLE_DATASTORE_ETCD_CA_FILE", format!("{d}/{ca}-ca.pem")),
        (
            "BRINDLE_DATASTORE_ETCD_CERT_FILE",
            format!("{d}/client.pem"),
        ),
        ("BRINDLE_DATASTORE_ETCD_KEY_FILE", format!("{d}/client.key")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[test]
#[ignore = "starts a real etcd with TLS (needs etcd-server and openssl)"]
fn the_daemon_uses_etcd_over_tls_with_its_client_certificate_and_refuses_a_wrong_ca() {
    let etcd = TlsEtcd::start().unwrap();
    let d = etcd.dir();
    let url = etcd.url.clone();

    // A wrong CA: the daemon exits at start, naming the certificate problem.
    let out = Command::new(env!("CARGO_BIN_EXE_brindle-ctrl"))
        .env("BRINDLE_CONFIG", "/dev/null")
        .env("RUST_BACKTRACE", "0")
        .envs(env(d, &url, "other"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("connecting to etcd") && stderr.contains("UnknownIssuer"),
        "{stderr}"
    );

    // The right files: it runs, and an allocation is stored in etcd.
    let _vrouter = FakeVrouter::start(&d.join("vrouter.sock"), "boot-1");
    let socket = d.join("ctrl.sock");
    let _daemon = Daemon::start(&env(d, &url, "good"), &socket, &d.join("log"));
    let mut c = Client::connect(&socket, Duration::from_secs(10)).unwrap();
    let r: Value = c
        .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
            "handle":{"network":"k8s-pod-network","container_id":"c1","ifname":"eth0"},
            "node":"tls-node","attrs":{},"ipv4":true,"ipv6":false}))
        .unwrap();
    let address = r["addresses"][0]["address"].as_str().unwrap().to_owned();
    let out = Command::new("etcdctl")
        .args(["--endpoints", &url, "--cacert", "good-ca.pem"])
        .args(["--cert", "client.pem", "--key", "client.key"])
        .args(["get", "--prefix", "--keys-only", "/brindle/ipam"])
        .current_dir(d)
        .output()
        .expect("etcdctl (Debian package etcd-client)");
    let keys = String::from_utf8_lossy(&out.stdout);
    assert!(
        keys.contains("/brindle/ipam"),
        "{keys}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(address.starts_with("10.244."), "{address}");
}
