//! Resources → the compiler's intermediate form, one shape for every
//! policy kind: Kubernetes NetworkPolicies become default-tier policies of
//! order 1000 named `knp.default.<name>` as Calico converts them (one
//! Allow rule per peer × port, ingress always applying), Calico policies
//! keep their rules with their selectors scoped as Calico scopes them.

use ipnet::IpNet;

use crate::program::{IcmpMatch, PolicyName, RuleAction};
use crate::resource::calico::{self, Action, DEFAULT_TIER, EntityRule, KUBERNETES_POLICY_ORDER};
use crate::resource::k8s::parse_net;
use crate::resource::k8s::{self, IntOrString, NetworkPolicyPeer, NetworkPolicyPort};
use crate::selector::{Expr, Selector};

/// Where a selection looks for endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Scope {
    /// Every endpoint and every global network set.
    Any,
    /// The endpoints of one namespace.
    Namespace(String),
    /// Endpoints whose namespace matches, and global network sets when the
    /// selector says `global()`.
    NamespaceSelector(Selector),
}

/// A set of endpoints (and network sets) by labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Selection {
    pub selector: Selector,
    pub scope: Scope,
    /// Service account names (any of; empty: no condition).
    pub sa_names: Vec<String>,
    /// Service account labels.
    pub sa_selector: Option<Selector>,
}

impl Selection {
    /// Every endpoint and network set.
    pub(crate) fn everything() -> Selection {
        Selection {
            selector: Selector::all(),
            scope: Scope::Any,
            sa_names: Vec::new(),
            sa_selector: None,
        }
    }
}

/// What an IP set is made from; equal definitions share one set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SetDef {
    /// Nets minus exceptions (sorted).
    Nets {
        nets: Vec<IpNet>,
        except: Vec<IpNet>,
    },
    /// The addresses of the selected endpoints and network sets.
    Select(Selection),
    /// `(address, protocol, port)` of the selected endpoints' ports of
    /// this name and protocol.
    NamedPort {
        selection: Selection,
        name: String,
        protocol: u8,
    },
}

impl SetDef {
    fn nets(mut nets: Vec<IpNet>, mut except: Vec<IpNet>) -> SetDef {
        nets.sort();
        nets.dedup();
        except.sort();
        except.dedup();
        SetDef::Nets { nets, except }
    }
}

/// A port condition before named ports become sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct IrPorts {
    pub ranges: Vec<(u16, u16)>,
    pub named: Vec<String>,
}

impl IrPorts {
    fn from_ports(ports: &[calico::Port]) -> Option<IrPorts> {
        if ports.is_empty() {
            return None;
        }
        let mut p = IrPorts::default();
        for port in ports {
            match port {
                calico::Port::Range(a, b) => p.ranges.push((*a, *b)),
                calico::Port::Named(n) => p.named.push(n.clone()),
            }
        }
        Some(p)
    }
}

/// One side of a rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct IrSide {
    pub in_sets: Vec<SetDef>,
    pub not_in_sets: Vec<SetDef>,
    pub ports: Option<IrPorts>,
    pub not_ports: Option<IrPorts>,
    /// Whose named ports the names refer to.
    pub named_scope: Option<Selection>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IrRule {
    pub action: RuleAction,
    pub ip_version: Option<u8>,
    pub protocol: Option<u8>,
    pub not_protocol: Option<u8>,
    pub icmp: Option<IcmpMatch>,
    pub not_icmp: Option<IcmpMatch>,
    pub src: IrSide,
    pub dst: IrSide,
    /// The rule's index in the resource (several IR rules may share one:
    /// a Kubernetes rule with several peers or ports).
    pub index: u32,
}

/// Which endpoints a policy applies to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applies {
    pub namespace: Option<String>,
    pub selector: Selector,
    pub namespace_selector: Option<Selector>,
    pub sa_selector: Option<Selector>,
}

