//! Underlay neighbours learned from the kernel.
//!
//! The vrouter's own ARP requests on the uplink get their replies passed to
//! the kernel by the steering program (they are addressed to the node), so
//! instead of answering them in userspace the daemon reads the kernel's
//! neighbour table (`/proc/net/arp` of its network namespace) for the next
//! hops its routes need (tunnel remotes, gateways) and hands complete
//! entries to the worker. A next hop the kernel does not know yet is poked
//! with one empty UDP datagram to the discard port, which makes the kernel
//! ARP for it; until it answers, the pipeline drops and counts
//! (`no_neighbour`) what it cannot send. Neighbours set over the API win.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, UdpSocket};

use brindle_api::vrouter::Mac;

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

/// Makes the kernel resolve `addr`: one empty datagram to the discard port
/// (9). The kernel ARPs for the next hop before it can send it.
pub fn poke(addr: Ipv4Addr) {
    if let Ok(s) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
        let _ = s.send_to(&[], (addr, 9));
    }
}

/// An entry to hand to the worker: interface, address, MAC.
pub type Learnt = (String, Ipv4Addr, [u8; 6]);

/// What the learner last told the worker, per (interface, address).
#[derive(Default)]
pub struct Learned {
    known: BTreeMap<(String, Ipv4Addr), [u8; 6]>,
}

impl Learned {
    /// Of the `wanted` (interface, address) pairs, those whose kernel entry
    /// is new or changed, with its MAC; and those the kernel lacks.
    pub fn update(
        &mut self,
        wanted: &[(String, Ipv4Addr)],
        kernel: &[KernelNeighbor],
    ) -> (Vec<Learnt>, Vec<Ipv4Addr>) {
        let mut changed = Vec::new();
        let mut missing = Vec::new();
        for (dev, addr) in wanted {
            match kernel.iter().find(|k| k.addr == *addr && k.device == *dev) {
                Some(k) => {
                    let key = (dev.clone(), *addr);
                    if self.known.get(&key) != Some(&k.mac) {
                        self.known.insert(key, k.mac);
                        changed.push((dev.clone(), *addr, k.mac));
                    }
                }
                None => missing.push(*addr),
            }
        }
        (changed, missing)
    }

    /// Forgets everything (a port came back in a new slot: resend).
    pub fn clear(&mut self) {
        self.known.clear();
    }
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
    fn learner_reports_new_and_changed_entries_once_and_the_missing() {
        let kernel = parse_proc_arp(ARP);
        let mut l = Learned::default();
        let wanted = vec![
            ("u1".to_owned(), Ipv4Addr::new(192, 168, 77, 2)),
            ("u1".to_owned(), Ipv4Addr::new(192, 168, 77, 3)),
            ("u1".to_owned(), Ipv4Addr::new(10, 0, 0, 1)),
        ];
        let (changed, missing) = l.update(&wanted, &kernel);
        assert_eq!(
            changed,
            vec![(
                "u1".to_owned(),
                Ipv4Addr::new(192, 168, 77, 2),
                [2, 0xb4, 0, 0, 0, 2]
            )]
        );
        assert_eq!(
            missing,
            vec![Ipv4Addr::new(192, 168, 77, 3), Ipv4Addr::new(10, 0, 0, 1)],
            "incomplete, and on another interface"
        );
        let (changed, _) = l.update(&wanted, &kernel);
        assert!(changed.is_empty(), "told once");
        let moved = parse_proc_arp(&ARP.replace("02:b4:00:00:00:02", "02:b4:00:00:00:99"));
        let (changed, _) = l.update(&wanted, &moved);
        assert_eq!(changed.len(), 1, "a changed MAC is told again");
    }
}
