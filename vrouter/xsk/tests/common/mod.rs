//! Helpers of the root-only tests: threads that run inside a namespace
//! (borrowing from the test), veths, frame builders. Namespaces and
//! commands are `brindle_testkit::netns`'s.
#![allow(dead_code)]

use std::fs::File;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use anyhow::Result;
#[allow(unused_imports)]
pub use brindle_testkit::netns::{Netns, run, unique};
use brindle_xsk::{Desc, Umem, XdpStats, XskSocket};
use nix::sched::{CloneFlags, setns};

static OCTETS: AtomicU32 = AtomicU32::new(0);

/// A small number unique to this call, for address octets.
pub fn unique_octet() -> u8 {
    (OCTETS.fetch_add(1, Ordering::Relaxed) + std::process::id()) as u8 % 200 + 20
}

/// Running a closure inside a namespace on a scoped thread (it may borrow
/// from the test), which `brindle_testkit::netns::in_netns` (a `'static`
/// thread) does not allow.
pub trait Enter {
    /// Runs `f` on a thread that lives in this namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T;
}

impl Enter for Netns {
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(move || {
                let file = File::open(&path).expect("open netns");
                setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            })
            .join()
            .expect("thread in netns panicked")
        })
    }
}

/// A MAC address derived from a tag and an index (locally administered).
pub fn mac(tag: u8, i: u8) -> [u8; 6] {
    [0x02, 0xb1, 0x00, tag, 0x00, i]
}

pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A veth pair `a` in `ns_a`, `b` in `ns_b`, with given MACs and addresses
/// (a /24 each), both up. (Eight plain arguments read best at the call sites.)
#[allow(clippy::too_many_arguments)]
pub fn veth(
    ns_a: &Netns,
    a: &str,
    mac_a: [u8; 6],
    addr_a: Option<&str>,
    ns_b: &Netns,
    b: &str,
    mac_b: [u8; 6],
    addr_b: Option<&str>,
) -> Result<()> {
    ns_a.ip(&[
        "link",
        "add",
        a,
        "address",
        &mac_str(mac_a),
        "type",
        "veth",
        "peer",
        "name",
        b,
        "netns",
        &ns_b.name,
        "address",
        &mac_str(mac_b),
    ])?;
    if let Some(addr) = addr_a {
        ns_a.ip(&["addr", "add", addr, "dev", a])?;
    }
    if let Some(addr) = addr_b {
        ns_b.ip(&["addr", "add", addr, "dev", b])?;
    }
    ns_a.ip(&["link", "set", "dev", a, "up"])?;
    ns_b.ip(&["link", "set", "dev", b, "up"])?;
    Ok(())
}

/// RFC 1071 checksum.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet + IPv4 + UDP frame (UDP checksum 0, which IPv4 allows).
pub fn udp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// What a received frame is, enough for the assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Udp {
        dst: Ipv4Addr,
        dport: u16,
        payload: Vec<u8>,
    },
    Ipip {
        dst: Ipv4Addr,
    },
    Tcp {
        dst: Ipv4Addr,
        dport: u16,
    },
    Icmp {
        dst: Ipv4Addr,
    },
    Arp {
        target: Ipv4Addr,
    },
    Other(u16),
}

pub fn classify(f: &[u8]) -> Seen {
    if f.len() < 14 {
        return Seen::Other(0);
    }
    let ethertype = u16::from_be_bytes([f[12], f[13]]);
    match ethertype {
        0x0806 if f.len() >= 42 => Seen::Arp {
            target: Ipv4Addr::new(f[38], f[39], f[40], f[41]),
        },
        0x0800 if f.len() >= 34 => {
            let ihl = usize::from(f[14] & 0x0f) * 4;
            let dst = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
            let l4 = &f[(14 + ihl).min(f.len())..];
            match f[23] {
                1 => Seen::Icmp { dst },
                4 => Seen::Ipip { dst },
                6 if l4.len() >= 4 => Seen::Tcp {
                    dst,
                    dport: u16::from_be_bytes([l4[2], l4[3]]),
                },
                17 if l4.len() >= 8 => Seen::Udp {
                    dst,
                    dport: u16::from_be_bytes([l4[2], l4[3]]),
                    payload: l4[8..].to_vec(),
                },
                p => Seen::Other(u16::from(p)),
            }
        }
        other => Seen::Other(other),
    }
}

