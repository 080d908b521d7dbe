//! The daemon's configuration: `/etc/brindle/node.toml`, every key
//! overridable by a flag (`--bgp-as-number 64513`) or an environment variable
//! (`BRINDLE_BGP_AS_NUMBER=64513`); flags win over variables, variables over
//! the file. Validated once at start ([`Config::validate`]).
//!
//! Overrides are applied to the TOML document before it is deserialised, by
//! key path, so the one list of keys is the [`Config`] struct itself: the
//! overridable paths are the scalar and string-list leaves of
//! `Config::default()` serialised to TOML.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Where the daemon reads its configuration when not told otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/brindle/node.toml";

/// What can be wrong with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file (with overrides applied) is not valid TOML for [`Config`].
    #[error("{0}")]
    Parse(String),
    /// A flag or variable names no key, or has a value of the wrong type.
    #[error("{0}")]
    Override(String),
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration (see `deploy/systemd/node.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This node's name; empty: `$NODENAME`, else the kernel host name.
    pub node_name: String,
    /// The node's underlay address (BGP source, encapsulation source).
    pub node_address: String,
    /// trace | debug | info | warn | error.
    pub log_level: String,
    /// text | json: plain lines (ANSI colours only when stderr is a
    /// terminal) or one JSON object per line.
    pub log_format: String,
    /// The endpoint/IPAM socket.
    pub api: ApiConfig,
    /// The vrouter's programming socket and the uplink.
    pub vrouter: VrouterSection,
    /// The metrics listener.
    pub metrics: MetricsConfig,
    /// Where state lives.
    pub datastore: DatastoreConfig,
    /// BGP.
    pub bgp: BgpConfig,
    /// IPAM bootstrap.
    pub ipam: IpamSection,
}

/// `[api]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Path of the socket (mode 0600).
    pub socket: PathBuf,
}

/// `[vrouter]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VrouterSection {
    /// Path of the vrouter's socket.
    pub socket: PathBuf,
    /// The uplink's interface name (native routes go out of it); empty: the
    /// interface holding `node_address`, else that of the default route.
    pub uplink: String,
    /// The underlay subnet (for cross-subnet decisions); empty: the subnet of
    /// the interface holding `node_address`, if any (else none known, so
    /// cross-subnet pools always encapsulate).
    pub underlay_subnet: String,
    /// The underlay router through which tunnels reach nodes outside the
    /// underlay subnet; empty: the gateway of the uplink's default route in
    /// the kernel's main table, followed as it changes.
    pub underlay_gateway: String,
    /// The host port (issue 14): a TAP the vrouter makes in this
    /// namespace (e.g. `brindle0`), to which the kernel routes every pod
    /// prefix and through which pods reach the node, Services and the
    /// outside (natOutgoing by nftables); empty: none (pods reach only
    /// pods and the node's own address).
    pub host_port: String,
    /// The host port's queues (the vrouter's worker count).
    pub host_port_queues: u16,
    /// The host port's MTU: the pods' (the kernel sends at most this into
    /// the vrouter, which may encapsulate it).
    pub host_port_mtu: u32,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` of the HTTP listener.
    pub listen: String,
}

/// `[datastore]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatastoreConfig {
    /// `embedded` or `etcd`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Directory of the embedded store.
    pub path: PathBuf,
    /// etcd endpoints.
    pub endpoints: Vec<String>,
    /// PEM CA bundle that signs the etcd servers' certificates (Calico's
    /// etcdCACertFile); set, `https://` endpoints are verified against it.
    #[serde(alias = "ca_file")]
    pub etcd_ca_file: String,
    /// PEM client certificate for etcd's client auth (etcdCertFile).
    #[serde(alias = "cert_file")]
    pub etcd_cert_file: String,
    /// PEM key of that certificate (etcdKeyFile).
    #[serde(alias = "key_file")]
    pub etcd_key_file: String,
    /// Key prefix.
    pub prefix: String,
    /// `[datastore.kubernetes]`: the Kubernetes API as the source of pods,
    /// nodes, namespaces and network policies (IPAM stays in this
    /// datastore).
    pub kubernetes: brindle_kube::KubeConfig,
}

