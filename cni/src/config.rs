//! The plugin's own keys in the network config (next to the spec's keys).
//!
//! Unknown keys are ignored, as the CNI spec requires, so that a conflist
//! written for a newer plugin still loads.

use std::path::PathBuf;
use std::time::Duration;

use brindle_api::cni::{CniError, NetConf};
use serde::Deserialize;

/// Encapsulation of the pod's pool, for deriving the MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encapsulation {
    /// Native routing: no overhead.
    None,
    /// IP-in-IP: a 20-byte outer IPv4 header.
    #[default]
    Ipip,
    /// VXLAN: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
    Vxlan,
}

impl Encapsulation {
    /// Bytes the encapsulation adds to every packet.
    pub fn overhead(self) -> u32 {
        match self {
            Encapsulation::None => 0,
            Encapsulation::Ipip => 20,
            Encapsulation::Vxlan => 50,
        }
    }
}

/// What `CNI_IFNAME` becomes in the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum InterfaceKind {
    /// A veth pair; the host end is the vrouter's port (AF_XDP). Kept as
    /// an option (kernels without TAP offloads, comparison).
    Veth,
    /// The default (issue 13): a persistent multi-queue TAP with a
    /// virtio-net header and offloads, only in the pod's netns; the vrouter
    /// attaches its queues by name. Pod TCP ran at 0.76-0.80x the kernel's
    /// veth path on TAP, 0.13x on veth + AF_XDP (vrouter/README.md).
    #[default]
    Tap,
}

impl InterfaceKind {
    /// The conflist's spelling (`veth`, `tap`).
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceKind::Veth => "veth",
            InterfaceKind::Tap => "tap",
        }
    }
}

impl std::str::FromStr for InterfaceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "veth" => Ok(InterfaceKind::Veth),
            "tap" => Ok(InterfaceKind::Tap),
            _ => Err(format!("pod interface {s:?}: veth or tap")),
        }
    }
}

/// Most queues a TAP takes (the kernel's `MAX_TAP_QUEUES`).
pub const MAX_TAP_QUEUES: u16 = 256;

/// The `brindle` plugin's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BrindleConfig {
    /// MTU of the veth pair. Absent or 0: the uplink's MTU minus the
    /// encapsulation overhead.
    pub mtu: Option<u32>,
    /// Encapsulation of the pool (`none`, `ipip`, `vxlan`).
    pub encapsulation: Encapsulation,
    /// The uplink whose MTU to start from. Absent: the interface of the
    /// host's IPv4 default route; 1500 when there is none.
    pub uplink_interface: Option<String>,
    /// The node daemon's socket.
    pub ctrl_socket: PathBuf,
    /// The pod's interface: `tap` (default) or `veth`.
    pub interface_kind: InterfaceKind,
    /// Queues a `tap` pod interface is made with (1..=256; default 1). The
    /// vrouter attaches one queue per worker whatever this says, so it
    /// only sizes the TAP until then; the lab sets its vrouter's workers.
    pub tap_queues: u16,
    /// Whether ADD fails (code 11) when the node daemon cannot be reached.
    /// `true` by default, as Calico fails ADD while calico-node is not
    /// ready: a pod whose endpoint the dataplane does not know has no
    /// network anyway. `false` is for labs without a daemon.
    pub require_daemon: bool,
    /// How long one exchange with the daemon may take.
    pub daemon_timeout_ms: u64,
    /// The node's vrouter has a host port (ctrl's `[vrouter] host_port`,
    /// `brindle0`): the node's kernel reaches pods through it (ctrl's
    /// `proto 73` routes via 169.254.1.1 cover the node's blocks), so a veth
    /// pod gets no `<ip>/32 dev <host veth>` route, which would take host →
    /// pod (and kube-proxy's DNAT to a pod on this node) past the vrouter.
    /// CHECK then does not expect that route.
    pub host_port: bool,
    /// `tracing` filter for the plugin's stderr log (`info`, `debug`, ...).
    pub log_level: String,
    /// A file to append the log to, besides stderr.
    pub log_file: Option<PathBuf>,
}

impl Default for BrindleConfig {
    fn default() -> Self {
        BrindleConfig {
            mtu: None,
            encapsulation: Encapsulation::default(),
            uplink_interface: None,
            ctrl_socket: PathBuf::from(brindle_api::CTRL_SOCKET),
            interface_kind: InterfaceKind::default(),
            tap_queues: 1,
            require_daemon: true,
            // Bounds a daemon that hangs, not a slow ADD: the daemon may
            // wait up to ADD_PORT_WAIT for the vrouter after storing the
            // endpoint, behind the node's other ADDs.
            daemon_timeout_ms: 10_000,
            host_port: false,
            log_level: "info".to_string(),
            log_file: None,
        }
    }
}

