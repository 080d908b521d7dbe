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
    #[cfg(feature = "demo")]
    Demo {
        /// Also record every port's traffic to DIR/<port>.pcap (open with
        /// tcpdump -r or Wireshark).
        #[arg(long, value_name = "DIR")]
        pcap: Option<std::path::PathBuf>,
    },
    /// Forward between AF_XDP (or AF_PACKET) ports with static ports,
    /// routes and neighbours, no controller, until SIGINT or SIGTERM; then
    /// detach, close, and print the counters.
    Run(brindle_vrouter::app::RunArgs),
    /// The node daemon: start with no ports, take ports, routes, neighbours
    /// and node settings over the programming socket
    /// (/run/brindle/vrouter.sock), serve metrics and health on
    /// 127.0.0.1:9092, until SIGINT or SIGTERM.
    Serve(brindle_vrouter::app::ServeArgs),
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let config = args.resolve()?;
            brindle_vrouter::app::init_logging(&config.log_level, config.log_format);
            brindle_vrouter::app::serve::serve(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            brindle_vrouter::app::init_logging("info", args.log_format.unwrap_or_default());
            brindle_vrouter::app::run::run(&args.resolve()?)?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "demo")]
        Command::Demo { pcap } => {
            brindle_vrouter::app::init_logging("info", Default::default());
            let ok = brindle_vrouter::demo::run(&mut std::io::stdout().lock(), pcap.as_deref())?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
