//! Running commands for the lab, each one bounded in time: a command that
//! hangs (a CLI on a stuck daemon's socket, a scrape of an endpoint that
//! never answers) is killed at its deadline and named in the error, so no
//! lab step and no teardown can wait forever.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};

/// Where `ip netns` pins named network namespaces.
const NETNS_DIR: &str = "/var/run/netns";

/// The deadline of a command run with [`sh`]: generous, since the machine
/// may be busy; it bounds a hang, it does not time anything.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What a finished command printed.
pub(crate) struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Waits for `child` (spawned with piped stdout and stderr) until
/// `timeout`, killing it at the deadline.
pub(crate) fn finish(mut child: Child, what: &str, timeout: Duration) -> Result<Output> {
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = pipe(child.stdout.take().map(|s| Box::new(s) as _));
    let err = pipe(child.stderr.take().map(|s| Box::new(s) as _));
    let deadline = Instant::now() + timeout;
    // Short sleeps first: most commands end within milliseconds, and the
    // density run times them.
    let mut nap = Duration::from_micros(200);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {timeout:?}: killed");
        }
        thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    // A grandchild holding a pipe open would block these joins: the
    // commands the lab runs do not leave any behind.
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Runs `cmd` (at most `timeout`) and returns its stdout, or an error with
/// its stderr when it fails.
pub(crate) fn sh_within(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {what}"))?;
    let out = finish(child, &what, timeout)?;
    if !out.status.success() {
        bail!("{what} failed: {}: {}", out.status, out.stderr.trim());
    }
    Ok(out.stdout)
}

/// [`sh_within`] with [`COMMAND_TIMEOUT`].
pub(crate) fn sh(cmd: &mut Command) -> Result<String> {
    sh_within(cmd, COMMAND_TIMEOUT)
}

pub(crate) fn ip(args: &[&str]) -> Result<String> {
    sh(Command::new("ip").args(args))
}

/// A command run in a namespace. Inherited `BRINDLE_*` variables (the
/// smoke test's own gate, a developer's shell) are removed: the daemons
/// treat every `BRINDLE_` variable as configuration and refuse unknown ones.
pub(crate) fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    without_brindle_env(&mut c);
    c
}

fn without_brindle_env(c: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BRINDLE_") {
            c.env_remove(key);
        }
    }
}

/// Makes the named network namespace `name` as `ip netns add` does, but
/// without exec'ing `ip`, as a runtime pins a pod's namespace (containerd
/// does it in-process too): a short-lived thread unshares its network
/// namespace and bind-mounts it on `/var/run/netns/NAME`. The directory is
/// the one `ip netns add` set up for the lab's nodes.
pub(crate) fn add_netns(name: &str) -> Result<()> {
    let path = Path::new(NETNS_DIR).join(name);
    File::create_new(&path).with_context(|| format!("create {}", path.display()))?;
    let pinned = thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            unshare(CloneFlags::CLONE_NEWNET).context("unshare a network namespace")?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .with_context(|| format!("bind-mount it on {}", path.display()))
        })
        .join()
        .unwrap_or_else(|_| bail!("the thread making {name} panicked"))
    });
    if pinned.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    pinned
}

/// Spawns `program` in the network namespace `ns` (one of
/// `/var/run/netns`) as a process that lives there does: a short-lived
/// thread enters the namespace and spawns, and the child inherits the
/// thread's namespace. This is how a runtime on a node execs CNI plugins
/// (libcni execs each one directly). `ip netns exec` would also unshare a
/// mount namespace and mount a sysfs for every plugin: a copy of a mount
/// table that holds one bind mount per pod namespace, which no runtime
/// pays and which made 110 parallel ADDs cost the lab more than the chain.
/// The child sees the host's `/sys`; the plugins read `/proc/sys`, which
/// follows the network namespace, and netlink.
pub(crate) fn spawn_in_netns(
    ns: &str,
    program: &Path,
    setup: impl FnOnce(&mut Command),
) -> Result<Child> {
    let netns = File::open(Path::new(NETNS_DIR).join(ns))
        .with_context(|| format!("network namespace {ns}"))?;
    let mut cmd = Command::new(program);
    without_brindle_env(&mut cmd);
    setup(&mut cmd);
    thread::scope(|s| {
        s.spawn(|| -> Result<Child> {
            setns(&netns, CloneFlags::CLONE_NEWNET).with_context(|| format!("enter {ns}"))?;
            cmd.spawn()
                .with_context(|| format!("could not start {}", program.display()))
        })
        .join()
        .unwrap_or_else(|_| bail!("the thread spawning {} in {ns} panicked", program.display()))
    })
}

/// Whether `cmd` exits with success within `timeout` (output discarded).
pub(crate) fn succeeds_within(cmd: &mut Command, timeout: Duration) -> bool {
    sh_within(cmd, timeout).is_ok()
}

pub(crate) fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(250));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_deadline_is_killed_and_named() {
        let start = Instant::now();
        let e = sh_within(Command::new("sleep").arg("30"), Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(10));
        let e = format!("{e:#}");
        assert!(e.contains("sleep") && e.contains("killed"), "{e}");
    }

    #[test]
    fn output_and_failure_are_reported() {
        let out = sh(Command::new("sh").args(["-c", "echo hi; echo warn >&2"])).unwrap();
        assert_eq!(out, "hi\n");
        let e = sh(Command::new("sh").args(["-c", "echo bad >&2; exit 3"])).unwrap_err();
        assert!(format!("{e:#}").contains("bad"), "{e:#}");
    }
}
