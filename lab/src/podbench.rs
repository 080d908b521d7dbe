//! Pod traffic beside the kernel's (issue 13): iperf3 between lab pods and,
//! in the same run, between pods of the kernel's Calico-shaped path built in
//! namespaces of its own (`brl-kb-*`, removed with the lab): veth pods with
//! a /32 and a default route via 169.254.1.1, proxy ARP on the host end,
//! /32 routes, two node namespaces on a veth underlay joined natively
//! (`--encap none`) or else by `vxlan.calico` (VNI 4096; this kernel has no
//! ipip module, so an IPIP lab is held against the kernel's VXLAN, as the
//! issue's figures were). The shape of /work/shared/anchors' `kbase.sh`.
//!
//! Cases, same node (`n1p1 -> n1p2`) and other node (`n1p1 -> n2p1`):
//! TCP 1 and 4 streams (Gbit/s received), UDP 64 B and 1400 B frames
//! (kpps received, one unpaced stream).
//!
//! CPU-seconds of a path: the iperf3 client's and server's own CPU (their
//! getrusage, from iperf3's JSON), every `ksoftirqd/N` and, on Brindle's
//! path, both nodes' vrouters (`/proc/<pid>/stat` utime + stime before and
//! after). The kernel here has tick-based accounting without
//! IRQ_TIME_ACCOUNTING: softirq work (veth, VXLAN, IPIP, TCP receive) is
//! charged to the task it interrupted, mostly the iperf3 processes or
//! ksoftirqd; softirq that interrupts an unrelated process is missed.

use std::fmt;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

use crate::cni::Pod;
use crate::exec::{in_ns, ip, sh_within};
use crate::{PREFIX, state};

/// What the pod benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodBenchSpec {
    /// Seconds of each iperf3 run.
    pub secs: u32,
    /// Only TCP 1 stream, same and other node, on both paths: the plumbing
    /// check of `cargo xtask test` (bytes moved, never speed).
    pub plumbing_only: bool,
}

/// One case on both paths.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchRow {
    /// `TCP 1 stream`, `TCP 4 streams`, `UDP 64 B`, `UDP 1400 B`.
    pub case: String,
    /// `same node` or `other node`.
    pub place: String,
    /// `Gbit/s` or `kpps`.
    pub unit: String,
    pub kernel: Option<Figure>,
    pub brindle: Option<Figure>,
}

/// One iperf3 run's figures.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figure {
    /// In the row's unit.
    pub rate: f64,
    /// Payload bytes the receiver got.
    pub bytes: u64,
    /// CPU-seconds of the path (see the module doc).
    pub cpu_s: f64,
    /// Of them, both vrouters' user time (the pipeline, GSO/GRO, copies
    /// in user space) and system time (the TAP reads/writes, AF_XDP
    /// wake-ups and the kernel's copies), in seconds; 0 on the kernel's
    /// path.
    pub vrouter_user_s: f64,
    pub vrouter_sys_s: f64,
}

impl Figure {
    /// CPU-seconds per GB received.
    pub fn cpu_s_per_gb(&self) -> Option<f64> {
        (self.bytes > 0).then(|| self.cpu_s / (self.bytes as f64 / 1e9))
    }
}

/// The pod benchmark of one lab run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodBench {
    /// Brindle's pods' interface kind (`veth`, `tap`).
    pub pod_interface: String,
    /// The lab's encapsulation; the kernel's other-node path matches it
    /// (`none`: native, else `vxlan.calico`: this kernel has no ipip module).
    pub encap: String,
    /// Seconds per run.
    pub secs: u32,
    /// /proc/loadavg at the start and the end.
    pub load: (String, String),
    pub rows: Vec<BenchRow>,
}

impl PodBench {
    /// Every run of both paths moved bytes.
    pub fn moved_bytes_everywhere(&self) -> bool {
        !self.rows.is_empty()
            && self.rows.iter().all(|r| {
                [r.kernel, r.brindle]
                    .iter()
                    .all(|f| f.is_some_and(|f| f.bytes > 0))
            })
    }
}

impl fmt::Display for PodBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "pods: brindle {} pods, {}; kernel veth pods, {} ({} s each; load {} -> {})",
            self.pod_interface,
            self.encap,
            kernel_mode(&self.encap),
            self.secs,
            self.load.0,
            self.load.1
        )?;
        writeln!(
            f,
            "| case | where | unit | kernel | brindle | brindle/kernel | CPU-s/GB kernel | CPU-s/GB brindle | vrouters user/sys s |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|")?;
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        for r in &self.rows {
            let (k, b) = (r.kernel.map(|x| x.rate), r.brindle.map(|x| x.rate));
            let ratio = match (k, b) {
                (Some(k), Some(b)) if k > 0.0 => Some(b / k),
                _ => None,
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.case,
                r.place,
                r.unit,
                num(k),
                num(b),
                num(ratio),
                num(r.kernel.and_then(|x| x.cpu_s_per_gb())),
                num(r.brindle.and_then(|x| x.cpu_s_per_gb())),
                r.brindle.map_or("-".to_string(), |x| format!(
                    "{:.2}/{:.2}",
                    x.vrouter_user_s, x.vrouter_sys_s
                )),
            )?;
        }
        Ok(())
    }
}

