//! Calico's `projectcalico.org/v3` policy kinds: `NetworkPolicy`,
//! `GlobalNetworkPolicy`, `Tier`, `GlobalNetworkSet`.
//!
//! Field names, defaults and checks follow Calico's API
//! (`api/pkg/apis/projectcalico/v3/{policy_common,networkpolicy,
//! globalnetworkpolicy,tier,globalnetworkset}.go`) and its validator. What
//! Brindle does not enforce (HTTP matches, Service matches, host-endpoint
//! options, egress domains) is refused with a clear error rather than
//! silently ignored.

use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Errors;
use super::ObjectMeta;
use super::k8s::{parse_net, validate_port_name};
use crate::selector::Selector;

/// `apiVersion` of Calico's kinds.
pub const PROJECTCALICO_V3: &str = "projectcalico.org/v3";
/// The tier policies without `tier` belong to.
pub const DEFAULT_TIER: &str = "default";
/// The default tier's order (Calico's `DefaultTierOrder`).
pub const DEFAULT_TIER_ORDER: f64 = 1_000_000.0;
/// The order Calico gives Kubernetes NetworkPolicies (in the default tier).
pub const KUBERNETES_POLICY_ORDER: f64 = 1000.0;

/// `projectcalico.org/v3 NetworkPolicy`: applies to endpoints of its
/// namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// The policy.
    #[serde(default)]
    pub spec: NetworkPolicySpec,
}

/// `spec` of a Calico NetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicySpec {
    /// The tier (`default` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Order within the tier; absent is infinite (last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// Endpoints the policy applies to (within its namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Directions; when absent, inferred ([`infer_types`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<PolicyType>>,
    /// Ingress rules, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<Rule>>,
    /// Egress rules, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<Rule>>,
    /// Selects endpoints by their service account's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_selector: Option<String>,
    /// Hints; never change enforcement (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance_hints: Option<Vec<String>>,
}

/// `projectcalico.org/v3 GlobalNetworkPolicy`: applies to endpoints of
/// every namespace (or of those its `namespaceSelector` selects).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalNetworkPolicy {
    /// Name.
    pub metadata: ObjectMeta,
    /// The policy.
    #[serde(default)]
    pub spec: GlobalNetworkPolicySpec,
}

/// `spec` of a GlobalNetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalNetworkPolicySpec {
    /// The tier (`default` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Order within the tier; absent is infinite (last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// Endpoints the policy applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Restricts the endpoints to those in namespaces it selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<String>,
    /// Selects endpoints by their service account's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_selector: Option<String>,
    /// Directions; when absent, inferred ([`infer_types`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<PolicyType>>,
    /// Ingress rules, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<Rule>>,
    /// Egress rules, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<Rule>>,
    /// Host-endpoint option; refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_not_track: Option<bool>,
    /// Host-endpoint option; refused when true.
    #[serde(default, rename = "preDNAT", skip_serializing_if = "Option::is_none")]
    pub pre_dnat: Option<bool>,
    /// Host-endpoint option; refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_on_forward: Option<bool>,
    /// Hints; never change enforcement (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance_hints: Option<Vec<String>>,
}

/// `Ingress` or `Egress`.
pub use super::k8s::PolicyType;

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Allow; stop.
    Allow,
    /// Drop; stop.
    Deny,
    /// Log, then continue with the next rule.
    Log,
    /// Skip the rest of this tier: go to the next tier.
    Pass,
}

/// Calico's rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// What a matching packet gets.
    pub action: Action,
    /// 4 or 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<u8>,
    /// The IP protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Any IP protocol but this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_protocol: Option<Protocol>,
    /// ICMP type (and code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<IcmpFields>,
    /// Not this ICMP type (and code).
    #[serde(default, rename = "notICMP", skip_serializing_if = "Option::is_none")]
    pub not_icmp: Option<IcmpFields>,
    /// Source match.
    #[serde(default, skip_serializing_if = "EntityRule::is_empty")]
    pub source: EntityRule,
    /// Destination match.
    #[serde(default, skip_serializing_if = "EntityRule::is_empty")]
    pub destination: EntityRule,
    /// HTTP match (needs an L7 proxy; refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<serde_json::Value>,
    /// Annotations, carried along.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RuleMetadata>,
}

