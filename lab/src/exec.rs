//! Running commands for the lab, each one bounded in time: a command that
//! hangs (a CLI on a stuck daemon's socket, a scrape of an endpoint that
//! never answers) is killed at its deadline and named in the error, so no
//! lab step and no teardown can wait forever.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

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
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BRINDLE_") {
            c.env_remove(key);
        }
    }
    c
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
