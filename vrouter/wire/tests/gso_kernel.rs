//! GSO and GRO checked against the Linux kernel (root, in a namespace).
//!
//! A super-packet with its virtio-net header is written into a TAP that
//! is bridged to a second TAP whose reader takes no offloads: the kernel
//! segments it in software (`skb_gso_segment`, checksums completed) and
//! the second TAP hands over the segments. They must equal ours byte for
//! byte; and our GRO, fed the kernel's segments, must give back the
//! super-packet that was written.

mod common;

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use brindle_testkit::netns::Netns;
use brindle_wire::{Gro, Push, VnetHdr, vnet};
use brindle_xsk::{Tap, TapConfig, TapOffloads, TapQueue};
use common::{ACK, CWR, FIN, PSH, SRC_MAC, Spec, build, segments};

/// A namespace with `ta` (offloads on) and `tb` (no offloads) on one
/// bridge, IPv6 off so that nothing else is sent.
struct Lab {
    _ns: Netns,
    a: Tap,
    b: Tap,
}

fn lab() -> Result<Lab> {
    let ns = Netns::new("gso")?;
    for key in ["all", "default"] {
        ns.exec(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{key}.disable_ipv6=1"),
        ])?;
    }
    let file = File::open(ns.path()).context("open netns")?;
    let a = Tap::create(Some(file.as_fd()), &TapConfig::pod("ta"))?;
    let b = Tap::create(
        Some(file.as_fd()),
        &TapConfig {
            offloads: TapOffloads::NONE,
            ..TapConfig::pod("tb")
        },
    )?;
    ns.ip(&["link", "add", "br0", "type", "bridge"])?;
    for dev in ["ta", "tb"] {
        ns.ip(&["link", "set", dev, "master", "br0", "up"])?;
    }
    ns.ip(&["link", "set", "br0", "up"])?;
    Ok(Lab { _ns: ns, a, b })
}

