//! The lab's processes: started with [`spawn_daemon`], found again (also
//! those of an interrupted lab) and stopped by [`down`], which removes the
//! namespaces and the state only once every process it signalled has
//! really exited.

use std::fmt;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::exec::{in_ns, ip};
use crate::{PREFIX, STATE_DIR, state};

/// The daemons this process started, reaped by [`down`] so none is left
/// as a zombie while the caller (a test) keeps running.
static CHILDREN: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// How long the lab's processes get to exit after SIGTERM (a vrouter
/// detaching XDP and closing its sockets, etcd syncing), and after SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);
const KILL_GRACE: Duration = Duration::from_secs(10);

/// The file naming the process running the lab (`<pid> <start time>`);
/// it has no `.pid` extension so that [`down`] never kills that process.
pub(crate) const OWNER: &str = "owner";

/// The lab's namespaces that exist now.
pub fn lab_namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_owned)
        .collect()
}

/// One process [`down`] stopped, and how long it took to exit.
#[derive(Debug, Clone)]
pub struct Stopped {
    pub pid: u32,
    /// Its command line (shortened) and where it ran.
    pub what: String,
    /// From SIGTERM to its exit.
    pub took: Duration,
    /// It needed SIGKILL.
    pub killed: bool,
}

/// What [`down`] did.
#[derive(Debug, Clone, Default)]
pub struct Teardown {
    pub stopped: Vec<Stopped>,
    /// The whole of `down`: signals, waits, namespaces, pins, state.
    pub took: Duration,
}

impl Teardown {
    /// The process that took longest to exit.
    pub fn slowest(&self) -> Option<&Stopped> {
        self.stopped.iter().max_by_key(|s| s.took)
    }
}

impl fmt::Display for Teardown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "teardown: {} process(es) exited, everything removed in {:.2} s",
            self.stopped.len(),
            self.took.as_secs_f64()
        )?;
        if let Some(s) = self.slowest() {
            write!(
                f,
                "; slowest exit {:.2} s{}: {}",
                s.took.as_secs_f64(),
                if s.killed { " (SIGKILL)" } else { "" },
                s.what
            )?;
        }
        Ok(())
    }
}

/// A process to stop: `identity` tells it from a later one with its pid.
struct Target {
    pid: u32,
    identity: String,
    what: String,
    exited: Option<Duration>,
    killed: bool,
}

/// `<pid> <start time in clock ticks since boot>`: a pid that cannot be
/// mistaken for a later process that got the same number. An error once
/// the process has exited (also while it is a zombie not yet reaped).
pub(crate) fn process_identity(pid: u32) -> Result<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: count from its ')'.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // A zombie (or dying) process keeps its entry until it is reaped.
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        bail!("process {pid} has exited");
    }
    let start = fields
        .get(19)
        .context("/proc/<pid>/stat without a start time")?;
    Ok(format!("{pid} {start}"))
}

/// The pid of another process running a lab right now, if one is: the
/// owner file names a live process other than this one. A run that was
/// interrupted, or finished with `--keep`, has no live owner.
pub(crate) fn running_owner() -> Option<u32> {
    let owner = fs::read_to_string(state().join(OWNER)).ok()?;
    let pid: u32 = owner.split_whitespace().next()?.parse().ok()?;
    let alive = process_identity(pid).is_ok_and(|now| now == owner.trim());
    (alive && pid != std::process::id()).then_some(pid)
}

/// Whether a process outside the lab's namespaces is one of the lab's: its
/// arguments, or one of its `BRINDLE_*` variables, name the state dir (the
/// daemons' configs, sockets and logs are there). A shell that merely sits
/// in that directory (`PWD`) is not.
fn started_by_lab(pid: u32) -> bool {
    let read = |f: &str| fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
    let names_state = |b: &[u8]| String::from_utf8_lossy(b).contains(STATE_DIR);
    names_state(&read("cmdline"))
        || read("environ")
            .split(|b| *b == 0)
            .any(|kv| kv.starts_with(b"BRINDLE_") && names_state(kv))
}

/// This process and its ancestors (the shell, cargo): never signalled.
fn ancestors() -> Vec<u32> {
    let mut out = vec![std::process::id()];
    while let Some(&pid) = out.last() {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0);
        if ppid <= 1 || out.contains(&ppid) {
            break;
        }
        out.push(ppid);
    }
    out
}

/// A process's command line, shortened for an error or a report line.
fn command_line(pid: u32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let line = String::from_utf8_lossy(&raw).replace('\0', " ");
    let line = line.trim();
    if line.chars().count() > 100 {
        format!("{}...", line.chars().take(100).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// The state letter of `/proc/<pid>/stat` (`D`: blocked in the kernel).
fn process_state(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned))
        })
        .unwrap_or_else(|| "?".into())
}

