//! The independent model: a pure function (policies, labels, traffic) →
//! allowed, written from the Kubernetes NetworkPolicy documentation
//! (kubernetes.io/docs/concepts/services-networking/network-policies/ and
//! the API reference) and Calico's policy reference
//! (docs.tigera.io/calico/latest/reference/resources/{networkpolicy,
//! globalnetworkpolicy,tier,globalnetworkset} and the "policy tiers" and
//! "selectors" pages). It shares no code with the crate: its own types,
//! its own selector evaluator, its own address matching, and Kubernetes
//! rules evaluated as Kubernetes states them (not converted to Calico
//! rules as the compiler does).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

pub type Labels = BTreeMap<String, String>;

/// A Calico selector (the model's own tree; [`Sel::render`] writes it in
/// the selector language).
#[derive(Debug, Clone)]
pub enum Sel {
    All,
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Has(String),
    Not(Box<Sel>),
    And(Box<Sel>, Box<Sel>),
    Or(Box<Sel>, Box<Sel>),
}

impl Sel {
    /// "label == value" is true only when the label is present and equal;
    /// "!=" and "not in" are true when the label is absent.
    pub fn eval(&self, l: &Labels) -> bool {
        match self {
            Sel::All => true,
            Sel::Eq(k, v) => l.get(k) == Some(v),
            Sel::Ne(k, v) => l.get(k) != Some(v),
            Sel::In(k, vs) => l.get(k).is_some_and(|x| vs.contains(x)),
            Sel::NotIn(k, vs) => l.get(k).is_none_or(|x| !vs.contains(x)),
            Sel::Has(k) => l.contains_key(k),
            Sel::Not(s) => !s.eval(l),
            Sel::And(a, b) => a.eval(l) && b.eval(l),
            Sel::Or(a, b) => a.eval(l) || b.eval(l),
        }
    }

    pub fn render(&self) -> String {
        let set = |vs: &[String]| {
            vs.iter()
                .map(|v| format!("'{v}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Sel::All => "all()".into(),
            Sel::Eq(k, v) => format!("{k} == '{v}'"),
            Sel::Ne(k, v) => format!("{k} != '{v}'"),
            Sel::In(k, vs) => format!("{k} in {{{}}}", set(vs)),
            Sel::NotIn(k, vs) => format!("{k} not in {{{}}}", set(vs)),
            Sel::Has(k) => format!("has({k})"),
            Sel::Not(s) => format!("!({})", s.render()),
            Sel::And(a, b) => format!("({}) && ({})", a.render(), b.render()),
            Sel::Or(a, b) => format!("({}) || ({})", a.render(), b.render()),
        }
    }
}

/// A Kubernetes label selector: matchLabels and matchExpressions, ANDed;
/// empty selects everything.
#[derive(Debug, Clone, Default)]
pub struct K8sSel {
    pub match_labels: Vec<(String, String)>,
    /// (key, operator: In | NotIn | Exists | DoesNotExist, values)
    pub exprs: Vec<(String, &'static str, Vec<String>)>,
}

impl K8sSel {
    pub fn eval(&self, l: &Labels) -> bool {
        self.match_labels.iter().all(|(k, v)| l.get(k) == Some(v))
            && self.exprs.iter().all(|(k, op, vs)| match *op {
                "In" => l.get(k).is_some_and(|x| vs.contains(x)),
                "NotIn" => l.get(k).is_none_or(|x| !vs.contains(x)),
                "Exists" => l.contains_key(k),
                _ => !l.contains_key(k),
            })
    }
}

/// An IPv4 CIDR.
#[derive(Debug, Clone, Copy)]
pub struct Cidr(pub Ipv4Addr, pub u8);

impl Cidr {
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let mask = if self.1 == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.1))
        };
        u32::from(a) & mask == u32::from(self.0) & mask
    }
}

#[derive(Debug, Clone)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub ip: Ipv4Addr,
    /// The service account (`default` when the pod names none).
    pub service_account: String,
    /// Named container ports: (name, protocol, port).
    pub ports: Vec<(String, u8, u16)>,
}

#[derive(Debug, Clone)]
pub struct NetSet {
    pub name: String,
    pub labels: Labels,
    pub nets: Vec<Cidr>,
}

#[derive(Debug, Clone)]
pub struct Tier {
    pub name: String,
    pub order: f64,
    pub pass_by_default: bool,
}

/// A Kubernetes peer.
#[derive(Debug, Clone)]
pub enum K8sPeer {
    Pods(K8sSel),
    Namespaces(K8sSel),
    Both(K8sSel, K8sSel),
    Block(Cidr, Vec<Cidr>),
}

