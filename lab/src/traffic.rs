//! Traffic between the lab's pods: the all-pairs ping matrix and the TCP
//! throughput run.

use std::io::Read;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::LabReport;
use crate::cni::Pod;
use crate::exec::{in_ns, sh_within, succeeds_within};

pub(crate) fn ping_matrix(pods: &[Pod], report: &mut LabReport) {
    let mut matrix = String::from("from \\ to");
    for p in pods {
        matrix.push_str(&format!(" {:>12}", p.name));
    }
    matrix.push('\n');
    for a in pods {
        matrix.push_str(&format!("{:<9}", a.name));
        for b in pods {
            if a.name == b.name {
                matrix.push_str(&format!(" {:>12}", "-"));
                continue;
            }
            report.pairs_total += 1;
            let ok = succeeds_within(
                in_ns(&a.name, "ping").args([
                    "-c",
                    "3",
                    "-i",
                    "0.2",
                    "-W",
                    "2",
                    "-q",
                    &b.ip.to_string(),
                ]),
                Duration::from_secs(20),
            );
            if ok {
                report.pairs_ok += 1;
            } else {
                report
                    .failed_pairs
                    .push(format!("{} ({}) -> {} ({})", a.name, a.ip, b.name, b.ip));
            }
            matrix.push_str(&format!(" {:>12}", if ok { "ok" } else { "FAIL" }));
        }
        matrix.push('\n');
    }
    println!("{matrix}");
}

/// A TCP transfer of `secs` seconds from one pod to another through the
/// vrouters (socat both ends); the receiver's byte count over its time.
pub(crate) fn throughput(from: &Pod, to: &Pod, secs: u32) -> Result<f64> {
    let mut receiver = in_ns(&to.name, "socat")
        .args(["-u", "TCP-LISTEN:5001,reuseaddr", "STDOUT"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = receiver.stdout.take().context("stdout")?;
    let counter = thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        (total, first.map(|f| f.elapsed()))
    });
    thread::sleep(Duration::from_millis(500));
    // The sender stops after `secs` by itself (coreutils' timeout); the
    // bound here is for a sender stuck beyond that.
    let _ = sh_within(
        in_ns(&from.name, "timeout").args([
            secs.to_string(),
            "socat".into(),
            "-u".into(),
            "/dev/zero".into(),
            format!("TCP:{}:5001", to.ip),
        ]),
        Duration::from_secs(u64::from(secs) + 20),
    );
    // A transfer that never connected leaves the receiver listening.
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver.try_wait()?.is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    let _ = receiver.kill();
    let _ = receiver.wait();
    let (bytes, elapsed) = counter
        .join()
        .map_err(|_| anyhow::anyhow!("counter panicked"))?;
    let elapsed = elapsed.context("no byte arrived")?;
    let mbit = bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e6;
    println!(
        "throughput {} -> {}: {bytes} bytes in {elapsed:.2?}: {mbit:.0} Mbit/s",
        from.name, to.name
    );
    Ok(mbit)
}
