//! Kubernetes objects: `networking.k8s.io/v1` `NetworkPolicy` (all of it),
//! and `v1` `Namespace`, `Pod`, `ServiceAccount` for what policy matches on.
//!
//! Field names and defaults are the Kubernetes API's
//! (`k8s.io/api/networking/v1/types.go`, `core/v1/types.go`); validation
//! follows the API server's (`pkg/apis/networking/validation`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::{Errors, ObjectMeta};
use crate::selector::{Expr, Selector};

/// `apiVersion` of NetworkPolicy.
pub const NETWORKING_V1: &str = "networking.k8s.io/v1";

/// `v1 Namespace`: its labels are what namespace selectors match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Namespace {
    /// Name and labels.
    pub metadata: ObjectMeta,
}

/// `v1 ServiceAccount`: its labels are what Calico's service account
/// selectors match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceAccount {
    /// Name, namespace and labels.
    pub metadata: ObjectMeta,
}

/// `v1 Pod`: labels, service account, named container ports and addresses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pod {
    /// Name, namespace and labels.
    pub metadata: ObjectMeta,
    /// The parts of the spec policy uses.
    #[serde(default)]
    pub spec: PodSpec,
    /// The pod's addresses.
    #[serde(default, skip_serializing_if = "PodStatus::is_empty")]
    pub status: PodStatus,
}

/// The parts of a pod's spec policy uses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// `serviceAccountName` (the API server defaults it to `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// The deprecated alias of `serviceAccountName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Containers, for their named ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<Container>,
    /// A host-network pod has the node's addresses, not its own: it is no
    /// endpoint and no peer by address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// The node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// A container, for its ports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Its ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
}

/// A container port, possibly named (named ports are what policies may
/// refer to instead of numbers).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    /// The name, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port number.
    pub container_port: i64,
    /// TCP (default), UDP or SCTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// A pod's addresses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `podIP`.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// `podIPs`.
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<PodIp>,
}

impl PodStatus {
    fn is_empty(&self) -> bool {
        self.pod_ip.is_none() && self.pod_ips.is_empty()
    }
}

/// One entry of `podIPs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodIp {
    /// The address.
    pub ip: String,
}

/// A named port of a pod: name, protocol, number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NamedPort {
    /// The port's name.
    pub name: String,
    /// IP protocol number (6, 17 or 132).
    pub protocol: u8,
    /// The port number.
    pub port: u16,
}

impl Pod {
    /// The pod's service account (`default` when unset, as the API server
    /// defaults it).
    pub fn service_account(&self) -> &str {
        self.spec
            .service_account_name
            .as_deref()
            .or(self.spec.service_account.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
    }

    /// Every named container port (unnamed ones are not addressable by
    /// policy).
    pub fn named_ports(&self) -> Vec<NamedPort> {
        let mut out = Vec::new();
        for c in &self.spec.containers {
            for p in &c.ports {
                let (Some(name), Ok(port)) = (&p.name, u16::try_from(p.container_port)) else {
                    continue;
                };
                out.push(NamedPort {
                    name: name.clone(),
                    protocol: p.protocol.unwrap_or_default().number(),
                    port,
                });
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The pod's addresses from its status (none for a host-network pod).
    pub fn addresses(&self) -> Vec<IpAddr> {
        if self.spec.host_network {
            return Vec::new();
        }
        let mut out: Vec<IpAddr> = self
            .status
            .pod_ips
            .iter()
            .map(|p| p.ip.as_str())
            .chain(self.status.pod_ip.as_deref())
            .filter_map(|s| s.parse().ok())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    pub(super) fn validate(&self, errors: &mut Errors) {
        for (i, c) in self.spec.containers.iter().enumerate() {
            for (j, p) in c.ports.iter().enumerate() {
                let path = format!("spec.containers[{i}].ports[{j}]");
                if !(1..=65535).contains(&p.container_port) {
                    errors.add(format!("{path}.containerPort"), "must be 1..65535");
                }
                if let Some(name) = &p.name
                    && let Err(e) = validate_port_name(name)
                {
                    errors.add(format!("{path}.name"), e);
                }
            }
        }
        let ips = self.status.pod_ips.iter().map(|p| &p.ip);
        for (i, ip) in self.status.pod_ip.iter().chain(ips).enumerate() {
            if ip.parse::<IpAddr>().is_err() {
                errors.add(
                    format!("status.podIPs[{i}]"),
                    format!("{ip:?} is not an IP address"),
                );
            }
        }
    }
}

/// `networking.k8s.io/v1 NetworkPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// The policy.
    #[serde(default)]
    pub spec: NetworkPolicySpec,
    /// Removed from the API in 1.25; accepted and dropped.
    #[serde(default, skip_serializing)]
    pub status: Option<serde_json::Value>,
}

/// `spec` of a NetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicySpec {
    /// The pods (of the policy's namespace) the policy applies to; empty
    /// selects every pod of the namespace.
    #[serde(default)]
    pub pod_selector: LabelSelector,
    /// Ingress rules (a list of allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<IngressRule>>,
    /// Egress rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressRule>>,
    /// Directions the policy applies to; see [`NetworkPolicySpec::applies`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_types: Option<Vec<PolicyType>>,
}

/// `Ingress` or `Egress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyType {
    /// Traffic to the selected pods.
    Ingress,
    /// Traffic from the selected pods.
    Egress,
}

impl NetworkPolicySpec {
    /// (ingress, egress): the directions the policy applies to. Without
    /// `policyTypes`, the API server's default: every policy applies to
    /// ingress, and to egress when it has egress rules
    /// (`SetDefaults_NetworkPolicySpec`: `len(spec.Egress) != 0`).
    pub fn applies(&self) -> (bool, bool) {
        match &self.policy_types {
            Some(types) if !types.is_empty() => (
                types.contains(&PolicyType::Ingress),
                types.contains(&PolicyType::Egress),
            ),
            _ => (true, self.egress.as_ref().is_some_and(|e| !e.is_empty())),
        }
    }
}

/// One ingress rule: traffic matching `from` and `ports` is allowed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressRule {
    /// Destination ports (of the selected pod); absent or empty: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    /// Sources; absent or empty: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<NetworkPolicyPeer>>,
}

/// One egress rule: traffic matching `to` and `ports` is allowed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// Destination ports; absent or empty: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    /// Destinations; absent or empty: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<NetworkPolicyPeer>>,
}