/// `[bgp]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BgpConfig {
    /// This node's AS.
    pub as_number: u32,
    /// TCP port we listen on and connect to for mesh peers.
    pub listen_port: u16,
    /// Peer with every other node of the registry.
    pub node_to_node_mesh: bool,
    /// Hold time offered to peers.
    pub hold_time_secs: u16,
    /// This node is a route reflector: mesh peers are its clients.
    pub route_reflector: bool,
    /// RFC 4456 cluster ID when reflecting; empty: the router ID.
    pub cluster_id: String,
    /// Seconds after which a node that stopped heartbeating is dead.
    pub node_lease_secs: u64,
    /// Service cluster IP ranges announced to every peer from every node
    /// (Calico's BGPConfiguration serviceClusterIPs): CIDRs.
    pub service_cluster_ips: Vec<String>,
    /// Service external IP ranges announced to every peer
    /// (serviceExternalIPs): CIDRs.
    pub service_external_ips: Vec<String>,
    /// LoadBalancer IP ranges announced to every peer
    /// (serviceLoadBalancerIPs): CIDRs.
    pub service_loadbalancer_ips: Vec<String>,
    /// Record the BGP speaker's inputs (received messages, timer events) as
    /// JSON lines to this file, for replay (`brindle_ctrl::bgp::record`);
    /// empty: no recording.
    pub record_file: String,
    /// Explicit peers (a top-of-rack router, reflectors).
    pub peers: Vec<ExplicitPeer>,
}

impl BgpConfig {
    /// The service prefixes of the three keys, each a CIDR without host
    /// bits; an error names the key and the entry.
    pub fn service_prefixes(&self) -> Result<std::collections::BTreeSet<IpNet>, ConfigError> {
        let mut out = std::collections::BTreeSet::new();
        for (key, list) in [
            ("bgp.service_cluster_ips", &self.service_cluster_ips),
            ("bgp.service_external_ips", &self.service_external_ips),
            (
                "bgp.service_loadbalancer_ips",
                &self.service_loadbalancer_ips,
            ),
        ] {
            for entry in list {
                let net: IpNet = entry
                    .parse()
                    .map_err(|_| ConfigError::Invalid(format!("{key} {entry:?}: not a CIDR")))?;
                if net.trunc() != net {
                    return Err(ConfigError::Invalid(format!(
                        "{key} {entry:?}: host bits set (the network is {})",
                        net.trunc()
                    )));
                }
                if net.addr().is_ipv6() {
                    // The daemon's sessions are IPv4 and it has no IPv6
                    // next hop of its own to announce IPv6 prefixes with.
                    return Err(ConfigError::Invalid(format!(
                        "{key} {entry:?}: IPv6 service prefixes are not supported yet"
                    )));
                }
                out.insert(net);
            }
        }
        Ok(out)
    }
}

/// `[[bgp.peers]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplicitPeer {
    /// The peer's address.
    pub address: IpAddr,
    /// Its AS.
    pub as_number: u32,
    /// Its port (default 179).
    #[serde(default)]
    pub port: Option<u16>,
    /// TCP-MD5 password.
    #[serde(default)]
    pub password: Option<String>,
    /// Max prefixes accepted.
    #[serde(default)]
    pub max_prefixes: Option<u32>,
    /// We reflect to it.
    #[serde(default)]
    pub rr_client: bool,
}

/// `[ipam]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IpamSection {
    /// The pool created when there is none.
    pub default_pool_cidr: String,
    /// Its blocks' prefix length.
    pub block_size: u8,
    /// none | ipip | ipip_cross_subnet | vxlan | vxlan_cross_subnet.
    pub encapsulation: String,
    /// Masquerade pod traffic leaving the pool.
    pub nat_outgoing: bool,
    /// Never borrow from another node's block.
    pub strict_affinity: bool,
    /// Seconds between automatic IPAM GC passes (leaked handles, dead
    /// nodes' blocks); 0 turns the automatic GC off.
    pub gc_interval_secs: u64,
    /// Seconds a leaked handle or a dead node must stay so before the GC
    /// releases it (covers an ADD in flight and a lagging pod source).
    pub gc_grace_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: String::new(),
            node_address: String::new(),
            log_level: "info".into(),
            log_format: "text".into(),
            api: ApiConfig::default(),
            vrouter: VrouterSection::default(),
            metrics: MetricsConfig::default(),
            datastore: DatastoreConfig::default(),
            bgp: BgpConfig::default(),
            ipam: IpamSection::default(),
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            socket: brindle_api::CTRL_SOCKET.into(),
        }
    }
}

