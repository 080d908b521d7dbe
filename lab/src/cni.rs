//! Pods as a runtime makes them: what deploy/'s init container installs
//! (the plugins, the conflist), then the conflist's plugins exec'd in order
//! for ADD and in reverse for DEL, each in the node's namespace with the
//! CNI variables (libcni's AddNetworkList and DelNetworkList).

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use brindle_api::cni::NetConfList;
use brindle_cni::conflist::{ConflistParams, render};
use serde_json::{Map, Value, json};

use crate::exec::{add_netns, finish, spawn_in_netns};
use crate::{LabConfig, STATE_DIR, node_dir, node_ns, state};

/// How long one plugin may take before the lab kills it: the brindle
/// plugin bounds its own socket calls, this bounds the whole exec.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) const NETWORK: &str = "k8s-pod-network";
/// The conflist's file name, as deploy/ installs it.
pub(crate) const CONFLIST: &str = "10-brindle.conflist";
/// The reference plugins the conflist chains after `brindle` (Debian's
/// containernetworking-plugins).
const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// The lab's `/opt/cni/bin`: what deploy/'s init container installs.
pub(crate) fn cni_bin_dir() -> PathBuf {
    state().join("opt/cni/bin")
}

/// Node `n`'s `/etc/cni/net.d`.
pub(crate) fn cni_conf_dir(n: u8) -> PathBuf {
    node_dir(n).join("etc/cni/net.d")
}

pub(crate) struct Pod {
    pub node: u8,
    pub name: String,
    pub ip: Ipv4Addr,
    /// `K8S_POD_NAMESPACE` and `K8S_POD_NAME` given at ADD and DEL.
    pub k8s: (String, String),
    /// The chain's ADD result, which libcni caches for DEL.
    pub add_result: Value,
}

/// What deploy/'s init container does on each node: the plugins into
/// `/opt/cni/bin` (here links to the release build and to Debian's
/// reference plugins) and the conflist rendered from the one template into
/// `/etc/cni/net.d`.
pub(crate) fn install_cni(cfg: &LabConfig) -> Result<()> {
    let bin = cni_bin_dir();
    fs::create_dir_all(&bin)?;
    for plugin in ["brindle", "brindle-ipam"] {
        std::os::unix::fs::symlink(cfg.bin_dir.join(plugin), bin.join(plugin))?;
    }
    // bridge and host-local: the density step's kernel-only reference.
    for plugin in ["tuning", "bandwidth", "portmap", "bridge", "host-local"] {
        let reference = Path::new(REFERENCE_PLUGINS).join(plugin);
        if !reference.exists() {
            bail!(
                "{} missing: the conflist chains it (apt-get install containernetworking-plugins)",
                reference.display()
            );
        }
        std::os::unix::fs::symlink(reference, bin.join(plugin))?;
    }
    for n in 1..=cfg.nodes {
        let sock = node_dir(n).join("ctrl.sock").display().to_string();
        let list = render(&ConflistParams {
            network_name: NETWORK.into(),
            // The plugin's key sizes the MTU only: cross-subnet may
            // encapsulate, so it reserves IPIP's 20 bytes like Calico's
            // CrossSubnet does.
            encapsulation: match cfg.encap.as_str() {
                "vxlan" => "vxlan",
                "none" => "none",
                _ => "ipip",
            }
            .into(),
            ctrl_socket: sock.clone(),
            // The lab's nodes share one host name: the node is named here
            // (operators leave it to NODENAME or the host name).
            ipam: json!({"type": "brindle-ipam", "mode": "daemon", "socket": sock, "node": node_ns(n)}),
            interface_kind: cfg.pod_interface,
            // The vrouter's workers.
            tap_queues: cfg.workers(),
            // ctrl's host port is on: no veth host route (host -> pod goes
            // through brindle0 and the vrouter, which sees both ways).
            host_port: cfg.host_port,
            ..ConflistParams::default()
        })?;
        let dir = cni_conf_dir(n);
        fs::create_dir_all(&dir)?;
        fs::write(
            dir.join(CONFLIST),
            serde_json::to_string_pretty(&list)? + "\n",
        )?;
    }
    eprintln!(
        "plugins in {}, conflists in {}/n<N>/etc/cni/net.d/{CONFLIST}",
        bin.display(),
        STATE_DIR
    );
    Ok(())
}

