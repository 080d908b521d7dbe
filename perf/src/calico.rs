//! A Calico-style iptables rule set for the "kernel + conntrack + Calico"
//! anchor: what Calico's standard (iptables) dataplane installs for N
//! workload endpoints, in its shape. Per endpoint a from-workload and a
//! to-workload chain (conntrack accept/drop, mark reset, anti-IPIP/VXLAN,
//! policy then profile chains with mark-based returns, default drop), one
//! egress and one ingress policy chain matching ipsets, dispatch chains on
//! the interface name, and mark-based accepts in `cali-FORWARD`.
//!
//! The probe flow goes from the endpoint on [`crate::topo::ROUTER_IN`] to
//! the one on [`crate::topo::ROUTER_OUT`]; both sit in the middle of the
//! dispatch order, and the rules that allow the flow are the last of their
//! policy chains, so a frame walks a realistic share of the set (count in
//! [`RuleSet::walked`]). UDP without replies stays conntrack NEW, so every
//! frame walks it: the figure is the per-packet cost of the rules.
//!
//! Everything lives in the router's namespace; deleting it removes rules,
//! sets and conntrack entries. [`RuleSet::removal`] also removes them
//! explicitly.

use std::fmt::Write;
use std::net::Ipv4Addr;

/// The generated scripts.
#[derive(Clone, Debug)]
pub struct RuleSet {
    /// Input for `ipset restore`.
    pub ipsets: String,
    /// Input for `iptables-restore --noflush`.
    pub iptables: String,
    /// Number of rules (`-A` lines).
    pub rules: usize,
    /// Number of ipsets.
    pub sets: usize,
    /// Rules a probe frame is matched against on its way through.
    pub walked: usize,
}

/// Rules of each policy chain: pairs of (set-matching MARK, mark RETURN).
const POLICY_RULE_PAIRS: usize = 5;

