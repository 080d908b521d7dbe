//! The exec driver: environment and stdin in, the verb dispatched, JSON out.

use std::io::{Read, Write};

use serde_json::Value;

use super::*;

// ===== exec driver =====

/// One invocation, as the driver hands it to a [`Plugin`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The validated environment.
    pub env: CniEnv,
    /// The validated config.
    pub conf: NetConf,
    /// The config's version.
    pub version: CniVersion,
    /// The config exactly as received, for delegation (the spec passes the
    /// same config to the delegated plugin).
    pub stdin: Vec<u8>,
}

/// What a CNI plugin implements; [`run`] does the rest.
pub trait Plugin {
    /// ADD: attach and return the result (the driver writes it in the
    /// config's version).
    fn add(&self, req: &Request) -> Result<CniResult, CniError>;
    /// DEL: detach, best-effort and idempotent.
    fn del(&self, req: &Request) -> Result<(), CniError>;
    /// CHECK: verify the attachment against `prevResult`.
    fn check(&self, req: &Request) -> Result<(), CniError>;
    /// GC: release what is not in the valid attachments.
    fn gc(&self, req: &Request) -> Result<(), CniError>;
    /// STATUS: `Ok` when ready for ADDs, else code 50 or 51.
    fn status(&self, req: &Request) -> Result<(), CniError>;
}

/// What one invocation produced: the bytes for stdout and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Everything to write to stdout.
    pub stdout: Vec<u8>,
    /// The process exit code (0 on success, 1 on error).
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: Vec<u8>) -> Self {
        Outcome {
            stdout,
            exit_code: 0,
        }
    }

    fn error(e: &CniError) -> Self {
        let mut stdout = e.to_json().into_bytes();
        stdout.push(b'\n');
        Outcome {
            stdout,
            exit_code: 1,
        }
    }
}

/// Runs one invocation from explicit inputs: validates the environment and
/// the config, checks that the config's version allows the verb, calls the
/// plugin and encodes its answer. Errors carry the config's `cniVersion`
/// when it was readable.
pub fn dispatch<P: Plugin>(
    plugin: &P,
    var: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Outcome {
    // The error's version: the config's when it names one we speak.
    let conf_version = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()));
    let fail = |e: CniError| {
        let e = match &conf_version {
            Some(v) => e.in_version(v),
            None => e,
        };
        Outcome::error(&e)
    };
    let env = match CniEnv::from_vars(&var) {
        Ok(env) => env,
        Err(e) => return fail(e),
    };
    if env.command == Command::Version {
        let mut out = serde_json::to_vec(&VersionInfo::brindle()).unwrap_or_default();
        out.push(b'\n');
        return Outcome::ok(out);
    }
    let conf = match NetConf::parse(stdin) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let version = match conf.version() {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let refuse = |what: &str| {
        fail(CniError::new(
            ErrorCode::INCOMPATIBLE_VERSION,
            format!("cniVersion {version} does not support {what}"),
        ))
    };
    match env.command {
        Command::Check if !version.supports_check() => return refuse("CHECK"),
        Command::Gc | Command::Status if !version.supports_gc_and_status() => {
            return refuse(env.command.as_str());
        }
        _ => {}
    }
    let req = Request {
        env,
        conf,
        version,
        stdin: stdin.to_vec(),
    };
    let answer = match req.env.command {
        Command::Add => plugin.add(&req).map(|r| {
            let mut out = serde_json::to_vec(&r.to_json(version)).unwrap_or_default();
            out.push(b'\n');
            out
        }),
        Command::Del => plugin.del(&req).map(|()| Vec::new()),
        Command::Check => plugin.check(&req).map(|()| Vec::new()),
        Command::Gc => plugin.gc(&req).map(|()| Vec::new()),
        Command::Status => plugin.status(&req).map(|()| Vec::new()),
        Command::Version => unreachable_version(),
    };
    match answer {
        Ok(out) => Outcome::ok(out),
        Err(e) => fail(e),
    }
}

// VERSION returned above; kept as a function so the match stays exhaustive
// without a panic path.
fn unreachable_version() -> Result<Vec<u8>, CniError> {
    Ok(Vec::new())
}

/// Runs one invocation against the real process: environment, stdin,
/// stdout. Returns the exit code for `std::process::exit`.
pub fn run<P: Plugin>(plugin: &P) -> i32 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = CniError::io("cannot read stdin", e);
        let _ = std::io::stdout().write_all(e.to_json().as_bytes());
        return 1;
    }
    let outcome = dispatch(plugin, |k| std::env::var(k).ok(), &stdin);
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&outcome.stdout)
        .and_then(|()| out.flush())
        .is_err()
    {
        return 1;
    }
    outcome.exit_code
}