/// Decrements the IPv4 TTL with an RFC 1624 incremental checksum update.
pub fn decrement_ttl(ip: &mut [u8]) -> bool {
    if ip[8] <= 1 {
        return false;
    }
    let old = u16::from_be_bytes([ip[8], ip[9]]);
    ip[8] -= 1;
    let new = u16::from_be_bytes([ip[8], ip[9]]);
    let sum = u16::from_be_bytes([ip[10], ip[11]]);
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    ip[10..12].copy_from_slice(&(!(acc as u16)).to_be_bytes());
    true
}

/// The test's forwarder: frames from one socket go out of the other by
/// descriptor, with MACs and TTL rewritten in place.
/// `a_out`/`b_out` are the (destination, source) MACs of frames leaving
/// through `a`/`b`. Returns frames sent and the sockets' counters.
pub fn forward(
    mut umem: Umem,
    a: XskSocket,
    b: XskSocket,
    a_out: ([u8; 6], [u8; 6]),
    b_out: ([u8; 6], [u8; 6]),
    stop: &AtomicBool,
) -> Result<(u64, [XdpStats; 2])> {
    let mut free: Vec<u64> = (0..umem.frame_count())
        .map(|i| umem.frame_addr(i))
        .collect();
    let mut descs = [Desc::default(); 64];
    let mut out = [Desc::default(); 64];
    let mut done = [0u64; 256];
    let mut sent = 0u64;
    let mut socks = [a, b];
    // A quarter of the frames to each fill ring; the rest are for frames in
    // flight on the TX rings.
    for s in &mut socks {
        let want = free.len() / 3;
        let n = s.fill(&free[free.len() - want..]);
        free.truncate(free.len() - n);
    }
    while !stop.load(Ordering::Relaxed) {
        let mut received = 0;
        for (from_a, (dst, src)) in [(true, b_out), (false, a_out)] {
            let [a, b] = &mut socks;
            let (rx, tx) = if from_a { (a, b) } else { (b, a) };
            let n = rx.rx_burst(&mut descs);
            received += n;
            let mut m = 0;
            for d in &descs[..n] {
                let keep = match umem.data_mut(*d) {
                    Some(f) if f.len() >= 34 && f[12..14] == [0x08, 0x00] => {
                        f[..6].copy_from_slice(&dst);
                        f[6..12].copy_from_slice(&src);
                        decrement_ttl(&mut f[14..34])
                    }
                    _ => false,
                };
                if keep {
                    out[m] = *d;
                    m += 1;
                } else {
                    free.push(umem.chunk_of(d.addr));
                }
            }
            let taken = tx.tx_burst(&out[..m]);
            sent += taken as u64;
            free.extend(out[taken..m].iter().map(|d| umem.chunk_of(d.addr)));
            tx.kick_tx()?;
        }
        for s in &mut socks {
            let n = s.reap_completions(&mut done);
            free.extend(done[..n].iter().map(|&addr| umem.chunk_of(addr)));
        }
        for s in &mut socks {
            let want = free.len().min(256);
            let n = s.fill(&free[free.len() - want..]);
            free.truncate(free.len() - n);
            if s.fill_needs_wakeup() {
                s.wake_rx()?;
            }
        }
        if received == 0 {
            // Idle: sleep in poll() rather than spin (a 1 ms tick is plenty
            // for the tests; the bench is never idle).
            socks[0].poll_rx(1)?;
        }
    }
    Ok((sent, [socks[0].stats()?, socks[1].stats()?]))
}
