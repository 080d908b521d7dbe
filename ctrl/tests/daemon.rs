//! The real `brindle-ctrl` binary, driven by real clients: the CNI plugin's
//! endpoint messages, `brindle-ipam` exec'd as a runtime would, and
//! `brindlectl`; a fake vrouter socket records the programming.

mod daemon_support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use brindle_api::endpoint::{Endpoint, EndpointKey, EndpointRequest, PodRef};
use brindle_api::framing::Client;
use brindle_api::vrouter::{PortKind, RouteTarget, VrouterRequest};
use daemon_support::{Daemon, FakeVrouter, free_port, wait_for};
use serde_json::Value;

fn env(dir: &Path, node: &str, address: &str, bgp_port: u16) -> Vec<(String, String)> {
    [
        ("BRINDLE_NODE_NAME", node.to_owned()),
        ("BRINDLE_NODE_ADDRESS", address.to_owned()),
        (
            "BRINDLE_API_SOCKET",
            dir.join("ctrl.sock").display().to_string(),
        ),
        (
            "BRINDLE_VROUTER_SOCKET",
            dir.join("vrouter.sock").display().to_string(),
        ),
        (
            "BRINDLE_DATASTORE_PATH",
            dir.join("data").display().to_string(),
        ),
        ("BRINDLE_BGP_LISTEN_PORT", bgp_port.to_string()),
        (
            "BRINDLE_METRICS_LISTEN",
            format!("{address}:{}", free_port()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The `brindle-ipam` binary next to ours in the target directory
/// (`cargo build -p brindle-ipam` puts it there).
fn ipam_plugin() -> Option<std::path::PathBuf> {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_brindle-ctrl"));
    let p = exe.parent()?.join("brindle-ipam");
    p.exists().then_some(p)
}

/// Allocates for container `c1` like a runtime running the IPAM plugin in
/// daemon mode would; returns the pod address (a /32).
fn allocate_with_the_plugin(dir: &Path, node: &str) -> String {
    let socket = dir.join("ctrl.sock");
    let Some(plugin) = ipam_plugin() else {
        // Without the plugin binary, send the same request it sends.
        eprintln!("brindle-ipam not built: sending its ipam_allocate directly");
        let mut c = Client::connect(&socket, Duration::from_secs(10)).unwrap();
        let r: Value = c
            .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
                "handle":{"network":"k8s-pod-network","container_id":"c1","ifname":"eth0"},
                "node":node,"attrs":{},"ipv4":true,"ipv6":false}))
            .unwrap();
        return r["addresses"][0]["address"].as_str().unwrap().to_owned();
    };
    let conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "k8s-pod-network",
        "type": "brindle",
        "ipam": {"type": "brindle-ipam", "mode": "daemon", "socket": socket, "node": node}
    });
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "c1")
        .env("CNI_NETNS", "/var/run/netns/test")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "brindle-ipam ADD failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    result["ips"][0]["address"].as_str().unwrap().to_owned()
}

fn pod(address: &str) -> Endpoint {
    Endpoint {
        key: EndpointKey {
            network: "k8s-pod-network".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        },
        pod: PodRef {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: String::new(),
            infra_container_id: String::new(),
        },
        netns: "/var/run/netns/test".into(),
        host_ifname: "bri0123456789a".into(),
        host_ifindex: 42,
        host_mac: "ee:ee:ee:ee:ee:ee".into(),
        pod_mac: "02:00:00:00:00:01".into(),
        ips: vec![address.parse().unwrap()],
        gateways: vec!["169.254.1.1".parse().unwrap()],
        mtu: 1480,
        interface: Default::default(),
    }
}

