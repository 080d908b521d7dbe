//! TAP devices in namespaces made by the test: created where asked,
//! persistent across their holders, re-attached by name, offloads that the
//! pod's kernel really uses (TSO super-packets and USO read with their
//! virtio-net header), frames written with a header delivered, and the
//! namespace guard always returning its thread.

mod common;

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use brindle_xsk::netns::current_netns;
use brindle_xsk::{Error, NetnsGuard, Tap, TapConfig, TapOffloads, TapQueue, VNET_HDR_LEN};
use common::{Enter, Netns, mac, mac_str, udp_frame, unique, unique_octet};

fn ns_file(ns: &Netns) -> Result<File> {
    File::open(ns.path()).with_context(|| format!("open {}", ns.path()))
}

/// (device, inode) of a namespace descriptor: equal iff same namespace.
fn ns_id(fd: impl AsFd) -> Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    Ok((st.st_dev as u64, st.st_ino as u64))
}

fn link(ns: &Netns, name: &str) -> Result<serde_like::Link> {
    serde_like::Link::parse(&ns.ip(&["-o", "link", "show", name])?)
}

/// Enough of `ip -o link show` for the assertions, without a JSON parser
/// (this crate's tests have none).
mod serde_like {
    use anyhow::{Context, Result};

    pub struct Link {
        pub mtu: u32,
        pub mac: String,
        pub line: String,
    }

    impl Link {
        pub fn parse(line: &str) -> Result<Link> {
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| words.get(i + 1))
                    .map(|s| s.to_string())
                    .with_context(|| format!("no {key} in {line}"))
            };
            Ok(Link {
                mtu: after("mtu")?.parse()?,
                mac: after("link/ether")?,
                line: line.to_owned(),
            })
        }
    }
}

fn ethtool_features(ns: &Netns, dev: &str) -> Result<String> {
    ns.exec(&["ethtool", "-k", dev])
}

fn feature_on(features: &str, name: &str) -> bool {
    features
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("{name}: on")))
}

#[test]
#[ignore = "requires root and network namespaces"]
fn tap_is_created_in_the_namespace_asked_for_and_outlives_its_queues() -> Result<()> {
    let pod = Netns::new("tp")?;
    let name = unique("bt");
    let netns = ns_file(&pod)?;
    let tap = Tap::create(
        Some(netns.as_fd()),
        &TapConfig::pod(&name).mtu(1410).mac(mac(0x31, 1)).queues(3),
    )?;
    assert_eq!(tap.queues().len(), 3);
    assert_eq!(
        tap.offloads(),
        TapOffloads::POD,
        "this kernel (6.18) has USO"
    );

    // In the pod's namespace, with its MTU and MAC; not in ours.
    let l = link(&pod, &name)?;
    assert_eq!(l.mtu, 1410, "{}", l.line);
    assert_eq!(l.mac, mac_str(mac(0x31, 1)));
    assert!(
        brindle_xsk::ifindex(&name).is_err(),
        "{name} must not exist in the test's own namespace"
    );
    assert_eq!(ns_id(tap.queues()[0].device_netns()?)?, ns_id(&netns)?);
    assert_eq!(tap.queues()[2].device_mac()?, mac(0x31, 1));
    let features = ethtool_features(&pod, &name)?;
    for f in [
        "tx-checksumming",
        "tcp-segmentation-offload",
        "tx-tcp-segmentation",
        "tx-tcp6-segmentation",
        "tx-tcp-ecn-segmentation",
        "tx-udp-segmentation",
    ] {
        assert!(feature_on(&features, f), "{f} not on:\n{features}");
    }
    let flags = pod.ip(&["-d", "link", "show", &name])?;
    assert!(flags.contains("tun type tap"), "{flags}");
    assert!(flags.contains("multi_queue"), "{flags}");
    assert!(flags.contains("vnet_hdr"), "{flags}");
    assert!(flags.contains("persist on"), "{flags}");

    // Persistent: the device and its address survive the holder.
    pod.ip(&["addr", "add", "10.201.0.5/32", "dev", &name])?;
    pod.ip(&["link", "set", &name, "up"])?;
    drop(tap);
    assert!(
        pod.ip(&["addr", "show", "dev", &name])?
            .contains("10.201.0.5/32")
    );

    // A name taken in that namespace is refused, and nothing changes.
    let again = Tap::create(Some(netns.as_fd()), &TapConfig::pod(&name));
    assert!(
        matches!(again, Err(Error::InterfaceExists { name: ref n }) if *n == name),
        "{again:?}"
    );

    // The vrouter attaches by name and namespace, as many queues as workers.
    let tap = Tap::attach(Some(netns.as_fd()), &name, 2, TapOffloads::POD)?;
    assert_eq!(tap.queues().len(), 2);
    assert_eq!(tap.ifindex(), ifindex_in(&pod, &name)?);
    assert!(
        pod.ip(&["addr", "show", "dev", &name])?
            .contains("10.201.0.5/32")
    );
    assert_eq!(l.mac, mac_str(tap.queues()[0].device_mac()?));

    // Delete with the vrouter still attached: the device goes when it lets go.
    assert!(Tap::delete(Some(netns.as_fd()), &name)?);
    assert!(pod.ip(&["link", "show", &name]).is_ok(), "still held");
    drop(tap);
    assert!(
        pod.ip(&["link", "show", &name]).is_err(),
        "gone with its last queue"
    );
    assert!(
        !Tap::delete(Some(netns.as_fd()), &name)?,
        "nothing left to delete"
    );
    Ok(())
}

