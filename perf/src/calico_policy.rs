//! The kernel-calico scenario's per-endpoint rule set ([`crate::calico`])
//! expressed as Calico policies for the `brindle-policy` scenarios: the
//! same endpoints, the same policies per endpoint and the same set sizes.
//!
//! Per endpoint `i` of `n` (namespace `perf`, pod `ep<i>`, label
//! `ep: e<i>`): ten GlobalNetworkSets `ep<i>{e,i}<pair>` of three
//! addresses each (`10.<100+pair>.<i>.<10+k>`), and one
//! GlobalNetworkPolicy selecting the endpoint with five egress and five
//! ingress Allow rules, as the iptables policy chains `cali-po-_ep<i>` and
//! `cali-pi-_ep<i>` have them: four TCP rules to ports `8000+pair,
//! 9000+pair` matching a set, and last a UDP rule matching the fifth set.
//! The probe's peer sits in that last set of its endpoints (the sink's
//! address in the generator's last egress set, the generator's in the
//! sink's last ingress set), so the probe is allowed by the last rule of
//! each chain, as in the iptables set. The generator is endpoint `n/3`,
//! the sink `2n/3`, the others have addresses of their own that no probe
//! uses. Calico's profile chains are not expressed: with a policy
//! selecting the endpoint, the iptables set never reaches them either
//! (the chain drops when no policy accepted).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::{EndpointKey, Update};
use brindle_policy::resource::parse_documents;

/// The namespace of every endpoint.
pub const NAMESPACE: &str = "perf";

/// Rule pairs per policy chain in the iptables set (the last allows UDP).
const RULES_PER_DIRECTION: usize = 5;

/// The compiled rule set.
#[derive(Clone, Debug)]
pub struct PolicySet {
    /// The compiler's snapshot: what the vrouter gets in one `ApplyPolicy`.
    pub update: Update,
    /// The generator's endpoint (on the router's ingress port).
    pub src: EndpointKey,
    /// The sink's endpoint (on the router's egress port).
    pub dst: EndpointKey,
    /// Policies (one per endpoint).
    pub policies: usize,
    /// Rules over every policy.
    pub rules: usize,
    /// Global network sets.
    pub sets: usize,
}

impl PolicySet {
    /// One line for the report.
    pub fn summary(&self) -> String {
        format!(
            "policy: {} GlobalNetworkPolicies ({} rules, {} per endpoint and direction), {} GlobalNetworkSets of 3 addresses over {} endpoints (the kernel-calico set's policy chains and ipsets), the probe allowed by the last rule of each direction, one ApplyPolicy of generation {} ({} programs, {} sets)",
            self.policies,
            self.rules,
            RULES_PER_DIRECTION,
            self.sets,
            self.policies,
            self.update.generation,
            self.update.programs.len(),
            self.update.sets.len(),
        )
    }
}

/// The index of the generator's and the sink's endpoints among `n`.
pub fn probe_endpoints(n: usize) -> (usize, usize) {
    let n = n.max(2);
    (n / 3, n * 2 / 3)
}

fn endpoint_addr(i: usize, n: usize, src: Ipv4Addr, dst: Ipv4Addr) -> Ipv4Addr {
    let (s, d) = probe_endpoints(n);
    match i {
        _ if i == s => src,
        _ if i == d => dst,
        _ => Ipv4Addr::new(10, 201, 3 + (i / 250) as u8, (i % 250 + 1) as u8),
    }
}

/// The resources as multi-document YAML (what `brindlectl apply -f` takes).
pub fn yaml(n: usize, src: Ipv4Addr, dst: Ipv4Addr) -> String {
    let n = n.max(2);
    let (s_at, d_at) = probe_endpoints(n);
    let last = RULES_PER_DIRECTION - 1;
    let mut y = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n");
    for i in 0..n {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: ep{i}, namespace: {NAMESPACE}, labels: {{ep: e{i}}}}}\n"
        );
        for dir in ["e", "i"] {
            for pair in 0..RULES_PER_DIRECTION {
                let mut nets: Vec<String> = (0..3)
                    .map(|k| format!("10.{}.{}.{}/32", 100 + pair, i, 10 + k))
                    .collect();
                if pair == last && dir == "e" && i == s_at {
                    nets.push(format!("{dst}/32"));
                }
                if pair == last && dir == "i" && i == d_at {
                    nets.push(format!("{src}/32"));
                }
                let _ = write!(
                    y,
                    "---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {{name: ep{i}{dir}{pair}, labels: {{set: ep{i}{dir}{pair}}}}}\nspec: {{nets: [{}]}}\n",
                    nets.join(", ")
                );
            }
        }
        let rules = |dir: &str| {
            let mut r = String::new();
            for pair in 0..RULES_PER_DIRECTION {
                let set = format!("set == \"ep{i}{dir}{pair}\"");
                let (proto, ports) = if pair == last {
                    ("UDP", String::new())
                } else {
                    ("TCP", format!("ports: [{}, {}]", 8000 + pair, 9000 + pair))
                };
                if dir == "e" {
                    let sep = if ports.is_empty() { "" } else { ", " };
                    let _ = write!(
                        r,
                        "  - action: Allow\n    protocol: {proto}\n    destination: {{selector: '{set}'{sep}{ports}}}\n"
                    );
                } else {
                    let _ = write!(
                        r,
                        "  - action: Allow\n    protocol: {proto}\n    source: {{selector: '{set}'}}\n    destination: {{{ports}}}\n"
                    );
                }
            }
            r
        };
        let _ = write!(
            y,
            "---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {{name: ep{i}}}\nspec:\n  selector: ep == \"e{i}\"\n  types: [Ingress, Egress]\n  ingress:\n{}  egress:\n{}",
            rules("i"),
            rules("e")
        );
    }
    y
}