/// A Kubernetes port: protocol, and a number with an optional end, or a
/// name, or nothing (every port of the protocol).
#[derive(Debug, Clone)]
pub struct K8sPort {
    pub protocol: u8,
    pub port: Option<K8sPortValue>,
}

#[derive(Debug, Clone)]
pub enum K8sPortValue {
    Number(u16, Option<u16>),
    Name(String),
}

/// A Kubernetes rule: peers (empty: everyone) and ports (empty: all).
#[derive(Debug, Clone, Default)]
pub struct K8sRule {
    pub peers: Vec<K8sPeer>,
    pub ports: Vec<K8sPort>,
}

#[derive(Debug, Clone)]
pub struct K8sPolicy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: K8sSel,
    pub policy_types: Option<(bool, bool)>,
    pub ingress: Vec<K8sRule>,
    pub egress: Vec<K8sRule>,
}

/// A Calico rule entity.
#[derive(Debug, Clone, Default)]
pub struct Entity {
    pub nets: Vec<Cidr>,
    pub not_nets: Vec<Cidr>,
    pub selector: Option<Sel>,
    pub not_selector: Option<Sel>,
    /// `Some(None)`: `global()`.
    pub namespace_selector: Option<Option<Sel>>,
    pub ports: Vec<(u16, u16)>,
    /// Named ports (of the destination endpoint).
    pub named_ports: Vec<String>,
    /// serviceAccounts: names (any of; empty: any) and a selector over the
    /// service account's labels.
    pub service_accounts: Option<(Vec<String>, Option<Sel>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    Pass,
    Log,
}

#[derive(Debug, Clone)]
pub struct CalicoRule {
    pub action: Action,
    pub protocol: Option<u8>,
    pub not_protocol: Option<u8>,
    pub icmp_type: Option<u8>,
    pub source: Entity,
    pub destination: Entity,
}

#[derive(Debug, Clone)]
pub struct CalicoPolicy {
    /// `None`: a GlobalNetworkPolicy.
    pub namespace: Option<String>,
    pub name: String,
    pub tier: String,
    pub order: f64,
    pub selector: Sel,
    /// Selects the endpoints by their service account's labels.
    pub sa_selector: Option<Sel>,
    /// GlobalNetworkPolicy only: selects the endpoints by their
    /// namespace's labels.
    pub namespace_selector: Option<Sel>,
    pub types: Option<(bool, bool)>,
    pub ingress: Vec<CalicoRule>,
    pub egress: Vec<CalicoRule>,
}

#[derive(Debug, Clone, Default)]
pub struct World {
    pub namespaces: Vec<Namespace>,
    /// Service accounts' labels, by (namespace, name).
    pub service_accounts: BTreeMap<(String, String), Labels>,
    pub pods: Vec<Pod>,
    pub netsets: Vec<NetSet>,
    pub tiers: Vec<Tier>,
    pub k8s: Vec<K8sPolicy>,
    pub calico: Vec<CalicoPolicy>,
}

/// One packet.
#[derive(Debug, Clone, Copy)]
pub struct Traffic {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub dst_port: u16,
    pub icmp_type: u8,
}

impl Traffic {
    fn ported(&self) -> bool {
        matches!(self.protocol, 6 | 17 | 132)
    }
}

impl World {
    fn ns_labels(&self, ns: &str) -> Labels {
        self.namespaces
            .iter()
            .find(|n| n.name == ns)
            .map(|n| n.labels.clone())
            .unwrap_or_default()
    }

    fn sa_labels(&self, pod: &Pod) -> Labels {
        self.service_accounts
            .get(&(pod.namespace.clone(), pod.service_account.clone()))
            .cloned()
            .unwrap_or_default()
    }

    fn pod_at(&self, ip: Ipv4Addr) -> Option<&Pod> {
        self.pods.iter().find(|p| p.ip == ip)
    }

    /// The verdict for a packet: the sending pod's egress and the receiving
    /// pod's ingress must both allow it (addresses that are no pod have no
    /// policy of their own).
    pub fn allowed(&self, t: &Traffic) -> bool {
        let egress_ok = self
            .pod_at(t.src)
            .is_none_or(|p| self.direction(p, false, t));
        let ingress_ok = self
            .pod_at(t.dst)
            .is_none_or(|p| self.direction(p, true, t));
        egress_ok && ingress_ok
    }

