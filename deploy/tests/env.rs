//! Every kustomization under deploy/kubernetes renders (`kubectl kustomize`),
//! and every `BRINDLE_*` variable its workloads set is one the program in
//! that container reads, asked of the program itself rather than of a list
//! kept here:
//!
//! - `brindle-ctrl`: the container's command is run with `--check-config`,
//!   the rendered variables, and the ConfigMap and Secret mounts laid out in
//!   a temporary directory (the downward API's `spec.nodeName` and
//!   `status.hostIP` become a node name and 127.0.0.1). It loads and
//!   validates exactly as a start would, so an unknown variable, a bad value
//!   or a missing mounted file fails here as it would in the cluster;
//! - `brindle-vrouter`: each variable must be one its `--help` lists;
//! - `brindle-install-cni`: each variable must be one the script reads.
//!
//! kubectl is required: without it this test fails and says to run
//! `cargo xtask deps` (it does not skip). The binaries are the ones
//! `cargo build --workspace --bins` put beside this test
//! (`BRINDLE_BIN_DIR` to point elsewhere).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("deploy/ has a parent")
        .to_path_buf()
}

fn bin(name: &str) -> Result<PathBuf> {
    let path = brindle_testkit::built_binaries("BRINDLE_BIN_DIR").join(name);
    ensure!(
        path.is_file(),
        "{} not built: run `cargo build --workspace --bins` first",
        path.display()
    );
    Ok(path)
}

/// Every directory under deploy/kubernetes with a kustomization.yaml.
fn kustomizations() -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                out.push(path.parent().context("a file has a parent")?.to_path_buf());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&repo().join("deploy/kubernetes"), &mut out)?;
    out.sort();
    Ok(out)
}

/// `kubectl kustomize dir` as JSON objects.
fn render(dir: &Path) -> Result<Vec<Value>> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| {
            anyhow!("kubectl: {e}: it renders the kustomizations; run `cargo xtask deps`")
        })?;
    ensure!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = <Value as serde::Deserialize>::deserialize(doc)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// One container's mounts, laid out under a temporary root: ConfigMap
/// volumes get the map's files, Secret volumes get any file a variable or
/// argument names under them (empty: only their existence is checked).
struct Mounts {
    root: tempfile::TempDir,
    /// container path -> host path, longest first.
    map: Vec<(String, PathBuf)>,
    secrets: Vec<String>,
}

impl Mounts {
    fn new(objects: &[Value], pod_spec: &Value, container: &Value) -> Result<Mounts> {
        let root = tempfile::tempdir()?;
        let mut map = Vec::new();
        let mut secrets = Vec::new();
        for (i, mount) in array_at(container, "/volumeMounts").iter().enumerate() {
            let (Some(name), Some(path)) = (str_at(mount, "/name"), str_at(mount, "/mountPath"))
            else {
                bail!("volumeMount without name or mountPath: {mount}");
            };
            let volume = array_at(pod_spec, "/volumes")
                .iter()
                .find(|v| str_at(v, "/name") == Some(name))
                .with_context(|| format!("volumeMount {name}: no such volume"))?;
            let host = root.path().join(format!("mount{i}"));
            fs::create_dir_all(&host)?;
            if let Some(map_name) = str_at(volume, "/configMap/name") {
                let config_map = objects
                    .iter()
                    .find(|o| {
                        str_at(o, "/kind") == Some("ConfigMap")
                            && str_at(o, "/metadata/name") == Some(map_name)
                    })
                    .with_context(|| format!("volume {name}: ConfigMap {map_name} not rendered"))?;
                for (file, text) in config_map["data"].as_object().into_iter().flatten() {
                    fs::write(host.join(file), text.as_str().unwrap_or_default())?;
                }
            } else if volume.get("secret").is_some() {
                secrets.push(path.to_owned());
            }
            map.push((path.to_owned(), host));
        }
        map.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        Ok(Mounts { root, map, secrets })
    }

    /// `value` with a mounted container path turned into its host path (a
    /// file under a Secret mount is created).
    fn host(&self, value: &str) -> Result<String> {
        for (path, host) in &self.map {
            if let Some(rest) = value.strip_prefix(path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                let mapped = format!("{}{rest}", host.display());
                if self.secrets.contains(path) && !rest.is_empty() {
                    fs::write(&mapped, "")?;
                }
                return Ok(mapped);
            }
        }
        Ok(value.to_owned())
    }
}

/// The container's `BRINDLE_*` variables with values as the kubelet would
/// give them on a node (field references resolved to stand-ins).
fn brindle_env(container: &Value) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for var in array_at(container, "/env") {
        let name = str_at(var, "/name").context("env entry without a name")?;
        if !name.starts_with("BRINDLE_") {
            continue;
        }
        let value = if let Some(v) = str_at(var, "/value") {
            v.to_owned()
        } else {
            match str_at(var, "/valueFrom/fieldRef/fieldPath") {
                Some("spec.nodeName") => "node-under-test".into(),
                Some("status.hostIP") => "127.0.0.1".into(),
                other => bail!("{name}: no stand-in for {other:?} (extend brindle_env)"),
            }
        };
        env.insert(name.to_owned(), value);
    }
    Ok(env)
}

