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
//! Beside the filter table, the static chains Calico's iptables dataplane
//! installs in raw, mangle and nat (felix/rules/static.go): raw
//! `cali-PREROUTING` clears Calico's mark bits, takes VXLAN out of
//! conntrack, marks frames from `cali+` interfaces, skips or applies the
//! strict RPF check on that mark and sends the rest to the (empty)
//! host-endpoint dispatch; mangle `cali-PREROUTING` accepts established
//! flows and what raw accepted, `cali-POSTROUTING` returns on the accept
//! mark; nat `cali-nat-outgoing` masquerades pool addresses leaving every
//! pool (`cali40masq-ipam-pools`, `cali40all-ipam-pools`). The failsafe
//! chains (raw and mangle, the default failsafe ports) are installed as
//! Calico installs them, reached only from host-endpoint chains. These
//! tables hold no per-workload rules in Calico either: workloads are
//! matched by the `cali+` wildcard there, per endpoint only in filter.
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
    /// Input for `iptables-restore --noflush`: raw, mangle, nat, filter.
    pub iptables: String,
    /// Number of rules (`-A` lines), every table.
    pub rules: usize,
    /// Rules per table, in script order: ("raw", n), ("mangle", n),
    /// ("nat", n), ("filter", n).
    pub per_table: Vec<(&'static str, usize)>,
    /// Number of ipsets.
    pub sets: usize,
    /// Rules a probe frame is matched against on its way through, every
    /// table (nat only sees a flow's first frame and is not counted).
    pub walked: usize,
}

/// Calico's mark bits (its default `IptablesMarkMask` 0xffff0000): accept,
/// pass, scratch 0 (here: "from a workload") and all four together.
const MARK_ACCEPT: &str = "0x10000";
const MARK_SCRATCH0: &str = "0x40000";
const MARK_ALL: &str = "0xf0000";

/// Calico's default failsafe ports (FailsafeInboundHostPorts and
/// FailsafeOutboundHostPorts).
const FAILSAFE_IN: [(&str, u16); 9] = [
    ("tcp", 22),
    ("udp", 68),
    ("tcp", 179),
    ("tcp", 2379),
    ("tcp", 2380),
    ("tcp", 5473),
    ("tcp", 6443),
    ("tcp", 6666),
    ("tcp", 6667),
];
const FAILSAFE_OUT: [(&str, u16); 9] = [
    ("udp", 53),
    ("udp", 67),
    ("tcp", 179),
    ("tcp", 2379),
    ("tcp", 2380),
    ("tcp", 5473),
    ("tcp", 6443),
    ("tcp", 6666),
    ("tcp", 6667),
];

/// One table of an `iptables-restore` script.
struct Table {
    name: &'static str,
    chains: Vec<String>,
    rules: Vec<String>,
}

impl Table {
    fn new(name: &'static str, chains: &[&str]) -> Table {
        Table {
            name,
            chains: chains.iter().map(|c| (*c).to_owned()).collect(),
            rules: Vec::new(),
        }
    }