fn brindlectl(dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_brindlectl"))
        .arg("--ctrl-socket")
        .arg(dir.join("ctrl.sock"))
        .args(["-o", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "brindlectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The last Sync the fake received, if any.
fn last_sync(v: &FakeVrouter) -> Option<brindle_api::vrouter::DesiredState> {
    v.requests().into_iter().rev().find_map(|r| match r {
        VrouterRequest::Sync { state } => Some(state),
        _ => None,
    })
}

#[test]
fn an_endpoint_is_stored_programmed_listed_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let vrouter = FakeVrouter::start(&dir.path().join("vrouter.sock"), "boot-1");
    let env = env(dir.path(), "node-a", "127.0.0.1", free_port());
    let mut daemon = Daemon::start(&env, &dir.path().join("ctrl.sock"), &dir.path().join("log"));

    let address = allocate_with_the_plugin(dir.path(), "node-a");
    assert!(
        address.starts_with("10.244.") && address.ends_with("/32"),
        "{address}"
    );

    // What the CNI plugin sends after its netns work.
    let ep = pod(&address);
    let mut c = Client::connect(dir.path().join("ctrl.sock"), Duration::from_secs(10)).unwrap();
    let stored: Endpoint = c
        .call(&EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        })
        .unwrap();
    assert_eq!(stored, ep);

    // The vrouter gets the pod port (with its address for anti-spoofing)
    // and a Local /32 to it, either as the calls or inside a resync.
    let programmed = |v: &FakeVrouter| {
        let reqs = v.requests();
        let port = reqs.iter().any(|r| match r {
            VrouterRequest::AddPorts { ports } => ports.iter().any(|p| {
                p.name == "bri0123456789a"
                    && p.kind == PortKind::Pod
                    && p.addresses == vec![ep.ips[0].addr()]
            }),
            _ => false,
        });
        let route = reqs.iter().any(|r| match r {
            VrouterRequest::AddRoutes { routes } => routes.iter().any(|r| {
                r.prefix == ep.ips[0]
                    && r.target
                        == RouteTarget::Local {
                            port: "bri0123456789a".into(),
                        }
            }),
            _ => false,
        });
        port && route
    };
    wait_for("the pod's programming", Duration::from_secs(20), || {
        programmed(&vrouter)
            || last_sync(&vrouter)
                .is_some_and(|s| s.ports.iter().any(|p| p.name == "bri0123456789a"))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", vrouter.requests(), daemon.log()));

    // Ready (datastore and vrouter reachable) and the gauge counts the pod.
    let metrics_addr = env
        .iter()
        .find(|(k, _)| k == "BRINDLE_METRICS_LISTEN")
        .map(|(_, v)| v.clone())
        .unwrap();
    wait_for("/readyz to say ready", Duration::from_secs(20), || {
        http_get(&metrics_addr, "/readyz").starts_with("HTTP/1.1 200")
    })
    .unwrap();
    let metrics = http_get(&metrics_addr, "/metrics");
    assert!(metrics.contains("brindle_ctrl_endpoints 1"), "{metrics}");
    assert!(
        metrics.contains("brindle_ctrl_vrouter_reachable 1"),
        "{metrics}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("ctrl.sock"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    let listed = brindlectl(dir.path(), &["endpoints"]);
    assert_eq!(listed[0]["key"]["container_id"], "c1");
    assert_eq!(listed[0]["ips"][0], address.as_str());
    let blocks = brindlectl(dir.path(), &["ipam", "blocks"]);
    assert_eq!(blocks[0]["affinity"], "node-a");
    let status = brindlectl(dir.path(), &["node", "status"]);
    assert_eq!(status["name"], "node-a");
    assert_eq!(status["endpoints"], 1);
    assert_eq!(status["vrouter_reachable"], true);
    wait_for(
        "the block in the BGP table",
        Duration::from_secs(20),
        || {
            let routes = brindlectl(dir.path(), &["bgp", "routes"]);
            routes.as_array().unwrap().iter().any(|r| {
                r["prefix"] == blocks[0]["cidr"] && r["source"] == "Local" && r["best"] == true
            })
        },
    )
    .unwrap();
    assert_eq!(
        brindlectl(dir.path(), &["bgp", "peers"]),
        serde_json::json!([])
    );
    // `vrouter routes` goes straight to the vrouter socket (the fake
    // answers an empty FIB).
    let out = Command::new(env!("CARGO_BIN_EXE_brindlectl"))
        .arg("--vrouter-socket")
        .arg(dir.path().join("vrouter.sock"))
        .args(["-o", "yaml", "vrouter", "routes"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n");
    assert!(vrouter.requests().contains(&VrouterRequest::DumpRoutes));

    // Restart: the record is still there and the new daemon replays it to
    // the vrouter in one Sync (a new controller always resyncs).
    drop(c);
    daemon.stop();
    vrouter.requests.lock().unwrap().clear();
    let daemon = Daemon::start(&env, &dir.path().join("ctrl.sock"), &dir.path().join("log"));
    let listed = brindlectl(dir.path(), &["endpoints"]);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["host_ifname"], "bri0123456789a");
    wait_for(
        "the resync after the restart",
        Duration::from_secs(20),
        || {
            last_sync(&vrouter).is_some_and(|s| {
                s.ports.iter().any(|p| p.name == "bri0123456789a")
                    && s.routes.iter().any(|r| r.prefix == ep.ips[0])
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", vrouter.requests(), daemon.log()));

    // Delete: not found afterwards, and the port and route are removed.
    let mut c = Client::connect(dir.path().join("ctrl.sock"), Duration::from_secs(10)).unwrap();
    let deleted: brindle_api::endpoint::Deleted = c
        .call(&EndpointRequest::DeleteEndpoint {
            key: ep.key.clone(),
        })
        .unwrap();
    assert!(deleted.existed);
    wait_for("the unprogramming", Duration::from_secs(20), || {
        vrouter.requests().iter().any(|r| {
            matches!(r, VrouterRequest::RemovePorts { names } if names == &["bri0123456789a".to_owned()])
        })
    })
    .unwrap();
    let err = c
        .call::<_, Endpoint>(&EndpointRequest::GetEndpoint { key: ep.key })
        .unwrap_err();
    assert!(err.to_string().contains("NotFound"), "{err}");
}

/// `brindlectl` with `input` on stdin; (success, stdout, stderr).
fn brindlectl_stdin(dir: &Path, args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_brindlectl"))
        .arg("--ctrl-socket")
        .arg(dir.join("ctrl.sock"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The newest policy update the fake received with a program for `pod`.
fn program_of(v: &FakeVrouter, pod: &str) -> Option<Option<usize>> {
    v.requests().into_iter().rev().find_map(|r| match r {
        VrouterRequest::ApplyPolicy { update } => update
            .programs
            .iter()
            .find(|p| p.endpoint.name == pod)
            .map(|p| p.program.as_ref().map(|p| p.ingress.tiers.len())),
        _ => None,
    })
}

const DENY_ALL: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}
";

#[test]
fn policy_applied_with_brindlectl_is_stored_compiled_and_sent_to_the_vrouter() {
    let dir = tempfile::tempdir().unwrap();
    let vrouter = FakeVrouter::start(&dir.path().join("vrouter.sock"), "boot-1");
    let env = env(dir.path(), "node-a", "127.0.0.1", free_port());
    let mut daemon = Daemon::start(&env, &dir.path().join("ctrl.sock"), &dir.path().join("log"));

    // An invalid second document: an error with its field path, nothing stored.
    let bad = format!(
        "{DENY_ALL}---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\n\
         metadata: {{name: g}}\nspec: {{selector: 'app == ', order: 1}}\n"
    );
    let (ok, _, err) = brindlectl_stdin(dir.path(), &["apply", "-f", "-"], &bad);
    assert!(!ok);
    assert!(
        err.contains("document 3") && err.contains("spec.selector"),
        "{err}"
    );
    assert_eq!(
        brindlectl(dir.path(), &["get", "all"]),
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": []})
    );

    let (ok, out, err) = brindlectl_stdin(dir.path(), &["apply", "-f", "-"], DENY_ALL);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "NetworkPolicy default/deny-all created\nTier security created\n"
    );
    let list = brindlectl(dir.path(), &["get", "networkpolicies"]);
    assert_eq!(list["items"][0]["metadata"]["name"], "deny-all");
    let (ok, table, _) = brindlectl_stdin(dir.path(), &["get", "tiers"], "");
    assert!(
        ok && table.contains("security") && table.contains("order=100"),
        "{table}"
    );

    // A pod of the namespace arrives: its port, then its program.
    let mut c = Client::connect(dir.path().join("ctrl.sock"), Duration::from_secs(10)).unwrap();
    let ep = pod("10.244.7.9/32");
    let _: Endpoint = c
        .call(&EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        })
        .unwrap();
    wait_for("the pod's program", Duration::from_secs(20), || {
        program_of(&vrouter, "web-0") == Some(Some(1))
            || last_sync(&vrouter)
                .and_then(|s| s.policy)
                .is_some_and(|p| !p.programs.is_empty())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", vrouter.requests(), daemon.log()));

    // A restarted daemon's first Sync already carries the policy (a resync
    // replaces the vrouter's policy state: never one without it).
    drop(c);
    daemon.stop();
    vrouter.requests.lock().unwrap().clear();
    let daemon = Daemon::start(&env, &dir.path().join("ctrl.sock"), &dir.path().join("log"));
    let first_sync = || {
        vrouter.requests().into_iter().find_map(|r| match r {
            VrouterRequest::Sync { state } => Some(state),
            _ => None,
        })
    };
    wait_for(
        "the resync after the restart",
        Duration::from_secs(20),
        || first_sync().is_some(),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", vrouter.requests(), daemon.log()));
    let policy = first_sync()
        .unwrap()
        .policy
        .expect("the first Sync has the policy");
    let program = policy
        .programs
        .iter()
        .find(|p| p.endpoint.name == "web-0")
        .and_then(|p| p.program.as_ref())
        .expect("web-0's program");
    assert_eq!(program.ingress.tiers.len(), 1, "still isolated");

    // Deleting the policy leaves the pod without a tier (all allowed).
    let (ok, out, err) = brindlectl_stdin(dir.path(), &["delete", "-f", "-"], DENY_ALL);
    assert!(ok, "{err}");
    assert!(
        out.contains("NetworkPolicy default/deny-all deleted"),
        "{out}"
    );
    wait_for(
        "the program without the policy",
        Duration::from_secs(20),
        || program_of(&vrouter, "web-0") == Some(Some(0)),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", vrouter.requests(), daemon.log()));
    let (ok, _, err) = brindlectl_stdin(dir.path(), &["delete", "-f", "-"], DENY_ALL);
    assert!(!ok && err.contains("not found"), "{err}");
}