/// Every process of a lab, running or left by an interrupted one: those in
/// a `brl-` namespace, and those whose arguments or `BRINDLE_*` variables
/// name the state dir (a CLI on a socket there), never this process or its
/// ancestors.
fn lab_processes(namespaces: &[String]) -> Vec<Target> {
    let mine = ancestors();
    let mut pids: Vec<(u32, String)> = Vec::new();
    for ns in namespaces {
        let listed = ip(&["netns", "pids", ns]).unwrap_or_default();
        for pid in listed.split_whitespace().filter_map(|p| p.parse().ok()) {
            pids.push((pid, ns.clone()));
        }
    }
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|p| p.parse().ok())
                && !pids.iter().any(|(p, _)| *p == pid)
                && started_by_lab(pid)
            {
                pids.push((pid, "host".into()));
            }
        }
    }
    pids.into_iter()
        .filter(|(pid, _)| !mine.contains(pid))
        .filter_map(|(pid, ns)| {
            let identity = process_identity(pid).ok()?;
            Some(Target {
                pid,
                identity,
                what: format!("{} [{ns}]", command_line(pid)),
                exited: None,
                killed: false,
            })
        })
        .collect()
}

fn signal(pids: &[u32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// Reaps the daemons this process started that have exited.
fn reap_children() {
    let mut children = CHILDREN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
}

/// Waits until every target has exited or `grace` has passed, noting when
/// each one went.
fn wait_exited(targets: &mut [Target], since: Instant, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        reap_children();
        for t in targets.iter_mut().filter(|t| t.exited.is_none()) {
            if process_identity(t.pid).map_or(true, |now| now != t.identity) {
                t.exited = Some(since.elapsed());
            }
        }
        if targets.iter().all(|t| t.exited.is_some()) || Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Removes everything a lab (finished, kept or interrupted) left behind:
/// SIGTERM to every lab process, SIGKILL to those still there after
/// [`TERM_GRACE`], and only when all have exited the namespaces, bpffs pins
/// and the state dir. A process that outlives [`KILL_GRACE`] too (blocked
/// in the kernel) fails it, named, with nothing removed: run it again.
pub fn down() -> Result<Teardown> {
    let started = Instant::now();
    let namespaces = lab_namespaces();
    let mut targets = lab_processes(&namespaces);
    let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
    signal(&pids, "-TERM");
    wait_exited(&mut targets, started, TERM_GRACE);
    let left: Vec<u32> = targets
        .iter_mut()
        .filter(|t| t.exited.is_none())
        .map(|t| {
            t.killed = true;
            t.pid
        })
        .collect();
    signal(&left, "-KILL");
    wait_exited(&mut targets, started, KILL_GRACE);
    let stragglers: Vec<String> = targets
        .iter()
        .filter(|t| t.exited.is_none())
        .map(|t| format!("pid {} (state {}) {}", t.pid, process_state(t.pid), t.what))
        .collect();
    if !stragglers.is_empty() {
        bail!(
            "lab down: {} process(es) still running {:.0} s after SIGTERM and SIGKILL, so the \
             namespaces and {STATE_DIR} are kept (run `cargo xtask lab down` again): {}",
            stragglers.len(),
            started.elapsed().as_secs_f64(),
            stragglers.join("; ")
        );
    }
    // Every daemon this process started has exited: reap what is left.
    for mut child in CHILDREN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .drain(..)
    {
        let _ = child.kill();
        let _ = child.wait();
    }
    for ns in &namespaces {
        // Deleting a namespace deletes its veths.
        let _ = ip(&["netns", "del", ns]);
    }
    if let Ok(entries) = fs::read_dir("/sys/fs/bpf") {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(PREFIX) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = fs::remove_dir_all(state());
    let left = lab_namespaces();
    if !left.is_empty() {
        bail!("namespaces left after lab down: {left:?}");
    }
    Ok(Teardown {
        stopped: targets
            .into_iter()
            .map(|t| Stopped {
                pid: t.pid,
                what: t.what,
                took: t.exited.unwrap_or_default(),
                killed: t.killed,
            })
            .collect(),
        took: started.elapsed(),
    })
}

/// Starts a daemon in a namespace, logging into the state dir.
pub(crate) fn spawn_daemon(
    ns: &str,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
) -> Result<()> {
    let log = fs::File::create(state().join(format!("{name}.log")))?;
    let child = in_ns(ns, program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    fs::write(state().join(format!("{name}.pid")), child.id().to_string())?;
    CHILDREN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(child);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_waited_for_until_it_has_really_exited() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        // The exec may not show in /proc yet on a busy machine.
        let shown = Instant::now();
        while command_line(pid).is_empty() && shown.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(10));
        }
        let mut targets = vec![Target {
            pid,
            identity: process_identity(pid).unwrap(),
            what: command_line(pid),
            exited: None,
            killed: false,
        }];
        assert_eq!(targets[0].what, "sleep 30");
        let start = Instant::now();
        wait_exited(&mut targets, start, Duration::from_millis(100));
        assert!(targets[0].exited.is_none(), "still running");
        signal(&[pid], "-TERM");
        // Not reaped yet: a zombie counts as exited.
        wait_exited(&mut targets, start, Duration::from_secs(10));
        assert!(targets[0].exited.is_some());
        let _ = child.wait();
    }
}
