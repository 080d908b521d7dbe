//! `run`'s neighbour learner. `serve` has none: the controller follows the
//! kernel's neighbour table over netlink and sends `set_neighbors`. `run`
//! has no controller, so a thread of its own reads the kernel's table
//! (`/proc/net/arp` of the vrouter's namespace) every 300 ms for the next
//! hops [`crate::control::Control::unresolved`] names — only while some lack a MAC, and
//! outside the control lock — and hands the complete entries to the control
//! state as `set_neighbors`, the same request the controller sends. The
//! control state itself makes the kernel resolve those it lacks (one empty
//! datagram to the discard port). Appliance ports (`--port IF`) need none of
//! this: every frame comes to the vrouter there, ARP replies included, and
//! the pipeline learns them itself. `/proc/net/arp` rather than rtnetlink:
//! the same table, read with no async runtime beside the poll loop.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use brindle_api::vrouter::{self as api, Mac};

use crate::control::Daemon;

/// One complete entry of `/proc/net/arp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelNeighbor {
    /// The neighbour's address.
    pub addr: Ipv4Addr,
    /// Its MAC.
    pub mac: [u8; 6],
    /// The interface it is on.
    pub device: String,
}

/// `ATF_COM`: the entry is complete.
const ATF_COM: u32 = 0x2;

/// Parses `/proc/net/arp`, keeping complete entries only.
pub fn parse_proc_arp(text: &str) -> Vec<KernelNeighbor> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 {
                return None;
            }
            let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
            if flags & ATF_COM == 0 {
                return None;
            }
            Some(KernelNeighbor {
                addr: f[0].parse().ok()?,
                mac: f[3].parse::<Mac>().ok()?.0,
                device: f[5].to_owned(),
            })
        })
        .collect()
}

/// Reads the kernel's IPv4 neighbour table of this network namespace.
pub fn read_kernel_neighbors() -> std::io::Result<Vec<KernelNeighbor>> {
    Ok(parse_proc_arp(&std::fs::read_to_string("/proc/net/arp")?))
}

/// Starts the learner; it ends when `stop` is set.
pub fn spawn_learner(
    control: Arc<Mutex<Daemon>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("neighbors".into())
        .spawn(move || {
            // Short naps, so a stop is seen within 50 ms; a round every 300 ms,
            // a poke every 1.2 s.
            let mut ticks = 0u32;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                ticks = ticks.wrapping_add(1);
                if ticks.is_multiple_of(6) {
                    learn_once(&control, ticks.is_multiple_of(24));
                }
            }
        })
}

/// One round: the missing next hops (under the lock: a few entries), the
/// kernel's table (outside it), the entries found (under it again).
fn learn_once(control: &Mutex<Daemon>, poke: bool) {
    let lock = || control.lock().unwrap_or_else(|e| e.into_inner());
    let wanted = lock().unresolved();
    if wanted.is_empty() {
        return;
    }
    let kernel = match read_kernel_neighbors() {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the kernel's neighbour table");
            return;
        }
    };
    let found = found(&wanted, &kernel);
    let mut control = lock();
    if !found.is_empty() {
        for n in &found {
            tracing::info!(port = %n.port, addr = %n.ip, "neighbour learned from the kernel");
        }
        if let Err(e) = control.handle(api::VrouterRequest::SetNeighbors { neighbors: found }) {
            tracing::warn!(error = %e.message, "learned neighbours refused");
        }
    } else if poke {
        control.resolve_missing();
    }
}

/// The `wanted` (port, address) pairs the kernel has a complete entry for.
pub fn found(wanted: &[(String, Ipv4Addr)], kernel: &[KernelNeighbor]) -> Vec<api::Neighbor> {
    wanted
        .iter()
        .filter_map(|(dev, addr)| {
            kernel
                .iter()
                .find(|k| k.addr == *addr && k.device == *dev)
                .map(|k| api::Neighbor {
                    port: dev.clone(),
                    ip: (*addr).into(),
                    mac: Mac(k.mac),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARP: &str =
        "IP address       HW type     Flags       HW address            Mask     Device
192.168.77.2     0x1         0x2         02:b4:00:00:00:02     *        u1
192.168.77.3     0x1         0x0         00:00:00:00:00:00     *        u1
192.168.77.4     0x1         0x6         02:b4:00:00:00:04     *        u1
10.0.0.1         0x1         0x2         02:00:00:00:00:01     *        eth9
";

    #[test]
    fn only_complete_entries_are_read() {
        let n = parse_proc_arp(ARP);
        assert_eq!(n.len(), 3);
        assert_eq!(n[0].addr, Ipv4Addr::new(192, 168, 77, 2));
        assert_eq!(n[0].mac, [2, 0xb4, 0, 0, 0, 2]);
        assert_eq!(n[0].device, "u1");
        assert_eq!(
            n[1].addr,
            Ipv4Addr::new(192, 168, 77, 4),
            "permanent counts"
        );
        assert!(parse_proc_arp("header only\n").is_empty());
        assert!(parse_proc_arp("h\nnot an entry\n").is_empty());
    }

    #[test]
    fn only_wanted_entries_on_their_port_are_found() {
        let kernel = parse_proc_arp(ARP);
        let wanted = vec![
            ("u1".to_owned(), Ipv4Addr::new(192, 168, 77, 2)),
            ("u1".to_owned(), Ipv4Addr::new(192, 168, 77, 3)),
            ("u1".to_owned(), Ipv4Addr::new(10, 0, 0, 1)),
        ];
        let f = found(&wanted, &kernel);
        assert_eq!(
            f.len(),
            1,
            "incomplete, and on another interface: not found"
        );
        assert_eq!(f[0].port, "u1");
        assert_eq!(f[0].mac, Mac([2, 0xb4, 0, 0, 0, 2]));
    }
}
