//! Opening a TAP port ([`brindle_api::vrouter::PortDevice::Tap`]): one
//! queue per worker of a persistent multi-queue TAP, found by name in a
//! network namespace.

use std::os::fd::AsFd;
use std::sync::Arc;

use brindle_xsk::{Tap, TapConfig, TapOffloads};

use super::{Backend, Dataplane, EngineError, PortParts};
use crate::frame::Port;
use crate::port::tap::{TapPort, TapPortStats};
use crate::port::xdp::LinkInfo;

/// What an opened TAP is: the device's MTU and MAC (the kernel's end: a
/// pod's `eth0`, or the host's `brindle0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapLink {
    /// The device's MTU.
    pub mtu: u32,
    /// The device's MAC.
    pub mac: [u8; 6],
}

impl Dataplane {
    /// Attaches one queue per worker to the TAP `ifname` in the namespace
    /// at `netns` (`None`: the vrouter's own), queue `i` going to worker
    /// `first + i`. A pod's TAP is never created here (the CNI plugin made
    /// it; after a vrouter restart it is still there, persistent); in the
    /// vrouter's own namespace (the host port) a missing one is created,
    /// persistent, with the pod offloads, and left down for whoever sets it
    /// up. `name` is the port's name, `mac` the vrouter's MAC on it.
    pub fn open_tap(
        &self,
        name: &str,
        netns: Option<&str>,
        ifname: &str,
        mac: [u8; 6],
        first: usize,
    ) -> Result<(PortParts, TapLink, Backend), EngineError> {
        let err = |error| EngineError::Tap {
            name: name.to_owned(),
            error,
        };
        let workers = self.workers.len().max(1);
        let queues = u16::try_from(workers)
            .map_err(|_| err(brindle_xsk::Error::Config("more workers than TAP queues")))?;
        let ns = netns
            .map(std::fs::File::open)
            .transpose()
            .map_err(|source| {
                err(brindle_xsk::Error::Sys {
                    what: "open the TAP's network namespace",
                    source,
                })
            })?;
        let ns_fd = ns.as_ref().map(|f| f.as_fd());
        let tap = match Tap::attach(ns_fd, ifname, queues, TapOffloads::POD) {
            Ok(t) => t,
            Err(brindle_xsk::Error::NoSuchInterface { .. }) if netns.is_none() => {
                tracing::info!(port = name, ifname, "creating the persistent TAP");
                Tap::create(None, &TapConfig::pod(ifname).queues(queues)).map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
        let link = TapLink {
            mtu: tap.mtu(),
            mac: tap.mac(),
        };
        let stats = Arc::new(TapPortStats::default());
        {
            let mut all = self.tap_stats.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|(n, w)| n != name && w.strong_count() > 0);
            all.push((name.to_owned(), Arc::downgrade(&stats)));
        }
        let first = first % workers;
        let frame_size = self.xdp.frame_size;
        let parts: PortParts = tap
            .into_queues()
            .into_iter()
            .enumerate()
            .map(|(i, q)| {
                let w = (first + i) % workers;
                let mut p = TapPort::new(name, mac, link.mtu, q, frame_size, stats.clone());
                p.set_home(self.homes.home(w));
                (w, Box::new(p) as Box<dyn Port>)
            })
            .collect();
        Ok((parts, link, "tap"))
    }

    /// [`Dataplane::open_tap`], then [`Dataplane::install_port`] with
    /// `endpoint` completed from the device: its MTU, and the device's MAC
    /// as the peer's unless `endpoint` names one. `endpoint.mac` is the
    /// vrouter's MAC on the port.
    pub fn attach_tap(
        &self,
        id: crate::frame::PortId,
        name: &str,
        netns: Option<&str>,
        ifname: &str,
        first: usize,
        mut endpoint: crate::endpoint::Endpoint,
    ) -> Result<(Vec<usize>, TapLink, Backend), EngineError> {
        let (parts, link, backend) = self.open_tap(name, netns, ifname, endpoint.mac, first)?;
        endpoint.mtu = link.mtu;
        endpoint.peer_mac = endpoint.peer_mac.or(Some(link.mac));
        let info = LinkInfo {
            mac: endpoint.mac,
            mtu: link.mtu,
        };
        let owners = self.install_port(id, name, info, parts, &endpoint)?;
        Ok((owners, link, backend))
    }

    /// The counters of every attached TAP port, by port name.
    pub fn tap_stats(&self) -> Vec<crate::port::tap::TapStatsRow> {
        let all = self.tap_stats.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?.values())))
            .collect()
    }
}