/// One policy of any kind.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IrPolicy {
    pub name: PolicyName,
    /// Order in the tier (`None`: last).
    pub order: Option<f64>,
    pub applies: Applies,
    /// `None`: the policy does not apply to ingress.
    pub ingress: Option<Vec<IrRule>>,
    pub egress: Option<Vec<IrRule>>,
}

fn action(a: Action) -> RuleAction {
    match a {
        Action::Allow => RuleAction::Allow,
        Action::Deny => RuleAction::Deny,
        Action::Pass => RuleAction::Pass,
        Action::Log => RuleAction::Log,
    }
}

fn parse_sel(s: Option<&str>) -> Option<Selector> {
    // Validation refused unparsable selectors before they got here; one
    // that still fails selects nothing rather than everything.
    s.map(|s| Selector::parse(s).unwrap_or_else(|_| Selector::parse("!all()").unwrap_or_default()))
}

fn nets(list: &[String]) -> Vec<IpNet> {
    list.iter().filter_map(|n| parse_net(n).ok()).collect()
}

fn icmp(f: Option<calico::IcmpFields>) -> Option<IcmpMatch> {
    let f = f?;
    Some(IcmpMatch {
        icmp_type: u8::try_from(f.icmp_type?).ok()?,
        code: f.code.and_then(|c| u8::try_from(c).ok()),
    })
}

/// Lowers a Calico entity (source or destination) of a policy in
/// `namespace` (`None`: global).
fn entity(e: &EntityRule, namespace: Option<&str>) -> IrSide {
    let mut side = IrSide::default();
    if !e.nets.is_empty() {
        side.in_sets.push(SetDef::nets(nets(&e.nets), Vec::new()));
    }
    if !e.not_nets.is_empty() {
        side.not_in_sets
            .push(SetDef::nets(nets(&e.not_nets), Vec::new()));
    }
    let ns_sel = parse_sel(e.namespace_selector.as_deref());
    let positive = e.selector.is_some()
        || ns_sel.is_some()
        || e.service_accounts.is_some()
        || (namespace.is_some() && e.has_selectors());
    let mut named_scope = Selection::everything();
    if positive {
        let scope = match (ns_sel, namespace) {
            (Some(s), _) => Scope::NamespaceSelector(s),
            (None, Some(ns)) => Scope::Namespace(ns.to_owned()),
            (None, None) => Scope::Any,
        };
        let (mut sa_names, sa_selector) = match &e.service_accounts {
            Some(sa) => (sa.names.clone(), parse_sel(sa.selector.as_deref())),
            None => (Vec::new(), None),
        };
        sa_names.sort();
        sa_names.dedup();
        let selection = Selection {
            selector: parse_sel(e.selector.as_deref()).unwrap_or_default(),
            scope,
            sa_names,
            sa_selector,
        };
        named_scope = selection.clone();
        side.in_sets.push(SetDef::Select(selection));
    }
    if let Some(not) = parse_sel(e.not_selector.as_deref()) {
        side.not_in_sets.push(SetDef::Select(Selection {
            selector: not,
            ..Selection::everything()
        }));
    }
    side.ports = IrPorts::from_ports(&e.ports);
    side.not_ports = IrPorts::from_ports(&e.not_ports);
    side.named_scope = Some(named_scope);
    side
}

fn calico_rules(rules: &[calico::Rule], namespace: Option<&str>) -> Vec<IrRule> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| IrRule {
            action: action(r.action),
            ip_version: r.ip_version,
            protocol: r.protocol.map(|p| p.0),
            not_protocol: r.not_protocol.map(|p| p.0),
            icmp: icmp(r.icmp),
            not_icmp: icmp(r.not_icmp),
            src: entity(&r.source, namespace),
            dst: entity(&r.destination, namespace),
            index: i as u32,
        })
        .collect()
}

