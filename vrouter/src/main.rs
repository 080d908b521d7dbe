//! The `brindle-vrouter` binary.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Brindle's userspace poll-mode vRouter.
#[derive(Parser)]
#[command(name = "brindle-vrouter", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the forwarding demo on in-memory ports: proxy ARP, pod to pod,
    /// IPIP and VXLAN encap and decap, anti-spoofing, TTL expiry, MTU; exits
    /// non-zero if any step misbehaves.
    Demo {
        /// Also record every port's traffic to DIR/<port>.pcap (open with
        /// tcpdump -r or Wireshark).
        #[arg(long, value_name = "DIR")]
        pcap: Option<std::path::PathBuf>,
    },
    /// Forward between AF_XDP (or AF_PACKET) ports with static ports,
    /// routes and neighbours, no controller, until SIGINT or SIGTERM; then
    /// detach, close, and print the counters.
    Run(brindle_vrouter::daemon::RunArgs),
    /// The node daemon: start with no ports, take ports, routes, neighbours
    /// and node settings over the programming socket
    /// (/run/brindle/vrouter.sock), serve metrics and health on
    /// 127.0.0.1:9092, until SIGINT or SIGTERM.
    Serve(brindle_vrouter::daemon::serve::ServeArgs),
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let serve_config = match &cli.command {
        Command::Serve(args) => Some(args.resolve()?),
        _ => None,
    };
    // RUST_LOG wins; then the config file's log_level; then info.
    let level = serve_config
        .as_ref()
        .map_or("info", |c| c.log_level.as_str())
        .to_owned();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Serve(_) => {
            let config = serve_config.ok_or_else(|| anyhow::anyhow!("serve config"))?;
            brindle_vrouter::daemon::serve::serve(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            brindle_vrouter::daemon::run::run(&args.resolve()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { pcap } => {
            let ok = brindle_vrouter::demo::run(&mut std::io::stdout().lock(), pcap.as_deref())?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
