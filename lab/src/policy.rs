//! Network policy on real traffic (issue 15): three namespaces (x, y, z) ×
//! three pods (a, b, c) spread over the nodes, each serving TCP and UDP on
//! ports 80 and 81; for each case the policies are applied with
//! `brindlectl apply` on node 1, every node's daemon is waited for, and
//! every pod probes every pod (TCP connect, UDP echo) on both ports. The
//! observed table must equal the expected one, which `brindle-policy`
//! computes from the same documents (its compiler and classifier, checked
//! against the independent model on these very cases by
//! `policy/tests/model/truth.rs`). Printed as the Kubernetes e2e
//! network-policy tests print theirs: rows from, columns to, `.` allowed,
//! `X` denied, `!` a mismatch, `-` not probed (a pod to itself: that
//! traffic stays in the pod's namespace and never meets the dataplane).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brindle_policy::classify::{Packet, PolicyState};
use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::{Direction, EndpointKey};
use brindle_policy::resource::parse_documents;

use crate::cni::{Pod, cni_add_as};
use crate::exec::{finish, in_ns, wait_for};
use crate::{LabConfig, PREFIX, brindlectl, scrape, state};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
/// (protocol, port) probed between every pair.
const PROBES: [(&str, u16); 4] = [("tcp", 80), ("tcp", 81), ("udp", 80), ("udp", 81)];
/// A probe that gets no answer in this time is denied.
const PROBE_TIMEOUT_SECS: f64 = 1.5;

/// What the policy step proved.
#[derive(Debug, Clone, Default)]
pub struct PolicyReport {
    /// Cases run.
    pub cases: usize,
    /// Probes sent (ordered pairs of distinct pods × protocols × ports ×
    /// cases).
    pub probes: usize,
    /// Probes denied as expected.
    pub denied: usize,
    /// `case: proto/port from -> to: expected X, got Y`.
    pub mismatches: Vec<String>,
    /// The slowest case from `brindlectl apply` on node 1 to every node's
    /// daemon reporting the policies compiled (polled every 250 ms).
    pub slowest_apply: Duration,
    /// The whole step (pods, servers, every case).
    pub took: Duration,
}

impl PolicyReport {
    /// Every probe as the model says.
    pub fn success(&self) -> bool {
        self.cases > 0 && self.mismatches.is_empty()
    }
}

impl fmt::Display for PolicyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy: {} cases, {} probes ({} denied as expected), {} mismatches; apply to compiled on every node {:.2} s at most; step {:.1} s",
            self.cases,
            self.probes,
            self.denied,
            self.mismatches.len(),
            self.slowest_apply.as_secs_f64(),
            self.took.as_secs_f64()
        )
    }
}

const SERVER: &str = r#"
import select, socket
socks = []
for port in (80, 81):
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", port)); t.listen(64); socks.append(t)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port)); socks.append(u)
print("ready", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        if s.type == socket.SOCK_STREAM:
            c, _ = s.accept(); c.close()
        else:
            data, peer = s.recvfrom(2048); s.sendto(data, peer)
"#;

const PROBER: &str = r#"
import socket, sys, threading
timeout = float(sys.argv[1])
out = {}
def probe(target):
    ip, proto, port = target.split(":")
    ok = False
    try:
        if proto == "tcp":
            s = socket.create_connection((ip, int(port)), timeout=timeout); s.close(); ok = True
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(timeout / 2)
            for _ in range(2):
                s.sendto(b"probe", (ip, int(port)))
                try:
                    s.recvfrom(64); ok = True; break
                except socket.timeout:
                    pass
    except OSError:
        pass
    out[target] = ok
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[2:]]
for t in threads: t.start()
for t in threads: t.join()
for t in sys.argv[2:]:
    print(t, "ok" if out.get(t) else "fail")
"#;

/// (from pod, to pod, protocol, port) → allowed.
type Table = BTreeMap<(usize, usize, &'static str, u16), bool>;

/// One pod of the policy world.
struct PolicyPod {
    namespace: &'static str,
    name: &'static str,
    ip: Ipv4Addr,
    netns: String,
}

/// The servers, killed when the step ends however it ends.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn k8s_np(ns: &str, name: &str, types: &str, rules: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  podSelector: {{}}\n  policyTypes: [{types}]\n{rules}"
    )
}