fn ifindex_in(ns: &Netns, name: &str) -> Result<u32> {
    let line = ns.ip(&["-o", "link", "show", name])?;
    Ok(line.split(':').next().context("index")?.trim().parse()?)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn attach_refuses_what_is_not_a_persistent_tap_and_creates_nothing() -> Result<()> {
    let pod = Netns::new("tq")?;
    let netns = ns_file(&pod)?;
    let missing = Tap::attach(Some(netns.as_fd()), "nosuch0", 1, TapOffloads::POD);
    assert!(
        matches!(missing, Err(Error::NoSuchInterface { .. })),
        "{missing:?}"
    );
    assert!(
        pod.ip(&["link", "show", "nosuch0"]).is_err(),
        "attach created it"
    );

    pod.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
    let veth = Tap::attach(Some(netns.as_fd()), "v0", 1, TapOffloads::POD);
    assert!(
        matches!(veth, Err(Error::NotPersistentTap { .. })),
        "{veth:?}"
    );

    // A TAP someone holds without persistence: not ours to attach to.
    let mut cfg = TapConfig::pod("eph0");
    cfg.persist = false;
    let held = Tap::create(Some(netns.as_fd()), &cfg)?;
    let eph = Tap::attach(Some(netns.as_fd()), "eph0", 1, TapOffloads::POD);
    assert!(
        matches!(eph, Err(Error::NotPersistentTap { .. })),
        "{eph:?}"
    );
    drop(held);
    assert!(
        pod.ip(&["link", "show", "eph0"]).is_err(),
        "a non-persistent TAP goes with its holder"
    );
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_namespace_guard_returns_its_thread_also_on_early_return() -> Result<()> {
    let other = Netns::new("tg")?;
    let target = ns_file(&other)?;
    let home = ns_id(current_netns()?)?;
    assert_ne!(home, ns_id(&target)?);
    {
        let _guard = NetnsGuard::enter(target.as_fd())?;
        assert_eq!(ns_id(current_netns()?)?, ns_id(&target)?);
    }
    assert_eq!(ns_id(current_netns()?)?, home);
    let failing = || -> Result<()> {
        let _guard = NetnsGuard::enter(target.as_fd())?;
        bail!("an error while inside")
    };
    assert!(failing().is_err());
    assert_eq!(
        ns_id(current_netns()?)?,
        home,
        "left behind by an early return"
    );
    Ok(())
}

/// Two pods with TAP `eth0`s, addresses and static neighbours, ready for a
/// relay: frames read from one queue are written, header and all, to the
/// other.
struct TapPair {
    pods: [Netns; 2],
    addrs: [Ipv4Addr; 2],
    macs: [[u8; 6]; 2],
    queues: [TapQueue; 2],
}

fn tap_pair(offloads: TapOffloads) -> Result<TapPair> {
    let pods = [Netns::new("ta")?, Netns::new("tb")?];
    let o = unique_octet();
    let addrs = [Ipv4Addr::new(10, 202, o, 1), Ipv4Addr::new(10, 202, o, 2)];
    let macs = [mac(0x32, 1), mac(0x32, 2)];
    let mut queues = Vec::new();
    for i in 0..2 {
        let netns = ns_file(&pods[i])?;
        let mut cfg = TapConfig::pod("eth0").mtu(1450).mac(macs[i]);
        cfg.offloads = offloads;
        queues.extend(Tap::create(Some(netns.as_fd()), &cfg)?.into_queues());
        let p = &pods[i];
        p.ip(&["addr", "add", &format!("{}/24", addrs[i]), "dev", "eth0"])?;
        p.ip(&["link", "set", "eth0", "up"])?;
        p.ip(&[
            "neigh",
            "add",
            &addrs[1 - i].to_string(),
            "lladdr",
            &mac_str(macs[1 - i]),
            "dev",
            "eth0",
        ])?;
    }
    let [a, b]: [TapQueue; 2] = queues.try_into().map_err(|_| anyhow::anyhow!("queues"))?;
    Ok(TapPair {
        pods,
        addrs,
        macs,
        queues: [a, b],
    })
}

#[derive(Default)]
struct RelayCounts {
    frames: AtomicU64,
    gso_frames: AtomicU64,
    largest: AtomicU64,
}

/// The anchor's relay (`tap_relay.c`): one read, one write, header carried
/// through. Runs until `stop`.
fn relay(queues: &[TapQueue; 2], stop: &AtomicBool, counts: &RelayCounts) -> Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut buf = vec![0u8; 65536 + VNET_HDR_LEN];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [
            PollFd::new(queues[0].as_fd(), PollFlags::POLLIN),
            PollFd::new(queues[1].as_fd(), PollFlags::POLLIN),
        ];
        poll(&mut fds, PollTimeout::from(50u8))?;
        for i in 0..2 {
            loop {
                let n = match queues[i].read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                };
                ensure!(n > VNET_HDR_LEN, "short read {n}");
                counts.frames.fetch_add(1, Ordering::Relaxed);
                if buf[1] != 0 {
                    counts.gso_frames.fetch_add(1, Ordering::Relaxed);
                }
                counts.largest.fetch_max(n as u64, Ordering::Relaxed);
                match queues[1 - i].write(&buf[..n]) {
                    Ok(w) => ensure!(w == n, "short write {w} of {n}"),
                    // A full queue drops, as a NIC would; TCP resends.
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e).context("write to the other TAP"),
                }
            }
        }
    }
    Ok(())
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

