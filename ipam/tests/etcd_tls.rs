//! The etcd store over TLS with client-certificate auth: a real etcd
//! (Debian's `/usr/bin/etcd`) started with certificates the test generates
//! with the openssl CLI (a CA, a server certificate for 127.0.0.1, a client
//! certificate). The right CA and identity work; a wrong CA, a missing
//! client certificate or a plain `http://` endpoint fail with errors that
//! say why.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brindle_ipam::store::{Datastore, EtcdStore, EtcdTls, StoreError};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

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

/// A CA (`<name>-ca.pem`, `<name>-ca.key`) and, signed by it, a
/// certificate `<cert>.pem`/`<cert>.key` with the given extensions.
fn ca(dir: &Path, name: &str) {
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
            &format!("{name}-ca.key"),
            "-out",
            &format!("{name}-ca.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
        ],
    );
}

fn signed(dir: &Path, ca: &str, cert: &str, cn: &str, ext: &str) {
    std::fs::write(dir.join(format!("{cert}.ext")), ext).unwrap();
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
            &format!("{cert}.key"),
            "-out",
            &format!("{cert}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{cert}.csr"),
            "-CA",
            &format!("{ca}-ca.pem"),
            "-CAkey",
            &format!("{ca}-ca.key"),
            "-CAcreateserial",
            "-out",
            &format!("{cert}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{cert}.ext"),
        ],
    );
}

struct TlsEtcd {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsEtcd {
    fn start() -> TlsEtcd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        ca(d, "good");
        ca(d, "other");
        signed(
            d,
            "good",
            "server",
            "etcd",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        signed(
            d,
            "good",
            "client",
            "brindle-node",
            "extendedKeyUsage=clientAuth\n",
        );
        let (client, peer) = (free_port(), free_port());
        let url = format!("https://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let name = format!("tls-{}", std::process::id());
        let child = Command::new("/usr/bin/etcd")
            .args(["--name", &name])
            .arg("--data-dir")
            .arg(d.join("data"))
            .args(["--listen-client-urls", &url])
            .args(["--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .arg("--cert-file")
            .arg(d.join("server.pem"))
            .arg("--key-file")
            .arg(d.join("server.key"))
            .arg("--trusted-ca-file")
            .arg(d.join("good-ca.pem"))
            .arg("--client-cert-auth")
            .args(["--log-level", "error", "--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn /usr/bin/etcd");
        let etcd = TlsEtcd { child, url, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while etcd
            .connect(&etcd.tls("good", true))
            .and_then(|s| s.get("/ready-probe"))
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "etcd with TLS never became ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        etcd
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    fn tls(&self, ca: &str, identity: bool) -> EtcdTls {
        EtcdTls {
            ca_file: Some(self.path(&format!("{ca}-ca.pem"))),
            cert_file: identity.then(|| self.path("client.pem")),
            key_file: identity.then(|| self.path("client.key")),
        }
    }

    fn connect(&self, tls: &EtcdTls) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with_tls(std::slice::from_ref(&self.url), Duration::from_secs(3), tls)
    }
}

#[test]
fn the_etcd_store_works_over_tls_with_a_client_certificate_and_explains_a_wrong_ca() {
    let etcd = TlsEtcd::start();

    // The right CA and identity: a real write and read back.
    let store = etcd.connect(&etcd.tls("good", true)).unwrap();
    assert!(
        store
            .txn(
                &[brindle_ipam::store::Compare::Absent("/tls/key".into())],
                &[brindle_ipam::store::Write::Put(
                    "/tls/key".into(),
                    b"v1".to_vec()
                )],
            )
            .unwrap()
    );
    let got = store.get("/tls/key").unwrap().unwrap();
    assert_eq!(got.value, b"v1");

    // A CA that did not sign the server's certificate: refused, and the
    // error says it is about the certificate.
    let e = etcd
        .connect(&etcd.tls("other", true))
        .err()
        .expect("a wrong CA must fail")
        .to_string();
    eprintln!("with a wrong CA: {e}");
    assert!(
        e.to_lowercase().contains("certificate") || e.contains("UnknownIssuer"),
        "{e}"
    );

    // No client certificate: etcd's client-cert-auth refuses the session.
    assert!(etcd.connect(&etcd.tls("good", false)).is_err());

    // TLS configured but a plain endpoint: a configuration error up front.
    let e = EtcdStore::connect_with_tls(
        &["http://127.0.0.1:2379".to_owned()],
        Duration::from_secs(1),
        &etcd.tls("good", true),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("use https://"), "{e}");

    // A missing file is named.
    let mut tls = etcd.tls("good", true);
    tls.ca_file = Some("/nonexistent/ca.pem".into());
    let e = etcd.connect(&tls).err().unwrap().to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
}
