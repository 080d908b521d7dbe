//! Helpers for the root integration tests: namespaces with Drop guards
//! (`brindle_testkit::netns`), a stand-in host netns, a stand-in node daemon
//! on a real Unix socket, and exec of the built plugin exactly as a runtime
//! does it (environment + config on stdin).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use brindle_api::endpoint::{
    DaemonStatus, Deleted, Endpoint, EndpointKey, EndpointRequest, GcReport, PodInterface,
};
use brindle_api::framing::{RemoteError, RemoteErrorKind, Reply, read_message, write_message};
use serde_json::{Value, json};

// The generic namespace helpers are the workspace's one copy; `sh` is the
// name these tests have always used for `run`. Each target including this
// module (the tests, the bench) uses its own subset.
#[allow(unused_imports)]
pub use brindle_testkit::netns::{Netns, run as sh, unique};

/// A fresh "host" netns for the plugin to run in, with a stand-in uplink
/// (`up0`, MTU `uplink_mtu`) holding the default route, so the tests never
/// touch the real host's interfaces.
pub struct HostNs {
    pub ns: Netns,
}

impl HostNs {
    pub fn new(uplink_mtu: u32) -> Result<HostNs> {
        let ns = Netns::new("bch")?;
        let mtu = uplink_mtu.to_string();
        // A veth pair stands in for the NIC (this kernel has no dummy).
        ns.ip(&[
            "link", "add", "up0", "mtu", &mtu, "type", "veth", "peer", "name", "up0p",
        ])?;
        ns.ip(&["link", "set", "up0p", "up"])?;
        ns.ip(&["link", "set", "up0", "up"])?;
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "up0"])?;
        ns.ip(&["route", "add", "default", "via", "192.0.2.254"])?;
        Ok(HostNs { ns })
    }

    /// Names of the `bri*` links in the host netns.
    pub fn bri_links(&self) -> Result<Vec<String>> {
        let links = self.ns.ip_json(&["link", "show"])?;
        Ok(links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str())
            .filter(|n| n.starts_with("bri"))
            .map(str::to_string)
            .collect())
    }
}

/// What one exec of a plugin produced.
#[derive(Debug)]
pub struct Exec {
    pub code: i32,
    pub stdout: Value,
    pub stderr: String,
}

impl Exec {
    pub fn ok(&self) -> Result<&Value> {
        if self.code != 0 {
            bail!(
                "plugin failed ({}): {} / stderr: {}",
                self.code,
                self.stdout,
                self.stderr
            );
        }
        Ok(&self.stdout)
    }

    pub fn err_code(&self) -> Option<u64> {
        if self.code == 0 {
            return None;
        }
        self.stdout["code"].as_u64()
    }
}

/// One invocation's CNI environment.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub cni_path: String,
    pub args: String,
}

impl Invocation {
    pub fn new(command: &str, container_id: &str, netns: &str, cni_path: &str) -> Self {
        Invocation {
            command: command.into(),
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: "eth0".into(),
            cni_path: cni_path.into(),
            args: format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{container_id};K8S_POD_UID=uid-{container_id}"
            ),
        }
    }

    pub fn with_command(&self, command: &str) -> Self {
        Invocation {
            command: command.into(),
            ..self.clone()
        }
    }
}

