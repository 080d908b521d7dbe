//! The `brindle-ipam` binary: the CNI IPAM plugin when `CNI_COMMAND` is set,
//! the admin views (`brindle-ipam admin ...`) otherwise. Logs go to stderr
//! only (`BRINDLE_LOG`, default `warn`); stdout carries the CNI result or
//! error JSON, or the admin output.
#![forbid(unsafe_code)]

mod admin;

use brindle_ipam::plugin::IpamPlugin;

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BRINDLE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none()
        && args.first().map(String::as_str) == Some("admin")
    {
        let mut out = std::io::stdout().lock();
        if let Err(e) = admin::run(&args[1..], &mut out) {
            // clap's own errors (help, usage) print themselves.
            if let Some(clap_err) = e.downcast_ref::<clap::Error>() {
                let _ = clap_err.print();
                std::process::exit(clap_err.exit_code());
            }
            eprintln!("brindle-ipam admin: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    // Everything else is a CNI invocation; the driver reports a missing
    // CNI_COMMAND as the spec's error 4.
    std::process::exit(brindle_api::cni::run(&IpamPlugin));
}