/// Calico's default `types`: Ingress unless the policy has only egress
/// rules; Egress when it has egress rules.
fn calico_types(
    types: Option<&[calico::PolicyType]>,
    ingress: &[calico::Rule],
    egress: &[calico::Rule],
) -> (bool, bool) {
    match types {
        Some(t) if !t.is_empty() => (
            t.contains(&calico::PolicyType::Ingress),
            t.contains(&calico::PolicyType::Egress),
        ),
        _ => (!ingress.is_empty() || egress.is_empty(), !egress.is_empty()),
    }
}

/// A Calico `NetworkPolicy`.
pub(crate) fn calico_np(p: &calico::NetworkPolicy) -> IrPolicy {
    let ns = p.metadata.namespace().to_owned();
    let s = &p.spec;
    let (ing, eg) = (
        s.ingress.as_deref().unwrap_or_default(),
        s.egress.as_deref().unwrap_or_default(),
    );
    let (in_on, eg_on) = calico_types(s.types.as_deref(), ing, eg);
    IrPolicy {
        name: PolicyName {
            tier: s.tier.clone().unwrap_or_else(|| DEFAULT_TIER.into()),
            name: format!("{ns}/{}", p.metadata.name),
        },
        order: s.order,
        applies: Applies {
            namespace: Some(ns.clone()),
            selector: parse_sel(s.selector.as_deref()).unwrap_or_default(),
            namespace_selector: None,
            sa_selector: parse_sel(s.service_account_selector.as_deref()),
        },
        ingress: in_on.then(|| calico_rules(ing, Some(&ns))),
        egress: eg_on.then(|| calico_rules(eg, Some(&ns))),
    }
}

/// A Calico `GlobalNetworkPolicy`.
pub(crate) fn calico_gnp(p: &calico::GlobalNetworkPolicy) -> IrPolicy {
    let s = &p.spec;
    let (ing, eg) = (
        s.ingress.as_deref().unwrap_or_default(),
        s.egress.as_deref().unwrap_or_default(),
    );
    let (in_on, eg_on) = calico_types(s.types.as_deref(), ing, eg);
    IrPolicy {
        name: PolicyName {
            tier: s.tier.clone().unwrap_or_else(|| DEFAULT_TIER.into()),
            name: p.metadata.name.clone(),
        },
        order: s.order,
        applies: Applies {
            namespace: None,
            selector: parse_sel(s.selector.as_deref()).unwrap_or_default(),
            namespace_selector: parse_sel(s.namespace_selector.as_deref()),
            sa_selector: parse_sel(s.service_account_selector.as_deref()),
        },
        ingress: in_on.then(|| calico_rules(ing, None)),
        egress: eg_on.then(|| calico_rules(eg, None)),
    }
}

/// A Kubernetes peer: the set its addresses must be in.
fn k8s_peer(peer: &NetworkPolicyPeer, ns: &str) -> (SetDef, Selection) {
    if let Some(block) = &peer.ip_block {
        let def = match block.parsed() {
            Some((cidr, except)) => SetDef::nets(vec![cidr], except),
            // Refused by validation; matches nothing if it ever gets here.
            None => SetDef::nets(Vec::new(), Vec::new()),
        };
        return (def, Selection::everything());
    }
    // Calico's conversion adds `projectcalico.org/orchestrator == 'k8s'`
    // to a Kubernetes peer's pod selector: a peer is only ever pods, never
    // a global network set (which a negative namespace selector such as
    // `NotIn` would otherwise match: a network set has no namespace labels).
    let pods_only = Selector::from_expr(Expr::Eq(
        super::LABEL_ORCHESTRATOR.to_owned(),
        "k8s".to_owned(),
    ));
    let selector = peer
        .pod_selector
        .as_ref()
        .map(k8s::LabelSelector::to_selector)
        .unwrap_or_default()
        .and(&pods_only);
    let scope = match &peer.namespace_selector {
        Some(ns_sel) => Scope::NamespaceSelector(ns_sel.to_selector()),
        None => Scope::Namespace(ns.to_owned()),
    };
    let selection = Selection {
        selector,
        scope,
        sa_names: Vec::new(),
        sa_selector: None,
    };
    (SetDef::Select(selection.clone()), selection)
}