/// A peer: pods by selectors, or addresses by CIDR.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyPeer {
    /// Pods (of the policy's namespace, or of the selected namespaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Namespaces (all their pods, or those matching `podSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IpBlock>,
}

/// A CIDR minus exceptions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpBlock {
    /// The range.
    pub cidr: String,
    /// Sub-ranges of `cidr` that do not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

impl IpBlock {
    /// `cidr` and `except`, parsed (host bits cleared); `None` if any is
    /// malformed (validation reports which).
    pub fn parsed(&self) -> Option<(IpNet, Vec<IpNet>)> {
        let cidr = parse_net(&self.cidr).ok()?;
        let except = self
            .except
            .iter()
            .flatten()
            .map(|e| parse_net(e).ok())
            .collect::<Option<Vec<_>>>()?;
        Some((cidr, except))
    }
}

/// A port (number or name, optionally a range to `endPort`) and protocol.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyPort {
    /// TCP (default), UDP or SCTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Number or named container port; absent: every port of the protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    /// The range `port..=endPort` (numeric `port` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i64>,
}

/// A port number or name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A number.
    Int(i64),
    /// A name (or a number written as a string, which the API treats as a
    /// name and so refuses).
    String(String),
}

/// The protocols NetworkPolicy ports name.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// `metav1.LabelSelector`: `matchLabels` and `matchExpressions`, ANDed; an
/// empty selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels that must be equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Requirements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    /// The label.
    pub key: String,
    /// The operator.
    pub operator: SelectorOperator,
    /// Values, for `In` and `NotIn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
}

/// `In`, `NotIn`, `Exists`, `DoesNotExist`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    /// The label is one of the values.
    #[default]
    In,
    /// The label is absent or none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && self.match_expressions.as_ref().is_none_or(Vec::is_empty)
    }

    /// The same selection in the selector language (what Calico's
    /// `k8sSelectorToCalico` writes).
    pub fn to_selector(&self) -> Selector {
        let mut terms = Vec::new();
        for (k, v) in self.match_labels.iter().flatten() {
            terms.push(Expr::Eq(k.clone(), v.clone()));
        }
        for r in self.match_expressions.iter().flatten() {
            let values = r.values.clone().unwrap_or_default();
            terms.push(match r.operator {
                SelectorOperator::In => Expr::In(r.key.clone(), values),
                SelectorOperator::NotIn => Expr::NotIn(r.key.clone(), values),
                SelectorOperator::Exists => Expr::Has(r.key.clone()),
                SelectorOperator::DoesNotExist => Expr::Not(Box::new(Expr::Has(r.key.clone()))),
            });
        }
        match terms.len() {
            0 => Selector::all(),
            1 => Selector::from_expr(terms.remove(0)),
            _ => Selector::from_expr(Expr::And(terms)),
        }
    }

    fn validate(&self, errors: &mut Errors, path: &str) {
        if let Some(labels) = &self.match_labels {
            validate_labels(errors, &format!("{path}.matchLabels"), labels);
        }
        for (i, r) in self.match_expressions.iter().flatten().enumerate() {
            let p = format!("{path}.matchExpressions[{i}]");
            if let Err(e) = validate_label_key(&r.key) {
                errors.add(format!("{p}.key"), e);
            }
            let n = r.values.as_ref().map_or(0, Vec::len);
            match r.operator {
                SelectorOperator::In | SelectorOperator::NotIn if n == 0 => {
                    errors.add(format!("{p}.values"), "must be non-empty for In and NotIn");
                }
                SelectorOperator::Exists | SelectorOperator::DoesNotExist if n > 0 => {
                    errors.add(
                        format!("{p}.values"),
                        "must be empty for Exists and DoesNotExist",
                    );
                }
                _ => {}
            }
            for (j, v) in r.values.iter().flatten().enumerate() {
                if let Err(e) = validate_label_value(v) {
                    errors.add(format!("{p}.values[{j}]"), e);
                }
            }
        }
    }
}

