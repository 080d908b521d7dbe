//! The one conflist template (`cni/conflist/10-brindle.conflist.template`)
//! and its rendering. deploy/ and the lab generate their conflists through
//! [`render`]; the integration tests use it too, so what is tested is what
//! is installed.

use brindle_api::cni::NetConfList;
use serde_json::{Value, json};

use crate::config::InterfaceKind;

/// The template, with `${NAME}` placeholders.
pub const TEMPLATE: &str = include_str!("../conflist/10-brindle.conflist.template");

/// `${BANDWIDTH}`: the `bandwidth` plugin, chained for veth pods only. It
/// shapes the pod's host veth (a tbf, an ifb for egress), which a TAP pod
/// does not have: its ADD with a rate and its every CHECK fail on a TAP
/// pod ("container interface eth0 has no veth peer").
pub fn bandwidth_plugin(kind: InterfaceKind) -> &'static str {
    match kind {
        InterfaceKind::Veth => {
            r#" { "type": "bandwidth", "capabilities": { "bandwidth": true } },"#
        }
        InterfaceKind::Tap => "",
    }
}

/// The values to fill in.
#[derive(Debug, Clone, PartialEq)]
pub struct ConflistParams {
    /// `cniVersion` of the list. Debian 12's reference plugins speak up to
    /// 1.0.0, so that is the default.
    pub cni_version: String,
    /// The network name.
    pub network_name: String,
    /// Explicit MTU; 0 derives it from the uplink.
    pub mtu: u32,
    /// `none`, `ipip` or `vxlan`.
    pub encapsulation: String,
    /// The node daemon's socket.
    pub ctrl_socket: String,
    /// Whether ADD fails without the daemon.
    pub require_daemon: bool,
    /// The `ipam` section.
    pub ipam: Value,
    /// What the pod's interface is (`interfaceKind`): `tap` by default
    /// (issue 13), `veth` as an option.
    pub interface_kind: InterfaceKind,
    /// Queues of a TAP pod interface (`tapQueues`). The vrouter attaches
    /// one queue per worker whatever the TAP was made with; this sizes the
    /// queues the pod's kernel sees until then. 1 by default (a node's
    /// `cores = "auto"` is not known where the conflist is written); the
    /// lab, which knows its vrouters' workers, gives their count.
    pub tap_queues: u16,
    /// The node's vrouter has a host port (ctrl's `[vrouter] host_port`):
    /// the brindle plugin gets `"hostPort": true` (no `/32 dev <veth>`
    /// route for a veth pod: the node reaches it through the host port).
    /// Not in the template: a list without it means `false`, so deploy's
    /// rendered conflist stays as it is while its nodes have no host port.
    pub host_port: bool,
}

impl Default for ConflistParams {
    fn default() -> Self {
        ConflistParams {
            cni_version: "1.0.0".into(),
            network_name: "k8s-pod-network".into(),
            mtu: 0,
            encapsulation: "ipip".into(),
            ctrl_socket: brindle_api::CTRL_SOCKET.into(),
            require_daemon: true,
            ipam: json!({"type": "brindle-ipam"}),
            interface_kind: InterfaceKind::Tap,
            tap_queues: 1,
            host_port: false,
        }
    }
}