/// The cases of issue 15, as `policy/tests/model/truth.rs` has them (the
/// ipBlock case over the lab's real addresses: the pods' /16 except y's).
fn cases(pods: &[PolicyPod]) -> Vec<(&'static str, String, usize)> {
    // The smoke test runs the first four: isolation, a namespace and pod
    // selector across nodes, a named port, Calico tiers with Pass.
    let mut all: Vec<Option<_>> = all_cases(pods).into_iter().map(Some).collect();
    [0, 3, 5, 7, 1, 2, 4, 6, 8]
        .into_iter()
        .filter_map(|i| all.get_mut(i).and_then(Option::take))
        .collect()
}

/// The cases in `truth.rs`'s order.
fn all_cases(pods: &[PolicyPod]) -> Vec<(&'static str, String, usize)> {
    let first = pods[0].ip.octets();
    let except: Vec<String> = pods
        .iter()
        .filter(|p| p.namespace == "y")
        .map(|p| format!("{}/32", p.ip))
        .collect();
    vec![
        (
            "deny-all ingress in x",
            k8s_np("x", "deny-all-ingress", "Ingress", ""),
            1,
        ),
        (
            "deny-all egress from x, DNS allowed",
            k8s_np(
                "x",
                "deny-egress-but-dns",
                "Egress",
                "  egress:\n  - ports: [{protocol: UDP, port: 53}]\n",
            ),
            1,
        ),
        (
            "x allows ingress from namespace y",
            k8s_np(
                "x",
                "from-y",
                "Ingress",
                "  ingress:\n  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]\n",
            ),
            1,
        ),
        (
            "x allows ingress from pod b of namespace y",
            k8s_np(
                "x",
                "from-y-b",
                "Ingress",
                "  ingress:\n  - from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]\n",
            ),
            1,
        ),
        (
            "x allows the pods' /16 except y's addresses (ipBlock)",
            k8s_np(
                "x",
                "ipblock",
                "Ingress",
                &format!(
                    "  ingress:\n  - from: [{{ipBlock: {{cidr: {}.{}.0.0/16, except: [{}]}}}}]\n",
                    first[0],
                    first[1],
                    except.join(", ")
                ),
            ),
            1,
        ),
        (
            "x allows the named port serve-81-tcp",
            k8s_np(
                "x",
                "named",
                "Ingress",
                "  ingress:\n  - ports: [{protocol: TCP, port: serve-81-tcp}]\n",
            ),
            1,
        ),
        (
            "x allows UDP 79-80 (endPort)",
            k8s_np(
                "x",
                "end-port",
                "Ingress",
                "  ingress:\n  - ports: [{protocol: UDP, port: 79, endPort: 80}]\n",
            ),
            1,
        ),
        (
            "tier security passes x and y to pods a, the default tier allows only pods b into y",
            format!(
                "apiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {{name: security}}\nspec: {{order: 100}}\n---\n\
                 apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {{name: security.guard-x}}\n\
                 spec:\n  tier: security\n  order: 10\n  selector: pod == 'a'\n  types: [Ingress]\n  ingress:\n\
                 \x20 - action: Pass\n    source: {{namespaceSelector: \"ns in {{'x', 'y'}}\"}}\n  - action: Deny\n---\n{}",
                k8s_np(
                    "y",
                    "only-b",
                    "Ingress",
                    "  ingress:\n  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: b}}}]\n",
                )
            ),
            2,
        ),
        (
            "GlobalNetworkPolicy pod in {a, b} && !has(exempt): no TCP 81",
            "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: no-81-to-a-b}\n\
             spec:\n  order: 500\n  selector: \"pod in {'a', 'b'} && !has(exempt)\"\n  types: [Ingress]\n  ingress:\n\
             \x20 - action: Deny\n    protocol: TCP\n    destination: {ports: [81]}\n  - action: Allow\n"
                .to_owned(),
            1,
        ),
    ]
}

/// Namespaces with `ns: <name>`, pods with `pod: <name>` and the named
/// ports `serve-<port>-<proto>`.
fn world_documents() -> String {
    let mut out = String::new();
    for ns in NAMESPACES {
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{ns: {ns}}}}}\n"
        ));
        for pod in PODS {
            out.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {ns}, labels: {{pod: {pod}}}}}\n\
                 spec:\n  containers:\n  - name: serve\n    ports:\n"
            ));
            for (proto, port) in PROBES {
                out.push_str(&format!(
                    "    - {{name: serve-{port}-{proto}, containerPort: {port}, protocol: {}}}\n",
                    proto.to_uppercase()
                ));
            }
        }
    }
    out
}