impl Default for VrouterSection {
    fn default() -> Self {
        VrouterSection {
            socket: brindle_api::VROUTER_SOCKET.into(),
            uplink: String::new(),
            underlay_subnet: String::new(),
            underlay_gateway: String::new(),
            host_port: String::new(),
            host_port_queues: 1,
            host_port_mtu: 1450,
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:9091".into(),
        }
    }
}

impl Default for DatastoreConfig {
    fn default() -> Self {
        DatastoreConfig {
            kind: "embedded".into(),
            path: "/var/lib/brindle".into(),
            endpoints: Vec::new(),
            etcd_ca_file: String::new(),
            etcd_cert_file: String::new(),
            etcd_key_file: String::new(),
            prefix: "/brindle/".into(),
            kubernetes: brindle_kube::KubeConfig::default(),
        }
    }
}

impl Default for BgpConfig {
    fn default() -> Self {
        BgpConfig {
            as_number: 64512,
            listen_port: 179,
            node_to_node_mesh: true,
            hold_time_secs: 90,
            route_reflector: false,
            cluster_id: String::new(),
            node_lease_secs: 30,
            service_cluster_ips: Vec::new(),
            service_external_ips: Vec::new(),
            service_loadbalancer_ips: Vec::new(),
            record_file: String::new(),
            peers: Vec::new(),
        }
    }
}

impl Default for IpamSection {
    fn default() -> Self {
        IpamSection {
            default_pool_cidr: "10.244.0.0/16".into(),
            block_size: 26,
            encapsulation: "ipip".into(),
            nat_outgoing: true,
            strict_affinity: false,
            gc_interval_secs: 60,
            gc_grace_secs: 900,
        }
    }
}

/// The validated values the daemon uses (parsed once).
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// Node name (resolved).
    pub node_name: String,
    /// Node address.
    pub node_address: Ipv4Addr,
    /// The uplink port's interface name.
    pub uplink: String,
    /// Metrics listener.
    pub metrics_listen: SocketAddr,
    /// Default pool.
    pub default_pool: IpNet,
    /// Underlay subnet, if configured.
    pub underlay_subnet: Option<IpNet>,
    /// Underlay gateway, if configured (else learned from the kernel).
    pub underlay_gateway: Option<Ipv4Addr>,
    /// Cluster ID, if configured.
    pub cluster_id: Option<Ipv4Addr>,
    /// Service cluster, external and load-balancer prefixes, announced by
    /// this node (deduplicated, sorted).
    pub service_prefixes: std::collections::BTreeSet<IpNet>,
}

const ENCAPSULATIONS: [&str; 5] = [
    "none",
    "ipip",
    "ipip_cross_subnet",
    "vxlan",
    "vxlan_cross_subnet",
];