#[test]
#[ignore = "requires root and network namespaces"]
fn tcp_between_two_tap_pods_moves_tso_super_packets_through_a_relay() -> Result<()> {
    let pair = tap_pair(TapOffloads::POD)?;
    let stop = AtomicBool::new(false);
    let counts = RelayCounts::default();
    const BYTES: usize = 16 << 20;
    let result = std::thread::scope(|s| -> Result<()> {
        let relay = s.spawn(|| relay(&pair.queues, &stop, &counts));
        let (tx, rx) = std::sync::mpsc::channel();
        let server_pod = &pair.pods[1];
        let server_addr = pair.addrs[1];
        let server = s.spawn(move || {
            server_pod.enter(|| -> Result<usize> {
                let l = TcpListener::bind((server_addr, 0))?;
                tx.send(l.local_addr()?)?;
                let (mut c, _) = l.accept()?;
                c.set_read_timeout(Some(Duration::from_secs(10)))?;
                let mut got = 0usize;
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = c.read(&mut buf)?;
                    if n == 0 {
                        return Ok(got);
                    }
                    for (k, b) in buf[..n].iter().enumerate() {
                        ensure!(*b == pattern(got + k), "byte {} differs", got + k);
                    }
                    got += n;
                }
            })
        });
        let to = rx.recv_timeout(Duration::from_secs(5))?;
        let sent = pair.pods[0].enter(|| -> Result<usize> {
            let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
            let data: Vec<u8> = (0..BYTES).map(pattern).collect();
            c.write_all(&data)?;
            Ok(data.len())
        });
        let got = server
            .join()
            .map_err(|_| anyhow::anyhow!("server panicked"))?;
        stop.store(true, Ordering::Relaxed);
        relay
            .join()
            .map_err(|_| anyhow::anyhow!("relay panicked"))??;
        ensure!(sent? == BYTES);
        ensure!(got? == BYTES, "short transfer");
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    result?;
    let (frames, gso, largest) = (
        counts.frames.load(Ordering::Relaxed),
        counts.gso_frames.load(Ordering::Relaxed),
        counts.largest.load(Ordering::Relaxed),
    );
    eprintln!("relay: {frames} frames, {gso} GSO, largest {largest} B");
    // 16 MiB in MTU-sized frames would be ~11,500 data frames.
    assert!(gso > 0, "no GSO frame among {frames}");
    assert!(
        largest > 1450 + 14 + VNET_HDR_LEN as u64,
        "largest {largest}"
    );
    assert!(frames < 8_000, "{frames} frames: TSO did not batch");
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn without_offloads_the_pods_kernel_segments_before_the_read() -> Result<()> {
    let pair = tap_pair(TapOffloads::NONE)?;
    let features = ethtool_features(&pair.pods[0], "eth0")?;
    assert!(
        !feature_on(&features, "tcp-segmentation-offload"),
        "{features}"
    );
    // A 4000-byte UDP send with UDP_SEGMENT 1000 arrives as four frames of
    // their own, each with a zero header.
    let frames = send_gso_udp(&pair, 4000, 1000)?;
    assert_eq!(
        frames.len(),
        4,
        "{:?}",
        frames.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for f in &frames {
        assert_eq!(
            &f[..VNET_HDR_LEN],
            &[0; VNET_HDR_LEN],
            "header of a plain frame"
        );
        assert_eq!(f.len(), VNET_HDR_LEN + 14 + 20 + 8 + 1000);
    }
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn uso_hands_over_one_udp_super_packet_with_its_gso_header() -> Result<()> {
    let pair = tap_pair(TapOffloads::POD)?;
    let frames = send_gso_udp(&pair, 4000, 1000)?;
    assert_eq!(frames.len(), 1, "one super-packet");
    let f = &frames[0];
    let le = |i: usize| u16::from_le_bytes([f[i], f[i + 1]]);
    assert_eq!(f[0] & 1, 1, "NEEDS_CSUM");
    assert_eq!(f[1], 5, "VIRTIO_NET_HDR_GSO_UDP_L4");
    assert_eq!(le(4), 1000, "gso_size");
    assert_eq!(le(6), 14 + 20, "csum_start: the UDP header");
    assert_eq!(le(8), 6, "csum_offset: the UDP checksum field");
    assert_eq!(f.len(), VNET_HDR_LEN + 14 + 20 + 8 + 4000);
    Ok(())
}

/// Sends `len` bytes from pod 0 to pod 1 as one UDP_SEGMENT send and
/// returns the frames read from pod 0's queue (ARP and IPv6 noise skipped).
fn send_gso_udp(pair: &TapPair, len: usize, segment: u16) -> Result<Vec<Vec<u8>>> {
    let (from, to) = (pair.addrs[0], pair.addrs[1]);
    pair.pods[0].enter(|| -> Result<()> {
        let s = UdpSocket::bind((from, 40000))?;
        nix::sys::socket::setsockopt(
            &s,
            nix::sys::socket::sockopt::UdpGsoSegment,
            &i32::from(segment),
        )?;
        s.send_to(&vec![0xab; len], (to, 40001))?;
        Ok(())
    })?;
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 65536 + VNET_HDR_LEN];
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match pair.queues[0].read(&mut buf) {
            Ok(n) => {
                let f = &buf[..n];
                let udp = f.len() > VNET_HDR_LEN + 34
                    && f[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14] == [0x08, 0x00]
                    && f[VNET_HDR_LEN + 23] == 17;
                if udp {
                    frames.push(f.to_vec());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if !frames.is_empty() {
                    std::thread::sleep(Duration::from_millis(50));
                    if let Err(e) = pair.queues[0].read(&mut buf)
                        && e.kind() == ErrorKind::WouldBlock
                    {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(frames)
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_frame_written_with_a_zero_header_reaches_the_pods_socket() -> Result<()> {
    let pair = tap_pair(TapOffloads::POD)?;
    let sock = pair.pods[1].enter(|| UdpSocket::bind((pair.addrs[1], 40002)))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let frame = udp_frame(
        pair.macs[1],
        pair.macs[0],
        pair.addrs[0],
        pair.addrs[1],
        1234,
        40002,
        b"through the tap",
    );
    let mut with_header = vec![0u8; VNET_HDR_LEN];
    with_header.extend_from_slice(&frame);
    assert_eq!(pair.queues[1].write(&with_header)?, with_header.len());
    let mut buf = [0u8; 64];
    let (n, from) = sock.recv_from(&mut buf)?;
    assert_eq!(&buf[..n], b"through the tap");
    assert_eq!(from.ip(), pair.addrs[0]);
    Ok(())
}