/// The load of one case.
#[derive(Debug, Clone, Copy)]
enum Load {
    Tcp {
        streams: u8,
    },
    /// UDP frames of this size on the wire (Ethernet header and FCS in).
    Udp {
        frame: u16,
    },
}

impl Load {
    fn name(self) -> String {
        match self {
            Load::Tcp { streams: 1 } => "TCP 1 stream".into(),
            Load::Tcp { streams } => format!("TCP {streams} streams"),
            Load::Udp { frame } => format!("UDP {frame} B"),
        }
    }
}

const ALL: [Load; 4] = [
    Load::Tcp { streams: 1 },
    Load::Tcp { streams: 4 },
    Load::Udp { frame: 64 },
    Load::Udp { frame: 1400 },
];

/// One iperf3 run from the pod `client` to `server_ip` (served by the pod
/// `server`); the CPU of the `soft` processes (ksoftirqd) and of the
/// `vrouters` is added to iperf3's own.
fn iperf(
    client: &str,
    server: &str,
    server_ip: Ipv4Addr,
    secs: u32,
    load: Load,
    soft: &[u32],
    vrouters: &[u32],
) -> Result<Figure> {
    let mut srv = in_ns(server, "iperf3")
        .args(["-s", "-1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("iperf3 -s")?;
    thread::sleep(Duration::from_millis(400));
    let mut cmd = in_ns(client, "iperf3");
    cmd.args(["-c", &server_ip.to_string(), "-t", &secs.to_string(), "-J"]);
    match load {
        Load::Tcp { streams } => {
            cmd.args(["-P", &streams.to_string()]);
        }
        Load::Udp { frame } => {
            // Payload = frame - Ethernet 14 - FCS 4 - IPv4 20 - UDP 8.
            let len = frame.saturating_sub(46).max(16);
            cmd.args(["-u", "-b", "0", "-l", &len.to_string()]);
        }
    }
    let (soft0, vr0) = (cpu_ticks(soft), cpu_ticks(vrouters));
    let out = sh_within(&mut cmd, Duration::from_secs(u64::from(secs) + 30));
    let (soft1, vr1) = (cpu_ticks(soft), cpu_ticks(vrouters));
    let _ = srv.kill();
    let _ = srv.wait();
    let v: Value = serde_json::from_str(&out?).context("iperf3 -J output")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    let (rate, bytes, secs_run) = match load {
        Load::Tcp { .. } => {
            let r = &end["sum_received"];
            let bps = r["bits_per_second"].as_f64().context("sum_received")?;
            (
                bps / 1e9,
                r["bytes"].as_u64().unwrap_or(0),
                r["seconds"].as_f64(),
            )
        }
        Load::Udp { frame } => {
            let s = &end["sum"];
            let packets = s["packets"].as_f64().context("end.sum.packets")?;
            let lost = s["lost_packets"].as_f64().unwrap_or(0.0);
            let secs_run = s["seconds"].as_f64().unwrap_or(f64::from(secs));
            let got = (packets - lost).max(0.0);
            let payload = f64::from(frame.saturating_sub(46).max(16));
            (got / secs_run / 1e3, (got * payload) as u64, Some(secs_run))
        }
    };
    let secs_run = secs_run.unwrap_or(f64::from(secs));
    let cpu = &end["cpu_utilization_percent"];
    let iperf_cpu = (cpu["host_total"].as_f64().unwrap_or(0.0)
        + cpu["remote_total"].as_f64().unwrap_or(0.0))
        / 100.0
        * secs_run;
    let secs_of = |ticks: u64| ticks as f64 / 100.0;
    let soft_cpu = secs_of((soft1.0 + soft1.1).saturating_sub(soft0.0 + soft0.1));
    let (user, sys) = (
        secs_of(vr1.0.saturating_sub(vr0.0)),
        secs_of(vr1.1.saturating_sub(vr0.1)),
    );
    Ok(Figure {
        rate,
        bytes,
        cpu_s: iperf_cpu + soft_cpu + user + sys,
        vrouter_user_s: user,
        vrouter_sys_s: sys,
    })
}

/// Utime and stime of these processes (all their threads), in clock
/// ticks (USER_HZ 100).
fn cpu_ticks(pids: &[u32]) -> (u64, u64) {
    pids.iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_user_sys(&stat)
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Utime and stime of one `/proc/<pid>/stat` line: the 12th and 13th
/// fields after the command name (which may hold spaces and parentheses).
fn parse_user_sys(stat: &str) -> Option<(u64, u64)> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// Every `ksoftirqd/N`.
fn ksoftirqd() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("ksoftirqd/"))
        })
        .collect()
}

