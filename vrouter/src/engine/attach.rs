//! Attaching many ports at once (issue 17): a node starting its pods sends
//! them in one `AddPorts`, and opening a port is mostly waiting in the
//! kernel (an AF_XDP port's BPF maps, program load and XDP attach, its
//! sockets and rings; a TAP's queues opened in the pod's namespace):
//! 20-30 ms each, one after the other 2-3 s for 110 pods. The ports of a
//! batch are opened on up to [`OPENERS`] threads at once, then installed
//! on the workers in the batch's order (a few channel sends each), so the
//! workers see the same commands as with one port at a time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use brindle_xsk::Role;

use super::{Backend, Dataplane, EngineError, PortParts};
use crate::endpoint::Endpoint;
use crate::frame::PortId;
use crate::port::xdp::LinkInfo;

/// Threads opening one batch's ports at most: the work is mostly the
/// kernel's waiting (RCU grace periods, the verifier), not CPU.
pub const OPENERS: usize = 16;

/// Which device a port to attach is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachDevice {
    /// An interface of the vrouter's namespace, by AF_XDP (or AF_PACKET).
    Xdp {
        /// Its steering program's role.
        role: Role,
        /// Its MAC and MTU.
        link: LinkInfo,
    },
    /// A persistent multi-queue TAP, one queue per worker.
    Tap {
        /// The namespace it is in (`None`: the vrouter's own).
        netns: Option<String>,
        /// Its name there.
        ifname: String,
    },
}

/// One port to open and install in slot `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttach {
    /// The slot.
    pub id: PortId,
    /// The port's name.
    pub name: String,
    /// The device.
    pub device: AttachDevice,
    /// The worker its queues spread from.
    pub first: usize,
    /// What the workers are told (a TAP's MTU, and its MAC as the peer's
    /// unless set, come from the device).
    pub endpoint: Endpoint,
}

/// A port opened, not yet installed.
struct Opened {
    parts: PortParts,
    backend: Backend,
    link: LinkInfo,
    endpoint: Endpoint,
}

/// What attaching one port gave: its owning workers and socket kind.
pub type Attached = Result<(Vec<usize>, Backend), EngineError>;

impl Dataplane {
    /// Opens `port`'s device (no worker sees it yet).
    fn open_one(&self, port: &PortAttach) -> Result<Opened, EngineError> {
        let mut endpoint = port.endpoint.clone();
        match &port.device {
            AttachDevice::Xdp { role, link } => {
                let (parts, backend) =
                    self.open_port(&port.name, *role, endpoint.kind, *link, port.first)?;
                Ok(Opened {
                    parts,
                    backend,
                    link: *link,
                    endpoint,
                })
            }
            AttachDevice::Tap { netns, ifname } => {
                let (parts, tap, backend) = self.open_tap(
                    &port.name,
                    netns.as_deref(),
                    ifname,
                    endpoint.mac,
                    port.first,
                )?;
                endpoint.mtu = tap.mtu;
                endpoint.peer_mac = endpoint.peer_mac.or(Some(tap.mac));
                Ok(Opened {
                    parts,
                    backend,
                    link: LinkInfo {
                        mac: endpoint.mac,
                        mtu: tap.mtu,
                    },
                    endpoint,
                })
            }
        }
    }

    /// Opens every port of `ports` (several at once), then installs each
    /// opened one in its slot on every worker, in order. One result per
    /// port, in order: a port that fails does not stop the others.
    pub fn attach_many(&self, ports: &[PortAttach]) -> Vec<Attached> {
        let opened: Vec<Result<Opened, EngineError>> = if ports.len() <= 1 {
            ports.iter().map(|p| self.open_one(p)).collect()
        } else {
            let slots: Vec<Mutex<Option<Result<Opened, EngineError>>>> =
                ports.iter().map(|_| Mutex::new(None)).collect();
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..ports.len().min(OPENERS) {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(port) = ports.get(i) else { return };
                            let got = self.open_one(port);
                            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(got);
                        }
                    });
                }
            });
            slots
                .into_iter()
                .map(|m| {
                    m.into_inner()
                        .unwrap_or_else(|e| e.into_inner())
                        .unwrap_or(Err(EngineError::Spawn(std::io::Error::other(
                            "opener thread ended early",
                        ))))
                })
                .collect()
        };
        ports
            .iter()
            .zip(opened)
            .map(|(port, opened)| {
                let o = opened?;
                let owners =
                    self.install_port(port.id, &port.name, o.link, o.parts, &o.endpoint)?;
                Ok((owners, o.backend))
            })
            .collect()
    }
}