impl Config {
    /// Reads `path` (a missing file at the default path is an empty file:
    /// defaults plus overrides), then applies `env` (name, value) pairs and
    /// `flags` (`--key-path value` or `--key-path=value`).
    pub fn load(
        path: Option<&std::path::Path>,
        env: &[(String, String)],
        flags: &[String],
    ) -> Result<Config, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })?,
            None => match std::fs::read_to_string(DEFAULT_CONFIG_PATH) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(source) => {
                    return Err(ConfigError::Read {
                        path: DEFAULT_CONFIG_PATH.into(),
                        source,
                    });
                }
            },
        };
        Self::from_toml_with_overrides(&text, env, flags)
    }

    /// [`Config::load`] on a string (tests).
    pub fn from_toml_with_overrides(
        text: &str,
        env: &[(String, String)],
        flags: &[String],
    ) -> Result<Config, ConfigError> {
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(format!("node.toml: {e}")))?;
        let leaves = override_paths();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("BRINDLE_") else {
                continue;
            };
            if rest == "CONFIG" {
                continue;
            }
            let path = leaves
                .iter()
                .find(|(p, _)| p.join("_").to_uppercase() == rest)
                .ok_or_else(|| {
                    ConfigError::Override(format!("environment variable {name}: no such key"))
                })?;
            set_path(&mut doc, &path.0, &path.1, value)
                .map_err(|e| ConfigError::Override(format!("environment variable {name}: {e}")))?;
        }
        let mut i = 0;
        while i < flags.len() {
            let flag = &flags[i];
            let Some(body) = flag.strip_prefix("--") else {
                return Err(ConfigError::Override(format!(
                    "unexpected argument {flag:?}"
                )));
            };
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n.to_owned(), v.to_owned()),
                None => {
                    i += 1;
                    let v = flags.get(i).ok_or_else(|| {
                        ConfigError::Override(format!("flag --{body} needs a value"))
                    })?;
                    (body.to_owned(), v.clone())
                }
            };
            i += 1;
            if name == "config" {
                continue;
            }
            let path = leaves
                .iter()
                .find(|(p, _)| p.join("-").replace('_', "-") == name)
                .ok_or_else(|| ConfigError::Override(format!("unknown flag --{name}")))?;
            set_path(&mut doc, &path.0, &path.1, &value)
                .map_err(|e| ConfigError::Override(format!("flag --{name}: {e}")))?;
        }
        toml::Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(format!("node.toml: {e}")))
    }

    /// Checks every value once, with errors that name the key.
    pub fn validate(&self) -> Result<Validated, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let node_name = if !self.node_name.is_empty() {
            self.node_name.clone()
        } else if let Ok(n) = std::env::var("NODENAME")
            && !n.is_empty()
        {
            n
        } else {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_default()
        };
        if node_name.is_empty() || node_name.contains('/') || node_name.len() > 253 {
            return bad(format!(
                "node_name {node_name:?}: must be 1-253 bytes without '/'"
            ));
        }
        let default_iface = std::fs::read_to_string("/proc/net/route")
            .ok()
            .and_then(|t| default_route_interface(&t));
        let interfaces = ipv4_interfaces();
        let node_address: Ipv4Addr = if self.node_address.is_empty() {
            let Some(iface) = &default_iface else {
                return bad(
                    "node_address is empty and there is no IPv4 default route to find it from"
                        .into(),
                );
            };
            match interfaces.iter().find(|(name, _)| name == iface) {
                Some((_, net)) => net.addr(),
                None => {
                    return bad(format!(
                        "node_address is empty and {iface} (the default route's interface) \
                         has no IPv4 address"
                    ));
                }
            }
        } else {
            match self.node_address.parse() {
                Ok(a) => a,
                Err(_) => {
                    return bad(format!(
                        "node_address {:?}: must be this node's IPv4 underlay address",
                        self.node_address
                    ));
                }
            }
        };
        let holder = interfaces
            .iter()
            .find(|(_, net)| net.addr() == node_address);
        let uplink = if !self.vrouter.uplink.is_empty() {
            self.vrouter.uplink.clone()
        } else if let Some((name, _)) = holder {
            name.clone()
        } else if let Some(iface) = default_iface {
            iface
        } else {
            return bad(format!(
                "vrouter.uplink is empty and neither an interface holding {node_address} \
                 nor a default route was found: set it"
            ));
        };
        if !["text", "json"].contains(&self.log_format.as_str()) {
            return bad(format!(
                "log_format {:?}: one of text, json",
                self.log_format
            ));
        }
        if !["trace", "debug", "info", "warn", "error"].contains(&self.log_level.as_str()) {
            return bad(format!(
                "log_level {:?}: one of trace, debug, info, warn, error",
                self.log_level
            ));
        }
        let metrics_listen: SocketAddr = self.metrics.listen.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics.listen {:?}: expected host:port",
                self.metrics.listen
            ))
        })?;
        match self.datastore.kind.as_str() {
            "embedded" => {}
            "etcd" => {
                if self.datastore.endpoints.is_empty() {
                    return bad("datastore.endpoints: type = \"etcd\" needs at least one".into());
                }
            }
            other => {
                return bad(format!(
                    "datastore.type {other:?}: one of \"embedded\", \"etcd\""
                ));
            }
        }
        let prefix = &self.datastore.prefix;
        if !prefix.starts_with('/') || !prefix.ends_with('/') {
            return bad(format!(
                "datastore.prefix {prefix:?}: must start and end with '/'"
            ));
        }
        if self.bgp.as_number == 0 || self.bgp.as_number == 23456 {
            return bad(format!(
                "bgp.as_number {}: 0 and 23456 (AS_TRANS) are reserved",
                self.bgp.as_number
            ));
        }
        if self.bgp.hold_time_secs != 0 && self.bgp.hold_time_secs < 3 {
            return bad(format!(
                "bgp.hold_time_secs {}: 0 or at least 3 (RFC 4271 §4.2)",
                self.bgp.hold_time_secs
            ));
        }
        if self.bgp.node_lease_secs < 3 {
            return bad("bgp.node_lease_secs: at least 3".into());
        }
        let cluster_id = if self.bgp.cluster_id.is_empty() {
            None
        } else {
            Some(self.bgp.cluster_id.parse().map_err(|_| {
                ConfigError::Invalid(format!(
                    "bgp.cluster_id {:?}: an IPv4 address",
                    self.bgp.cluster_id
                ))
            })?)
        };
        let default_pool: IpNet = self.ipam.default_pool_cidr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "ipam.default_pool_cidr {:?}: not a CIDR",
                self.ipam.default_pool_cidr
            ))
        })?;
        let max = match default_pool {
            IpNet::V4(_) => 32,
            IpNet::V6(_) => 128,
        };
        if self.ipam.block_size < default_pool.prefix_len() || self.ipam.block_size > max {
            return bad(format!(
                "ipam.block_size {}: must be between the pool's prefix length {} and {max}",
                self.ipam.block_size,
                default_pool.prefix_len()
            ));
        }
        if !ENCAPSULATIONS.contains(&self.ipam.encapsulation.as_str()) {
            return bad(format!(
                "ipam.encapsulation {:?}: one of {}",
                self.ipam.encapsulation,
                ENCAPSULATIONS.join(", ")
            ));
        }
        let underlay_subnet = if self.vrouter.underlay_subnet.is_empty() {
            holder.map(|(_, net)| IpNet::V4(net.trunc()))
        } else {
            Some(self.vrouter.underlay_subnet.parse().map_err(|_| {
                ConfigError::Invalid(format!(
                    "vrouter.underlay_subnet {:?}: not a CIDR",
                    self.vrouter.underlay_subnet
                ))
            })?)
        };
        let underlay_gateway = if self.vrouter.underlay_gateway.is_empty() {
            None
        } else {
            Some(self.vrouter.underlay_gateway.parse().map_err(|_| {
                ConfigError::Invalid(format!(
                    "vrouter.underlay_gateway {:?}: an IPv4 address",
                    self.vrouter.underlay_gateway
                ))
            })?)
        };
        let host_port = &self.vrouter.host_port;
        if host_port.len() > 15 || host_port.contains(['/', ' ']) {
            return bad(format!(
                "vrouter.host_port {host_port:?}: an interface name of at most 15 bytes"
            ));
        }
        if !host_port.is_empty() {
            if !(1..=256).contains(&self.vrouter.host_port_queues) {
                return bad(format!(
                    "vrouter.host_port_queues {}: 1 to 256",
                    self.vrouter.host_port_queues
                ));
            }
            if !(576..=65_535).contains(&self.vrouter.host_port_mtu) {
                return bad(format!(
                    "vrouter.host_port_mtu {}: 576 to 65535",
                    self.vrouter.host_port_mtu
                ));
            }
        }
        let service_prefixes = self.bgp.service_prefixes()?;
        if self.datastore.kind == "etcd" {
            let tls = [
                ("datastore.etcd_ca_file", &self.datastore.etcd_ca_file),
                ("datastore.etcd_cert_file", &self.datastore.etcd_cert_file),
                ("datastore.etcd_key_file", &self.datastore.etcd_key_file),
            ];
            for (key, path) in tls {
                if !path.is_empty() && !std::path::Path::new(path).is_file() {
                    return bad(format!("{key} {path:?}: no such file"));
                }
            }
            if self.datastore.etcd_cert_file.is_empty() != self.datastore.etcd_key_file.is_empty() {
                return bad(
                    "datastore.etcd_cert_file and datastore.etcd_key_file: set both or neither"
                        .into(),
                );
            }
        }
        self.datastore
            .kubernetes
            .validate()
            .map_err(ConfigError::Invalid)?;
        Ok(Validated {
            node_name,
            node_address,
            uplink,
            metrics_listen,
            default_pool,
            underlay_subnet,
            underlay_gateway,
            cluster_id,
            service_prefixes,
        })
    }
}

