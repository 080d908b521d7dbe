//! The `brindle-ctrl` node daemon.
//!
//! `brindle-ctrl [--config PATH] [--key-path VALUE ...]`: every key of
//! `node.toml` is also a flag (`--bgp-as-number 64513`) and an environment
//! variable (`BRINDLE_BGP_AS_NUMBER`); see `ctrl/README.md`.
//!
//! `--check-config` loads and validates the configuration exactly as a start
//! would (file, variables, flags), prints the effective `node.toml` and
//! exits: 0 when the daemon would start with it, 1 with the error otherwise.
//! The deploy tests ask it whether the manifests' variables are keys.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
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
            "usage: brindle-ctrl [--config PATH] [--check-config] [--record-bgp FILE] [--log-format text|json] [--<key-path> VALUE ...]\n\
             every node.toml key is a flag (--bgp-as-number) and a variable (BRINDLE_BGP_AS_NUMBER)\n\
             --log-format (log_format, BRINDLE_LOG_FORMAT): text (colours only on a terminal) or json (one object per line)\n\
             --check-config: validate the configuration, print the effective node.toml, exit"
        );
        return Ok(());
    }
    let check_only = args.iter().any(|a| a == "--check-config");
    let args: Vec<String> = args.into_iter().filter(|a| a != "--check-config").collect();
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
    if check_only {
        print!(
            "{}",
            toml::to_string(&config).context("printing the configuration")?
        );
        eprintln!(
            "configuration OK: node {} ({}), uplink {}, datastore {}",
            validated.node_name, validated.node_address, validated.uplink, config.datastore.kind
        );
        return Ok(());
    }
    init_logging(&config);
    // SIGHUP reads the same sources again (the variables as they were at
    // start: a running process's environment does not change).
    let reload: brindle_ctrl::daemon::Reload =
        Box::new(move || Config::load(config_path.as_deref(), &env, &args));
    if let Err(e) = brindle_ctrl::daemon::run_with_reload(config, validated, Some(reload)) {
        // Through the logger, so that a JSON log stays JSON to the end.
        tracing::error!(error = %format!("{:#}", anyhow::Error::from(e)), "brindle-ctrl stopped");
        std::process::exit(1);
    }
    Ok(())
}

/// Logs to stderr at `log_level` (or `RUST_LOG`): `log_format = "text"`
/// gives plain lines, with ANSI colours only when stderr is a terminal;
/// `"json"` one JSON object per line (level, target, fields, spans).
fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if config.log_format == "json" {
        builder
            .json()
            .with_ansi(false)
            .with_current_span(true)
            .with_span_list(true)
            .init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}