/// Compiles the set for `n` endpoints, the generator's address `src` and
/// the sink's `dst`, as brindle-ctrl would (every endpoint local).
pub fn policy_set(n: usize, src: Ipv4Addr, dst: Ipv4Addr) -> Result<PolicySet, String> {
    let n = n.max(2);
    let resources = parse_documents(&yaml(n, src, dst)).map_err(|e| e.to_string())?;
    let mut changes: Vec<Change> = resources.into_iter().map(Change::Apply).collect();
    for i in 0..n {
        changes.push(Change::Endpoint(
            EndpointKey::new(NAMESPACE, format!("ep{i}")),
            Some(EndpointInfo {
                addrs: vec![IpAddr::V4(endpoint_addr(i, n, src, dst))],
                local: true,
            }),
        ));
    }
    let mut compiler = Compiler::new();
    compiler.apply(changes);
    let (s_at, d_at) = probe_endpoints(n);
    Ok(PolicySet {
        update: compiler.snapshot(),
        src: EndpointKey::new(NAMESPACE, format!("ep{s_at}")),
        dst: EndpointKey::new(NAMESPACE, format!("ep{d_at}")),
        policies: n,
        rules: n * 2 * RULES_PER_DIRECTION,
        sets: n * 2 * RULES_PER_DIRECTION,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 201, 2, 2);

    #[test]
    fn fifty_endpoints_give_the_kernel_calico_sizes() {
        let s = policy_set(50, SRC, DST).expect("compiles");
        assert_eq!(s.policies, 50);
        assert_eq!(s.rules, 500);
        assert_eq!(s.sets, 500);
        assert_eq!(s.update.programs.len(), 50);
        assert!(s.update.sets.len() >= 500, "{}", s.update.sets.len());
        assert_eq!(s.src, EndpointKey::new(NAMESPACE, "ep16"));
        assert_eq!(s.dst, EndpointKey::new(NAMESPACE, "ep33"));
    }

    #[test]
    fn the_probe_passes_both_ends_and_other_traffic_does_not() {
        use brindle_policy::classify::{Packet, PolicyState, classify};
        use brindle_policy::program::Direction;
        let s = policy_set(50, SRC, DST).expect("compiles");
        let mut state = PolicyState::default();
        state
            .apply(&s.update)
            .expect("the vrouter's state takes it");
        let verdict = |key: &EndpointKey, dir: Direction, pkt: &Packet| {
            let ep = state.endpoint(key).expect("a local endpoint has a program");
            classify(&ep.program, dir, state.sets(), pkt).allow
        };
        let probe = Packet::ported(SRC.into(), DST.into(), 17, 10_000, 9);
        assert!(verdict(&s.src, Direction::Egress, &probe));
        assert!(verdict(&s.dst, Direction::Ingress, &probe));
        // TCP to a port no rule names, and UDP to an address in no set.
        let tcp = Packet::ported(SRC.into(), DST.into(), 6, 10_000, 9);
        assert!(!verdict(&s.src, Direction::Egress, &tcp));
        let other = Packet::ported(SRC.into(), Ipv4Addr::new(10, 201, 3, 1).into(), 17, 1, 9);
        assert!(!verdict(&s.src, Direction::Egress, &other));
        let tcp_allowed = Packet::ported(
            SRC.into(),
            Ipv4Addr::new(10, 100, 16, 10).into(),
            6,
            1,
            8000,
        );
        assert!(verdict(&s.src, Direction::Egress, &tcp_allowed));
    }
}