/// Node `n`'s conflist, read back from its `/etc/cni/net.d` as a runtime
/// loads it.
pub(crate) fn load_conflist(n: u8) -> Result<NetConfList> {
    let path = cni_conf_dir(n).join(CONFLIST);
    let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// A pod: its netns, then the conflist's plugins ADDed in order, each
/// getting the previous one's result (libcni's AddNetworkList).
pub(crate) fn cni_add(n: u8, name: &str) -> Result<Pod> {
    cni_add_as(n, name, ("lab", name))
}

/// [`cni_add`] of a pod the runtime names `k8s` (namespace, name).
pub(crate) fn cni_add_as(n: u8, name: &str, k8s: (&str, &str)) -> Result<Pod> {
    cni_add_list(n, name, k8s, &load_conflist(n)?)
}

/// [`cni_add_as`] through the chain `list` rather than node `n`'s.
pub(crate) fn cni_add_list(
    n: u8,
    name: &str,
    k8s: (&str, &str),
    list: &NetConfList,
) -> Result<Pod> {
    add_netns(name)?;
    let mut prev: Option<Value> = None;
    for i in 0..list.plugins.len() {
        let conf = list
            .plugin_conf(i, &Map::new(), prev.as_ref())
            .context("plugin index")?;
        let mut attempt = 0;
        let result = loop {
            match exec_plugin(n, name, k8s, "ADD", &conf) {
                Ok(r) => break r,
                // CNI code 11: try again later (the vrouter not yet programmed).
                Err(e) if i == 0 && attempt < 20 && e.to_string().contains("\"code\":11") => {
                    attempt += 1;
                    eprintln!("CNI ADD {name}: {e:#}; retrying");
                    thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        };
        prev = Some(result);
    }
    let result = prev.context("the conflist has no plugins")?;
    let addr = result["ips"][0]["address"]
        .as_str()
        .context("ADD result without ips[0].address")?;
    let ip: Ipv4Addr = addr.split('/').next().unwrap_or("").parse()?;
    Ok(Pod {
        node: n,
        name: name.to_owned(),
        ip,
        k8s: (k8s.0.to_owned(), k8s.1.to_owned()),
        add_result: result,
    })
}

/// The conflist's plugins DELeted in reverse order, each with the cached
/// ADD result (libcni's DelNetworkList).
pub(crate) fn cni_del(pod: &Pod) -> Result<()> {
    cni_del_list(pod, &load_conflist(pod.node)?)
}

/// [`cni_del`] through the chain `list` rather than the pod's node's.
pub(crate) fn cni_del_list(pod: &Pod, list: &NetConfList) -> Result<()> {
    let mut first_error = None;
    for i in (0..list.plugins.len()).rev() {
        let conf = list
            .plugin_conf(i, &Map::new(), Some(&pod.add_result))
            .context("plugin index")?;
        let k8s = (pod.k8s.0.as_str(), pod.k8s.1.as_str());
        if let Err(e) = exec_plugin(pod.node, &pod.name, k8s, "DEL", &conf) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Execs one plugin of the chain, found in CNI_PATH, as a runtime on node
/// `n` does: the CNI variables, the plugin config on stdin.
pub(crate) fn exec_plugin(
    n: u8,
    pod: &str,
    k8s: (&str, &str),
    command: &str,
    conf: &Value,
) -> Result<Value> {
    let kind = conf["type"]
        .as_str()
        .context("plugin config without type")?;
    let binary = cni_bin_dir().join(kind);
    if !binary.exists() {
        bail!(
            "plugin {kind:?} not in CNI_PATH {}",
            cni_bin_dir().display()
        );
    }
    let mut child = spawn_in_netns(&node_ns(n), &binary, |c| {
        c.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", pod)
            .env("CNI_NETNS", format!("/var/run/netns/{pod}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni_bin_dir())
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}",
                    k8s.0, k8s.1
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    })?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.to_string().as_bytes())?;
    let out = finish(child, &format!("{kind} {command} {pod}"), PLUGIN_TIMEOUT)?;
    let stdout = out.stdout;
    if !out.status.success() {
        bail!(
            "{kind} {command} {pod}: {}: {} {}",
            out.status,
            stdout.trim(),
            out.stderr.trim()
        );
    }
    if stdout.trim().is_empty() {
        return Ok(Value::Null);
    }
    Ok(serde_json::from_str(&stdout)?)
}
