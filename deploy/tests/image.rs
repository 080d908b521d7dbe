//! The container image, built and run for real: `deploy/image/build.sh`
//! makes the Debian base from Debian's packages (mmdebstrap, podman import),
//! builds `deploy/Containerfile` on it with Podman around the binaries
//! `cargo build --workspace --bins` put beside this test, and this test runs
//! the image: every binary answers, the init container's install-cni fills
//! a temporary CNI bin and config directory as on a node, and
//! `brindle-ctrl --check-config` accepts the ConfigMap's node.toml with the
//! variables the DaemonSet sets.
//!
//! Root (mmdebstrap and rootful Podman): `cargo xtask test` runs it. The
//! base is kept between runs (its tag hashes its recipe); the image is
//! removed on drop.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("deploy/ has a parent")
        .to_path_buf()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A built image, removed on drop (also when the test fails).
struct Image {
    tag: String,
}

impl Image {
    fn build() -> Result<Image> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "localhost/brindle-test:{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let image = Image { tag };
        let started = Instant::now();
        let out = Command::new(repo().join("deploy/image/build.sh"))
            .arg("--tag")
            .arg(&image.tag)
            .arg("--binaries")
            .arg(brindle_testkit::built_binaries("BRINDLE_BIN_DIR"))
            .output()
            .context("deploy/image/build.sh")?;
        eprintln!("{}", text(&out));
        ensure!(out.status.success(), "build.sh failed: {}", text(&out));
        eprintln!(
            "image {} built in {:.1} s",
            image.tag,
            started.elapsed().as_secs_f64()
        );
        Ok(image)
    }

    /// `podman run` with no network; `prepare` adds options before the
    /// image, `args` is the command.
    fn run(&self, prepare: impl FnOnce(&mut Command), args: &[&str]) -> Result<Output> {
        let mut cmd = Command::new("podman");
        cmd.args(["run", "--rm", "--network=none"]);
        // This sandbox mixes cgroup v1 and v2, which crun refuses and runc
        // takes; and it may not raise resource limits, so the ones Podman
        // would set (1M files) are replaced by what the test itself has.
        cmd.args(["--runtime", "runc"]);
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?.1;
        cmd.arg(format!("--ulimit=nofile={nofile}:{nofile}"))
            .arg("--ulimit=nproc=4096:4096");
        prepare(&mut cmd);
        cmd.arg(&self.tag).args(args);
        Ok(cmd.output()?)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.tag])
            .output();
    }
}