/// Renders the template and checks that the result is a valid conflist.
pub fn render(p: &ConflistParams) -> Result<NetConfList, serde_json::Error> {
    let quoted = |s: &str| {
        // The string without its JSON quotes, escaped for the template.
        let q = Value::String(s.to_string()).to_string();
        q[1..q.len() - 1].to_string()
    };
    let text = TEMPLATE
        .replace("${CNI_VERSION}", &quoted(&p.cni_version))
        .replace("${NETWORK_NAME}", &quoted(&p.network_name))
        .replace("${MTU}", &p.mtu.to_string())
        .replace("${ENCAPSULATION}", &quoted(&p.encapsulation))
        .replace("${CTRL_SOCKET}", &quoted(&p.ctrl_socket))
        .replace("${REQUIRE_DAEMON}", &p.require_daemon.to_string())
        .replace("${IPAM}", &p.ipam.to_string())
        .replace("${INTERFACE_KIND}", p.interface_kind.as_str())
        .replace("${BANDWIDTH}", bandwidth_plugin(p.interface_kind))
        .replace("${TAP_QUEUES}", &p.tap_queues.to_string());
    let mut list: NetConfList = serde_json::from_str(&text)?;
    if p.host_port
        && let Some(brindle) = list.plugins.first_mut()
    {
        brindle.insert("hostPort".into(), Value::Bool(true));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;

    fn types(list: &NetConfList) -> Vec<&str> {
        list.plugins
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn template_renders_to_brindle_then_tuning_portmap_and_bandwidth_for_veth_pods() {
        let list = render(&ConflistParams::default()).unwrap();
        assert_eq!(list.cni_version, "1.0.0");
        assert_eq!(list.name, "k8s-pod-network");
        // TAP pods (the default): no bandwidth plugin, it needs a host veth.
        assert_eq!(types(&list), ["brindle", "tuning", "portmap"]);
        assert_eq!(list.plugins[0]["ipam"]["type"], "brindle-ipam");
        assert_eq!(list.plugins[0]["requireDaemon"], true);
        let veth = render(&ConflistParams {
            interface_kind: InterfaceKind::Veth,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(types(&veth), ["brindle", "tuning", "bandwidth", "portmap"]);
        assert_eq!(veth.plugins[2]["capabilities"]["bandwidth"], true);
    }

    #[test]
    fn the_first_plugin_config_parses_as_brindle_config() {
        let p = ConflistParams {
            mtu: 1400,
            encapsulation: "vxlan".into(),
            ctrl_socket: "/tmp/a \"quoted\" path".into(),
            interface_kind: InterfaceKind::Veth,
            tap_queues: 4,
            ..Default::default()
        };
        let list = render(&p).unwrap();
        let conf = list.plugin_conf(0, &Map::new(), None).unwrap();
        let conf = brindle_api::cni::NetConf::parse(conf.to_string().as_bytes()).unwrap();
        let cfg = crate::config::BrindleConfig::from_conf(&conf).unwrap();
        assert_eq!(cfg.explicit_mtu(), Some(1400));
        assert_eq!(cfg.encapsulation, crate::config::Encapsulation::Vxlan);
        assert_eq!(cfg.ctrl_socket.to_str(), Some("/tmp/a \"quoted\" path"));
        assert_eq!(
            (cfg.interface_kind, cfg.tap_queues),
            (InterfaceKind::Veth, 4)
        );
        // The default conflist makes TAP pods with one queue (issue 13).
        let tap = render(&ConflistParams::default()).unwrap();
        assert_eq!(tap.plugins[0]["interfaceKind"], "tap");
        let conf = tap.plugin_conf(0, &Map::new(), None).unwrap();
        let conf = brindle_api::cni::NetConf::parse(conf.to_string().as_bytes()).unwrap();
        let cfg = crate::config::BrindleConfig::from_conf(&conf).unwrap();
        assert_eq!(
            (cfg.interface_kind, cfg.tap_queues),
            (InterfaceKind::Tap, 1)
        );
        assert!(!cfg.host_port);
        assert!(tap.plugins[0].get("hostPort").is_none());
    }

    #[test]
    fn a_node_with_a_host_port_gets_host_port_true_in_the_brindle_plugin() {
        let list = render(&ConflistParams {
            host_port: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(list.plugins[0]["hostPort"], true);
        let conf = list.plugin_conf(0, &Map::new(), None).unwrap();
        let conf = brindle_api::cni::NetConf::parse(conf.to_string().as_bytes()).unwrap();
        let cfg = crate::config::BrindleConfig::from_conf(&conf).unwrap();
        assert!(cfg.host_port);
    }
}
