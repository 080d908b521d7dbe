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
    /// Network policy cases run on real traffic (issue 15: nine pods in
    /// three namespaces probed all pairs per case); 0 skips the step,
    /// `usize::MAX` runs every case.
    pub policy_cases: usize,
    /// The pod benchmark (iperf3 between pods beside the kernel's
    /// Calico-shaped path built in the same run; issue 13), if any.
    pub pod_bench: Option<PodBenchSpec>,
    /// The pods' interface (the conflist's `interfaceKind`): a veth whose
    /// host end the vrouter takes by AF_XDP, or a TAP in the pod that it
    /// attaches one queue per worker of (issue 13).
    pub pod_interface: InterfaceKind,
    /// The vrouter's host port `brindle0` (issue 14): ctrl's
    /// `[vrouter] host_port`, the kernel's routes into it and natOutgoing.
    pub host_port: bool,
}

impl LabConfig {
    /// The defaults of `cargo xtask lab`: 3 nodes, 2 pods each, IPIP, two
    /// subnets, a 3 s throughput run, torn down at the end.
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
            policy_cases: 0,
            pod_interface: InterfaceKind::Veth,
            pod_bench: None,
            host_port: false,
        }
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
        encap_key(&self.encap)?;
        Ok(())
    }
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
