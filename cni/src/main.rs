//! The `brindle` CNI plugin binary (installed as `/opt/cni/bin/brindle`).
//!
//! stdout carries only the CNI result, VERSION output or error JSON; logs go
//! to stderr, filtered by `logLevel` in the config (or `BRINDLE_LOG`).
#![forbid(unsafe_code)]

use std::io::{Read, Write};

use brindle_api::cni::{CniError, dispatch};
use brindle_cni::plugin::Brindle;
use tracing_subscriber::EnvFilter;

fn main() {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = CniError::io("cannot read stdin", e);
        let _ = writeln!(std::io::stdout(), "{}", e.to_json());
        std::process::exit(1);
    }
    let level = std::env::var("BRINDLE_LOG").ok().or_else(|| {
        serde_json::from_slice::<serde_json::Value>(&stdin)
            .ok()
            .and_then(|v| v.get("logLevel")?.as_str().map(str::to_string))
    });
    let filter = EnvFilter::try_new(level.as_deref().unwrap_or("info"))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .init();
    let outcome = dispatch(&Brindle, |k| std::env::var(k).ok(), &stdin);
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&outcome.stdout)
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(1);
    }
    std::process::exit(outcome.exit_code);
}
