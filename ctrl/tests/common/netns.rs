//! Network-namespace helpers shared by the interop tests and the
//! benchmark: namespaces, veth links, daemons and our speaker on a thread
//! inside a namespace, each cleaned up by Drop.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use brindle_ctrl::bgp::rib::RouteChange;
use brindle_ctrl::bgp::speaker::{Speaker, SpeakerConfig};
use tokio::sync::mpsc::UnboundedReceiver;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short tag: process id and a counter.
pub fn tag() -> String {
    format!(
        "{}{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: String) -> Result<Self> {
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut v = vec!["ip", "-n", &self.name];
        v.extend_from_slice(args);
        run(&v)
    }
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        run(&v)
    }
    pub fn spawn(&self, args: &[&str]) -> Result<Daemon> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {args:?}"))?;
        Ok(Daemon(child))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A daemon process, killed on drop.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A veth pair between two namespaces with an address on each end; returns
/// the interface name on `a`'s side.
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> Result<String> {
    let t = tag();
    let (ia, ib) = (format!("va{t}"), format!("vb{t}"));
    run(&[
        "ip", "link", "add", &ia, "netns", &a.name, "type", "veth", "peer", "name", &ib, "netns",
        &b.name,
    ])?;
    a.ip(&["addr", "add", a_addr, "dev", &ia])?;
    b.ip(&["addr", "add", b_addr, "dev", &ib])?;
    a.ip(&["link", "set", &ia, "up"])?;
    b.ip(&["link", "set", &ib, "up"])?;
    Ok(ia)
}

/// Our speaker running on a thread that entered `ns`, so that every socket
/// it opens lives there. Stopped (and its thread joined) on drop.
pub struct NsSpeaker {
    speaker: Option<Speaker>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsSpeaker {
    pub fn start(
        ns: &Netns,
        config: SpeakerConfig,
    ) -> Result<(NsSpeaker, UnboundedReceiver<RouteChange>)> {
        let path = PathBuf::from("/run/netns").join(&ns.name);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let enter = || -> Result<tokio::runtime::Runtime> {
                let f = std::fs::File::open(&path)?;
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)?;
                Ok(tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?)
            };
            let rt = match enter() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let r = Speaker::start(config).await.map_err(anyhow::Error::from);
                let _ = ready_tx.send(r);
                let _ = stop_rx.await;
            });
        });
        let (speaker, rx) = ready_rx.recv().context("speaker thread")??;
        Ok((
            NsSpeaker {
                speaker: Some(speaker),
                stop: Some(stop_tx),
                thread: Some(thread),
            },
            rx,
        ))
    }

    pub fn api(&self) -> &Speaker {
        self.speaker.as_ref().expect("running")
    }

    /// Graceful shutdown: Cease to every peer.
    pub async fn shutdown(&mut self) {
        if let Some(s) = self.speaker.take() {
            s.shutdown().await;
        }
    }
}

impl Drop for NsSpeaker {
    fn drop(&mut self) {
        self.speaker.take();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