fn command_of(container: &Value) -> Vec<String> {
    array_at(container, "/command")
        .iter()
        .chain(array_at(container, "/args"))
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// Runs the container's brindle-ctrl command with `--check-config`.
fn check_ctrl(objects: &[Value], pod_spec: &Value, container: &Value) -> Result<String> {
    let mounts = Mounts::new(objects, pod_spec, container)?;
    let mut cmd = Command::new(bin("brindle-ctrl")?);
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    for (name, value) in brindle_env(container)? {
        cmd.env(name, mounts.host(&value)?);
    }
    for arg in &command_of(container)[1..] {
        cmd.arg(mounts.host(arg)?);
    }
    let out = cmd.arg("--check-config").output()?;
    ensure!(
        out.status.success(),
        "brindle-ctrl --check-config refuses what the manifest gives it: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(mounts.root);
    Ok(String::from_utf8(out.stdout)?)
}

/// The variables `brindle-vrouter serve --help` says it reads.
fn vrouter_variables() -> Result<Vec<String>> {
    let out = Command::new(bin("brindle-vrouter")?)
        .args(["serve", "--help"])
        .output()?;
    ensure!(out.status.success(), "brindle-vrouter serve --help failed");
    Ok(String::from_utf8(out.stdout)?
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split('=').next().map(str::to_owned))
        .collect())
}

/// The variables install-cni.sh reads (`${NAME:-default}`).
fn install_cni_variables() -> Result<Vec<String>> {
    let script = fs::read_to_string(repo().join("deploy/image/install-cni.sh"))?;
    Ok(script
        .split("${")
        .skip(1)
        .filter_map(|rest| rest.split(":-").next())
        .filter(|name| name.starts_with("BRINDLE_"))
        .map(str::to_owned)
        .collect())
}

#[test]
fn every_overlay_renders_and_its_programs_accept_its_variables() -> Result<()> {
    let dirs = kustomizations()?;
    ensure!(dirs.len() >= 3, "kustomizations found: {dirs:?}");
    let vrouter_vars = vrouter_variables()?;
    let install_vars = install_cni_variables()?;
    ensure!(
        vrouter_vars.contains(&"BRINDLE_VROUTER_CORES".to_owned()),
        "the vrouter's --help lists {vrouter_vars:?}"
    );
    let mut checked_ctrl = 0;
    let mut datastores = Vec::new();
    for dir in &dirs {
        let objects = render(dir)?;
        let workloads: Vec<&Value> = objects
            .iter()
            .filter(|o| {
                matches!(
                    str_at(o, "/kind"),
                    Some("DaemonSet" | "Deployment" | "StatefulSet")
                )
            })
            .collect();
        if dir.ends_with("base") {
            // The base is rendered through deploy/kubernetes too; both count.
            ensure!(!workloads.is_empty(), "{}: no workload", dir.display());
        }
        for workload in workloads {
            let pod_spec = workload
                .pointer("/spec/template/spec")
                .context("workload without a pod template")?;
            let containers = array_at(pod_spec, "/initContainers")
                .iter()
                .chain(array_at(pod_spec, "/containers"));
            for container in containers {
                let name = str_at(container, "/name").unwrap_or("?");
                let where_ = format!("{}: container {name}", dir.display());
                let command = command_of(container);
                let program = command
                    .first()
                    .map(|c| c.rsplit('/').next().unwrap_or(c))
                    .with_context(|| format!("{where_}: no command"))?;
                let env = brindle_env(container)?;
                match program {
                    "brindle-ctrl" => {
                        let effective = check_ctrl(&objects, pod_spec, container)
                            .with_context(|| where_.clone())?;
                        let parsed: toml::Table = toml::from_str(&effective)?;
                        datastores.push(
                            parsed["datastore"]["type"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        );
                        checked_ctrl += 1;
                    }
                    "brindle-vrouter" => {
                        for var in env.keys() {
                            ensure!(
                                vrouter_vars.contains(var),
                                "{where_}: {var} is not read by brindle-vrouter (it reads {vrouter_vars:?})"
                            );
                        }
                    }
                    "brindle-install-cni" => {
                        for var in env.keys() {
                            ensure!(
                                install_vars.contains(var),
                                "{where_}: {var} is not read by install-cni.sh (it reads {install_vars:?})"
                            );
                        }
                    }
                    other => bail!("{where_}: no check for the program {other}"),
                }
            }
        }
    }
    // The base (twice: directly and through deploy/kubernetes) and the etcd
    // overlay; the overlay really switched the datastore.
    ensure!(
        checked_ctrl >= 3,
        "brindle-ctrl checked {checked_ctrl} times"
    );
    ensure!(
        datastores.iter().any(|d| d == "etcd") && datastores.iter().any(|d| d == "embedded"),
        "datastores seen: {datastores:?}"
    );
    Ok(())
}

#[test]
fn check_config_refuses_an_unknown_variable_and_a_missing_mounted_file() -> Result<()> {
    // The negative half: the check above would pass silently if
    // --check-config accepted anything.
    let ctrl = bin("brindle-ctrl")?;
    let node_toml = repo().join("deploy/systemd/node.toml");
    let base = |cmd: &mut Command| {
        cmd.env_clear()
            .env("BRINDLE_NODE_NAME", "n1")
            .env("BRINDLE_NODE_ADDRESS", "127.0.0.1")
            .arg("--config")
            .arg(&node_toml)
            .arg("--check-config");
    };
    let mut ok = Command::new(&ctrl);
    base(&mut ok);
    let out = ok.output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut unknown = Command::new(&ctrl);
    base(&mut unknown);
    let out = unknown
        .env("BRINDLE_DATASTORE_CA_FILE", "/etc/brindle/etcd/ca.crt")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("BRINDLE_DATASTORE_CA_FILE: no such key"),
        "{stderr}"
    );
    let mut missing = Command::new(&ctrl);
    base(&mut missing);
    let out = missing
        .env("BRINDLE_DATASTORE_TYPE", "etcd")
        .env("BRINDLE_DATASTORE_ENDPOINTS", "https://127.0.0.1:2379")
        .env("BRINDLE_DATASTORE_ETCD_CA_FILE", "/nonexistent/ca.crt")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("datastore.etcd_ca_file"),
        "{stderr}"
    );
    Ok(())
}