    /// One direction of one pod, as Calico evaluates tiers: tiers in order;
    /// within a tier, policies in order; the first Allow or Deny decides,
    /// Pass skips to the next tier, Log goes on; a tier in which some
    /// policy applies but nothing decided drops (or passes with
    /// `defaultAction: Pass`); no policy at all, or the last tier passed:
    /// allowed. Kubernetes policies sit in the default tier at order 1000.
    fn direction(&self, pod: &Pod, ingress: bool, t: &Traffic) -> bool {
        // (tier order, tier name, policy order, policy name, what it does)
        enum Which<'a> {
            K(&'a K8sPolicy),
            C(&'a CalicoPolicy),
        }
        let mut applicable: Vec<(f64, String, f64, String, Which<'_>)> = Vec::new();
        let tier_of = |name: &str| -> (f64, bool) {
            if name == "default" {
                return (1_000_000.0, false);
            }
            self.tiers
                .iter()
                .find(|x| x.name == name)
                .map(|x| (x.order, x.pass_by_default))
                .unwrap_or((f64::INFINITY, false))
        };
        for p in &self.k8s {
            let (i, e) = p.policy_types.unwrap_or((true, !p.egress.is_empty()));
            let applies_here = if ingress { i } else { e };
            if applies_here && p.namespace == pod.namespace && p.pod_selector.eval(&pod.labels) {
                applicable.push((
                    1_000_000.0,
                    "default".into(),
                    1000.0,
                    format!("{}/knp.default.{}", p.namespace, p.name),
                    Which::K(p),
                ));
            }
        }
        for p in &self.calico {
            let (i, e) = p.types.unwrap_or((
                !p.ingress.is_empty() || p.egress.is_empty(),
                !p.egress.is_empty(),
            ));
            let applies_here = if ingress { i } else { e };
            let in_ns = p.namespace.as_ref().is_none_or(|ns| *ns == pod.namespace)
                && p.namespace_selector
                    .as_ref()
                    .is_none_or(|s| s.eval(&self.ns_labels(&pod.namespace)));
            let sa_ok = p
                .sa_selector
                .as_ref()
                .is_none_or(|s| s.eval(&self.sa_labels(pod)));
            if applies_here && in_ns && p.selector.eval(&pod.labels) && sa_ok {
                let name = match &p.namespace {
                    Some(ns) => format!("{ns}/{}", p.name),
                    None => p.name.clone(),
                };
                applicable.push((
                    tier_of(&p.tier).0,
                    p.tier.clone(),
                    p.order,
                    name,
                    Which::C(p),
                ));
            }
        }
        applicable.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.total_cmp(&b.2))
                .then(a.3.cmp(&b.3))
        });
        let mut i = 0;
        while i < applicable.len() {
            let tier = applicable[i].1.clone();
            let mut decided = None;
            let mut passed = false;
            while i < applicable.len() && applicable[i].1 == tier {
                if decided.is_none() && !passed {
                    match &applicable[i].4 {
                        Which::K(p) => {
                            let rules = if ingress { &p.ingress } else { &p.egress };
                            if rules.iter().any(|r| self.k8s_rule(p, r, ingress, t)) {
                                decided = Some(true);
                            }
                        }
                        Which::C(p) => {
                            let rules = if ingress { &p.ingress } else { &p.egress };
                            for r in rules {
                                if !self.calico_rule(p, r, t) {
                                    continue;
                                }
                                match r.action {
                                    Action::Allow => decided = Some(true),
                                    Action::Deny => decided = Some(false),
                                    Action::Pass => passed = true,
                                    Action::Log => continue,
                                }
                                break;
                            }
                        }
                    }
                }
                i += 1;
            }
            if let Some(d) = decided {
                return d;
            }
            if !passed && !tier_of(&tier).1 {
                return false;
            }
        }
        true
    }

    /// A Kubernetes rule: some peer matches the other side (or there are no
    /// peers) and some port matches (or there are no ports). Named ports
    /// are the destination pod's container ports.
    fn k8s_rule(&self, p: &K8sPolicy, r: &K8sRule, ingress: bool, t: &Traffic) -> bool {
        let other = if ingress { t.src } else { t.dst };
        let peer_ok = r.peers.is_empty()
            || r.peers.iter().any(|peer| match peer {
                K8sPeer::Block(c, except) => {
                    c.contains(other) && !except.iter().any(|e| e.contains(other))
                }
                K8sPeer::Pods(ps) => self
                    .pod_at(other)
                    .is_some_and(|o| o.namespace == p.namespace && ps.eval(&o.labels)),
                K8sPeer::Namespaces(ns) => self
                    .pod_at(other)
                    .is_some_and(|o| ns.eval(&self.ns_labels_k8s(&o.namespace))),
                K8sPeer::Both(ns, ps) => self.pod_at(other).is_some_and(|o| {
                    ns.eval(&self.ns_labels_k8s(&o.namespace)) && ps.eval(&o.labels)
                }),
            });
        let port_ok = r.ports.is_empty()
            || r.ports.iter().any(|port| {
                port.protocol == t.protocol
                    && match &port.port {
                        None => true,
                        Some(K8sPortValue::Number(a, end)) => {
                            t.ported() && *a <= t.dst_port && t.dst_port <= end.unwrap_or(*a)
                        }
                        Some(K8sPortValue::Name(n)) => self.pod_at(t.dst).is_some_and(|d| {
                            d.ports.iter().any(|(pn, pp, num)| {
                                pn == n && *pp == t.protocol && *num == t.dst_port
                            })
                        }),
                    }
            });
        peer_ok && port_ok
    }