impl NetworkPolicy {
    pub(super) fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        spec.pod_selector.validate(errors, "spec.podSelector");
        for (i, rule) in spec.ingress.iter().flatten().enumerate() {
            let path = format!("spec.ingress[{i}]");
            validate_ports(errors, &path, rule.ports.as_deref());
            validate_peers(errors, &format!("{path}.from"), rule.from.as_deref());
        }
        for (i, rule) in spec.egress.iter().flatten().enumerate() {
            let path = format!("spec.egress[{i}]");
            validate_ports(errors, &path, rule.ports.as_deref());
            validate_peers(errors, &format!("{path}.to"), rule.to.as_deref());
        }
        if let Some(types) = &spec.policy_types
            && (types.len() > 2 || (types.len() == 2 && types[0] == types[1]))
        {
            errors.add("spec.policyTypes", "may hold Ingress and Egress once each");
        }
    }
}

fn validate_ports(errors: &mut Errors, path: &str, ports: Option<&[NetworkPolicyPort]>) {
    for (i, p) in ports.unwrap_or_default().iter().enumerate() {
        let path = format!("{path}.ports[{i}]");
        match (&p.port, p.end_port) {
            (Some(IntOrString::Int(n)), end) => {
                if !(1..=65535).contains(n) {
                    errors.add(format!("{path}.port"), "must be 1..65535");
                }
                if let Some(end) = end {
                    if !(1..=65535).contains(&end) {
                        errors.add(format!("{path}.endPort"), "must be 1..65535");
                    } else if end < *n {
                        errors.add(
                            format!("{path}.endPort"),
                            format!("{end} is below port {n}"),
                        );
                    }
                }
            }
            (Some(IntOrString::String(name)), end) => {
                if let Err(e) = validate_port_name(name) {
                    errors.add(format!("{path}.port"), e);
                }
                if end.is_some() {
                    errors.add(format!("{path}.endPort"), "needs a numeric port");
                }
            }
            (None, Some(_)) => errors.add(format!("{path}.endPort"), "needs a numeric port"),
            (None, None) => {}
        }
    }
}

fn validate_peers(errors: &mut Errors, path: &str, peers: Option<&[NetworkPolicyPeer]>) {
    for (i, peer) in peers.unwrap_or_default().iter().enumerate() {
        let path = format!("{path}[{i}]");
        let selectors = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
        match (&peer.ip_block, selectors) {
            (Some(_), true) => errors.add(
                &path,
                "ipBlock may not be combined with podSelector or namespaceSelector",
            ),
            (None, false) => errors.add(
                &path,
                "needs one of podSelector, namespaceSelector or ipBlock",
            ),
            _ => {}
        }
        if let Some(s) = &peer.pod_selector {
            s.validate(errors, &format!("{path}.podSelector"));
        }
        if let Some(s) = &peer.namespace_selector {
            s.validate(errors, &format!("{path}.namespaceSelector"));
        }
        if let Some(block) = &peer.ip_block {
            let cidr = match parse_net(&block.cidr) {
                Ok(c) => Some(c),
                Err(e) => {
                    errors.add(format!("{path}.ipBlock.cidr"), e);
                    None
                }
            };
            for (j, e) in block.except.iter().flatten().enumerate() {
                let p = format!("{path}.ipBlock.except[{j}]");
                match (parse_net(e), cidr) {
                    (Err(err), _) => errors.add(p, err),
                    (Ok(ex), Some(c))
                        if !(c.contains(&ex.network()) && ex.prefix_len() > c.prefix_len()) =>
                    {
                        errors.add(p, format!("{ex} must be a strict subset of {c}"))
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Parses a CIDR (or a bare address, as a host route) and clears host bits.
pub(crate) fn parse_net(s: &str) -> Result<IpNet, String> {
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    match s.parse::<IpAddr>() {
        Ok(ip) => Ok(IpNet::from(ip)),
        Err(_) => Err(format!("{s:?} is not a CIDR")),
    }
}

/// IANA_SVC_NAME: what Kubernetes accepts as a port name.
pub(crate) fn validate_port_name(name: &str) -> Result<(), String> {
    let ok = (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a port name (1-15 lower case alphanumerics or '-', with a letter)"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A qualified name: optional DNS-subdomain prefix and `/`, then a name.
pub(crate) fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        let mut e = Errors::default();
        super::validate_name(&mut e, "", p);
        e.0.is_empty()
    });
    if prefix_ok && is_label_name(name) {
        Ok(())
    } else {
        Err(format!("{key:?} is not a valid label key"))
    }
}

/// Empty, or a name of at most 63 characters.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!("{value:?} is not a valid label value"))
    }
}

pub(crate) fn validate_labels(errors: &mut Errors, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        if let Err(e) = validate_label_key(k) {
            errors.add(path, e);
        }
        if let Err(e) = validate_label_value(v) {
            errors.add(format!("{path}.{k}"), e);
        }
    }
}
