//! The plugin driven through exec exactly as a container runtime does:
//! `CNI_*` in the environment, the network config on stdin, the result or the
//! spec's error JSON on stdout.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use brindle_ipam::Ipam;
use brindle_ipam::server::serve_connection;
use brindle_ipam::store::{EmbeddedMode, EmbeddedStore};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_brindle-ipam");

struct Run {
    code: i32,
    out: Value,
    raw: String,
}

fn exec(command: &str, container: &str, stdin: &[u8], extra_env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", "/var/run/netns/test")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        );
    for (k, v) in extra_env {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brindle-ipam");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let o = child.wait_with_output().unwrap();
    let raw = String::from_utf8_lossy(&o.stdout).into_owned();
    let out = if raw.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&raw).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {raw:?}"))
    };
    Run {
        code: o.status.code().unwrap_or(-1),
        out,
        raw,
    }
}

fn conf(version: &str, ipam: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": version,
        "name": "net",
        "type": "brindle",
        "ipam": ipam,
    }))
    .unwrap()
}

fn standalone(db: &Path, pool: &str) -> Value {
    json!({
        "type": "brindle-ipam",
        "mode": "standalone",
        "embedded_path": db,
        "node": "node-a",
        "bootstrap_pools": [{"name": "p", "cidr": pool, "block_size": 30}],
    })
}

fn admin(db: &Path, args: &[&str]) -> Value {
    let o = Command::new(BIN)
        .args(["admin", "--mode", "standalone", "--embedded-path"])
        .arg(db)
        .args(args)
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "admin {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn add_returns_ips_and_routes_in_every_supported_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    for (i, v) in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"].iter().enumerate() {
        let r = exec(
            "ADD",
            &format!("c{i}"),
            &conf(v, standalone(&db, "10.20.0.0/24")),
            &[],
        );
        assert_eq!(r.code, 0, "{v}: {}", r.raw);
        assert_eq!(r.out["cniVersion"], *v);
        let addr = r.out["ips"][0]["address"].as_str().unwrap();
        assert!(
            addr.starts_with("10.20.0.") && addr.ends_with("/32"),
            "{v}: {addr}"
        );
        assert_eq!(r.out["routes"][0]["dst"], "0.0.0.0/0");
        if *v == "0.3.1" || *v == "0.4.0" {
            assert_eq!(
                r.out["ips"][0]["version"], "4",
                "pre-1.0 results carry ips[].version"
            );
        }
    }
    assert_eq!(admin(&db, &["audit"]), json!([]));
}

#[test]
fn add_is_idempotent_and_del_releases_once_and_then_succeeds_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let c = conf("1.1.0", standalone(&db, "10.21.0.0/24"));
    let first = exec("ADD", "ctr1", &c, &[]);
    let again = exec("ADD", "ctr1", &c, &[]);
    assert_eq!(first.code, 0, "{}", first.raw);
    assert_eq!(first.out["ips"], again.out["ips"]);
    let handles = admin(&db, &["handles"]);
    assert_eq!(handles.as_array().unwrap().len(), 1);
    assert_eq!(handles[0]["attrs"]["pod"], "web-0");
    assert_eq!(handles[0]["attrs"]["namespace"], "default");
    for _ in 0..2 {
        let del = exec("DEL", "ctr1", &c, &[("CNI_NETNS", "")]);
        assert_eq!(del.code, 0, "{}", del.raw);
        assert_eq!(del.raw, "", "DEL prints nothing on success");
    }
    assert_eq!(admin(&db, &["handles"]), json!([]));
}

#[test]
fn dual_stack_config_returns_both_families_and_both_default_routes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let ipam = json!({
        "type": "brindle-ipam", "mode": "standalone", "embedded_path": &db, "node": "node-a",
        "assign_ipv6": true,
        "bootstrap_pools": [{"name": "v4", "cidr": "10.22.0.0/24"}, {"name": "v6", "cidr": "fd22::/112"}],
    });
    let r = exec("ADD", "ds", &conf("1.0.0", ipam), &[]);
    assert_eq!(r.code, 0, "{}", r.raw);
    let ips: Vec<&str> = r.out["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .collect();
    assert!(
        ips[0].ends_with("/32") && ips[1].starts_with("fd22::") && ips[1].ends_with("/128"),
        "{ips:?}"
    );
    let dsts: Vec<&str> = r.out["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["dst"].as_str().unwrap())
        .collect();
    assert_eq!(dsts, vec!["0.0.0.0/0", "::/0"]);
}

#[test]
fn bad_json_is_a_decode_error_and_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let r = exec("ADD", "x", b"{\"cniVersion\": \"1.0.0\", \"name\": ", &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.out["code"], 6, "{}", r.raw);
    assert!(!db.exists(), "nothing was opened");
}

#[test]
fn an_unknown_cni_version_is_incompatible() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let r = exec(
        "ADD",
        "x",
        &conf("0.2.0", standalone(&db, "10.23.0.0/24")),
        &[],
    );
    assert_eq!(r.code, 1);
    assert_eq!(r.out["code"], 1, "{}", r.raw);
    assert!(!db.exists());
}

#[test]
fn missing_environment_is_an_invalid_environment_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let c = conf("1.0.0", standalone(&db, "10.24.0.0/24"));
    for missing in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_COMMAND"] {
        let r = exec("ADD", "x", &c, &[(missing, "")]);
        assert_eq!(r.code, 1, "without {missing}");
        assert_eq!(r.out["code"], 4, "without {missing}: {}", r.raw);
        assert_eq!(r.out["cniVersion"], "1.0.0");
    }
    assert!(!db.exists());
}