/// Execs `binary` in the "host" netns `host` (through `ip netns exec`, the
/// way a runtime in that netns would exec it): a clean environment holding
/// only the CNI variables and PATH, the config on stdin.
pub fn exec_plugin(host: &HostNs, binary: &Path, inv: &Invocation, conf: &Value) -> Result<Exec> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &host.ns.name])
        .arg(binary)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", &inv.command)
        .env("CNI_CONTAINERID", &inv.container_id)
        .env("CNI_IFNAME", &inv.ifname)
        .env("CNI_PATH", &inv.cni_path)
        .env("CNI_ARGS", &inv.args)
        .env("BRINDLE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !inv.netns.is_empty() {
        cmd.env("CNI_NETNS", &inv.netns);
    }
    let mut child = cmd.spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "stdout is not JSON: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?
    };
    Ok(Exec {
        code: out.status.code().unwrap_or(-1),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The built plugin.
pub fn brindle() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_brindle"))
}

/// A CNI_PATH directory: the reference plugins, plus `host-local-1.1`, a
/// wrapper that lets Debian's host-local (which speaks up to 1.0.0) serve a
/// 1.1.0 config by rewriting the version on the way in and out; GC and
/// STATUS, which host-local 1.1.1 does not have, succeed without work.
pub struct CniPath {
    pub dir: tempfile::TempDir,
}

impl CniPath {
    pub fn new() -> Result<CniPath> {
        let dir = tempfile::tempdir()?;
        let wrapper = dir.path().join("host-local-1.1");
        std::fs::write(
            &wrapper,
            "#!/bin/bash\nset -o pipefail\ncase \"$CNI_COMMAND\" in GC|STATUS) exit 0;; esac\n\
             sed 's/\"cniVersion\":\"1.1.0\"/\"cniVersion\":\"1.0.0\"/g' | /usr/lib/cni/host-local | \
             sed 's/\"cniVersion\":\"1.0.0\"/\"cniVersion\":\"1.1.0\"/g'\n",
        )?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(CniPath { dir })
    }

    pub fn value(&self) -> String {
        format!("{}:/usr/lib/cni", self.dir.path().display())
    }
}

/// A host-local IPAM section with its own data directory.
pub fn host_local(data_dir: &Path, subnet: &str, range: Option<(&str, &str)>) -> Value {
    let mut r = json!({"subnet": subnet});
    if let Some((start, end)) = range {
        r["rangeStart"] = json!(start);
        r["rangeEnd"] = json!(end);
    }
    json!({"type": "host-local", "dataDir": data_dir.display().to_string(), "ranges": [[r]]})
}

/// The files host-local keeps per allocated address (its allocation state).
pub fn allocations(data_dir: &Path, network: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(data_dir.join(network)) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect()
}

// ===== stand-in node daemon =====

#[derive(Default)]
struct DaemonState {
    received: Vec<EndpointRequest>,
    endpoints: HashMap<EndpointKey, Endpoint>,
    /// With `hold_taps`: a queue on each TAP pod's device, as the vrouter
    /// attaches one before ctrl answers, kept until DeleteEndpoint.
    held: HashMap<EndpointKey, brindle_xsk::Tap>,
    hold_taps: bool,
}

/// A stand-in node daemon: speaks `brindle_api::endpoint` over a real Unix
/// socket and records every request it received.
pub struct StandInDaemon {
    pub path: PathBuf,
    state: Arc<Mutex<DaemonState>>,
    /// When set, AddEndpoint is answered with `try_again_later`.
    pub reject_adds: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl StandInDaemon {
    pub fn start() -> Result<StandInDaemon> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ctrl.sock");
        let listener = UnixListener::bind(&path)?;
        let state = Arc::new(Mutex::new(DaemonState::default()));
        let reject_adds = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, reject, stop) = (state.clone(), reject_adds.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (state, reject) = (state.clone(), reject.clone());
                    std::thread::spawn(move || serve(stream, &state, &reject));
                }
            })
        };
        Ok(StandInDaemon {
            path,
            state,
            reject_adds,
            stop,
            accept: Some(accept),
            _dir: dir,
        })
    }

    pub fn received(&self) -> Vec<EndpointRequest> {
        self.state.lock().unwrap().received.clone()
    }

    /// From now on, attach a queue to every TAP pod's device on
    /// AddEndpoint (before answering, whatever the answer), as the vrouter
    /// does once ctrl programs it.
    pub fn hold_taps(&self) {
        self.state.lock().unwrap().hold_taps = true;
    }

    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.state
            .lock()
            .unwrap()
            .endpoints
            .values()
            .cloned()
            .collect()
    }
}

impl Drop for StandInDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve(stream: UnixStream, state: &Mutex<DaemonState>, reject: &AtomicBool) {
    let Ok(read) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut writer = stream;
    while let Ok(Some(req)) = read_message::<_, EndpointRequest>(&mut reader) {
        let reply: Reply<Value> = {
            let mut st = state.lock().unwrap();
            st.received.push(req.clone());
            answer(&mut st, req, reject.load(Ordering::SeqCst))
        };
        if write_message(&mut writer, &reply).is_err() {
            return;
        }
    }
}

fn answer(st: &mut DaemonState, req: EndpointRequest, reject_adds: bool) -> Reply<Value> {
    let ok = |v: Value| Reply::Ok { result: v };
    let err = |kind, message: &str| {
        Reply::Error(RemoteError {
            kind,
            message: message.into(),
        })
    };
    if let EndpointRequest::AddEndpoint { endpoint } = &req
        && st.hold_taps
        && let PodInterface::Tap { netns, ifname, .. } = &endpoint.interface
    {
        let ns = std::fs::File::open(netns).expect("the pod's netns");
        let tap = brindle_xsk::Tap::attach(
            Some(std::os::fd::AsFd::as_fd(&ns)),
            ifname,
            1,
            brindle_xsk::TapConfig::pod(ifname).offloads,
        )
        .expect("attach a queue to the pod's TAP");
        st.held.insert(endpoint.key.clone(), tap);
    }
    match req {
        EndpointRequest::AddEndpoint { .. } if reject_adds => {
            err(RemoteErrorKind::TryAgainLater, "stand-in told to reject")
        }
        EndpointRequest::AddEndpoint { endpoint } => {
            st.endpoints
                .insert(endpoint.key.clone(), (*endpoint).clone());
            ok(serde_json::to_value(*endpoint).unwrap())
        }
        EndpointRequest::DeleteEndpoint { key } => {
            st.held.remove(&key);
            let existed = st.endpoints.remove(&key).is_some();
            ok(serde_json::to_value(Deleted { existed }).unwrap())
        }
        EndpointRequest::GetEndpoint { key } => match st.endpoints.get(&key) {
            Some(ep) => ok(serde_json::to_value(ep).unwrap()),
            None => err(RemoteErrorKind::NotFound, "no such endpoint"),
        },
        EndpointRequest::ListEndpoints { network } => {
            let eps: Vec<&Endpoint> = st
                .endpoints
                .values()
                .filter(|e| network.as_ref().is_none_or(|n| &e.key.network == n))
                .collect();
            ok(serde_json::to_value(eps).unwrap())
        }
        EndpointRequest::GcEndpoints { network, valid } => {
            let removed: Vec<EndpointKey> = st
                .endpoints
                .keys()
                .filter(|k| k.network == network && !valid.contains(k))
                .cloned()
                .collect();
            for k in &removed {
                st.endpoints.remove(k);
            }
            ok(serde_json::to_value(GcReport { removed }).unwrap())
        }
        EndpointRequest::Status => ok(serde_json::to_value(DaemonStatus {
            ready: true,
            message: String::new(),
            protocol_version: brindle_api::framing::PROTOCOL_VERSION,
        })
        .unwrap()),
    }
}
