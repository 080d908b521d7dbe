//! The etcd store over TLS with client-certificate auth: a real etcd
//! (Debian's `/usr/bin/etcd`) started with certificates the test generates
//! with the openssl CLI (a CA, a server certificate for 127.0.0.1, a client
//! certificate). The right CA and identity work; a wrong CA, a missing
//! client certificate or a plain `http://` endpoint fail with errors that
//! say why.

use std::time::{Duration, Instant};

use brindle_ipam::store::{Datastore, EtcdStore, EtcdTls, StoreError};

/// The shared TLS etcd (`brindle_testkit::tls_etcd`), with this crate's
/// client on top.
struct TlsEtcd(brindle_testkit::tls_etcd::TlsEtcd);

impl TlsEtcd {
    /// Starts it and waits until a TLS client gets an answer.
    fn start() -> TlsEtcd {
        let etcd = TlsEtcd(brindle_testkit::tls_etcd::TlsEtcd::start().unwrap());
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

    fn tls(&self, ca: &str, identity: bool) -> EtcdTls {
        EtcdTls {
            ca_file: Some(self.0.path(&format!("{ca}-ca.pem"))),
            cert_file: identity.then(|| self.0.path("client.pem")),
            key_file: identity.then(|| self.0.path("client.key")),
        }
    }

    fn connect(&self, tls: &EtcdTls) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with_tls(
            std::slice::from_ref(&self.0.url),
            Duration::from_secs(3),
            tls,
        )
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
