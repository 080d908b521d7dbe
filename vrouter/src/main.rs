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
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
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
