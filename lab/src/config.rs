//! What a lab run is asked for ([`LabConfig`]) and the derived facts of
//! its topology: which subnet and address each node has, which path the
//! encapsulation mode calls for between two nodes.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use brindle_cni::config::InterfaceKind;

use crate::PodBenchSpec;

/// What to run.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The directory holding the release binaries.
    pub bin_dir: PathBuf,
    pub nodes: u8,
    pub pods: u8,
    /// `none`, `ipip`, `vxlan` or `cross-subnet`.
    pub encap: String,
    /// Underlay subnets: 1 (every node on 10.99.0.0/24) or 2 (the last
    /// third of the nodes, at least one, on 10.99.1.0/24 behind the router).
    pub subnets: u8,
    /// Seconds of the TCP throughput run; 0 skips it.
    pub throughput_secs: u32,
    /// Leave the lab running at the end.
    pub keep: bool,
    /// Extra pods added to node 1 by parallel ADDs, probed, measured and
    /// deleted (issue 17); 0 skips that step.
    pub density: u16,
    /// Seconds over which the density step measures the idle vrouter
    /// (after as many to settle).
    pub density_idle_secs: u32,
    /// After the density step's DELs, the same parallel ADDs and DELs
    /// through the kernel-only reference chain (Debian's bridge +
    /// host-local, then tuning, bandwidth, portmap) in node 1's namespace,
    /// for a ratio from the same run; off in the smoke test.
    pub density_reference: bool,
    /// Network policy cases run on real traffic (issue 15: nine pods in
    /// three namespaces probed all pairs per case); 0 skips the step,
    /// `usize::MAX` runs every case.
    pub policy_cases: usize,
    /// The pod benchmark (iperf3 between pods beside the kernel's
    /// Calico-shaped path built in the same run; issue 13), if any.
    pub pod_bench: Option<PodBenchSpec>,
    /// The pods' interface (the conflist's `interfaceKind`): a TAP in the
    /// pod that the vrouter attaches one queue per worker of (the default,
    /// issue 13), or a veth whose host end it takes by AF_XDP.
    pub pod_interface: InterfaceKind,
    /// The vrouter's host port `brindle0` (issue 14): ctrl's
    /// `[vrouter] host_port`, the kernel's routes into it and natOutgoing,
    /// and the connectivity table (on by default, as a cluster needs it).
    pub host_port: bool,
    /// With the host port: encapsulation modes the pool is switched to
    /// after the first table, one more table each (cheaper than a lab run
    /// per mode; `none` needs one subnet).
    pub then_encaps: Vec<String>,
    /// Workers per vrouter: 0 is `cores = "auto"` (one per CPU); N pins
    /// node n's N workers to CPUs (n-1)*N.. modulo the CPUs, so the nodes
    /// spread over them. TAP pods get as many queues (`tapQueues`).
    pub vrouter_workers: u16,
    /// Node 3's pods borrow their addresses from node 1's or 2's block (a pool of
    /// two /28 blocks; issue 14 item 5): `borrow.rs` checks the /32s.
    pub borrow: bool,
}

impl LabConfig {
    /// The defaults of `cargo xtask lab`: 3 nodes, 2 pods each (TAP pods),
    /// IPIP, two subnets, a 3 s throughput run, torn down at the end.
    pub fn new(bin_dir: PathBuf) -> LabConfig {
        LabConfig {
            bin_dir,
            nodes: 3,
            pods: 2,
            encap: "ipip".into(),
            subnets: 2,
            throughput_secs: 3,
            keep: false,
            density: 0,
            density_idle_secs: 5,
            density_reference: false,
            policy_cases: 0,
            pod_interface: InterfaceKind::default(),
            pod_bench: None,
            host_port: true,
            then_encaps: Vec::new(),
            vrouter_workers: 0,
            borrow: false,
        }
    }

    /// How many workers each vrouter runs.
    pub fn workers(&self) -> u16 {
        match self.vrouter_workers {
            0 => cpus(),
            n => n,
        }
    }

    /// vrouter.toml's `cores` for node `n`.
    pub(crate) fn vrouter_cores(&self, n: u8) -> String {
        cores_of(n, self.vrouter_workers, cpus())
    }