/// What `brindle-policy` says of every probe: (from, to, proto, port) →
/// allowed (the source's egress and the destination's ingress).
fn expected(pods: &[PolicyPod], documents: &str) -> Result<Table> {
    let mut changes: Vec<Change> = parse_documents(documents)?
        .into_iter()
        .map(Change::Apply)
        .collect();
    for p in pods {
        changes.push(Change::Endpoint(
            EndpointKey::new(p.namespace, p.name),
            Some(EndpointInfo {
                addrs: vec![IpAddr::V4(p.ip)],
                local: true,
            }),
        ));
    }
    let mut dp = PolicyState::default();
    dp.apply(&Compiler::new().apply(changes))
        .map_err(|e| anyhow::anyhow!("the expected table's update: {e:?}"))?;
    let mut out = BTreeMap::new();
    for (i, from) in pods.iter().enumerate() {
        for (j, to) in pods.iter().enumerate() {
            for (proto, port) in PROBES {
                let number = if proto == "tcp" { 6 } else { 17 };
                let pkt =
                    Packet::ported(IpAddr::V4(from.ip), IpAddr::V4(to.ip), number, 40000, port);
                let k = |p: &PolicyPod| EndpointKey::new(p.namespace, p.name);
                let allow = dp.classify(&k(from), Direction::Egress, &pkt).allow
                    && dp.classify(&k(to), Direction::Ingress, &pkt).allow;
                out.insert((i, j, proto, port), allow);
            }
        }
    }
    Ok(out)
}

/// Every pod probes every pod at once; (from, to, proto, port) → answered.
fn observe(pods: &[PolicyPod]) -> Result<Table> {
    let script = state().join("policy-prober.py");
    let mut children = Vec::new();
    for p in pods {
        let mut cmd = in_ns(&p.netns, "python3");
        cmd.arg(&script).arg(PROBE_TIMEOUT_SECS.to_string());
        // Not itself: a pod's traffic to its own address stays in its
        // namespace and never meets the dataplane.
        for to in pods.iter().filter(|to| to.ip != p.ip) {
            for (proto, port) in PROBES {
                cmd.arg(format!("{}:{proto}:{port}", to.ip));
            }
        }
        children.push(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?);
    }
    let mut out = BTreeMap::new();
    for (i, child) in children.into_iter().enumerate() {
        let o = finish(child, "policy prober", Duration::from_secs(30))?;
        for line in o.stdout.lines() {
            let mut f = line.split_whitespace();
            let (Some(target), Some(result)) = (f.next(), f.next()) else {
                continue;
            };
            let parts: Vec<&str> = target.split(':').collect();
            let [ip, proto, port] = parts[..] else {
                bail!("prober output {line:?}");
            };
            let j = pods
                .iter()
                .position(|p| p.ip.to_string() == ip)
                .context("prober named an unknown address")?;
            let (proto, port) = PROBES
                .into_iter()
                .find(|(p, n)| *p == proto && n.to_string() == port)
                .context("prober named an unknown port")?;
            out.insert((i, j, proto, port), result == "ok");
        }
    }
    Ok(out)
}

/// Waits until every node's daemon holds `count` policies (it compiled
/// what node 1 stored), then a moment for the vrouters to take it.
fn wait_policies(cfg: &LabConfig, count: usize) -> Result<Duration> {
    let start = Instant::now();
    let line = format!("brindle_ctrl_policies {count}\n");
    wait_for(
        &format!("{count} policies compiled on every node"),
        Duration::from_secs(20),
        || (1..=cfg.nodes).all(|n| scrape(n, 9091).is_ok_and(|m| m.contains(&line))),
    )?;
    let took = start.elapsed();
    thread::sleep(Duration::from_millis(500));
    Ok(took)
}

fn apply(cfg: &LabConfig, verb: &str, documents: &str) -> Result<()> {
    let file = state().join("policy-case.yaml");
    fs::write(&file, documents)?;
    let out = brindlectl(cfg, 1, &[verb, "-f", &file.display().to_string()])?;
    print!("{out}");
    Ok(())
}

