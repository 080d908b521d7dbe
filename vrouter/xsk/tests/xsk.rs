//! AF_XDP on veths in network namespaces made by the test: receive, transmit,
//! a shared-UMEM forwarder carrying a real ping, and the memlock error.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use brindle_xsk::{
    BindMode, Desc, Error, Role, Steering, SteeringConfig, Umem, UmemConfig, XdpMode, XskConfig,
    XskSocket, ifindex,
};
use common::{Enter, Netns, Seen, classify, mac, udp_frame, unique, unique_octet, veth};

const ROOT: &str = "requires root and network namespaces";

fn small_umem(frames: u32) -> Result<Umem> {
    Ok(Umem::new(UmemConfig {
        frame_count: frames,
        ..UmemConfig::default()
    })?)
}

fn small_config() -> XskConfig {
    XskConfig {
        rx_size: 256,
        tx_size: 256,
        fill_size: 256,
        comp_size: 256,
        mode: BindMode::Auto,
        ..XskConfig::default()
    }
}

/// Waits for frames on `sock` until `pred` holds for one of them or about
/// five seconds pass; returns every frame seen. Gives received chunks back
/// to the fill ring.
fn collect_until(
    umem: &Umem,
    sock: &mut XskSocket,
    mut pred: impl FnMut(&[u8]) -> bool,
) -> Result<(bool, Vec<Vec<u8>>)> {
    let mut seen = Vec::new();
    let mut descs = [Desc::default(); 64];
    for _ in 0..50 {
        if sock.fill_needs_wakeup() {
            sock.wake_rx()?;
        }
        sock.poll_rx(100)?;
        let n = sock.rx_burst(&mut descs);
        let mut hit = false;
        for d in &descs[..n] {
            let bytes = umem
                .data(*d)
                .context("descriptor outside the UMEM")?
                .to_vec();
            hit |= pred(&bytes);
            seen.push(bytes);
        }
        let addrs: Vec<u64> = descs[..n].iter().map(|d| umem.chunk_of(d.addr)).collect();
        ensure!(sock.fill(&addrs) == n, "fill ring full");
        if hit {
            return Ok((true, seen));
        }
    }
    Ok((false, seen))
}