/// The interface of the IPv4 default route with the lowest metric, from the
/// text of `/proc/net/route`.
pub fn default_route_interface(proc_net_route: &str) -> Option<String> {
    proc_net_route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            let (iface, dest, flags, metric, mask) =
                (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
            let up = u32::from_str_radix(flags, 16).ok()? & 1 == 1;
            (up && *dest == "00000000" && *mask == "00000000")
                .then(|| (metric.parse::<u32>().unwrap_or(u32::MAX), iface.to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

/// Every IPv4 address of this host with its interface and prefix length.
fn ipv4_interfaces() -> Vec<(String, ipnet::Ipv4Net)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            let mask = a.netmask?.as_sockaddr_in()?.ip();
            let len = u32::from(mask).leading_ones() as u8;
            Some((a.interface_name, ipnet::Ipv4Net::new(ip, len).ok()?))
        })
        .collect()
}

/// Every overridable key path with its default value (its type).
fn override_paths() -> Vec<(Vec<String>, toml::Value)> {
    fn walk(prefix: &mut Vec<String>, t: &toml::Table, out: &mut Vec<(Vec<String>, toml::Value)>) {
        for (k, v) in t {
            prefix.push(k.clone());
            match v {
                toml::Value::Table(inner) => walk(prefix, inner, out),
                toml::Value::Array(a) if a.iter().any(|x| x.is_table()) => {}
                other => out.push((prefix.clone(), other.clone())),
            }
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    if let Ok(toml::Value::Table(t)) = toml::Value::try_from(Config::default()) {
        walk(&mut Vec::new(), &t, &mut out);
    }
    // Keys whose default serialises to nothing still need an entry.
    if !out.iter().any(|(p, _)| p == &["datastore", "endpoints"]) {
        out.push((
            vec!["datastore".into(), "endpoints".into()],
            toml::Value::Array(Vec::new()),
        ));
    }
    out.retain(|(p, _)| p.last().is_none_or(|l| l != "peers"));
    out
}

fn set_path(
    doc: &mut toml::Table,
    path: &[String],
    example: &toml::Value,
    raw: &str,
) -> Result<(), String> {
    let value = match example {
        toml::Value::Integer(_) => toml::Value::Integer(
            raw.parse()
                .map_err(|_| format!("{raw:?} is not an integer"))?,
        ),
        toml::Value::Boolean(_) => toml::Value::Boolean(
            raw.parse()
                .map_err(|_| format!("{raw:?} is not true or false"))?,
        ),
        toml::Value::Array(_) => toml::Value::Array(
            raw.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.trim().to_owned()))
                .collect(),
        ),
        _ => toml::Value::String(raw.to_owned()),
    };
    let (last, parents) = path.split_last().ok_or("empty key path")?;
    let mut table = doc;
    for p in parents {
        let entry = table
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| format!("{p} is not a table in the file"))?;
    }
    table.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
