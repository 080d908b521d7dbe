//! The daemon on an etcd that requires TLS and client certificates
//! (`datastore.etcd_ca_file`, `etcd_cert_file`, `etcd_key_file`): the
//! certificates are made by the test with the openssl CLI. With the right
//! files the daemon starts and its IPAM writes reach etcd; with a CA that
//! did not sign etcd's certificate it refuses to start and says why. No
//! root; needs etcd-server and openssl.

mod daemon_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use brindle_api::framing::Client;
use daemon_support::{Daemon, FakeVrouter, free_port, wait_for};
use serde_json::Value;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `<name>-ca.pem` and its key.
fn make_ca(dir: &Path, name: &str) {
    let (key, pem, subj) = (
        format!("{name}-ca.key"),
        format!("{name}-ca.pem"),
        format!("/CN={name} CA"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subj,
        ],
    );
}

/// `<cert>.pem` and `<cert>.key`, signed by the `good` CA.
fn make_cert(dir: &Path, cert: &str, ext: &str) {
    let (key, csr, pem, extfile) = (
        format!("{cert}.key"),
        format!("{cert}.csr"),
        format!("{cert}.pem"),
        format!("{cert}.ext"),
    );
    std::fs::write(dir.join(&extfile), ext).unwrap();
    let subj = format!("/CN={cert}");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subj,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "good-ca.pem",
            "-CAkey",
            "good-ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    );
}

struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_ca(d, "good");
    make_ca(d, "other");
    make_cert(
        d,
        "server",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    make_cert(d, "client", "extendedKeyUsage=clientAuth\n");
    let (client, peer) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let _etcd = Etcd(
        Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(d.join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .arg(format!("--initial-cluster=t={peer_url}"))
            .args(["--cert-file", "server.pem", "--key-file", "server.key"])
            .args(["--trusted-ca-file", "good-ca.pem", "--client-cert-auth"])
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian package etcd-server) must be installed"),
    );
    let addr = format!("127.0.0.1:{client}");
    wait_for("etcd", Duration::from_secs(20), || {
        std::net::TcpStream::connect(&addr).is_ok()
    })
    .unwrap();

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