#[test]
#[ignore = "requires root and network namespaces"]
fn frame_sent_from_a_namespace_arrives_in_the_af_xdp_socket() -> Result<()> {
    let _ = ROOT;
    let ns_a = Netns::new("xa")?;
    let ns_b = Netns::new("xb")?;
    let o = unique_octet();
    let (a_addr, b_addr) = (Ipv4Addr::new(10, 201, o, 1), Ipv4Addr::new(10, 201, o, 2));
    veth(
        &ns_a,
        "va",
        mac(1, 1),
        Some(&format!("{a_addr}/24")),
        &ns_b,
        "vb",
        mac(1, 2),
        Some(&format!("{b_addr}/24")),
    )?;
    // Every frame goes to the socket, ARP too: resolve the peer statically.
    ns_a.ip(&[
        "neigh",
        "add",
        &b_addr.to_string(),
        "lladdr",
        &common::mac_str(mac(1, 2)),
        "dev",
        "va",
    ])?;

    let (umem, mut sock, steering, attach) = ns_b.enter(|| -> Result<_> {
        let umem = small_umem(512)?;
        let idx = ifindex("vb")?;
        let sock = XskSocket::bind(&umem, idx, 0, &small_config())?;
        let steering = Steering::new(SteeringConfig::default())?;
        let attach = steering.attach(idx, Role::All, XdpMode::Native)?;
        attach.set_socket(&sock)?;
        Ok((umem, sock, steering, attach))
    })?;
    let addrs: Vec<u64> = (0..256).map(|i| umem.frame_addr(i)).collect();
    assert_eq!(sock.fill(&addrs), 256);

    let payload = b"brindle-xsk receive test".to_vec();
    ns_a.enter(|| -> Result<()> {
        let udp = UdpSocket::bind((a_addr, 0))?;
        udp.send_to(&payload, (b_addr, 9999))?;
        Ok(())
    })?;
    let (found, seen) = collect_until(&umem, &mut sock, |f| {
        matches!(classify(f), Seen::Udp { dport: 9999, .. })
    })?;
    ensure!(
        found,
        "UDP frame not received; saw {:?}",
        seen.iter().map(|f| classify(f)).collect::<Vec<_>>()
    );
    let frame = seen
        .iter()
        .find(|f| matches!(classify(f), Seen::Udp { dport: 9999, .. }))
        .unwrap();
    assert_eq!(frame[..6], mac(1, 2), "destination MAC");
    assert_eq!(frame[6..12], mac(1, 1), "source MAC");
    assert_eq!(
        classify(frame),
        Seen::Udp {
            dst: b_addr,
            dport: 9999,
            payload
        }
    );
    let stats = sock.stats()?;
    assert_eq!(stats.rx_invalid_descs, 0);
    drop(attach);
    drop(steering);
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn frame_put_on_the_tx_ring_leaves_on_the_wire() -> Result<()> {
    let ns_a = Netns::new("xa")?;
    let ns_b = Netns::new("xb")?;
    let o = unique_octet();
    let (a_addr, b_addr) = (Ipv4Addr::new(10, 202, o, 1), Ipv4Addr::new(10, 202, o, 2));
    veth(
        &ns_a,
        "va",
        mac(2, 1),
        Some(&format!("{a_addr}/24")),
        &ns_b,
        "vb",
        mac(2, 2),
        Some(&format!("{b_addr}/24")),
    )?;

    let (mut umem, mut sock) = ns_b.enter(|| -> Result<_> {
        let umem = small_umem(64)?;
        let sock = XskSocket::bind(&umem, ifindex("vb")?, 0, &small_config())?;
        Ok((umem, sock))
    })?;
    let receiver = ns_a.enter(|| UdpSocket::bind((a_addr, 7777)))?;
    receiver.set_read_timeout(Some(Duration::from_secs(5)))?;

    let payload = b"brindle-xsk transmit test";
    let frame = udp_frame(mac(2, 1), mac(2, 2), b_addr, a_addr, 4242, 7777, payload);
    let addr = umem.frame_addr(3) + 256;
    let desc = Desc {
        addr,
        len: frame.len() as u32,
    };
    umem.data_mut(desc).unwrap().copy_from_slice(&frame);
    assert_eq!(sock.tx_burst(&[desc]), 1);
    let mut completed = [0u64; 4];
    let mut n = 0;
    for _ in 0..100 {
        sock.kick_tx()?;
        n = sock.reap_completions(&mut completed);
        if n > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        &completed[..n],
        &[addr],
        "completion returns the descriptor's address"
    );
    let mut buf = [0u8; 128];
    let (len, from) = receiver
        .recv_from(&mut buf)
        .context("the frame never reached the peer's UDP socket")?;
    assert_eq!(&buf[..len], payload);
    assert_eq!(from, (b_addr, 4242).into());
    assert_eq!(sock.stats()?.tx_invalid_descs, 0);
    Ok(())
}

/// Environment variable that turns the helper test below into the child
/// process of the memlock test.
const MEMLOCK_CHILD: &str = "BRINDLE_XSK_MEMLOCK_CHILD_NETNS";

#[test]
#[ignore = "requires root and network namespaces"]
fn umem_larger_than_memlock_fails_naming_rlimit_memlock() -> Result<()> {
    // Root with CAP_IPC_LOCK is exempt from RLIMIT_MEMLOCK, so the UMEM is
    // registered by a child process without that capability, as a vrouter
    // in a container with only CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF runs.
    let ns = Netns::new("xm")?;
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new("setpriv")
        .args(["--bounding-set", "-ipc_lock"])
        .arg(exe)
        .args([
            "--exact",
            "helper_process_registers_an_oversized_umem",
            "--include-ignored",
            "--nocapture",
        ])
        .env(MEMLOCK_CHILD, &ns.name)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("UMEM-RESULT: "))
        .with_context(|| format!("no result line in {stdout}"))?;
    assert!(line.contains("Memlock"), "{line}");
    assert!(line.contains("RLIMIT_MEMLOCK"), "{line}");
    assert!(
        line.contains("No buffer space available"),
        "errno kept: {line}"
    );
    Ok(())
}