/// The ConfigMap's `data` entries, written as files into `dir`.
fn config_map_files(dir: &Path) -> Result<()> {
    let text = fs::read_to_string(repo().join("deploy/kubernetes/base/configmap.yaml"))?;
    let map: serde_json::Value = serde_norway::from_str(&text)?;
    let data = map["data"].as_object().context("ConfigMap data")?;
    for (name, value) in data {
        fs::write(dir.join(name), value.as_str().context("a string")?)?;
    }
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces (mmdebstrap, rootful podman)"]
fn the_image_builds_and_its_binaries_install_cni_and_check_config_run() -> Result<()> {
    let image = Image::build()?;

    // Every binary runs (dynamic libraries present, right paths).
    for (args, expect) in [
        (&["brindle-ctrl", "--help"][..], "usage: brindle-ctrl"),
        (&["brindle-vrouter", "--help"][..], "Usage: brindle-vrouter"),
        (&["brindlectl", "--help"][..], "Usage: brindlectl"),
        (
            &["/opt/brindle/cni/bin/brindle-ipam", "admin", "--help"][..],
            "Usage:",
        ),
        (&["ip", "-V"][..], "iproute2"),
        (&["iptables", "--version"][..], "iptables"),
    ] {
        let out = image.run(|_| {}, args)?;
        ensure!(
            out.status.success() && text(&out).contains(expect),
            "{args:?}: {}",
            text(&out)
        );
    }
    // The CNI plugin answers the spec's VERSION command.
    let out = image.run(
        |c| {
            c.args(["-e", "CNI_COMMAND=VERSION"]);
        },
        &[
            "sh",
            "-c",
            "echo '{\"cniVersion\":\"1.0.0\"}' | /opt/brindle/cni/bin/brindle",
        ],
    )?;
    let version: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("brindle VERSION: {}", text(&out)))?;
    ensure!(
        version["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|x| x == "1.0.0")),
        "{version}"
    );

    // The init container, as the DaemonSet runs it: host directories
    // mounted at /host/..., the ConfigMap at /etc/brindle.
    let host = tempfile::tempdir()?;
    let (bin_dir, net_dir, config) = (
        host.path().join("opt-cni-bin"),
        host.path().join("etc-cni-net.d"),
        host.path().join("etc-brindle"),
    );
    for d in [&bin_dir, &net_dir, &config] {
        fs::create_dir(d)?;
    }
    config_map_files(&config)?;
    let volume = |host: &Path, at: &str, mode: &str| format!("{}:{at}:{mode}", host.display());
    let out = image.run(
        |c| {
            c.arg("-v")
                .arg(volume(&bin_dir, "/host/opt/cni/bin", "rw"))
                .arg("-v")
                .arg(volume(&net_dir, "/host/etc/cni/net.d", "rw"))
                .arg("-v")
                .arg(volume(&config, "/etc/brindle", "ro"))
                .args([
                    "-e",
                    "BRINDLE_CNI_CONFLIST=/etc/brindle/10-brindle.conflist",
                ]);
        },
        &["/usr/local/bin/brindle-install-cni"],
    )?;
    ensure!(out.status.success(), "install-cni: {}", text(&out));
    for plugin in ["brindle", "brindle-ipam", "tuning", "bandwidth", "portmap"] {
        let path = bin_dir.join(plugin);
        let mode = fs::metadata(&path)
            .with_context(|| format!("{} not installed", path.display()))?
            .permissions()
            .mode();
        ensure!(mode & 0o777 == 0o755, "{plugin}: mode {mode:o}");
    }
    let installed = fs::read_to_string(net_dir.join("10-brindle.conflist"))?;
    ensure!(
        installed == fs::read_to_string(config.join("10-brindle.conflist"))?,
        "the installed conflist is not the ConfigMap's"
    );
    let leftovers: Vec<_> = fs::read_dir(&bin_dir)?
        .chain(fs::read_dir(&net_dir)?)
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".brindle-new."))
        .collect();
    ensure!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // The node daemon's configuration as the DaemonSet gives it.
    let out = image.run(
        |c| {
            c.arg("-v")
                .arg(volume(&config, "/etc/brindle", "ro"))
                .args(["-e", "BRINDLE_NODE_NAME=node-under-test"])
                .args(["-e", "BRINDLE_NODE_ADDRESS=127.0.0.1"]);
        },
        &[
            "brindle-ctrl",
            "--config",
            "/etc/brindle/node.toml",
            "--check-config",
        ],
    )?;
    ensure!(
        out.status.success() && text(&out).contains("configuration OK: node node-under-test"),
        "check-config: {}",
        text(&out)
    );
    // And it refuses a bad one (so the line above can fail).
    let out = image.run(
        |c| {
            c.arg("-v")
                .arg(volume(&config, "/etc/brindle", "ro"))
                .args(["-e", "BRINDLE_NODE_ADDRESS=127.0.0.1"])
                .args(["-e", "BRINDLE_BGP_AS_NUMBER=0"]);
        },
        &[
            "brindle-ctrl",
            "--config",
            "/etc/brindle/node.toml",
            "--check-config",
        ],
    )?;
    ensure!(
        !out.status.success() && text(&out).contains("bgp.as_number 0"),
        "{}",
        text(&out)
    );
    Ok(())
}