/// Reads frames from `q` until `n` from our source MAC came (5 s at most);
/// drops the virtio-net header.
fn read_frames(q: &TapQueue, n: usize) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70000];
    while out.len() < n {
        match q.read(&mut buf) {
            Ok(len) => {
                let frame = &buf[vnet::HEADER_LEN..len];
                if frame.len() >= 12 && frame[6..12] == SRC_MAC {
                    out.push(frame.to_vec());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                ensure!(
                    Instant::now() < deadline,
                    "{} of {n} frames after 5 s",
                    out.len()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

fn write_super(q: &TapQueue, hdr: &VnetHdr, frame: &[u8]) -> Result<()> {
    let mut buf = vec![0u8; vnet::HEADER_LEN + frame.len()];
    hdr.emit(&mut buf)?;
    buf[vnet::HEADER_LEN..].copy_from_slice(frame);
    let n = q.write(&buf)?;
    ensure!(n == buf.len(), "short write {n}");
    Ok(())
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    format!(
        "lengths {} / {}, first difference at {at:?}",
        a.len(),
        b.len()
    )
}

#[test]
#[ignore = "requires root (network namespace, TAP)"]
fn kernel_segments_equal_ours_and_our_gro_rebuilds_the_super_packet() -> Result<()> {
    let lab = lab()?;
    let tcp_opts = Spec::tcp4(10000, 1448);
    let cases = [
        ("tcp4 psh", Spec::tcp4(10000, 1448)),
        (
            "tcp4 cwr fin, no options",
            Spec {
                flags: ACK | CWR | PSH | FIN,
                options: vec![],
                ..Spec::tcp4(5000, 1000)
            },
        ),
        (
            "tcp4 id wraps, seq wraps",
            Spec {
                ident: 0xfffe,
                seq: 0xffff_fa00,
                ..Spec::tcp4(6000, 1400)
            },
        ),
        (
            "tcp6",
            Spec {
                v6: true,
                ..tcp_opts.clone()
            },
        ),
        (
            "udp4",
            Spec {
                tcp: false,
                ..Spec::tcp4(4000, 1200)
            },
        ),
        (
            "udp6",
            Spec {
                tcp: false,
                v6: true,
                ..Spec::tcp4(4000, 1200)
            },
        ),
    ];
    let aq = &lab.a.queues()[0];
    let bq = &lab.b.queues()[0];
    for (name, spec) in cases {
        let (hdr, frame) = build(&spec);
        let ours = segments(&hdr, &frame);
        write_super(aq, &hdr, &frame)?;
        let kernel = read_frames(bq, ours.len()).with_context(|| name.to_owned())?;
        for (i, (k, o)) in kernel.iter().zip(&ours).enumerate() {
            ensure!(
                k == o,
                "{name}: segment {i} differs: {}\nkernel {}\nours   {}",
                first_diff(k, o),
                hex(k),
                hex(o)
            );
        }
        if !spec.tcp {
            eprintln!("{name}: {} segments, equal to the kernel's", kernel.len());
            continue;
        }
        let mut gro = Gro::new();
        for (i, k) in kernel.iter().enumerate() {
            let v = gro.push(k);
            ensure!(
                matches!(v, Push::Merged { .. }),
                "{name}: kernel segment {i}: {v:?}"
            );
        }
        let out = gro.take().context("held")?;
        ensure!(
            out.frame() == &frame[..],
            "{name}: GRO: {}",
            first_diff(out.frame(), &frame)
        );
        ensure!(
            out.header == hdr,
            "{name}: GRO header {:?} != {hdr:?}",
            out.header
        );
        eprintln!(
            "{name}: {} segments, equal to the kernel's; GRO gives the super-packet back",
            kernel.len()
        );
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().take(80).map(|x| format!("{x:02x}")).collect()
}

/// A namespace with `tc` (IFF_NAPI, GRO held for 100 ms) bridged to `td`
/// (a reader taking TSO): what is written into `tc` comes out of `td` as
/// the kernel's GRO made it.
fn gro_lab() -> Result<(Netns, Tap, Tap)> {
    let ns = Netns::new("gro")?;
    for key in ["all", "default"] {
        ns.exec(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{key}.disable_ipv6=1"),
        ])?;
    }
    let file = File::open(ns.path()).context("open netns")?;
    let c = Tap::create(
        Some(file.as_fd()),
        &TapConfig {
            napi: true,
            ..TapConfig::pod("tc")
        },
    )?;
    let d = Tap::create(Some(file.as_fd()), &TapConfig::pod("td"))?;
    ns.ip(&["link", "add", "br1", "type", "bridge"])?;
    for dev in ["tc", "td"] {
        ns.ip(&["link", "set", dev, "master", "br1", "up"])?;
    }
    ns.ip(&["link", "set", "br1", "up"])?;
    ns.exec(&[
        "sh",
        "-c",
        "echo 100000000 > /sys/class/net/tc/gro_flush_timeout",
    ])?;
    Ok((ns, c, d))
}

/// Reads one frame from our source MAC (5 s at most): virtio-net header
/// and frame.
fn read_one(q: &TapQueue) -> Result<(VnetHdr, Vec<u8>)> {
    let mut buf = vec![0u8; 70000];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match q.read(&mut buf) {
            Ok(n) if buf[vnet::HEADER_LEN + 6..vnet::HEADER_LEN + 12] == SRC_MAC => {
                return Ok((VnetHdr::parse(&buf)?, buf[vnet::HEADER_LEN..n].to_vec()));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                ensure!(Instant::now() < deadline, "nothing after 5 s");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Where GRO stops, against the kernel: a stream with a lost segment and
/// one segment with another ACK number. The kernel's GRO and ours give
/// the same frames in the same order: three super-packets and the odd
/// segment on its own.
#[test]
#[ignore = "requires root (network namespace, TAP)"]
fn our_gro_stops_where_the_kernels_gro_does() -> Result<()> {
    let (_ns, c, d) = gro_lab()?;
    let spec = Spec {
        flags: ACK,
        ..Spec::tcp4(10000, 1000)
    };
    let (hdr, frame) = build(&spec);
    let mut segs = segments(&hdr, &frame);
    // Segment 6 acknowledges more; segment 3 is lost.
    let s6 = &mut segs[6];
    s6[45] = s6[45].wrapping_add(1);
    s6[50..52].copy_from_slice(&[0, 0]);
    let mut pseudo = s6[26..34].to_vec();
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&((s6.len() - 34) as u16).to_be_bytes());
    let sum = brindle_wire::checksum::combine(&[
        brindle_wire::checksum::data(&pseudo),
        brindle_wire::checksum::data(&s6[34..]),
    ]);
    let c6 = brindle_wire::checksum::result(sum);
    s6[50..52].copy_from_slice(&c6.to_be_bytes());
    segs.remove(3);

    // Ours, driven as the vrouter will drive it.
    let mut ours: Vec<(VnetHdr, Vec<u8>)> = Vec::new();
    let mut gro = Gro::new();
    for s in &segs {
        loop {
            match gro.push(s) {
                Push::Merged { flush } => {
                    if flush && let Some(o) = gro.take() {
                        ours.push((o.header, o.frame().to_vec()));
                    }
                    break;
                }
                Push::Bypass => {
                    ours.push((VnetHdr::PLAIN, s.clone()));
                    break;
                }
                Push::Flush => {
                    if let Some(o) = gro.take() {
                        ours.push((o.header, o.frame().to_vec()));
                    }
                }
            }
        }
    }
    if let Some(o) = gro.take() {
        ours.push((o.header, o.frame().to_vec()));
    }
    let counts: Vec<usize> = ours
        .iter()
        .map(|(_, f)| (f.len() - 66).div_ceil(1000))
        .collect();
    ensure!(
        counts == [3, 2, 1, 3],
        "our GRO gave {counts:?} segments per frame"
    );

    let kernel = kernel_gro_agrees("stops", &c, &d, &segs, &counts)?;
    for (i, ((kh, kf), (oh, of))) in kernel.iter().zip(&ours).enumerate() {
        ensure!(
            kf == of && kh.gso_type == oh.gso_type && kh.gso_size == oh.gso_size,
            "frame {i} driven as the vrouter drives GRO: kernel {kh:?}, ours {oh:?}, {}",
            first_diff(kf, of)
        );
    }
    Ok(())
}

/// The kernel's GRO as the reference: segments written into a TAP with
/// `IFF_NAPI` (GRO held across polls by `gro_flush_timeout`) come out of a
/// bridged TAP that takes TSO as one super-packet; ours must be the same.
#[test]
#[ignore = "requires root (network namespace, TAP)"]
fn our_gro_equals_the_kernels_gro() -> Result<()> {
    let (_ns, c, d) = gro_lab()?;
    for (name, spec) in [
        ("tcp4", Spec::tcp4(10000, 1448)),
        (
            "tcp6",
            Spec {
                v6: true,
                ..Spec::tcp4(10000, 1448)
            },
        ),
    ] {
        let (hdr, frame) = build(&spec);
        let segs = segments(&hdr, &frame);
        let mut gro = Gro::new();
        for s in &segs {
            gro.push(s);
        }
        let ours = gro.take().context("held")?;
        ensure!(
            ours.frame() == &frame[..] && ours.header == hdr,
            "{name}: our GRO does not give back the super-packet"
        );
        kernel_gro_agrees(name, &c, &d, &segs, &[segs.len()])?;
    }
    Ok(())
}

/// What the kernel's GRO makes of `segs`, compared with ours: every frame
/// the kernel gives must equal what our GRO makes of the same run of
/// segments, and the runs must be `expected`. The kernel also flushes what
/// it holds once it is a jiffy old (`napi_complete_done` flushes old
/// packets even with `gro_flush_timeout`), so a writer delayed on a busy
/// machine can see a run cut in two (CI saw tcp6's 7 segments come out as
/// 4 + 3). Cut runs are still compared frame by frame; the segments are
/// then written again, 5 times at most. A run the kernel merged further
/// than ours is a failure at once. Returns the kernel's frames.
fn kernel_gro_agrees(
    name: &str,
    c: &Tap,
    d: &Tap,
    segs: &[Vec<u8>],
    expected: &[usize],
) -> Result<Vec<(VnetHdr, Vec<u8>)>> {
    for attempt in 1..=5 {
        let kernel = kernel_gro(c, d, segs)?;
        let runs = compare_run_by_run(name, &kernel, segs)?;
        if runs == expected {
            eprintln!("{name}: runs {runs:?}, every frame equal to the kernel's");
            return Ok(kernel);
        }
        ensure!(
            boundaries(expected).is_subset(&boundaries(&runs)),
            "{name}: the kernel's runs {runs:?}, ours {expected:?}"
        );
        eprintln!(
            "{name}: attempt {attempt}: the kernel flushed early (runs {runs:?}, \
             ours {expected:?}); its frames equal ours; writing again"
        );
    }
    anyhow::bail!("{name}: the kernel cut the runs short on 5 attempts")
}

/// Where runs of segments end, as segment counts from the start.
fn boundaries(runs: &[usize]) -> std::collections::BTreeSet<usize> {
    runs.iter()
        .scan(0, |end, n| {
            *end += n;
            Some(*end)
        })
        .collect()
}

/// Writes `segs` into `c` and reads from `d` what the kernel's GRO made
/// of them, until all their TCP payload has come out.
fn kernel_gro(c: &Tap, d: &Tap, segs: &[Vec<u8>]) -> Result<Vec<(VnetHdr, Vec<u8>)>> {
    let total: usize = segs.iter().map(|s| tcp_payload_len(s)).sum();
    for s in segs {
        write_super(&c.queues()[0], &VnetHdr::PLAIN, s)?;
    }
    let mut out = Vec::new();
    let mut got = 0;
    while got < total {
        let (h, f) = read_one(&d.queues()[0])?;
        got += tcp_payload_len(&f);
        out.push((h, f));
    }
    ensure!(got == total, "{got} payload bytes came out of {total}");
    Ok(out)
}

/// Feeds our GRO, for each kernel frame, the segments whose payload that
/// frame holds; what ours takes must equal the kernel's frame byte for
/// byte, with the same GSO type and size (and, for a super-packet, the same
/// virtio-net header but `hdr_len`, which the kernel sets to the whole
/// first segment). Returns how many segments each kernel frame held.
fn compare_run_by_run(
    name: &str,
    kernel: &[(VnetHdr, Vec<u8>)],
    segs: &[Vec<u8>],
) -> Result<Vec<usize>> {
    let mut next = 0;
    let mut runs = Vec::new();
    for (i, (kh, kf)) in kernel.iter().enumerate() {
        let want = tcp_payload_len(kf);
        let mut gro = Gro::new();
        let (mut have, first) = (0, next);
        while have < want {
            let s = segs
                .get(next)
                .with_context(|| format!("{name}: frame {i} holds more than was written"))?;
            let verdict = gro.push(s);
            next += 1;
            have += tcp_payload_len(s);
            let last = have >= want;
            ensure!(
                matches!(verdict, Push::Merged { flush } if last || !flush),
                "{name}: the kernel merged segment {} into frame {i}; ours: {verdict:?}",
                next - 1
            );
        }
        ensure!(have == want, "{name}: frame {i} does not end on a segment");
        let ours = gro.take().context("held")?;
        ensure!(
            kf == ours.frame(),
            "{name}: frame {i}: {}\nkernel {}\nours   {}",
            first_diff(kf, ours.frame()),
            hex(kf),
            hex(ours.frame())
        );
        let same_header = if next - first > 1 {
            VnetHdr { hdr_len: 0, ..*kh }
                == VnetHdr {
                    hdr_len: 0,
                    ..ours.header
                }
        } else {
            kh.gso_type == ours.header.gso_type && kh.gso_size == ours.header.gso_size
        };
        ensure!(
            same_header,
            "{name}: frame {i}: kernel {kh:?}, ours {:?}",
            ours.header
        );
        runs.push(next - first);
    }
    Ok(runs)
}

/// TCP payload bytes of an Ethernet frame (IPv4, or IPv6 without
/// extension headers), from the IP length so that padding is not counted.
fn tcp_payload_len(f: &[u8]) -> usize {
    let (l4, end) = if f[12..14] == [0x86, 0xdd] {
        (54, 54 + usize::from(u16::from_be_bytes([f[18], f[19]])))
    } else {
        (
            14 + usize::from(f[14] & 0x0f) * 4,
            14 + usize::from(u16::from_be_bytes([f[16], f[17]])),
        )
    };
    end - l4 - usize::from(f[l4 + 12] >> 4) * 4
}