/// Child of the test above (does nothing unless started by it).
#[test]
#[ignore = "requires root and network namespaces"]
fn helper_process_registers_an_oversized_umem() -> Result<()> {
    let Ok(ns) = std::env::var(MEMLOCK_CHILD) else {
        return Ok(());
    };
    let ns = Netns { name: ns };
    let result = ns.enter(|| -> Result<_> {
        // 64 MiB: far above the 8 MiB limit of these machines.
        let umem = Umem::new(UmemConfig {
            frame_count: 32768,
            ..UmemConfig::default()
        })?;
        Ok(XskSocket::bind(&umem, ifindex("lo")?, 0, &small_config()).map(drop))
    });
    // The parent owns the namespace.
    std::mem::forget(ns);
    match result? {
        Err(e) => println!("UMEM-RESULT: {e:?} / {e}"),
        Ok(()) => println!("UMEM-RESULT: registered"),
    }
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn shared_umem_forwarder_carries_a_real_ping_between_namespaces() -> Result<()> {
    let ns_a = Netns::new("fa")?;
    let ns_f = Netns::new("ff")?;
    let ns_b = Netns::new("fb")?;
    let o = unique_octet();
    let net_a = |h| format!("10.203.{o}.{h}");
    let net_b = |h| format!("10.204.{o}.{h}");
    veth(
        &ns_a,
        "va",
        mac(3, 1),
        Some(&format!("{}/24", net_a(2))),
        &ns_f,
        "fa",
        mac(3, 2),
        None,
    )?;
    veth(
        &ns_b,
        "vb",
        mac(3, 3),
        Some(&format!("{}/24", net_b(2))),
        &ns_f,
        "fb",
        mac(3, 4),
        None,
    )?;
    for (ns, dev, gw, gw_mac, remote) in [
        (&ns_a, "va", net_a(1), mac(3, 2), format!("10.204.{o}.0/24")),
        (&ns_b, "vb", net_b(1), mac(3, 4), format!("10.203.{o}.0/24")),
    ] {
        ns.ip(&[
            "neigh",
            "add",
            &gw,
            "lladdr",
            &common::mac_str(gw_mac),
            "dev",
            dev,
        ])?;
        ns.ip(&["route", "add", &gw, "dev", dev])?;
        ns.ip(&["route", "add", &remote, "via", &gw])?;
    }

    let (umem, sock_a, steering, att_a, att_b) = ns_f.enter(|| -> Result<_> {
        let umem = small_umem(1024)?;
        let (ia, ib) = (ifindex("fa")?, ifindex("fb")?);
        // The first socket registers the UMEM.
        let sock_a = XskSocket::bind(&umem, ia, 0, &small_config())?;
        let steering = Steering::new(SteeringConfig::default())?;
        let att_a = steering.attach(ia, Role::All, XdpMode::Auto)?;
        let att_b = steering.attach(ib, Role::All, XdpMode::Auto)?;
        att_a.set_socket(&sock_a)?;
        Ok((umem, sock_a, steering, att_a, att_b))
    })?;
    // The second shares it, bound from another thread through a handle, as
    // a control thread adds a port while a worker owns the UMEM.
    let handle = umem.handle();
    let sock_b = ns_f.enter(|| -> Result<_> {
        let sock_b = XskSocket::bind_handle(&handle, ifindex("fb")?, 0, &small_config())?;
        att_b.set_socket(&sock_b)?;
        Ok(sock_b)
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let forwarder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            common::forward(
                umem,
                sock_a,
                sock_b,
                (mac(3, 1), mac(3, 2)),
                (mac(3, 3), mac(3, 4)),
                &stop,
            )
        })
    };
    let ping = ns_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &net_b(2)]);
    stop.store(true, Ordering::Relaxed);
    let (forwarded, _) = forwarder.join().expect("forwarder panicked")?;
    let ping = ping?;
    assert!(ping.contains("3 received"), "{ping}");
    // The kernel of the forwarding namespace does not route (forwarding is
    // off in a new namespace): TTL 63 says our forwarder did, once.
    assert!(ping.contains("ttl=63"), "{ping}");
    assert!(forwarded >= 6, "forwarded {forwarded} frames");
    drop((att_a, att_b, steering));
    Ok(())
}

#[test]
#[ignore = "requires root and network namespaces"]
fn a_second_socket_on_the_same_queue_of_a_umem_is_refused() -> Result<()> {
    let ns_a = Netns::new("xq")?;
    let ns_b = Netns::new("xq")?;
    veth(&ns_a, "va", mac(4, 1), None, &ns_b, "vb", mac(4, 2), None)?;
    let _ = unique("x");
    ns_b.enter(|| -> Result<()> {
        let umem = small_umem(64)?;
        let idx = ifindex("vb")?;
        let _first = XskSocket::bind(&umem, idx, 0, &small_config())?;
        let second = XskSocket::bind(&umem, idx, 0, &small_config());
        assert!(
            matches!(second, Err(Error::QueueTaken { queue: 0, .. })),
            "{second:?}"
        );
        // Zero-copy forced on a veth is refused with the errno kept.
        let other = small_umem(64)?;
        let zc = XskSocket::bind(
            &other,
            idx,
            0,
            &XskConfig {
                mode: BindMode::ZeroCopy,
                ..small_config()
            },
        );
        match zc {
            Err(e @ Error::ZeroCopyUnsupported { .. }) => {
                assert!(e.raw_os_error().is_some(), "{e}")
            }
            other => bail!("zero-copy on veth: {other:?}"),
        }
        Ok(())
    })
}
