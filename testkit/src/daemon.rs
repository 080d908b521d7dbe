//! The one guard for a daemon that a test, the lab or brindle-perf starts
//! as a child process: stopped on drop (SIGTERM, SIGKILL after a grace
//! period) and always reaped, so no test leaves a process or a zombie
//! behind, also when it fails. The wait after SIGKILL is bounded too: a
//! process stuck in the kernel is named in the error instead of hanging
//! the test.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long [`Daemon::stop`] waits after SIGTERM before SIGKILL, unless
/// [`Daemon::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// How long a SIGKILLed process may take to be gone (it may be finishing a
/// syscall, e.g. closing AF_XDP sockets) before it is reported as stuck.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// A running child process, stopped on drop.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Option<Child>,
    grace: Duration,
}

/// How a daemon ended.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    pub status: ExitStatus,
    /// From the first signal (or the stop call) until it was reaped.
    pub took: Duration,
    /// Whether it needed SIGKILL.
    pub killed: bool,
}

impl Daemon {
    /// Spawns `cmd` (already given its arguments, environment and output)
    /// as the daemon `name`.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Result<Daemon> {
        let name = name.into();
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Daemon::adopt(name, child))
    }

    /// Takes charge of a child spawned elsewhere.
    pub fn adopt(name: impl Into<String>, child: Child) -> Daemon {
        Daemon {
            name: name.into(),
            child: Some(child),
            grace: DEFAULT_GRACE,
        }
    }

    /// How long [`Daemon::stop`] waits between SIGTERM and SIGKILL.
    pub fn grace(mut self, grace: Duration) -> Daemon {
        self.grace = grace;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id (`ip netns exec` execs the program in place, so this
    /// is the daemon itself); `None` once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child, e.g. to take a pipe.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Fails if it has exited (or was stopped).
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was stopped", self.name);
        };
        if let Some(status) = child.try_wait()? {
            bail!("{} exited: {status}", self.name);
        }
        Ok(())
    }

    /// Sends `signal` (e.g. SIGHUP: reload).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let child = self.child.as_ref().context("already stopped")?;
        // Safe from pid reuse: an unreaped child keeps its pid.
        kill(pid_of(child)?, signal).with_context(|| format!("{signal} to {}", self.name))
    }

    /// SIGTERM, up to the grace period for it to exit, then SIGKILL;
    /// returns once it is reaped. Fails, naming it, if it outlives
    /// [`KILL_WAIT`] after SIGKILL (it then stays a zombie of this process).
    pub fn stop(&mut self) -> Result<Stopped> {
        self.end(Some(Signal::SIGTERM))
    }

    /// SIGKILL at once (a crash: no cleanup), then reaped.
    pub fn kill(&mut self) -> Result<Stopped> {
        self.end(None)
    }

    fn end(&mut self, first: Option<Signal>) -> Result<Stopped> {
        let mut child = self.child.take().context("already stopped")?;
        let start = Instant::now();
        if let Some(status) = child.try_wait()? {
            return Ok(Stopped {
                status,
                took: Duration::ZERO,
                killed: false,
            });
        }
        if let Some(signal) = first {
            let _ = kill(pid_of(&child)?, signal);
            if let Some(status) = wait_until(&mut child, start + self.grace)? {
                return Ok(Stopped {
                    status,
                    took: start.elapsed(),
                    killed: false,
                });
            }
        }
        let _ = child.kill();
        match wait_until(&mut child, Instant::now() + KILL_WAIT)? {
            Some(status) => Ok(Stopped {
                status,
                took: start.elapsed(),
                killed: true,
            }),
            None => bail!(
                "{} (pid {}) still running {KILL_WAIT:?} after SIGKILL: {}",
                self.name,
                child.id(),
                process_state(child.id())
            ),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.stop()
        {
            // A drop cannot fail: say it where the test's output shows it.
            eprintln!("stopping a daemon: {e:#}");
        }
    }
}

fn pid_of(child: &Child) -> Result<Pid> {
    Ok(Pid::from_raw(i32::try_from(child.id())?))
}

/// Reaps `child` if it exits before `deadline`.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `State: ...` and `wchan` of a live process, for an error message.
pub fn process_state(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let state = status
        .lines()
        .find(|l| l.starts_with("State:"))
        .unwrap_or("State: gone")
        .trim();
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    format!(
        "{state}, wchan {}",
        if wchan.is_empty() { "?" } else { &wchan }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> Daemon {
        Daemon::spawn("sleep", Command::new("sleep").arg("600")).unwrap()
    }

    #[test]
    fn stop_terminates_and_reaps() {
        let mut d = sleeper();
        let pid = d.pid().unwrap();
        d.check_alive().unwrap();
        let stopped = d.stop().unwrap();
        assert!(!stopped.killed, "{stopped:?}");
        assert!(!stopped.status.success());
        // Reaped: no /proc entry, not even a zombie.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        assert!(d.check_alive().is_err());
        assert!(d.stop().is_err(), "a second stop says it was stopped");
    }

    #[test]
    fn a_daemon_ignoring_sigterm_is_killed_after_the_grace_period() {
        use std::io::BufRead;
        // Short sleeps: the one running when bash is killed is orphaned
        // and must end soon by itself.
        let mut d = Daemon::spawn(
            "stubborn",
            Command::new("bash")
                .args([
                    "-c",
                    "trap '' TERM; echo ready; while :; do sleep 0.05; done",
                ])
                .stdout(std::process::Stdio::piped()),
        )
        .unwrap()
        .grace(Duration::from_millis(200));
        // The signal only after bash ignores it.
        let stdout = d.child_mut().unwrap().stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        let stopped = d.stop().unwrap();
        assert!(stopped.killed, "{stopped:?}");
        assert!(stopped.took >= Duration::from_millis(200), "{stopped:?}");
    }

    #[test]
    fn drop_reaps_the_child() {
        let d = sleeper();
        let pid = d.pid().unwrap();
        drop(d);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn an_exited_daemon_is_reported() {
        let mut d = Daemon::spawn("true", &mut Command::new("true")).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let err = d.check_alive().unwrap_err();
        assert!(err.to_string().contains("true exited"), "{err}");
        assert!(d.stop().unwrap().status.success());
    }
}
