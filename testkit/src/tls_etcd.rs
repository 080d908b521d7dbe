//! A real etcd (Debian's etcd-server) that requires TLS and client
//! certificates, with a throw-away PKI made by the openssl CLI, for the
//! tests of every crate that talks to etcd over TLS. Killed and its files
//! removed on drop.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::netns::unique;

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs `openssl ARGS...` in `dir`.
pub fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("the openssl CLI (Debian package openssl)")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A self-signed CA in `dir`: `<name>-ca.pem` and `<name>-ca.key` (P-256).
pub fn make_ca(dir: &Path, name: &str) -> Result<()> {
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
    )
}

/// `<cert>.pem` and `<cert>.key` for common name `cn`, signed by the CA
/// `<ca>-ca.*`, with the X.509v3 extensions `ext` (openssl extfile lines).
pub fn make_signed(dir: &Path, ca: &str, cert: &str, cn: &str, ext: &str) -> Result<()> {
    std::fs::write(dir.join(format!("{cert}.ext")), ext)?;
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
    )?;
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
    )
}

/// etcd on `https://127.0.0.1:<port>` with client-certificate auth. Its
/// directory holds two CAs, `good-ca.pem` (signed etcd's and the client's
/// certificates) and `other-ca.pem` (signed nothing: the wrong CA), and the
/// client identity `client.pem`/`client.key`.
pub struct TlsEtcd {
    child: Child,
    /// The client URL.
    pub url: String,
    dir: PathBuf,
}

impl TlsEtcd {
    /// Makes the PKI, starts etcd and waits until it accepts connections.
    pub fn start() -> Result<TlsEtcd> {
        let dir = std::env::temp_dir().join(unique("tlsetcd"));
        std::fs::create_dir_all(&dir)?;
        let d = dir.as_path();
        let (client, peer) = (free_port()?, free_port()?);
        let url = format!("https://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let pki = make_ca(d, "good")
            .and_then(|()| make_ca(d, "other"))
            .and_then(|()| {
                make_signed(
                    d,
                    "good",
                    "server",
                    "etcd",
                    "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
                )
            })
            .and_then(|()| {
                make_signed(
                    d,
                    "good",
                    "client",
                    "brindle-node",
                    "extendedKeyUsage=clientAuth\n",
                )
            });
        if let Err(e) = pki {
            let _ = std::fs::remove_dir_all(d);
            return Err(e);
        }
        let name = unique("tls");
        let spawned = Command::new("etcd")
            .args(["--name", &name])
            .arg("--data-dir")
            .arg(d.join("data"))
            .args(["--listen-client-urls", &url])
            .args(["--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .args(["--cert-file", "server.pem", "--key-file", "server.key"])
            .args(["--trusted-ca-file", "good-ca.pem", "--client-cert-auth"])
            .args(["--log-level", "error", "--logger", "zap"])
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(d);
                return Err(e).context("etcd (Debian package etcd-server)");
            }
        };
        let etcd = TlsEtcd { child, url, dir };
        let addr = format!("127.0.0.1:{client}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&addr).is_err() {
            if Instant::now() > deadline {
                bail!("etcd with TLS did not listen on {addr} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(etcd)
    }

    /// The directory with the PKI files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file of the PKI, e.g. `good-ca.pem`, `client.key`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