impl BrindleConfig {
    /// Reads and validates the plugin's keys (code 7 on a bad value).
    pub fn from_conf(conf: &NetConf) -> Result<BrindleConfig, CniError> {
        let cfg: BrindleConfig = conf.plugin_config()?;
        if let Some(mtu) = cfg.mtu
            && mtu != 0
            && !(576..=65535).contains(&mtu)
        {
            return Err(
                CniError::invalid_config(format!("mtu {mtu} is outside 576..=65535"))
                    .in_version(&conf.cni_version),
            );
        }
        if !(1..=MAX_TAP_QUEUES).contains(&cfg.tap_queues) {
            return Err(CniError::invalid_config(format!(
                "tapQueues {} is outside 1..={MAX_TAP_QUEUES}",
                cfg.tap_queues
            ))
            .in_version(&conf.cni_version));
        }
        if conf.ipam.is_none() {
            return Err(
                CniError::invalid_config("the brindle plugin needs an \"ipam\" section")
                    .in_version(&conf.cni_version),
            );
        }
        Ok(cfg)
    }

    /// The explicit MTU, if one is set.
    pub fn explicit_mtu(&self) -> Option<u32> {
        self.mtu.filter(|m| *m != 0)
    }

    /// The MTU derived from the uplink's MTU.
    pub fn derived_mtu(&self, uplink_mtu: u32) -> u32 {
        uplink_mtu
            .saturating_sub(self.encapsulation.overhead())
            .max(576)
    }

    /// The daemon exchange timeout.
    pub fn daemon_timeout(&self) -> Duration {
        Duration::from_millis(self.daemon_timeout_ms.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        let json = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"brindle","ipam":{{"type":"host-local"}}{extra}}}"#
        );
        NetConf::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn defaults_apply_and_unknown_keys_are_ignored() {
        let cfg = BrindleConfig::from_conf(&conf(r#","someFutureKey":true"#)).unwrap();
        assert_eq!(cfg, BrindleConfig::default());
        assert!(cfg.require_daemon);
        assert_eq!(cfg.ctrl_socket, PathBuf::from("/run/brindle/ctrl.sock"));
    }

    #[test]
    fn the_default_exchange_outlasts_the_daemons_wait_for_the_port() {
        // ADD's exchange includes the daemon's wait for the vrouter's port
        // after the datastore write, behind the node's other ADDs: with
        // 2 s against a 1.5 s wait, 110 parallel TAP ADDs timed out and
        // rolled back ADDs the daemon had completed.
        let wait = brindle_api::endpoint::ADD_PORT_WAIT;
        assert!(BrindleConfig::default().daemon_timeout() >= wait * 5);
    }

    #[test]
    fn keys_are_read_in_camel_case() {
        let cfg = BrindleConfig::from_conf(&conf(
            r#","mtu":1400,"encapsulation":"vxlan","uplinkInterface":"eth1","ctrlSocket":"/tmp/s","requireDaemon":false,"daemonTimeoutMs":10"#,
        ))
        .unwrap();
        assert_eq!(cfg.explicit_mtu(), Some(1400));
        assert_eq!(cfg.encapsulation, Encapsulation::Vxlan);
        assert_eq!(cfg.uplink_interface.as_deref(), Some("eth1"));
        assert!(!cfg.require_daemon);
        assert_eq!(cfg.daemon_timeout(), Duration::from_millis(10));
        // TAP pods are the default (issue 13), with one queue until the
        // vrouter attaches its workers' queues.
        assert_eq!(
            (cfg.interface_kind, cfg.tap_queues),
            (InterfaceKind::Tap, 1)
        );
        let cfg =
            BrindleConfig::from_conf(&conf(r#","interfaceKind":"tap","tapQueues":2"#)).unwrap();
        assert_eq!(
            (cfg.interface_kind, cfg.tap_queues),
            (InterfaceKind::Tap, 2)
        );
        // veth stays an option.
        let cfg = BrindleConfig::from_conf(&conf(r#","interfaceKind":"veth""#)).unwrap();
        assert_eq!(cfg.interface_kind, InterfaceKind::Veth);
    }

    #[test]
    fn mtu_is_derived_from_the_uplink_minus_the_encapsulation() {
        let mut cfg = BrindleConfig::default();
        assert_eq!(cfg.derived_mtu(1500), 1480);
        cfg.encapsulation = Encapsulation::Vxlan;
        assert_eq!(cfg.derived_mtu(1500), 1450);
        cfg.encapsulation = Encapsulation::None;
        assert_eq!(cfg.derived_mtu(9000), 9000);
        assert_eq!(BrindleConfig::default().explicit_mtu(), None);
    }

    #[test]
    fn bad_values_are_code_7() {
        for extra in [
            r#","mtu":10"#,
            r#","encapsulation":"gre""#,
            r#","requireDaemon":"yes""#,
            r#","interfaceKind":"macvlan""#,
            r#","tapQueues":0"#,
            r#","tapQueues":257"#,
        ] {
            let e = BrindleConfig::from_conf(&conf(extra)).unwrap_err();
            assert_eq!(e.code.0, 7, "{extra}");
        }
        let no_ipam =
            NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"brindle"}"#).unwrap();
        assert_eq!(BrindleConfig::from_conf(&no_ipam).unwrap_err().code.0, 7);
    }
}