#[test]
fn bad_ipam_settings_are_an_invalid_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let mut ipam = standalone(&db, "10.25.0.0/24");
    ipam["mode"] = json!("sideways");
    let r = exec("ADD", "x", &conf("1.0.0", ipam), &[]);
    assert_eq!(r.out["code"], 7, "{}", r.raw);
    let mut bad_pool = standalone(&db, "10.25.0.1/24");
    bad_pool["node"] = json!("node-a");
    let r = exec("ADD", "x", &conf("1.0.0", bad_pool), &[]);
    assert_eq!(r.out["code"], 7, "{}", r.raw);
}

#[test]
fn an_exhausted_pool_is_code_100_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    // One /30 block: four addresses.
    let c = conf("1.1.0", standalone(&db, "10.26.0.0/30"));
    for i in 0..4 {
        assert_eq!(exec("ADD", &format!("c{i}"), &c, &[]).code, 0);
    }
    let r = exec("ADD", "c4", &c, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.out["code"], 100, "{}", r.raw);
    assert_eq!(admin(&db, &["handles"]).as_array().unwrap().len(), 4);
    assert_eq!(admin(&db, &["audit"]), json!([]));
    // STATUS reports the plugin cannot serve ADDs.
    let s = exec(
        "STATUS",
        "",
        &c,
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", ""),
            ("CNI_NETNS", ""),
        ],
    );
    assert_eq!(s.out["code"], 50, "{}", s.raw);
    // After a DEL, an ADD succeeds again with the freed address.
    assert_eq!(exec("DEL", "c2", &c, &[]).code, 0);
    assert_eq!(exec("ADD", "c4", &c, &[]).code, 0);
}

#[test]
fn check_confirms_the_allocation_and_rejects_an_unknown_container() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let add = exec(
        "ADD",
        "chk",
        &conf("1.0.0", standalone(&db, "10.27.0.0/24")),
        &[],
    );
    let mut with_prev: Value =
        serde_json::from_slice(&conf("1.0.0", standalone(&db, "10.27.0.0/24"))).unwrap();
    with_prev["prevResult"] = add.out.clone();
    let c = serde_json::to_vec(&with_prev).unwrap();
    let ok = exec("CHECK", "chk", &c, &[]);
    assert_eq!(ok.code, 0, "{}", ok.raw);
    let unknown = exec("CHECK", "other", &c, &[]);
    assert_eq!(unknown.out["code"], 3, "{}", unknown.raw);
}

#[test]
fn gc_releases_attachments_the_runtime_no_longer_lists() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ipam.redb");
    let c = conf("1.1.0", standalone(&db, "10.28.0.0/24"));
    for id in ["keep", "stale1", "stale2"] {
        assert_eq!(exec("ADD", id, &c, &[]).code, 0);
    }
    let mut gc: Value = serde_json::from_slice(&c).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let r = exec(
        "GC",
        "",
        &serde_json::to_vec(&gc).unwrap(),
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", ""),
            ("CNI_NETNS", ""),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.raw);
    let handles = admin(&db, &["handles"]);
    assert_eq!(handles.as_array().unwrap().len(), 1);
    assert_eq!(handles[0]["handle"]["container_id"], "keep");
}

#[test]
fn version_lists_every_supported_version() {
    let r = exec("VERSION", "", b"{\"cniVersion\":\"1.1.0\"}", &[]);
    assert_eq!(r.code, 0);
    assert_eq!(
        r.out["supportedVersions"],
        json!(["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

#[test]
fn daemon_mode_allocates_through_the_socket_and_fails_softly_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctrl.sock");
    let ipam_conf = json!({"type": "brindle-ipam", "mode": "daemon", "socket": &sock, "node": "node-a", "timeout_ms": 2000});
    // No daemon: try again later, nothing else.
    let r = exec("ADD", "d1", &conf("1.0.0", ipam_conf.clone()), &[]);
    assert_eq!(r.out["code"], 11, "{}", r.raw);
    let status = exec(
        "STATUS",
        "",
        &conf("1.1.0", ipam_conf.clone()),
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", ""),
            ("CNI_NETNS", ""),
        ],
    );
    assert_eq!(status.out["code"], 50, "{}", status.raw);

    // A daemon stand-in: the library's server over an exclusive embedded store.
    let store = EmbeddedStore::open(
        dir.path().join("d.redb"),
        EmbeddedMode::Exclusive,
        Duration::from_secs(5),
    )
    .unwrap();
    let ipam = Arc::new(Ipam::new(store, "/brindle/ipam"));
    ipam.put_pool(&brindle_ipam::model::Pool::new(
        "p",
        "10.29.0.0/24".parse().unwrap(),
    ))
    .unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let server_ipam = ipam.clone();
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (s, _) = listener.accept().unwrap();
            serve_connection(&*server_ipam, BufReader::new(s.try_clone().unwrap()), s).unwrap();
        }
    });
    let add = exec("ADD", "d1", &conf("1.0.0", ipam_conf.clone()), &[]);
    assert_eq!(add.code, 0, "{}", add.raw);
    let addr: ipnet::IpNet = add.out["ips"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let held = ipam.handles().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].addresses, vec![addr.addr()]);
    assert_eq!(held[0].attrs.node, "node-a");
    assert_eq!(exec("DEL", "d1", &conf("1.0.0", ipam_conf), &[]).code, 0);
    server.join().unwrap();
    assert!(ipam.handles().unwrap().is_empty());
}