/// The vrouters of nodes 1 and 2.
fn vrouters() -> Result<Vec<u32>> {
    [1u8, 2]
        .iter()
        .map(|n| {
            let f = state().join(format!("n{n}-vrouter.pid"));
            let pid = std::fs::read_to_string(&f).with_context(|| format!("{}", f.display()))?;
            Ok(pid.trim().parse()?)
        })
        .collect()
}

fn kns(name: &str) -> String {
    format!("{PREFIX}kb-{name}")
}

/// `ip -n <ns> <args>`, args split at spaces.
fn ipn(ns: &str, args: &str) -> Result<String> {
    let mut v = vec!["-n", ns];
    v.extend(args.split_whitespace());
    ip(&v)
}

fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    let mut c = in_ns(ns, "sysctl");
    c.args(["-qw", &format!("{key}={value}")]);
    sh_within(&mut c, Duration::from_secs(10)).map(|_| ())
}

/// The kernel's path between nodes for the lab's encapsulation: native for
/// `none`, else VXLAN (this machine's kernel has no ipip module, so IPIP
/// labs are held against the kernel's VXLAN, as the figures were).
fn kernel_mode(encap: &str) -> &'static str {
    match encap {
        "none" => "native",
        _ => "VXLAN",
    }
}

const KERNEL_NS: [&str; 5] = ["n1", "n2", "p1", "p2", "p3"];
/// The kernel path's pods: same node, same node, other node.
const KERNEL_PODS: [(&str, &str, Ipv4Addr); 3] = [
    ("p1", "n1", Ipv4Addr::new(10, 245, 1, 1)),
    ("p2", "n1", Ipv4Addr::new(10, 245, 1, 2)),
    ("p3", "n2", Ipv4Addr::new(10, 245, 2, 1)),
];

/// The kernel's Calico-shaped path (see the module doc), pods at `mtu`.
fn kernel_up(mtu: u32, encap: &str) -> Result<()> {
    kernel_down();
    let encap = if encap == "none" { "none" } else { "vxlan" };
    for n in KERNEL_NS {
        ip(&["netns", "add", &kns(n)])?;
        ipn(&kns(n), "link set lo up")?;
    }
    let (n1, n2) = (kns("n1"), kns("n2"));
    ipn(
        &n1,
        &format!("link add eth0 type veth peer name eth0 netns {n2}"),
    )?;
    for (i, n) in [(1u8, &n1), (2, &n2)] {
        sysctl(n, "net.ipv4.ip_forward", "1")?;
        ipn(n, &format!("addr add 10.98.0.{i}/24 dev eth0"))?;
        ipn(n, "link set eth0 up")?;
        // Proxy ARP answers for 169.254.1.1 only if the node routes it.
        ipn(n, &format!("route add default via 10.98.0.{}", 3 - i))?;
    }
    for (i, (pod, node, addr)) in KERNEL_PODS.iter().enumerate() {
        let (pod, node, host) = (kns(pod), kns(node), format!("cali{i}"));
        ipn(
            &node,
            &format!("link add {host} type veth peer name eth0 netns {pod}"),
        )?;
        ipn(&node, &format!("link set {host} mtu {mtu} up"))?;
        sysctl(&node, &format!("net.ipv4.conf.{host}.proxy_arp"), "1")?;
        sysctl(&node, &format!("net.ipv4.neigh.{host}.proxy_delay"), "0")?;
        ipn(&node, &format!("route add {addr}/32 dev {host}"))?;
        ipn(&pod, &format!("addr add {addr}/32 dev eth0"))?;
        ipn(&pod, &format!("link set eth0 mtu {mtu} up"))?;
        ipn(&pod, "route add 169.254.1.1 dev eth0 scope link")?;
        ipn(&pod, "route add default via 169.254.1.1 dev eth0")?;
    }
    let mut macs = Vec::new();
    for (i, n) in [(1u8, &n1), (2, &n2)] {
        match encap {
            "none" => {}
            "vxlan" => {
                ipn(
                    n,
                    &format!(
                        "link add vxlan.calico type vxlan id 4096 dstport 4789 local 10.98.0.{i} dev eth0 nolearning"
                    ),
                )?;
                ipn(n, &format!("addr add 10.245.{i}.0/32 dev vxlan.calico"))?;
                ipn(n, "link set vxlan.calico up")?;
                let v: Value = serde_json::from_str(&ipn(n, "-j link show vxlan.calico")?)?;
                macs.push(v[0]["address"].as_str().context("vxlan MAC")?.to_string());
            }
            _ => {
                ipn(n, &format!("addr add 10.245.{i}.0/32 dev tunl0"))
                    .context("tunl0 (the ipip module)")?;
                ipn(n, "link set tunl0 up")?;
            }
        }
    }
    for (i, n) in [(1usize, &n1), (2, &n2)] {
        let o = 3 - i;
        let route = match encap {
            "none" => format!("route add 10.245.{o}.0/26 via 10.98.0.{o} dev eth0"),
            "vxlan" => {
                let mac = &macs[o - 1];
                ipn(
                    n,
                    &format!("neigh add 10.245.{o}.0 lladdr {mac} dev vxlan.calico"),
                )?;
                sh_within(
                    Command::new("bridge").args([
                        "-n",
                        n,
                        "fdb",
                        "add",
                        mac,
                        "dev",
                        "vxlan.calico",
                        "dst",
                        &format!("10.98.0.{o}"),
                    ]),
                    Duration::from_secs(10),
                )?;
                format!("route add 10.245.{o}.0/26 via 10.245.{o}.0 dev vxlan.calico onlink")
            }
            _ => format!("route add 10.245.{o}.0/26 via 10.98.0.{o} dev tunl0 onlink"),
        };
        ipn(n, &route)?;
    }
    Ok(())
}