/// Rule annotations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleMetadata {
    /// Free-form annotations.
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// ICMP type and code (code needs type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcmpFields {
    /// 0..=254.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<i64>,
    /// 0..=255.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
}

/// One side (source or destination) of a rule. Every field present must
/// match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntityRule {
    /// The address is in one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    /// The address is in none of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_nets: Vec<String>,
    /// The address is an endpoint (or in a global network set) matching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The address is no endpoint (nor global network set) matching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_selector: Option<String>,
    /// The endpoint's namespace matches (`global()`: non-namespaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<String>,
    /// The port is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// The port is none of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<Port>,
    /// The endpoint runs as a matching service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_accounts: Option<ServiceAccountMatch>,
    /// Kubernetes Service match (refused: needs Service endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<serde_json::Value>,
}

impl EntityRule {
    fn is_empty(&self) -> bool {
        *self == EntityRule::default()
    }

    /// Whether any selector-like field is set (which is when Calico scopes
    /// the entity to the policy's namespace).
    pub fn has_selectors(&self) -> bool {
        self.selector.is_some()
            || self.not_selector.is_some()
            || self.namespace_selector.is_some()
            || self.service_accounts.is_some()
    }
}

/// Service accounts by name and/or label (ANDed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceAccountMatch {
    /// Names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Labels of the service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// `projectcalico.org/v3 Tier`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Name.
    pub metadata: ObjectMeta,
    /// Order and default action.
    #[serde(default)]
    pub spec: TierSpec,
    /// Status; accepted and dropped.
    #[serde(default, skip_serializing)]
    pub status: Option<serde_json::Value>,
}

/// `spec` of a Tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TierSpec {
    /// Order among tiers; absent is infinite (last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// What a packet gets when the tier's policies apply but no rule
    /// decided: `Deny` (default) or `Pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<Action>,
}

/// `projectcalico.org/v3 GlobalNetworkSet`: labelled addresses rule
/// selectors can match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalNetworkSet {
    /// Name and labels.
    pub metadata: ObjectMeta,
    /// The addresses.
    #[serde(default)]
    pub spec: GlobalNetworkSetSpec,
}

/// `spec` of a GlobalNetworkSet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalNetworkSetSpec {
    /// CIDRs (or bare addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    /// DNS-based sets (refused: Brindle does not snoop DNS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_egress_domains: Option<Vec<String>>,
}

impl GlobalNetworkSet {
    /// The nets, parsed; malformed ones (refused by validation) skipped.
    pub fn nets(&self) -> Vec<IpNet> {
        self.spec
            .nets
            .iter()
            .filter_map(|n| parse_net(n).ok())
            .collect()
    }
}

/// An IP protocol: a name Calico knows (`TCP`, `UDP`, `ICMP`, `ICMPv6`,
/// `SCTP`, `UDPLite`, any case) or a number 1..=255.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Protocol(pub u8);

impl Protocol {
    /// TCP.
    pub const TCP: Protocol = Protocol(6);
    /// UDP.
    pub const UDP: Protocol = Protocol(17);
    /// ICMP.
    pub const ICMP: Protocol = Protocol(1);
    /// ICMPv6.
    pub const ICMPV6: Protocol = Protocol(58);
    /// SCTP.
    pub const SCTP: Protocol = Protocol(132);
    /// UDPLite.
    pub const UDPLITE: Protocol = Protocol(136);

