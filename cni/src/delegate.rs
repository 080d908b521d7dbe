//! Delegation to the IPAM plugin, as the CNI spec describes it: find the
//! binary named in `ipam.type` in `CNI_PATH`, exec it with the same
//! environment (only `CNI_COMMAND` differs when rolling back) and the same
//! network config on stdin, and read its result or error from stdout.

use std::io::Write;
use std::process::{Command as Process, Stdio};

use brindle_api::cni::{CniError, CniResult, Command, ErrorCode, Request};
use serde_json::Value;

/// Runs `plugin` for `command` with the request's environment and stdin;
/// returns its stdout on success, its own error (code kept) on failure.
pub fn exec_plugin(req: &Request, plugin: &str, command: Command) -> Result<Vec<u8>, CniError> {
    let path = req.env.find_plugin(plugin).ok_or_else(|| {
        CniError::invalid_config(format!("plugin {plugin:?} not found in CNI_PATH"))
            .with_details(format!("CNI_PATH={:?}", req.env.path))
    })?;
    let mut child = Process::new(&path);
    for (k, v) in req.env.to_vars() {
        child.env(k, v);
    }
    child
        .env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = child
        .spawn()
        .map_err(|e| CniError::io(format!("cannot exec {}", path.display()), e))?;
    let stdin = child.stdin.take();
    // Write stdin on another thread: a plugin that answers before reading
    // everything must not deadlock us on a full pipe.
    let output = std::thread::scope(|s| {
        if let Some(mut pipe) = stdin {
            s.spawn(move || {
                let _ = pipe.write_all(&req.stdin);
            });
        }
        child.wait_with_output()
    })
    .map_err(|e| CniError::io(format!("waiting for {}", path.display()), e))?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    Err(match serde_json::from_slice::<CniError>(&output.stdout) {
        Ok(e) if e.code.0 != 0 => e,
        _ => CniError::io(
            format!("{plugin} {} failed ({})", command.as_str(), output.status),
            String::from_utf8_lossy(&output.stdout).trim(),
        ),
    }
    .in_version(&req.conf.cni_version))
}

/// The IPAM plugin's name (validated by `NetConf::parse`).
pub fn ipam_type(req: &Request) -> Result<&str, CniError> {
    req.conf
        .ipam
        .as_ref()
        .map(|i| i.plugin_type.as_str())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| CniError::invalid_config("no ipam.type in the network config"))
}

/// IPAM ADD: the addresses for this attachment.
pub fn ipam_add(req: &Request) -> Result<CniResult, CniError> {
    let out = exec_plugin(req, ipam_type(req)?, Command::Add)?;
    let (_, result) = CniResult::from_slice(&out)?;
    if result.ips.is_empty() {
        return Err(CniError::new(
            ErrorCode::IO_FAILURE,
            "the IPAM plugin returned no addresses",
        ));
    }
    Ok(result)
}

/// IPAM DEL: release the attachment's addresses (idempotent in the IPAM
/// plugin).
pub fn ipam_del(req: &Request) -> Result<(), CniError> {
    exec_plugin(req, ipam_type(req)?, Command::Del).map(|_| ())
}

/// IPAM with any verb that has no output (CHECK, GC, STATUS).
pub fn ipam_call(req: &Request, command: Command) -> Result<(), CniError> {
    exec_plugin(req, ipam_type(req)?, command).map(|_| ())
}

/// IPAM VERSION: whether the plugin runs at all.
pub fn ipam_version(req: &Request) -> Result<Value, CniError> {
    let out = exec_plugin(req, ipam_type(req)?, Command::Version)?;
    serde_json::from_slice(&out).map_err(|e| {
        CniError::new(ErrorCode::DECODE_FAILURE, "bad VERSION output from IPAM")
            .with_details(e.to_string())
    })
}
