//! Namespace helpers for this crate's root-only tests: the generic ones
//! (unique names, `Netns` deleted on drop, `run`, `in_netns`) come from
//! `brindle_testkit::netns`; what only BGP tests need (a daemon killed on
//! drop, a veth between two namespaces, our speaker on a thread inside a
//! namespace) stays here. `benches/learn_routes.rs` includes this file by
//! path.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use brindle_ctrl::bgp::rib::RouteChange;
use brindle_ctrl::bgp::speaker::{Speaker, SpeakerConfig};
pub use brindle_testkit::netns::{Netns, in_netns, run, unique};
use tokio::sync::mpsc::UnboundedReceiver;

/// A daemon process, killed on drop.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` inside `ns` with its output discarded.
pub fn spawn(ns: &Netns, args: &[&str]) -> Result<Daemon> {
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {args:?}"))?;
    Ok(Daemon(child))
}

/// A veth pair between two namespaces with an address on each end; returns
/// the interface name on `a`'s side.
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> Result<String> {
    let (ia, ib) = (unique("va"), unique("vb"));
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
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl NsSpeaker {
    pub fn start(
        ns: &Netns,
        config: SpeakerConfig,
    ) -> Result<(NsSpeaker, UnboundedReceiver<RouteChange>)> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = in_netns(ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let r = Speaker::start(config).await.map_err(anyhow::Error::from);
                let _ = ready_tx.send(r);
                let _ = stop_rx.await;
            });
            Ok(())
        });
        let Ok(started) = ready_rx.recv() else {
            // The thread failed before starting the speaker: its error.
            return Err(thread
                .join()
                .map_err(|_| anyhow::anyhow!("speaker thread panicked"))?
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("speaker thread ended")));
        };
        let (speaker, rx) = started?;
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
