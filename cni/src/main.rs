//! The `brindle` CNI plugin binary (installed as `/opt/cni/bin/brindle`).
//!
//! stdout carries only the CNI result, VERSION output or error JSON; logs go
//! to stderr (and to `logFile` when the config names one), filtered by
//! `logLevel` in the config (or `BRINDLE_LOG`).
#![forbid(unsafe_code)]

use std::io::{Read, Write};

use brindle_api::cni::{CniError, dispatch};
use brindle_cni::plugin::Brindle;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

fn main() {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = CniError::io("cannot read stdin", e);
        let _ = writeln!(std::io::stdout(), "{}", e.to_json());
        std::process::exit(1);
    }
    let conf = serde_json::from_slice::<serde_json::Value>(&stdin).ok();
    let setting = |key: &str| {
        conf.as_ref()
            .and_then(|c| c.get(key)?.as_str().map(str::to_string))
    };
    let level = std::env::var("BRINDLE_LOG")
        .ok()
        .or_else(|| setting("logLevel"));
    let filter = |level: &Option<String>| {
        EnvFilter::try_new(level.as_deref().unwrap_or("info"))
            .unwrap_or_else(|_| EnvFilter::new("info"))
    };
    let stderr_layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .with_filter(filter(&level));
    // Optionally also a log file (runtimes often drop a plugin's stderr);
    // a file that cannot be opened only costs the file log.
    let file_layer = setting("logFile").and_then(|path| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .ok()?;
        Some(
            tracing_subscriber::fmt::layer()
                .with_writer(std::sync::Mutex::new(file))
                .with_target(false)
                .with_ansi(false)
                .with_filter(filter(&level)),
        )
    });
    tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
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
