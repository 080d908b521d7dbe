//! The `brindle-ctrl` node daemon.
//!
//! `brindle-ctrl [--config PATH] [--key-path VALUE ...]`: every key of
//! `node.toml` is also a flag (`--bgp-as-number 64513`) and an environment
//! variable (`BRINDLE_BGP_AS_NUMBER`); see `ctrl/README.md`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use brindle_ctrl::config::Config;

fn main() -> anyhow::Result<()> {
    // `--record-bgp FILE` is the short name of `--bgp-record-file FILE`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| match a.strip_prefix("--record-bgp") {
            Some(rest) if rest.is_empty() || rest.starts_with('=') => {
                format!("--bgp-record-file{rest}")
            }
            _ => a,
        })
        .collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: brindle-ctrl [--config PATH] [--record-bgp FILE] [--<key-path> VALUE ...]\n\
             every node.toml key is a flag (--bgp-as-number) and a variable (BRINDLE_BGP_AS_NUMBER)"
        );
        return Ok(());
    }
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("BRINDLE_"))
        .collect();
    let mut config_path: Option<PathBuf> = std::env::var_os("BRINDLE_CONFIG").map(PathBuf::from);
    for (i, a) in args.iter().enumerate() {
        if a == "--config" {
            config_path = args.get(i + 1).map(PathBuf::from);
        } else if let Some(p) = a.strip_prefix("--config=") {
            config_path = Some(PathBuf::from(p));
        }
    }
    let config = Config::load(config_path.as_deref(), &env, &args)?;
    let validated = config.validate()?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // SIGHUP reads the same sources again (the variables as they were at
    // start: a running process's environment does not change).
    let reload: brindle_ctrl::daemon::Reload =
        Box::new(move || Config::load(config_path.as_deref(), &env, &args));
    brindle_ctrl::daemon::run_with_reload(config, validated, Some(reload)).context("brindle-ctrl")
}