    fn rule(&mut self, chain: &str, spec: &str) {
        self.rules.push(format!("-A {chain} {spec}"));
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "*{}", self.name);
        for c in &self.chains {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for r in &self.rules {
            out.push_str(r);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
}

fn failsafe_chains(t: &mut Table) {
    for (chain, ports) in [
        ("cali-failsafe-in", &FAILSAFE_IN),
        ("cali-failsafe-out", &FAILSAFE_OUT),
    ] {
        for (proto, port) in ports {
            t.rule(
                chain,
                &format!("-p {proto} -m {proto} --dport {port} -j ACCEPT"),
            );
        }
    }
}

/// Calico's raw table: mark workload traffic, strict RPF for it, untracked
/// VXLAN, host-endpoint dispatch (empty: no host endpoints) for the rest.
/// Returns the table and the rules a forwarded probe from a workload walks.
fn raw_table(vxlan_port: u16) -> (Table, usize) {
    let mut t = Table::new(
        "raw",
        &[
            "cali-PREROUTING",
            "cali-OUTPUT",
            "cali-rpf-skip",
            "cali-from-host-endpoint",
            "cali-to-host-endpoint",
            "cali-failsafe-in",
            "cali-failsafe-out",
        ],
    );
    t.rule(
        "PREROUTING",
        "-m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING",
    );
    t.rule(
        "OUTPUT",
        "-m comment --comment \"cali:tVnHkvAo15HuiPy0\" -j cali-OUTPUT",
    );
    let pre = "cali-PREROUTING";
    t.rule(pre, &format!("-j MARK --set-xmark 0x0/{MARK_ALL}"));
    t.rule(
        pre,
        &format!("-p udp -m udp --dport {vxlan_port} -j NOTRACK"),
    );
    t.rule(
        pre,
        &format!("-i cali+ -j MARK --set-xmark {MARK_SCRATCH0}/{MARK_SCRATCH0}"),
    );
    t.rule(
        pre,
        &format!("-m mark --mark {MARK_SCRATCH0}/{MARK_SCRATCH0} -j cali-rpf-skip"),
    );
    t.rule(
        pre,
        &format!(
            "-m mark --mark {MARK_SCRATCH0}/{MARK_SCRATCH0} -m rpfilter --validmark --invert -j DROP"
        ),
    );
    t.rule(
        pre,
        &format!("-m mark --mark 0x0/{MARK_SCRATCH0} -j cali-from-host-endpoint"),
    );
    t.rule(
        pre,
        &format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j ACCEPT"),
    );
    let out = "cali-OUTPUT";
    t.rule(out, &format!("-j MARK --set-xmark 0x0/{MARK_ALL}"));
    t.rule(out, "-j cali-to-host-endpoint");
    t.rule(
        out,
        &format!("-p udp -m udp --dport {vxlan_port} -j NOTRACK"),
    );
    t.rule(
        out,
        &format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j ACCEPT"),
    );
    failsafe_chains(&mut t);
    // PREROUTING's jump and all seven of cali-PREROUTING (the two chains it
    // may enter are empty or not entered).
    (t, 1 + 7)
}

/// Calico's mangle table: established flows and raw-accepted frames leave
/// at once; host-endpoint dispatch (empty); POSTROUTING returns on the
/// accept mark the filter table set.
fn mangle_table() -> (Table, usize) {
    let mut t = Table::new(
        "mangle",
        &[
            "cali-PREROUTING",
            "cali-POSTROUTING",
            "cali-from-host-endpoint",
            "cali-to-host-endpoint",
            "cali-failsafe-in",
            "cali-failsafe-out",
        ],
    );
    t.rule(
        "PREROUTING",
        "-m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING",
    );
    t.rule(
        "POSTROUTING",
        "-m comment --comment \"cali:O3lYWMrLQYEMJtB5\" -j cali-POSTROUTING",
    );
    let pre = "cali-PREROUTING";
    t.rule(pre, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT");
    t.rule(
        pre,
        &format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j ACCEPT"),
    );
    t.rule(pre, "-j cali-from-host-endpoint");
    t.rule(
        pre,
        &format!(
            "-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -m comment --comment \"cali:Host endpoint policy accepted packet.\" -j ACCEPT"
        ),
    );
    let post = "cali-POSTROUTING";
    t.rule(
        post,
        &format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"),
    );
    t.rule(post, &format!("-j MARK --set-xmark 0x0/{MARK_ALL}"));
    t.rule(post, "-m conntrack --ctstate DNAT -j cali-to-host-endpoint");
    t.rule(
        post,
        &format!(
            "-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -m comment --comment \"cali:Host endpoint policy accepted packet.\" -j RETURN"
        ),
    );
    failsafe_chains(&mut t);
    // PREROUTING (1 + 4), POSTROUTING (1 + 1: the filter table accepted
    // the probe by setting the accept mark).
    (t, 5 + 2)
}

/// Calico's nat table: floating-IP chains (empty), NAT-outgoing for pool
/// addresses leaving every pool, MASQUERADE of host-sourced tunnel traffic.
fn nat_table() -> Table {
    let mut t = Table::new(
        "nat",
        &[
            "cali-PREROUTING",
            "cali-POSTROUTING",
            "cali-OUTPUT",
            "cali-fip-dnat",
            "cali-fip-snat",
            "cali-nat-outgoing",
        ],
    );
    t.rule(
        "PREROUTING",
        "-m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING",
    );
    t.rule(
        "POSTROUTING",
        "-m comment --comment \"cali:O3lYWMrLQYEMJtB5\" -j cali-POSTROUTING",
    );
    t.rule(
        "OUTPUT",
        "-m comment --comment \"cali:tVnHkvAo15HuiPy0\" -j cali-OUTPUT",
    );
    t.rule("cali-PREROUTING", "-j cali-fip-dnat");
    t.rule("cali-OUTPUT", "-j cali-fip-dnat");
    t.rule("cali-POSTROUTING", "-j cali-fip-snat");
    t.rule("cali-POSTROUTING", "-j cali-nat-outgoing");
    t.rule(
        "cali-POSTROUTING",
        "-o vxlan.calico -m addrtype ! --src-type LOCAL --limit-iface-out -m addrtype --src-type LOCAL -j MASQUERADE --random-fully",
    );
    t.rule(
        "cali-nat-outgoing",
        "-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully",
    );
    t
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
    // The IPAM pool (every pod address of the run) for NAT-outgoing, and
    // this host's addresses, as Calico keeps them.
    for (set, kind, members) in [
        (
            "cali40all-ipam-pools",
            "hash:net",
            &["10.201.0.0/16", "10.100.0.0/14"][..],
        ),
        (
            "cali40masq-ipam-pools",
            "hash:net",
            &["10.201.0.0/16", "10.100.0.0/14"][..],
        ),
        (
            "cali40this-host",
            "hash:ip",
            &["10.201.1.1", "10.201.2.1", "127.0.0.1"][..],
        ),
    ] {
        let _ = writeln!(
            sets,
            "create {set} {kind} family inet hashsize 1024 maxelem 1048576"
        );
        for m in members {
            let _ = writeln!(sets, "add {set} {m}");
        }
        set_count += 1;
    }
    let (raw, raw_walked) = raw_table(4789);
    let (mangle, mangle_walked) = mangle_table();
    let nat = nat_table();
    let filter = Table {
        name: "filter",
        chains,
        rules,
    };
    let mut iptables = String::new();
    for t in [&raw, &mangle, &nat, &filter] {
        t.render(&mut iptables);
    }
    let per_table: Vec<(&'static str, usize)> = [&raw, &mangle, &nat, &filter]
        .iter()
        .map(|t| (t.name, t.rules.len()))
        .collect();
    // FORWARD 1, cali-FORWARD up to the from dispatch (4), dispatch up to
    // the source (src_at + 1), its fw chain (9 up to the policy jump, then
    // 2 after the return), the policy chain (all pairs), back in
    // cali-FORWARD (1), the to dispatch (dst_at + 1), its tw chain (7 + 2),
    // its policy chain.
    let per_policy = 2 * POLICY_RULE_PAIRS - 1;
    let walked_filter = 1 + 4 + (src_at + 1) + 7 + per_policy + 1 + (dst_at + 1) + 5 + per_policy;
    RuleSet {
        ipsets: sets,
        iptables,
        rules: per_table.iter().map(|(_, n)| n).sum(),
        per_table,
        sets: set_count,
        walked: walked_filter + raw_walked + mangle_walked,
    }
}

impl RuleSet {
    /// Script for `iptables-restore` that removes the rule set again.
    pub fn removal() -> &'static str {
        "*raw\n-F\n-X\nCOMMIT\n*mangle\n-F\n-X\nCOMMIT\n*nat\n-F\n-X\nCOMMIT\n*filter\n:FORWARD ACCEPT [0:0]\n-F\n-X\nCOMMIT\n"
    }

    /// "raw 31, mangle 28, nat 9, filter 2248".
    pub fn per_table_summary(&self) -> String {
        self.per_table
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
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
        assert_eq!(s.sets, 50 * 2 * POLICY_RULE_PAIRS + 3);
        assert!((36..=120).contains(&s.walked), "walked {}", s.walked);
        assert!(s.iptables.starts_with("*raw\n") && s.iptables.ends_with("COMMIT\n"));
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

    /// The rules of `table` in the script.
    fn table<'a>(s: &'a RuleSet, table: &str) -> Vec<&'a str> {
        let start = format!("*{table}");
        s.iptables
            .lines()
            .skip_while(|l| *l != start)
            .take_while(|l| *l != "COMMIT")
            .filter(|l| l.starts_with("-A "))
            .collect()
    }

    #[test]
    fn every_table_is_there_and_counted() {
        let s = set();
        let names: Vec<&str> = s.per_table.iter().map(|(t, _)| *t).collect();
        assert_eq!(names, ["raw", "mangle", "nat", "filter"]);
        for (t, n) in &s.per_table {
            assert_eq!(table(&s, t).len(), *n, "{t}");
        }
        assert_eq!(s.iptables.matches("COMMIT\n").count(), 4);
        assert_eq!(
            s.per_table_summary(),
            format!(
                "raw {}, mangle {}, nat {}, filter {}",
                s.per_table[0].1, s.per_table[1].1, s.per_table[2].1, s.per_table[3].1
            )
        );
    }

    #[test]
    fn raw_marks_workload_traffic_and_checks_rpf_on_that_mark() {
        let s = set();
        let raw = table(&s, "raw");
        let pre: Vec<&&str> = raw
            .iter()
            .filter(|r| r.starts_with("-A cali-PREROUTING "))
            .collect();
        // Clear the marks first, then mark cali+ traffic, then RPF on it.
        assert!(pre[0].contains("--set-xmark 0x0/0xf0000"), "{}", pre[0]);
        let mark = pre.iter().position(|r| r.contains("-i cali+")).unwrap();
        let rpf = pre.iter().position(|r| r.contains("rpfilter")).unwrap();
        assert!(mark < rpf);
        assert!(pre[rpf].contains("--mark 0x40000/0x40000") && pre[rpf].ends_with("-j DROP"));
        assert!(raw.iter().any(|r| r.contains("--dport 4789 -j NOTRACK")));
        assert!(raw.contains(
            &"-A PREROUTING -m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING"
        ));
        assert!(
            raw.iter()
                .any(|r| r.starts_with("-A cali-failsafe-in -p tcp -m tcp --dport 22 "))
        );
    }

    #[test]
    fn mangle_accepts_established_and_nat_masquerades_only_leaving_the_pools() {
        let s = set();
        let mangle = table(&s, "mangle");
        assert_eq!(
            mangle
                .iter()
                .find(|r| r.starts_with("-A cali-PREROUTING "))
                .copied(),
            Some("-A cali-PREROUTING -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
        );
        assert!(mangle.contains(&"-A cali-POSTROUTING -m mark --mark 0x10000/0x10000 -j RETURN"));
        let nat = table(&s, "nat");
        let masq: Vec<&&str> = nat
            .iter()
            .filter(|r| r.starts_with("-A cali-nat-outgoing "))
            .collect();
        assert_eq!(masq.len(), 1);
        assert!(masq[0].contains("--match-set cali40masq-ipam-pools src"));
        assert!(masq[0].contains("! --match-set cali40all-ipam-pools dst"));
        // The probe (10.201.1.2 -> 10.201.2.2) stays inside the pools: no NAT.
        assert!(s.ipsets.contains("add cali40all-ipam-pools 10.201.0.0/16"));
        assert!(s.ipsets.contains("add cali40masq-ipam-pools 10.201.0.0/16"));
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
            .chain(["PREROUTING", "OUTPUT", "POSTROUTING", "FORWARD", "INPUT"])
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for l in s.iptables.lines().filter(|l| l.starts_with("-A ")) {
            let words: Vec<&str> = l.split_whitespace().collect();
            if let Some(p) = words.iter().position(|w| *w == "-j" || *w == "-g") {
                let target = words[p + 1];
                if !["ACCEPT", "DROP", "RETURN", "MARK", "NOTRACK", "MASQUERADE"].contains(&target)
                {
                    assert!(declared.contains(target), "{target} undeclared in {l}");
                }
            }
        }
    }
}