    const NAMES: [(&'static str, u8); 6] = [
        ("TCP", 6),
        ("UDP", 17),
        ("ICMP", 1),
        ("ICMPv6", 58),
        ("SCTP", 132),
        ("UDPLite", 136),
    ];

    /// Whether the protocol has ports Calico can match.
    pub fn has_ports(self) -> bool {
        matches!(self.0, 6 | 17 | 132 | 136)
    }

    /// Whether it is ICMP or ICMPv6.
    pub fn is_icmp(self) -> bool {
        matches!(self.0, 1 | 58)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Protocol::NAMES.iter().find(|(_, n)| *n == self.0) {
            Some((name, _)) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some((_, n)) = Protocol::NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
        {
            return Ok(Protocol(*n));
        }
        match s.parse::<u8>() {
            Ok(n) if n >= 1 => Ok(Protocol(n)),
            _ => Err(format!(
                "protocol {s:?} is not TCP, UDP, ICMP, ICMPv6, SCTP, UDPLite or 1..255"
            )),
        }
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match Protocol::NAMES.iter().find(|(_, n)| *n == self.0) {
            Some((name, _)) => s.serialize_str(name),
            None => s.serialize_u8(self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(i64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => u8::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .map(Protocol)
                .ok_or_else(|| serde::de::Error::custom(format!("protocol {n} is not 1..255"))),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A port match: a number, a range `"min:max"`, or a named port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    /// `min..=max` (a single port has `min == max`).
    Range(u16, u16),
    /// A named container port of the endpoint.
    Named(String),
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Range(a, b) if a == b => write!(f, "{a}"),
            Port::Range(a, b) => write!(f, "{a}:{b}"),
            Port::Named(n) => f.write_str(n),
        }
    }
}

impl std::str::FromStr for Port {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let num = |x: &str| {
            x.trim()
                .parse::<u16>()
                .map_err(|_| format!("port {s:?}: {x:?} is not 0..65535"))
        };
        if let Some((a, b)) = s.split_once(':') {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("port range {s:?} has min above max"));
            }
            return Ok(Port::Range(a, b));
        }
        if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() {
            let n = num(s)?;
            return Ok(Port::Range(n, n));
        }
        validate_port_name(s)?;
        Ok(Port::Named(s.to_owned()))
    }
}

impl Serialize for Port {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Port::Range(a, b) if a == b => s.serialize_u16(*a),
            p => s.collect_str(p),
        }
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(i64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => u16::try_from(n)
                .map(|n| Port::Range(n, n))
                .map_err(|_| serde::de::Error::custom(format!("port {n} is not 0..65535"))),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Calico's inference of `types` when a policy leaves it out:
/// `[Ingress]` without egress rules (also with no rules at all), `[Egress]`
/// with egress rules only, both with both (`NetworkPolicySpec.Types`).
pub fn infer_types(
    types: Option<&[PolicyType]>,
    ingress: &[Rule],
    egress: &[Rule],
) -> (bool, bool) {
    match types {
        Some(t) if !t.is_empty() => (
            t.contains(&PolicyType::Ingress),
            t.contains(&PolicyType::Egress),
        ),
        _ => match (ingress.is_empty(), egress.is_empty()) {
            (_, true) => (true, false),
            (true, false) => (false, true),
            (false, false) => (true, true),
        },
    }
}

/// Parses a selector field: `Ok(None)` when absent.
pub(crate) fn selector_field(
    errors: &mut Errors,
    path: &str,
    value: Option<&str>,
    global_ok: bool,
) -> Option<Selector> {
    let s = value?;
    match Selector::parse(s) {
        Ok(sel) if !global_ok && sel.uses_global() => {
            errors.add(path, "global() is only valid in a rule's namespaceSelector");
            None
        }
        Ok(sel) => Some(sel),
        Err(e) => {
            errors.add(path, e);
            None
        }
    }
}

fn validate_order(errors: &mut Errors, path: &str, order: Option<f64>) {
    if order.is_some_and(|o| !o.is_finite()) {
        errors.add(path, "must be a finite number");
    }
}

fn validate_types(errors: &mut Errors, types: Option<&[PolicyType]>) {
    if let Some(t) = types
        && (t.len() > 2 || (t.len() == 2 && t[0] == t[1]))
    {
        errors.add("spec.types", "may hold Ingress and Egress once each");
    }
}

fn validate_entity(
    errors: &mut Errors,
    path: &str,
    e: &EntityRule,
    ip_version: Option<u8>,
    ported: bool,
) {
    for (field, nets) in [("nets", &e.nets), ("notNets", &e.not_nets)] {
        for (i, n) in nets.iter().enumerate() {
            match parse_net(n) {
                Err(err) => errors.add(format!("{path}.{field}[{i}]"), err),
                Ok(net) => {
                    let v = if matches!(net, IpNet::V4(_)) { 4 } else { 6 };
                    if ip_version.is_some_and(|want| want != v) {
                        errors.add(
                            format!("{path}.{field}[{i}]"),
                            format!(
                                "{net} is IPv{v} but the rule's ipVersion is {}",
                                ip_version.unwrap_or(v)
                            ),
                        );
                    }
                }
            }
        }
    }
    selector_field(
        errors,
        &format!("{path}.selector"),
        e.selector.as_deref(),
        false,
    );
    selector_field(
        errors,
        &format!("{path}.notSelector"),
        e.not_selector.as_deref(),
        false,
    );
    selector_field(
        errors,
        &format!("{path}.namespaceSelector"),
        e.namespace_selector.as_deref(),
        true,
    );
    if let Some(sa) = &e.service_accounts {
        selector_field(
            errors,
            &format!("{path}.serviceAccounts.selector"),
            sa.selector.as_deref(),
            false,
        );
        for (i, n) in sa.names.iter().enumerate() {
            let mut e2 = Errors::default();
            super::validate_name(&mut e2, "", n);
            if !e2.0.is_empty() {
                errors.add(
                    format!("{path}.serviceAccounts.names[{i}]"),
                    format!("{n:?} is not a name"),
                );
            }
        }
    }
    if (!e.ports.is_empty() || !e.not_ports.is_empty()) && !ported {
        errors.add(
            path,
            "ports and notPorts need the rule's protocol to be TCP, UDP, SCTP or UDPLite",
        );
    }
    if e.services.is_some() {
        errors.add(
            format!("{path}.services"),
            "Service matches are not supported by Brindle",
        );
    }
}

fn validate_rules(errors: &mut Errors, path: &str, rules: &[Rule]) {
    for (i, r) in rules.iter().enumerate() {
        let path = format!("{path}[{i}]");
        if let Some(v) = r.ip_version
            && v != 4
            && v != 6
        {
            errors.add(format!("{path}.ipVersion"), "must be 4 or 6");
        }
        for (field, p) in [("protocol", r.protocol), ("notProtocol", r.not_protocol)] {
            match (p, r.ip_version) {
                (Some(Protocol::ICMP), Some(6)) => {
                    errors.add(format!("{path}.{field}"), "ICMP needs ipVersion 4")
                }
                (Some(Protocol::ICMPV6), Some(4)) => {
                    errors.add(format!("{path}.{field}"), "ICMPv6 needs ipVersion 6")
                }
                _ => {}
            }
        }
        for (field, icmp) in [("icmp", r.icmp), ("notICMP", r.not_icmp)] {
            let Some(icmp) = icmp else { continue };
            if !r.protocol.is_some_and(Protocol::is_icmp) {
                errors.add(format!("{path}.{field}"), "needs protocol ICMP or ICMPv6");
            }
            if icmp.code.is_some() && icmp.icmp_type.is_none() {
                errors.add(format!("{path}.{field}.code"), "needs a type");
            }
            if icmp.icmp_type.is_some_and(|t| !(0..=254).contains(&t)) {
                errors.add(format!("{path}.{field}.type"), "must be 0..254");
            }
            if icmp.code.is_some_and(|c| !(0..=255).contains(&c)) {
                errors.add(format!("{path}.{field}.code"), "must be 0..255");
            }
        }
        let ported = r.protocol.is_some_and(Protocol::has_ports);
        validate_entity(
            errors,
            &format!("{path}.source"),
            &r.source,
            r.ip_version,
            ported,
        );
        validate_entity(
            errors,
            &format!("{path}.destination"),
            &r.destination,
            r.ip_version,
            ported,
        );
        if r.http.is_some() {
            errors.add(
                format!("{path}.http"),
                "HTTP matches are not supported by Brindle",
            );
        }
    }
}

impl NetworkPolicy {
    pub(super) fn validate(&self, errors: &mut Errors) {
        let s = &self.spec;
        validate_order(errors, "spec.order", s.order);
        if let Some(t) = &s.tier {
            super::validate_name(errors, "spec.tier", t);
        }
        selector_field(errors, "spec.selector", s.selector.as_deref(), false);
        selector_field(
            errors,
            "spec.serviceAccountSelector",
            s.service_account_selector.as_deref(),
            false,
        );
        validate_types(errors, s.types.as_deref());
        validate_rules(
            errors,
            "spec.ingress",
            s.ingress.as_deref().unwrap_or_default(),
        );
        validate_rules(
            errors,
            "spec.egress",
            s.egress.as_deref().unwrap_or_default(),
        );
    }
}

impl GlobalNetworkPolicy {
    pub(super) fn validate(&self, errors: &mut Errors) {
        let s = &self.spec;
        validate_order(errors, "spec.order", s.order);
        if let Some(t) = &s.tier {
            super::validate_name(errors, "spec.tier", t);
        }
        selector_field(errors, "spec.selector", s.selector.as_deref(), false);
        selector_field(
            errors,
            "spec.namespaceSelector",
            s.namespace_selector.as_deref(),
            false,
        );
        selector_field(
            errors,
            "spec.serviceAccountSelector",
            s.service_account_selector.as_deref(),
            false,
        );
        validate_types(errors, s.types.as_deref());
        validate_rules(
            errors,
            "spec.ingress",
            s.ingress.as_deref().unwrap_or_default(),
        );
        validate_rules(
            errors,
            "spec.egress",
            s.egress.as_deref().unwrap_or_default(),
        );
        for (field, v) in [
            ("doNotTrack", s.do_not_track),
            ("preDNAT", s.pre_dnat),
            ("applyOnForward", s.apply_on_forward),
        ] {
            if v == Some(true) {
                errors.add(
                    format!("spec.{field}"),
                    "host-endpoint policy options are not supported by Brindle",
                );
            }
        }
    }
}

impl Tier {
    /// The tier's order (the default tier's is fixed).
    pub fn order(&self) -> Option<f64> {
        if self.metadata.name == DEFAULT_TIER {
            Some(DEFAULT_TIER_ORDER)
        } else {
            self.spec.order
        }
    }

    /// Whether an undecided packet passes to the next tier (else: denied).
    pub fn passes_by_default(&self) -> bool {
        self.spec.default_action == Some(Action::Pass)
    }

    pub(super) fn validate(&self, errors: &mut Errors) {
        validate_order(errors, "spec.order", self.spec.order);
        match self.spec.default_action {
            None | Some(Action::Deny) | Some(Action::Pass) => {}
            Some(a) => errors.add("spec.defaultAction", format!("{a:?} is not Deny or Pass")),
        }
        if self.metadata.name == DEFAULT_TIER {
            if self.spec.order.is_some_and(|o| o != DEFAULT_TIER_ORDER) {
                errors.add("spec.order", "the default tier's order is 1000000");
            }
            if self.spec.default_action == Some(Action::Pass) {
                errors.add(
                    "spec.defaultAction",
                    "the default tier's default action is Deny",
                );
            }
        }
    }
}

impl GlobalNetworkSet {
    pub(super) fn validate(&self, errors: &mut Errors) {
        for (i, n) in self.spec.nets.iter().enumerate() {
            if let Err(e) = parse_net(n) {
                errors.add(format!("spec.nets[{i}]"), e);
            }
        }
        if self.spec.allowed_egress_domains.is_some() {
            errors.add(
                "spec.allowedEgressDomains",
                "DNS-based network sets are not supported by Brindle",
            );
        }
    }
}