/// Builds the rule set for `endpoints` workload interfaces, with the
/// generator's and sink's router ports (`src_if`, `dst_if`) among them.
pub fn rule_set(
    endpoints: usize,
    src_if: &str,
    dst_if: &str,
    src: Ipv4Addr,
    dst: Ipv4Addr,
) -> RuleSet {
    let endpoints = endpoints.max(2);
    let src_at = endpoints / 3;
    let dst_at = endpoints * 2 / 3;
    let names: Vec<String> = (0..endpoints)
        .map(|i| match i {
            _ if i == src_at => src_if.to_owned(),
            _ if i == dst_at => dst_if.to_owned(),
            // Calico names: "cali" + 11 hex digits of a hash of the workload.
            _ => format!(
                "cali{:011x}",
                (0x5eed_0000_0000u64 + (i as u64) * 0x9e37_79b9) & 0xfff_ffff_ffff
            ),
        })
        .collect();
    let mut sets = String::new();
    let mut rules: Vec<String> = Vec::new();
    let mut chains: Vec<String> = vec![
        "cali-FORWARD".into(),
        "cali-from-wl-dispatch".into(),
        "cali-to-wl-dispatch".into(),
    ];
    let mut set_count = 0;
    // The address every endpoint's policy sets hold: the peer pods of this
    // namespace. The probe's peers are in the sets of the last rule pair.
    for i in 0..endpoints {
        for dir in ["e", "i"] {
            for pair in 0..POLICY_RULE_PAIRS {
                let _ = writeln!(
                    sets,
                    "create cali40s:ep{i}{dir}{pair} hash:net family inet hashsize 64 maxelem 1048576"
                );
                for k in 0..3 {
                    let _ = writeln!(
                        sets,
                        "add cali40s:ep{i}{dir}{pair} 10.{}.{}.{}/32",
                        100 + pair,
                        i,
                        10 + k
                    );
                }
                set_count += 1;
            }
        }
    }
    // The probe's addresses go into the last set of its endpoints.
    let last = POLICY_RULE_PAIRS - 1;
    let _ = writeln!(sets, "add cali40s:ep{src_at}e{last} {dst}/32");
    let _ = writeln!(sets, "add cali40s:ep{dst_at}i{last} {src}/32");

    let r = |rules: &mut Vec<String>, s: String| rules.push(s);
    r(
        &mut rules,
        "-A FORWARD -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD".into(),
    );
    r(&mut rules, "-A cali-FORWARD -m comment --comment \"cali:vjrMJCRpqwy5oRoX\" -j MARK --set-xmark 0x0/0xe0000".into());
    r(&mut rules, "-A cali-FORWARD -m comment --comment \"cali:A_sPAO0mcxbT9mOV\" -m mark --mark 0x0/0x10000 -m conntrack --ctstate INVALID -j DROP".into());
    r(&mut rules, "-A cali-FORWARD -i cali+ -m comment --comment \"cali:8ZoYfO5HKXWbB3pk\" -j cali-from-wl-dispatch".into());
    r(&mut rules, "-A cali-FORWARD -o cali+ -m comment --comment \"cali:jdEuaPBe14V2hutn\" -j cali-to-wl-dispatch".into());
    r(&mut rules, "-A cali-FORWARD -m comment --comment \"cali:MH9kMp5aNICL-Olv\" -m mark --mark 0x10000/0x10000 -j ACCEPT".into());
    for (i, n) in names.iter().enumerate() {
        r(
            &mut rules,
            format!(
                "-A cali-from-wl-dispatch -i {n} -m comment --comment \"cali:dispatch-fw-{i}\" -g cali-fw-{n}"
            ),
        );
    }
    r(
        &mut rules,
        "-A cali-from-wl-dispatch -m comment --comment \"cali:Unknown interface\" -j DROP".into(),
    );
    for (i, n) in names.iter().enumerate() {
        r(
            &mut rules,
            format!(
                "-A cali-to-wl-dispatch -o {n} -m comment --comment \"cali:dispatch-tw-{i}\" -g cali-tw-{n}"
            ),
        );
    }
    r(
        &mut rules,
        "-A cali-to-wl-dispatch -m comment --comment \"cali:Unknown interface\" -j DROP".into(),
    );
    for (i, n) in names.iter().enumerate() {
        for (prefix, dir, pol, matchdir) in [("fw", "e", "po", "dst"), ("tw", "i", "pi", "src")] {
            let chain = format!("cali-{prefix}-{n}");
            let policy = format!("cali-{pol}-_ep{i}");
            let profile = format!(
                "cali-pr{}-kns.ns{}",
                if dir == "e" { "o" } else { "i" },
                i % 10
            );
            chains.push(chain.clone());
            chains.push(policy.clone());
            if i < 10 {
                chains.push(profile.clone());
            }
            let c = &chain;
            r(
                &mut rules,
                format!("-A {c} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
            );
            r(
                &mut rules,
                format!("-A {c} -m conntrack --ctstate INVALID -j DROP"),
            );
            r(
                &mut rules,
                format!("-A {c} -j MARK --set-xmark 0x0/0x10000"),
            );
            if prefix == "fw" {
                r(
                    &mut rules,
                    format!(
                        "-A {c} -p udp -m udp --dport 4789 -m comment --comment \"cali:Drop VXLAN encapped packets originating in workloads\" -j DROP"
                    ),
                );
                r(
                    &mut rules,
                    format!(
                        "-A {c} -p 4 -m comment --comment \"cali:Drop IPinIP encapped packets originating in workloads\" -j DROP"
                    ),
                );
            }
            r(
                &mut rules,
                format!(
                    "-A {c} -m comment --comment \"cali:Start of policies\" -j MARK --set-xmark 0x0/0x20000"
                ),
            );
            r(
                &mut rules,
                format!("-A {c} -m mark --mark 0x0/0x20000 -j {policy}"),
            );
            r(
                &mut rules,
                format!(
                    "-A {c} -m mark --mark 0x10000/0x10000 -m comment --comment \"cali:Return if policy accepted\" -j RETURN"
                ),
            );
            r(
                &mut rules,
                format!(
                    "-A {c} -m mark --mark 0x0/0x20000 -m comment --comment \"cali:Drop if no policies passed packet\" -j DROP"
                ),
            );
            r(&mut rules, format!("-A {c} -j {profile}"));
            r(
                &mut rules,
                format!(
                    "-A {c} -m mark --mark 0x10000/0x10000 -m comment --comment \"cali:Return if profile accepted\" -j RETURN"
                ),
            );
            r(
                &mut rules,
                format!("-A {c} -m comment --comment \"cali:Drop if no profiles matched\" -j DROP"),
            );
            for pair in 0..POLICY_RULE_PAIRS {
                let set = format!("cali40s:ep{i}{dir}{pair}");
                let l4 = if pair == POLICY_RULE_PAIRS - 1 {
                    "-p udp".to_owned()
                } else {
                    format!(
                        "-p tcp -m multiport --dports {},{}",
                        8000 + pair,
                        9000 + pair
                    )
                };
                r(
                    &mut rules,
                    format!(
                        "-A {policy} {l4} -m set --match-set {set} {matchdir} -j MARK --set-xmark 0x10000/0x10000"
                    ),
                );
                r(
                    &mut rules,
                    format!("-A {policy} -m mark --mark 0x10000/0x10000 -j RETURN"),
                );
            }
            if i < 10 {
                r(
                    &mut rules,
                    format!(
                        "-A {profile} -m set --match-set cali40s:ep{i}{dir}0 {matchdir} -j MARK --set-xmark 0x10000/0x10000"
                    ),
                );
                r(
                    &mut rules,
                    format!("-A {profile} -m mark --mark 0x10000/0x10000 -j RETURN"),
                );
            }
        }
    }
    let mut iptables = String::from("*filter\n");
    for c in &chains {
        let _ = writeln!(iptables, ":{c} - [0:0]");
    }
    for rule in &rules {
        iptables.push_str(rule);
        iptables.push('\n');
    }
    iptables.push_str("COMMIT\n");
    // FORWARD 1, cali-FORWARD up to the from dispatch (4), dispatch up to
    // the source (src_at + 1), its fw chain (9 up to the policy jump, then
    // 2 after the return), the policy chain (all pairs), back in
    // cali-FORWARD (1), the to dispatch (dst_at + 1), its tw chain (7 + 2),
    // its policy chain.
    let per_policy = 2 * POLICY_RULE_PAIRS - 1;
    let walked = 1 + 4 + (src_at + 1) + 7 + per_policy + 1 + (dst_at + 1) + 5 + per_policy;
    RuleSet {
        ipsets: sets,
        iptables,
        rules: rules.len(),
        sets: set_count,
        walked,
    }
}

impl RuleSet {
    /// Script for `iptables-restore` that removes the rule set again.
    pub fn removal() -> &'static str {
        "*filter\n:FORWARD ACCEPT [0:0]\n-F\n-X\nCOMMIT\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> RuleSet {
        rule_set(
            50,
            "cali0ge0000001",
            "cali0si0000002",
            Ipv4Addr::new(10, 201, 1, 2),
            Ipv4Addr::new(10, 201, 2, 2),
        )
    }

    #[test]
    fn fifty_endpoints_give_about_2300_rules_in_calico_shape() {
        let s = set();
        assert!((2_100..=2_500).contains(&s.rules), "{} rules", s.rules);
        assert_eq!(
            s.rules,
            s.iptables.lines().filter(|l| l.starts_with("-A ")).count()
        );
        assert_eq!(s.sets, 50 * 2 * POLICY_RULE_PAIRS);
        assert!((36..=90).contains(&s.walked), "walked {}", s.walked);
        assert!(s.iptables.starts_with("*filter\n") && s.iptables.ends_with("COMMIT\n"));
        for needle in [
            "-A cali-from-wl-dispatch -i cali0ge0000001",
            "-A cali-to-wl-dispatch -o cali0si0000002",
            "--ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-m mark --mark 0x10000/0x10000 -j ACCEPT",
            "-m set --match-set cali40s:ep16e4 dst",
        ] {
            assert!(s.iptables.contains(needle), "missing {needle}");
        }
    }

    #[test]
    fn the_probe_addresses_are_in_the_last_policy_sets_of_its_endpoints() {
        let s = set();
        assert!(s.ipsets.contains("add cali40s:ep16e4 10.201.2.2/32"));
        assert!(s.ipsets.contains("add cali40s:ep33i4 10.201.1.2/32"));
    }

    #[test]
    fn interface_names_fit_ifnamsiz() {
        let s = set();
        for l in s.iptables.lines() {
            let words: Vec<&str> = l.split_whitespace().collect();
            for w in words.windows(2).filter(|w| w[0] == "-i" || w[0] == "-o") {
                assert!(w[1].len() <= 15, "{} in {l}", w[1]);
            }
        }
    }

    #[test]
    fn every_jump_target_is_declared() {
        let s = set();
        let declared: std::collections::HashSet<&str> = s
            .iptables
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for l in s.iptables.lines().filter(|l| l.starts_with("-A ")) {
            let words: Vec<&str> = l.split_whitespace().collect();
            if let Some(p) = words.iter().position(|w| *w == "-j" || *w == "-g") {
                let target = words[p + 1];
                if !["ACCEPT", "DROP", "RETURN", "MARK"].contains(&target) {
                    assert!(declared.contains(target), "{target} undeclared in {l}");
                }
            }
        }
    }
}