/// Runs the first `max_cases` cases (all: `usize::MAX`).
pub(crate) fn run(
    cfg: &LabConfig,
    lab_pods: &mut Vec<Pod>,
    max_cases: usize,
) -> Result<PolicyReport> {
    let start = Instant::now();
    fs::write(state().join("policy-server.py"), SERVER)?;
    fs::write(state().join("policy-prober.py"), PROBER)?;
    let mut pods = Vec::new();
    let mut servers = Servers(Vec::new());
    for (i, ns) in NAMESPACES.iter().enumerate() {
        for (j, name) in PODS.iter().enumerate() {
            let node = ((i * PODS.len() + j) % usize::from(cfg.nodes)) as u8 + 1;
            let netns = format!("{PREFIX}pol-{ns}{name}");
            let pod = cni_add_as(node, &netns, (ns, name))?;
            eprintln!("{ns}/{name} on node {node}: {}", pod.ip);
            pods.push(PolicyPod {
                namespace: ns,
                name,
                ip: pod.ip,
                netns: netns.clone(),
            });
            lab_pods.push(pod);
            let mut server = in_ns(&netns, "python3")
                .arg(state().join("policy-server.py"))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let mut ready = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(server.stdout.take().context("server stdout")?),
                &mut ready,
            )?;
            servers.0.push(server);
            if ready.trim() != "ready" {
                bail!("the policy server in {netns} did not start");
            }
        }
    }
    let world = world_documents();
    apply(cfg, "apply", &world)?;
    let mut report = PolicyReport::default();
    for (name, documents, policies) in cases(&pods).into_iter().take(max_cases) {
        println!("\npolicy case: {name}");
        let mismatches_before = report.mismatches.len();
        apply(cfg, "apply", &documents)?;
        report.slowest_apply = report.slowest_apply.max(wait_policies(cfg, policies)?);
        let want = expected(&pods, &format!("{world}---\n{documents}"))?;
        let got = observe(&pods)?;
        report.cases += 1;
        for (proto, port) in PROBES {
            let mut table = format!("{}/{port}\n       ", proto.to_uppercase());
            for to in &pods {
                table.push_str(&format!("{}/{} ", to.namespace, to.name));
            }
            table.push('\n');
            for (i, from) in pods.iter().enumerate() {
                table.push_str(&format!("   {}/{} ", from.namespace, from.name));
                for (j, to) in pods.iter().enumerate() {
                    if i == j {
                        table.push_str(" -  ");
                        continue;
                    }
                    let w = want.get(&(i, j, proto, port)).copied();
                    let g = got.get(&(i, j, proto, port)).copied();
                    report.probes += 1;
                    table.push_str(match (w, g) {
                        (Some(true), Some(true)) => " .  ",
                        (Some(false), Some(false)) => {
                            report.denied += 1;
                            " X  "
                        }
                        _ => {
                            report.mismatches.push(format!(
                                "{name}: {proto}/{port} {}/{} -> {}/{}: expected {}, got {}",
                                from.namespace,
                                from.name,
                                to.namespace,
                                to.name,
                                verdict(w),
                                verdict(g)
                            ));
                            " !  "
                        }
                    });
                }
                table.push('\n');
            }
            print!("{table}");
        }
        if report.mismatches.len() > mismatches_before {
            print_log_problems();
        }
        apply(cfg, "delete", &documents)?;
        wait_policies(cfg, 0)?;
    }
    report.took = start.elapsed();
    println!("{report}");
    for m in &report.mismatches {
        println!("MISMATCH {m}");
    }
    Ok(report)
}

/// The daemons' warnings and refusals so far (what explains a mismatch).
fn print_log_problems() {
    let Ok(dir) = fs::read_dir(state()) else {
        return;
    };
    for e in dir.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "log") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("refused"))
            .collect();
        for l in &lines[lines.len().saturating_sub(8)..] {
            println!("{}: {l}", path.display());
        }
    }
}

fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "allowed",
        Some(false) => "denied",
        None => "no answer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Vec<PolicyPod> {
        let mut out = Vec::new();
        for (i, ns) in NAMESPACES.iter().enumerate() {
            for (j, name) in PODS.iter().enumerate() {
                out.push(PolicyPod {
                    namespace: ns,
                    name,
                    ip: Ipv4Addr::new(10, 244, i as u8, j as u8 + 2),
                    netns: String::new(),
                });
            }
        }
        out
    }

    #[test]
    fn every_case_parses_and_the_expected_tables_say_what_the_cases_mean() {
        let pods = pods();
        let world = world_documents();
        let cases = cases(&pods);
        assert_eq!(cases.len(), 9);
        let mut denied = Vec::new();
        for (name, docs, _) in &cases {
            let t = expected(&pods, &format!("{world}---\n{docs}")).unwrap();
            assert_eq!(t.len(), 9 * 9 * 4, "{name}");
            denied.push(t.values().filter(|a| !**a).count());
        }
        // deny-all ingress in x: every probe into x's 3 pods from the 9.
        assert_eq!(denied[0], 3 * 9 * 4);
        // deny-all egress from x: every probe from x's 3 pods.
        assert_eq!(denied[4], 3 * 9 * 4);
        // ipBlock: into x only from x and z (y's addresses excepted).
        assert_eq!(denied[6], 3 * 3 * 4);
        // the named port: into x only TCP 81.
        assert_eq!(denied[2], 3 * 9 * 3);
        assert!(denied.iter().all(|d| *d > 0), "{denied:?}");
    }
}