    /// The underlay subnet (0 or 1) node `n` is on.
    pub fn subnet_of(&self, n: u8) -> u8 {
        let on_second = if self.subnets >= 2 {
            (self.nodes / 3).max(1)
        } else {
            0
        };
        u8::from(n > self.nodes.saturating_sub(on_second))
    }

    /// Node `n`'s underlay address: 10.99.<subnet>.<10 + n>.
    pub fn node_addr(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, self.subnet_of(n), 10 + n)
    }

    /// The path traffic from node `a` to node `b` must take: `native`,
    /// `ipip` or `vxlan`.
    pub fn expected_path(&self, a: u8, b: u8) -> &'static str {
        match self.encap.as_str() {
            "none" => "native",
            "vxlan" => "vxlan",
            "cross-subnet" if self.subnet_of(a) == self.subnet_of(b) => "native",
            _ => "ipip",
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if !(2..=200).contains(&self.nodes) || !(1..=50).contains(&self.pods) {
            bail!("nodes 2..=200, pods 1..=50");
        }
        if self.density > 250 {
            bail!("density: at most 250 pods");
        }
        if !(1..=2).contains(&self.subnets) {
            bail!("subnets: 1 or 2");
        }
        if self.encap == "none" && self.subnets != 1 {
            // Native routing hands pod packets to the underlay as they are:
            // the router between the subnets knows no pod routes (it does
            // not peer BGP), exactly like Calico's ipipMode: Never.
            bail!("--encap none routes natively, so every node must share one subnet: --subnets 1");
        }
        if self.vrouter_workers > cpus() {
            bail!("vrouter workers: at most one per CPU ({})", cpus());
        }
        encap_key(&self.encap)?;
        for e in &self.then_encaps {
            encap_key(e)?;
            if e == "none" && self.subnets != 1 {
                bail!("then encapsulation none: every node must share one subnet (--subnets 1)");
            }
        }
        if self.borrow {
            crate::borrow::check(self)?;
            if !self.then_encaps.is_empty() {
                // switch_encap rewrites the default /16 pool.
                bail!("--borrow: no --then-encap (the borrow pool is its own)");
            }
        }
        Ok(())
    }
}

/// `cores` for node `n` (from 1) with `workers` per vrouter (0: `auto`)
/// on `cpus` CPUs: the nodes take the CPUs in turn.
fn cores_of(n: u8, workers: u16, cpus: u16) -> String {
    if workers == 0 {
        return "auto".into();
    }
    let (workers, cpus) = (usize::from(workers), usize::from(cpus.max(1)));
    let first = usize::from(n.max(1) - 1) * workers;
    (first..first + workers)
        .map(|c| (c % cpus).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs this process may run on (what `cores = "auto"` takes).
fn cpus() -> u16 {
    std::thread::available_parallelism()
        .map(|n| u16::try_from(n.get()).unwrap_or(256).min(256))
        .unwrap_or(1)
}

/// The pool's `encapsulation` for a lab mode.
pub(crate) fn encap_key(encap: &str) -> Result<&'static str> {
    Ok(match encap {
        "none" => "none",
        "ipip" => "ipip",
        "vxlan" => "vxlan",
        "cross-subnet" => "ipip_cross_subnet",
        other => bail!("unknown encapsulation {other:?}: none | ipip | vxlan | cross-subnet"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vrouter_cores_are_auto_or_spread_over_the_cpus_node_by_node() {
        assert_eq!(cores_of(1, 0, 2), "auto");
        assert_eq!(
            (1..=3).map(|n| cores_of(n, 1, 2)).collect::<Vec<_>>(),
            ["0", "1", "0"]
        );
        assert_eq!(cores_of(2, 2, 4), "2,3");
        assert_eq!(cores_of(3, 2, 4), "0,1");
        let cfg = LabConfig::new(PathBuf::new());
        assert_eq!(
            (cfg.vrouter_workers, cfg.vrouter_cores(1)),
            (0, "auto".into())
        );
        assert_eq!(cfg.workers(), cpus());
        assert_eq!(cfg.pod_interface, InterfaceKind::Tap);
    }
}