/// A Kubernetes port: protocol, and the port condition.
fn k8s_port(p: &NetworkPolicyPort) -> (u8, Option<IrPorts>) {
    let proto = p.protocol.unwrap_or_default().number();
    let ports = match &p.port {
        None => None,
        Some(IntOrString::Int(n)) => {
            let a = u16::try_from(*n).unwrap_or(0);
            let b = p.end_port.and_then(|e| u16::try_from(e).ok()).unwrap_or(a);
            Some(IrPorts {
                ranges: vec![(a, b)],
                named: Vec::new(),
            })
        }
        Some(IntOrString::String(name)) => Some(IrPorts {
            ranges: Vec::new(),
            named: vec![name.clone()],
        }),
    };
    (proto, ports)
}

/// Kubernetes rules: allowed when (any peer) and (any port) match, as one
/// Allow rule per peer × port.
fn k8s_rules<'a>(
    rules: impl Iterator<
        Item = (
            Option<&'a [NetworkPolicyPeer]>,
            Option<&'a [NetworkPolicyPort]>,
        ),
    >,
    ns: &str,
    ingress: bool,
) -> Vec<IrRule> {
    let mut out = Vec::new();
    for (i, (peers, ports)) in rules.enumerate() {
        let peers: Vec<Option<&NetworkPolicyPeer>> = match peers {
            Some(p) if !p.is_empty() => p.iter().map(Some).collect(),
            _ => vec![None],
        };
        let ports: Vec<Option<&NetworkPolicyPort>> = match ports {
            Some(p) if !p.is_empty() => p.iter().map(Some).collect(),
            _ => vec![None],
        };
        for peer in &peers {
            for port in &ports {
                let mut remote = IrSide::default();
                let mut named_scope = Selection::everything();
                if let Some(peer) = peer {
                    let (def, sel) = k8s_peer(peer, ns);
                    remote.in_sets.push(def);
                    named_scope = sel;
                }
                let (protocol, port_cond) = match port {
                    Some(p) => {
                        let (proto, cond) = k8s_port(p);
                        (Some(proto), cond)
                    }
                    None => (None, None),
                };
                let (src, dst) = if ingress {
                    let local = IrSide {
                        ports: port_cond,
                        named_scope: Some(Selection::everything()),
                        ..IrSide::default()
                    };
                    (remote, local)
                } else {
                    remote.ports = port_cond;
                    remote.named_scope = Some(named_scope);
                    (IrSide::default(), remote)
                };
                out.push(IrRule {
                    action: RuleAction::Allow,
                    ip_version: None,
                    protocol,
                    not_protocol: None,
                    icmp: None,
                    not_icmp: None,
                    src,
                    dst,
                    index: i as u32,
                });
            }
        }
    }
    out
}

/// A Kubernetes `NetworkPolicy`.
pub(crate) fn k8s_np(p: &k8s::NetworkPolicy) -> IrPolicy {
    let ns = p.metadata.namespace().to_owned();
    let s = &p.spec;
    let (in_on, eg_on) = s.applies();
    let ingress = k8s_rules(
        s.ingress
            .iter()
            .flatten()
            .map(|r| (r.from.as_deref(), r.ports.as_deref())),
        &ns,
        true,
    );
    let egress = k8s_rules(
        s.egress
            .iter()
            .flatten()
            .map(|r| (r.to.as_deref(), r.ports.as_deref())),
        &ns,
        false,
    );
    IrPolicy {
        name: PolicyName {
            tier: DEFAULT_TIER.into(),
            name: format!("{ns}/knp.default.{}", p.metadata.name),
        },
        order: Some(KUBERNETES_POLICY_ORDER),
        applies: Applies {
            namespace: Some(ns),
            selector: s.pod_selector.to_selector(),
            namespace_selector: None,
            sa_selector: None,
        },
        ingress: in_on.then_some(ingress),
        egress: eg_on.then_some(egress),
    }
}
