//! The real `brindle-ctrl` with stderr to a pipe, as a container runtime or
//! a log collector gives it: no ANSI escape, and with `log_format = json`
//! (here `BRINDLE_LOG_FORMAT`, and `--log-format`) one JSON object per line.

mod daemon_support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_support::{FakeVrouter, free_port, wait_for};
use serde_json::Value;

/// Runs the daemon on loopback until its API socket answers, stops it with
/// SIGTERM and returns everything it wrote to stderr.
fn run_daemon(dir: &Path, extra_env: &[(&str, &str)], args: &[&str]) -> Vec<u8> {
    let _vrouter = FakeVrouter::start(&dir.join("vrouter.sock"), "boot-1");
    let socket = dir.join("ctrl.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brindle-ctrl"));
    cmd.args(args)
        .env("BRINDLE_CONFIG", "/dev/null")
        .env_remove("RUST_LOG")
        .env("BRINDLE_NODE_NAME", "node-log")
        .env("BRINDLE_NODE_ADDRESS", "127.0.0.1")
        .env("BRINDLE_API_SOCKET", &socket)
        .env("BRINDLE_VROUTER_SOCKET", dir.join("vrouter.sock"))
        .env("BRINDLE_DATASTORE_PATH", dir.join("data"))
        .env("BRINDLE_BGP_LISTEN_PORT", free_port().to_string())
        .env(
            "BRINDLE_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stderr.read_to_end(&mut out);
        out
    });
    let up = wait_for("the daemon's socket", Duration::from_secs(30), || {
        brindle_api::framing::Client::connect(&socket, Duration::from_secs(2)).is_ok()
    });
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let exited = wait_for("the daemon to exit", Duration::from_secs(15), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let out = reader.join().unwrap();
    up.unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&out)));
    out
}

#[test]
fn text_logs_to_a_pipe_have_no_ansi_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_daemon(dir.path(), &[], &[]);
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("brindle-ctrl running"), "{text}");
    assert!(!out.contains(&0x1b), "an ESC byte in:\n{text}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    for (env, args) in [
        (&[("BRINDLE_LOG_FORMAT", "json")][..], &[][..]),
        (&[][..], &["--log-format", "json"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_daemon(dir.path(), env, args);
        let text = String::from_utf8_lossy(&out);
        assert!(!out.contains(&0x1b), "an ESC byte in:\n{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 2, "{text}");
        let mut messages = Vec::new();
        for line in &lines {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
            assert!(v.is_object(), "{line}");
            assert!(v["level"].is_string(), "{line}");
            messages.push(v["fields"]["message"].as_str().unwrap_or("").to_owned());
        }
        assert!(
            messages.iter().any(|m| m == "brindle-ctrl running"),
            "{messages:?}"
        );
    }
}