fn kernel_down() {
    for n in KERNEL_NS {
        let _ = ip(&["netns", "del", &kns(n)]);
    }
}

/// The MTU of `eth0` in the pod `ns`.
fn pod_mtu(ns: &str) -> Result<u32> {
    let v: Value = serde_json::from_str(&ipn(ns, "-j link show eth0")?)?;
    Ok(u32::try_from(v[0]["mtu"].as_u64().context("mtu")?)?)
}

/// Runs the cases on the kernel's path, then on Brindle's between the lab's
/// pods `n1p1`, `n1p2` and `n2p1`.
pub(crate) fn run(
    pods: &[Pod],
    spec: PodBenchSpec,
    pod_interface: &str,
    encap: &str,
) -> Result<PodBench> {
    let find = |name: &str| {
        pods.iter()
            .find(|p| p.name == format!("{PREFIX}{name}"))
            .with_context(|| format!("no pod {name}: the pod benchmark needs 2 nodes, 2 pods each"))
    };
    let (a, b, c) = (find("n1p1")?, find("n1p2")?, find("n2p1")?);
    let loads: &[Load] = if spec.plumbing_only { &ALL[..1] } else { &ALL };
    let load_start = loadavg();
    let mtu = pod_mtu(&a.name)?;
    kernel_up(mtu, encap)?;
    let soft = ksoftirqd();
    let mut rows = Vec::new();
    for &load in loads {
        for (place, server) in [("same node", 1), ("other node", 2)] {
            let (srv, addr) = (KERNEL_PODS[server].0, KERNEL_PODS[server].2);
            let k = iperf(&kns("p1"), &kns(srv), addr, spec.secs, load, &soft, &[]);
            rows.push(BenchRow {
                case: load.name(),
                place: place.into(),
                unit: if matches!(load, Load::Tcp { .. }) {
                    "Gbit/s"
                } else {
                    "kpps"
                }
                .into(),
                kernel: k
                    .inspect_err(|e| eprintln!("pod bench: kernel {place}: {e:#}"))
                    .ok(),
                brindle: None,
            });
        }
    }
    kernel_down();
    let vr = vrouters()?;
    let mut row = rows.iter_mut();
    for &load in loads {
        for to in [b, c] {
            let r = row.next().context("rows")?;
            r.brindle = iperf(&a.name, &to.name, to.ip, spec.secs, load, &soft, &vr)
                .inspect_err(|e| eprintln!("pod bench: brindle {} -> {}: {e:#}", a.name, to.name))
                .ok();
        }
    }
    Ok(PodBench {
        pod_interface: pod_interface.into(),
        encap: encap.into(),
        secs: spec.secs,
        load: (load_start, loadavg()),
        rows,
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_system_ticks_are_read_past_a_command_name_with_parentheses() {
        // A real vrouter line, its name changed to hold ") (" and spaces.
        let stat = "4242 (brindle) (vr 0) S 1 4242 4242 0 -1 4194624 1043 0 0 0 \
                    731 264 0 0 20 0 5 0 1234 1048576 2048 18446744073709551615";
        assert_eq!(parse_user_sys(stat), Some((731, 264)));
        assert_eq!(parse_user_sys("4242 (brindle) S 1"), None);
    }
}