    fn ns_labels_k8s(&self, ns: &str) -> Labels {
        // The API server labels every namespace with its name.
        let mut l = self.ns_labels(ns);
        l.insert("kubernetes.io/metadata.name".into(), ns.into());
        l
    }

    fn calico_rule(&self, p: &CalicoPolicy, r: &CalicoRule, t: &Traffic) -> bool {
        if r.protocol.is_some_and(|x| x != t.protocol) {
            return false;
        }
        if r.not_protocol.is_some_and(|x| x == t.protocol) {
            return false;
        }
        if r.icmp_type
            .is_some_and(|x| t.protocol != 1 || x != t.icmp_type)
        {
            return false;
        }
        self.entity(p, &r.source, t.src, None) && self.entity(p, &r.destination, t.dst, Some(t))
    }

    /// A Calico entity against one address (and, for the destination, the
    /// port). In a namespaced policy, a side that uses any selector only
    /// matches endpoints of the policy's namespace unless it has a
    /// namespaceSelector; `global()` as namespaceSelector selects global
    /// network sets; a GlobalNetworkPolicy's selector matches endpoints of
    /// every namespace and global network sets. notSelector excludes every
    /// endpoint and network set it matches.
    fn entity(&self, p: &CalicoPolicy, e: &Entity, addr: Ipv4Addr, t: Option<&Traffic>) -> bool {
        if !e.nets.is_empty() && !e.nets.iter().any(|c| c.contains(addr)) {
            return false;
        }
        if e.not_nets.iter().any(|c| c.contains(addr)) {
            return false;
        }
        let any_selector = e.selector.is_some()
            || e.not_selector.is_some()
            || e.namespace_selector.is_some()
            || e.service_accounts.is_some();
        let scoped = e.selector.is_some()
            || e.namespace_selector.is_some()
            || e.service_accounts.is_some()
            || (p.namespace.is_some() && any_selector);
        // Whether the pod at the address (if any) is one the entity selects:
        // named ports are those of the selected endpoints only.
        let mut pod_selected = true;
        if scoped {
            let sel = e.selector.clone().unwrap_or(Sel::All);
            let pod_ok = self.pod_at(addr).is_some_and(|o| {
                let ns_ok = match (&e.namespace_selector, &p.namespace) {
                    (Some(Some(ns_sel)), _) => ns_sel.eval(&self.ns_labels(&o.namespace)),
                    (Some(None), _) => false,
                    (None, Some(ns)) => o.namespace == *ns,
                    (None, None) => true,
                };
                let sa_ok = e.service_accounts.as_ref().is_none_or(|(names, sa_sel)| {
                    (names.is_empty() || names.contains(&o.service_account))
                        && sa_sel.as_ref().is_none_or(|s| s.eval(&self.sa_labels(o)))
                });
                ns_ok && sel.eval(&o.labels) && sa_ok
            });
            // A network set has no service account.
            let set_ok = match (&e.namespace_selector, &p.namespace) {
                _ if e.service_accounts.is_some() => false,
                (Some(None), _) | (None, None) => self
                    .netsets
                    .iter()
                    .any(|s| sel.eval(&s.labels) && s.nets.iter().any(|c| c.contains(addr))),
                _ => false,
            };
            if !pod_ok && !set_ok {
                return false;
            }
            pod_selected = pod_ok;
        }
        if let Some(not) = &e.not_selector {
            let hit_pod = self.pod_at(addr).is_some_and(|o| not.eval(&o.labels));
            let hit_set = self
                .netsets
                .iter()
                .any(|s| not.eval(&s.labels) && s.nets.iter().any(|c| c.contains(addr)));
            if hit_pod || hit_set {
                return false;
            }
        }
        if !e.ports.is_empty() || !e.named_ports.is_empty() {
            // A named port is the container port of that name and the
            // packet's protocol of a destination endpoint the entity selects.
            let Some(t) = t else { return false };
            let numbered = e
                .ports
                .iter()
                .any(|(a, b)| *a <= t.dst_port && t.dst_port <= *b);
            let named = pod_selected
                && self.pod_at(addr).is_some_and(|o| {
                    o.ports.iter().any(|(n, proto, num)| {
                        e.named_ports.contains(n) && *proto == t.protocol && *num == t.dst_port
                    })
                });
            if !t.ported() || !(numbered || named) {
                return false;
            }
        }
        true
    }
}
