//! deploy/ is what operators install, so it is checked like code:
//!
//! - every Kubernetes manifest, and what `kubectl kustomize` renders for the
//!   base and the etcd overlay, validates against the Kubernetes schemas of a
//!   current version (the `kubernetes-validate` Python package, strict), and
//!   every CRD schema is valid OpenAPI v3 and structural
//!   (`deploy/tools/validate.py`); the CRDs reject invalid objects;
//! - the objects keep the contracts of docs/DESIGN.md (ports, paths, probes,
//!   privileges, the pinned cores, least-privilege RBAC);
//! - the conflist in deploy/ is the plugin's template rendered with the
//!   deploy values, and the ConfigMap carries exactly that file;
//! - the Containerfile builds and copies binaries the workspace has;
//! - the init container's install script and the plain-host install script
//!   install what they should, and the systemd units pass
//!   `systemd-analyze verify`.
//!
//! Run: `cargo test -p brindle-deploy` (no root needed; needs
//! `pip install kubernetes-validate==1.37.0`, which `cargo xtask deps` does).
//! `BRINDLE_DEPLOY_BLESS=1` rewrites deploy/cni/10-brindle.conflist from the
//! template instead of failing on a difference.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::{Value, json};

/// The Kubernetes version the manifests are validated against: the newest
/// the pinned kubernetes-validate ships.
const KUBERNETES_VERSION: &str = "1.37";
const PIP_INSTALL: &str = "pip install kubernetes-validate==1.37.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("deploy/ has a parent")
        .to_path_buf()
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A directory under the system's temporary directory, removed on drop
/// (also when the test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("brindle-deploy-{what}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn mode_of(path: &Path) -> Result<u32> {
    Ok(fs::metadata(path)
        .with_context(|| format!("{} missing", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

// ===== the conflist =====

/// `NAME=VALUE` lines of deploy/cni/10-brindle.conflist.env.
fn conflist_values() -> Result<BTreeMap<String, String>> {
    let text = read(&deploy().join("cni/10-brindle.conflist.env"))?;
    let mut values = BTreeMap::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| anyhow!("not NAME=VALUE: {line:?}"))?;
        values.insert(name.to_string(), value.to_string());
    }
    Ok(values)
}

/// Renders the template the way `brindle_cni::conflist::render` does: a
/// placeholder the template quotes (`"${NAME}"`) gets the value JSON-escaped,
/// any other gets it verbatim (numbers, booleans, JSON objects). Every
/// placeholder needs a value and every value a placeholder.
fn render_conflist(template: &str, values: &BTreeMap<String, String>) -> Result<String> {
    let mut text = template.to_string();
    for (name, value) in values {
        let placeholder = format!("${{{name}}}");
        ensure!(
            text.contains(&placeholder),
            "{name} is not a placeholder of the template"
        );
        let quoted = format!("\"{placeholder}\"");
        if text.contains(&quoted) {
            let escaped = Value::String(value.clone()).to_string();
            text = text.replace(&quoted, &escaped);
        }
        text = text.replace(&placeholder, value);
    }
    ensure!(
        !text.contains("${"),
        "placeholders without a value in the rendered template:\n{text}"
    );
    Ok(text)
}

fn rendered_conflist() -> Result<String> {
    let template = read(&repo().join("cni/conflist/10-brindle.conflist.template"))?;
    render_conflist(&template, &conflist_values()?)
}

#[test]
fn the_deploy_conflist_is_the_template_rendered_with_the_deploy_values() -> Result<()> {
    let rendered = rendered_conflist()?;
    let path = deploy().join("cni/10-brindle.conflist");
    if std::env::var_os("BRINDLE_DEPLOY_BLESS").is_some() {
        fs::write(&path, &rendered)?;
    }
    let installed = read(&path)?;
    assert_eq!(
        installed,
        rendered,
        "{} differs from cni/conflist/10-brindle.conflist.template rendered with \
         deploy/cni/10-brindle.conflist.env; rerun with BRINDLE_DEPLOY_BLESS=1 and update \
         deploy/kubernetes/base/configmap.yaml",
        path.display()
    );

    // What the runtime and the plugin will read from it.
    let list: Value = serde_json::from_str(&installed)?;
    assert_eq!(list["cniVersion"], "1.0.0");
    assert_eq!(list["name"], "k8s-pod-network");
    let types: Vec<&str> = list["plugins"]
        .as_array()
        .context("plugins")?
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    // TAP pods: no bandwidth plugin (it shapes a host veth they lack).
    assert_eq!(types, ["brindle", "tuning", "portmap"]);
    let brindle = &list["plugins"][0];
    assert_eq!(brindle["ctrlSocket"], "/run/brindle/ctrl.sock");
    assert_eq!(brindle["encapsulation"], "ipip");
    assert_eq!(brindle["mtu"], 0);
    assert_eq!(brindle["requireDaemon"], true);
    assert_eq!(brindle["interfaceKind"], "tap");
    assert_eq!(brindle["tapQueues"], 1);
    assert_eq!(brindle["ipam"], json!({"type": "brindle-ipam"}));
    Ok(())
}

#[test]
fn rendering_escapes_strings_and_refuses_missing_or_unknown_values() -> Result<()> {
    let template = r#"{"name": "${NAME}", "mtu": ${MTU}}"#;
    let values = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let text = render_conflist(template, &values(&[("NAME", "a \"b\""), ("MTU", "1400")]))?;
    assert_eq!(text, r#"{"name": "a \"b\"", "mtu": 1400}"#);
    assert!(render_conflist(template, &values(&[("NAME", "x")])).is_err());
    assert!(
        render_conflist(
            template,
            &values(&[("NAME", "x"), ("MTU", "1"), ("OTHER", "y")])
        )
        .is_err()
    );
    Ok(())
}

// ===== the manifests =====

/// Every manifest under deploy/kubernetes that is a whole object: not the
/// kustomization files, not the overlay's patches (those are checked in
/// what kustomize renders).
fn manifest_files() -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "overlays") {
                    continue;
                }
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(&deploy().join("kubernetes"), &mut files)?;
    files.sort();
    Ok(files)
}

/// kubectl renders the kustomizations; missing, the tests that need it
/// fail (they never skip) and say how to get it.
fn kubectl_present() -> Result<()> {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(ok, "kubectl not found: run `cargo xtask deps`");
    Ok(())
}

/// Objects the CRD schemas must reject, one reason each.
const INVALID_OBJECTS: &str = r#"
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: prefix-too-long}
spec: {cidr: 10.244.0.0/33}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: no-prefix}
spec: {cidr: 10.244.0.0}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: octet-too-big}
spec: {cidr: 10.256.0.0/16}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: unknown-encapsulation}
spec: {cidr: 10.244.0.0/16, encapsulation: gre}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: block-too-big}
spec: {cidr: 10.244.0.0/16, blockSize: 19}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: block-too-small}
spec: {cidr: 10.244.0.0/16, blockSize: 129}
---
apiVersion: brindle.dev/v1alpha1
kind: IPPool
metadata: {name: no-cidr}
spec: {blockSize: 26}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPPeer
metadata: {name: as-zero}
spec: {peerIP: 192.0.2.1, asNumber: 0}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPPeer
metadata: {name: as-beyond-32-bits}
spec: {peerIP: 192.0.2.1, asNumber: 4294967296}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPPeer
metadata: {name: not-an-address}
spec: {peerIP: 300.1.1.1, asNumber: 65001}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPPeer
metadata: {name: port-zero}
spec: {peerIP: 192.0.2.1, asNumber: 65001, port: 0}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPConfiguration
metadata: {name: as-negative}
spec: {asNumber: -1}
---
apiVersion: brindle.dev/v1alpha1
kind: BGPConfiguration
metadata: {name: mesh-not-boolean}
spec: {nodeToNodeMeshEnabled: "yes"}
---
apiVersion: brindle.dev/v1alpha1
kind: BrindleNode
metadata: {name: cores-not-a-list}
spec: {vrouter: {cores: two}}
---
apiVersion: brindle.dev/v1alpha1
kind: BrindleNode
metadata: {name: interface-name-too-long}
spec: {vrouter: {uplink: a-very-long-interface}}
---
apiVersion: brindle.dev/v1alpha1
kind: BrindleNode
metadata: {name: address-without-prefix}
spec: {bgp: {ipv4Address: 10.0.0.5}}
"#;

/// Runs deploy/tools/validate.py over `files` (and the kustomizations when
/// kubectl is here) and returns its JSON dump of every parsed document by
/// source, or the validator's output as the error.
fn run_validator(
    files: &[PathBuf],
    kustomize: &[PathBuf],
    expect_invalid: Option<&str>,
) -> Result<Value> {
    let probe = Command::new("python3")
        .args(["-c", "import kubernetes_validate"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => bail!(
            "the kubernetes-validate Python package is missing: run `cargo xtask deps` \
             (it runs `{PIP_INSTALL}`)\n{}",
            output_text(&out)
        ),
        Err(e) => bail!("python3 not found ({e}): run `cargo xtask deps` ({PIP_INSTALL})"),
    }
    let scratch = TempDir::new("validate")?;
    let dump = scratch.path().join("documents.json");
    let mut cmd = Command::new("python3");
    cmd.arg(deploy().join("tools/validate.py"))
        .args(["--kubernetes-version", KUBERNETES_VERSION])
        .arg("--dump-json")
        .arg(&dump);
    for dir in kustomize {
        cmd.arg("--kustomize").arg(dir);
    }
    if let Some(objects) = expect_invalid {
        let path = scratch.path().join("invalid.yaml");
        fs::write(&path, objects)?;
        cmd.arg("--expect-invalid").arg(path);
    }
    cmd.args(files);
    let out = cmd.output().context("running deploy/tools/validate.py")?;
    let text = output_text(&out);
    eprintln!("{text}");
    match out.status.code() {
        Some(0) => {}
        Some(3) => bail!("run `cargo xtask deps` ({PIP_INSTALL}):\n{text}"),
        _ => bail!("deploy/tools/validate.py found problems:\n{text}"),
    }
    Ok(serde_json::from_str(&read(&dump)?)?)
}

/// The validation of everything in deploy/kubernetes, run once for all the
/// tests that look at its documents.
fn validated() -> &'static Result<Value, String> {
    static RESULT: OnceLock<Result<Value, String>> = OnceLock::new();
    RESULT.get_or_init(|| {
        let run = || -> Result<Value> {
            let files = manifest_files()?;
            kubectl_present()?;
            let kustomize = vec![
                deploy().join("kubernetes"),
                deploy().join("kubernetes/overlays/etcd"),
            ];
            run_validator(&files, &kustomize, Some(INVALID_OBJECTS))
        };
        run().map_err(|e| format!("{e:#}"))
    })
}

fn documents() -> Result<&'static Value> {
    validated().as_ref().map_err(|e| anyhow!("{e}"))
}

/// Every document of the source files under deploy/kubernetes/base.
fn base_objects() -> Result<Vec<&'static Value>> {
    let all = documents()?.as_object().context("dump is an object")?;
    let base = deploy().join("kubernetes/base");
    Ok(all
        .iter()
        .filter(|(source, _)| Path::new(source).starts_with(&base))
        .flat_map(|(_, docs)| docs.as_array().into_iter().flatten())
        .collect())
}

fn find<'a>(objects: &[&'a Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .copied()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .ok_or_else(|| anyhow!("no {kind}/{name}"))
}

fn named<'a>(list: &'a Value, name: &str) -> Result<&'a Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .find(|item| item["name"] == name)
        .ok_or_else(|| anyhow!("nothing named {name} in {list}"))
}

#[test]
fn every_manifest_validates_against_the_kubernetes_schemas_and_crds_are_structural() -> Result<()> {
    let docs = documents()?.as_object().context("dump")?;
    let files = manifest_files()?;
    // Every file was read and none is empty: a file the walk missed is not
    // validated.
    for file in &files {
        let source = file.to_string_lossy();
        let parsed = docs
            .get(source.as_ref())
            .with_context(|| format!("{source} not validated"))?;
        ensure!(
            parsed.as_array().is_some_and(|a| !a.is_empty()),
            "{source} has no objects"
        );
    }
    {
        // The base's kustomization lists every object in base/.
        let source = format!("kustomize {}", deploy().join("kubernetes").display());
        let rendered = docs.get(&source).context("the base was not rendered")?;
        let key = |o: &Value| format!("{}/{}", o["kind"], o["metadata"]["name"]);
        let rendered: BTreeSet<String> =
            rendered.as_array().into_iter().flatten().map(key).collect();
        for object in base_objects()? {
            ensure!(
                rendered.contains(&key(object)),
                "{} is in base/ but not in kustomization.yaml",
                key(object)
            );
        }
    }
    Ok(())
}

#[test]
fn the_validator_rejects_what_kubernetes_would() -> Result<()> {
    let scratch = TempDir::new("broken")?;
    let broken_daemonset = scratch.path().join("daemonset.yaml");
    let daemonset = read(&deploy().join("kubernetes/base/daemonset.yaml"))?;
    fs::write(
        &broken_daemonset,
        daemonset.replace("hostNetwork: true", "hostNetwork: \"yes\""),
    )?;
    let err = run_validator(&[broken_daemonset], &[], None)
        .expect_err("a string hostNetwork must not validate");
    assert!(format!("{err:#}").contains("hostNetwork"), "{err:#}");

    let unknown_field = scratch.path().join("service.yaml");
    let service = read(&deploy().join("kubernetes/base/service.yaml"))?;
    fs::write(
        &unknown_field,
        service.replace("clusterIP: None", "clusterIP: None\n  clusterIPz: None"),
    )?;
    let err = run_validator(&[unknown_field], &[], None)
        .expect_err("an unknown field must not validate (strict)");
    assert!(format!("{err:#}").contains("clusterIPz"), "{err:#}");

    let not_structural = scratch.path().join("crd.yaml");
    let crd = read(&deploy().join("kubernetes/base/crds/ippools.brindle.dev.yaml"))?;
    let crd = crd.replacen("                natOutgoing:\n                  type: boolean\n",
        "                natOutgoing:\n                  anyOf:\n                    - type: boolean\n", 1);
    fs::write(&not_structural, crd)?;
    let err = run_validator(&[not_structural], &[], None)
        .expect_err("a property without a type is not structural");
    let text = format!("{err:#}");
    assert!(text.contains("spec.natOutgoing: no type"), "{text}");
    assert!(text.contains("inside allOf/anyOf/oneOf/not"), "{text}");
    Ok(())
}

#[test]
fn the_daemonset_keeps_the_node_contracts() -> Result<()> {
    let objects = base_objects()?;
    let ds = find(&objects, "DaemonSet", "brindle-node")?;
    assert_eq!(ds["metadata"]["namespace"], "brindle-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_ne!(pod["hostPID"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    // Tolerates every taint: an empty key with operator Exists and no effect.
    let tolerates_all = pod["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["operator"] == "Exists" && t.get("key").is_none() && t.get("effect").is_none());
    assert!(tolerates_all, "tolerations: {}", pod["tolerations"]);

    // The ServiceAccount and ConfigMap it names exist.
    let account = pod["serviceAccountName"]
        .as_str()
        .context("serviceAccountName")?;
    find(&objects, "ServiceAccount", account)?;
    let volumes = &pod["volumes"];
    let config = named(volumes, "brindle-config")?["configMap"]["name"]
        .as_str()
        .context("the config volume is a ConfigMap")?;
    find(&objects, "ConfigMap", config)?;

    // Host paths, and which are read-only.
    let host_path = |name: &str| -> Result<&str> {
        named(volumes, name)?["hostPath"]["path"]
            .as_str()
            .with_context(|| format!("{name} is not a hostPath"))
    };
    let mut host_paths = BTreeSet::new();
    for v in volumes.as_array().into_iter().flatten() {
        if let Some(p) = v["hostPath"]["path"].as_str() {
            host_paths.insert(p);
        }
    }
    for path in [
        "/run/brindle",
        "/var/lib/brindle",
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/sys/fs/bpf",
        "/lib/modules",
        "/var/run/netns",
    ] {
        assert!(host_paths.contains(path), "no hostPath volume for {path}");
    }

    // The init container installs into the host's CNI directories.
    let init = named(&pod["initContainers"], "install-cni")?;
    let init_mounts: BTreeMap<&str, &str> = init["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["mountPath"].as_str()?, m["name"].as_str()?)))
        .collect();
    let env_of = |container: &Value, name: &str| -> Option<String> {
        named(&container["env"], name)
            .ok()
            .and_then(|e| e["value"].as_str().map(str::to_string))
    };
    for (env, host) in [
        ("BRINDLE_CNI_BIN_DIR", "/opt/cni/bin"),
        ("BRINDLE_CNI_NET_DIR", "/etc/cni/net.d"),
    ] {
        let dir = env_of(init, env).with_context(|| format!("{env} unset"))?;
        let volume = init_mounts
            .get(dir.as_str())
            .with_context(|| format!("{dir} not mounted"))?;
        assert_eq!(host_path(volume)?, host);
    }
    let conflist = env_of(init, "BRINDLE_CNI_CONFLIST").context("BRINDLE_CNI_CONFLIST")?;
    assert!(
        init_mounts
            .get(conflist.rsplit_once('/').map_or("", |(d, _)| d))
            .is_some_and(|v| *v == "brindle-config"),
        "the conflist {conflist} is not read from the ConfigMap"
    );

    // The daemons: privileged, probed on their own ports, with requests.
    let mut pod_guaranteed = true;
    for (name, command, port, mounts) in [
        (
            "brindle-ctrl",
            vec!["brindle-ctrl", "--config", "/etc/brindle/node.toml"],
            9091,
            vec![
                "/run/brindle",
                "/var/lib/brindle",
                "/lib/modules",
                "/etc/brindle",
            ],
        ),
        (
            "brindle-vrouter",
            vec![
                "brindle-vrouter",
                "serve",
                "--config",
                "/etc/brindle/vrouter.toml",
            ],
            9092,
            vec![
                "/run/brindle",
                "/sys/fs/bpf",
                "/lib/modules",
                "/etc/brindle",
            ],
        ),
    ] {
        let c = named(&pod["containers"], name)?;
        assert_eq!(c["command"], json!(command), "{name}");
        assert_eq!(c["securityContext"]["privileged"], true, "{name}");
        for (probe, path) in [
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
            ("startupProbe", "/healthz"),
        ] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["host"], "127.0.0.1", "{name} {probe}");
            assert_eq!(get["port"], port, "{name} {probe}");
            assert_eq!(get["path"], path, "{name} {probe}");
        }
        assert!(
            c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["containerPort"] == port),
            "{name} does not declare port {port}"
        );
        for path in mounts {
            let mount = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["mountPath"] == path)
                .with_context(|| format!("{name} does not mount {path}"))?;
            if path == "/lib/modules" || path == "/etc/brindle" {
                assert_eq!(mount["readOnly"], true, "{name} {path}");
            }
        }
        let resources = &c["resources"];
        for r in ["cpu", "memory"] {
            assert!(
                resources["requests"][r].is_string(),
                "{name} requests no {r}"
            );
        }
        pod_guaranteed &= resources["requests"] == resources["limits"];
    }
    pod_guaranteed &= init["resources"]["requests"] == init["resources"]["limits"];
    // Exclusive cores under the static CPU manager policy need a Guaranteed
    // pod and a whole number of CPUs for the vrouter.
    assert!(
        pod_guaranteed,
        "every container's requests must equal its limits"
    );
    let vrouter = named(&pod["containers"], "brindle-vrouter")?;
    // TAP pods (the default): the vrouter opens the pods' network
    // namespaces by the runtime's paths, which appear after it started.
    let netns = vrouter["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == "/var/run/netns")
        .context("brindle-vrouter does not mount /var/run/netns")?;
    assert_eq!(netns["mountPropagation"], "HostToContainer");
    assert_eq!(
        host_path(netns["name"].as_str().context("mount name")?)?,
        "/var/run/netns"
    );
    let cpus = vrouter["resources"]["requests"]["cpu"]
        .as_str()
        .context("vrouter cpu")?;
    assert!(
        cpus.parse::<u32>().is_ok_and(|n| n >= 1),
        "vrouter cpu {cpus:?} is not whole cores"
    );
    assert!(
        env_of(vrouter, "BRINDLE_VROUTER_CORES").is_some(),
        "the pinned cores are not set"
    );
    let ctrl = named(&pod["containers"], "brindle-ctrl")?;
    assert!(
        ctrl["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["containerPort"] == 179),
        "brindle-ctrl does not declare BGP"
    );
    Ok(())
}

#[test]
fn rbac_only_reads_what_the_daemon_reads() -> Result<()> {
    let objects = base_objects()?;
    let role = find(&objects, "ClusterRole", "brindle-node")?;
    let mut reads = BTreeSet::new();
    let mut writes = BTreeSet::new();
    for rule in role["rules"].as_array().context("rules")? {
        for group in rule["apiGroups"].as_array().context("apiGroups")? {
            for resource in rule["resources"].as_array().context("resources")? {
                for verb in rule["verbs"].as_array().context("verbs")? {
                    let (group, resource, verb) = (
                        group.as_str().unwrap_or("?"),
                        resource.as_str().unwrap_or("?"),
                        verb.as_str().unwrap_or("?"),
                    );
                    assert!(
                        group != "*" && resource != "*" && verb != "*",
                        "wildcard in {rule}"
                    );
                    let entry = format!("{group}/{resource}");
                    if ["get", "list", "watch"].contains(&verb) {
                        reads.insert(entry);
                    } else {
                        writes.insert(entry);
                    }
                }
            }
        }
    }
    // Exactly what brindle-kube's watchers read (kube/README.md), and no
    // write: nothing reads leases or the brindle.dev resources.
    let expected_reads: BTreeSet<String> = [
        "/nodes",
        "/pods",
        "/namespaces",
        "networking.k8s.io/networkpolicies",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(reads, expected_reads);
    assert_eq!(writes, BTreeSet::new());

    // The binding binds the DaemonSet's account to the role.
    let binding = find(&objects, "ClusterRoleBinding", "brindle-node")?;
    assert_eq!(binding["roleRef"]["name"], "brindle-node");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "brindle-node", "namespace": "brindle-system"})
    );
    Ok(())
}

#[test]
fn the_crds_are_the_four_brindle_kinds() -> Result<()> {
    let objects = base_objects()?;
    let kinds: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .inspect(|o| {
            assert_eq!(o["spec"]["group"], "brindle.dev");
            assert_eq!(o["apiVersion"], "apiextensions.k8s.io/v1");
        })
        .filter_map(|o| o["spec"]["names"]["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["IPPool", "BGPPeer", "BGPConfiguration", "BrindleNode"])
    );
    // The defaults documented in DESIGN.md are the CRDs' defaults.
    let spec = |name: &str| -> Result<&Value> {
        let crd = find(&objects, "CustomResourceDefinition", name)?;
        Ok(
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"],
        )
    };
    let pool = spec("ippools.brindle.dev")?;
    assert_eq!(pool["encapsulation"]["default"], "ipip");
    assert_eq!(
        pool["encapsulation"]["enum"],
        json!([
            "none",
            "ipip",
            "ipip_cross_subnet",
            "vxlan",
            "vxlan_cross_subnet"
        ])
    );
    let bgp = spec("bgpconfigurations.brindle.dev")?;
    assert_eq!(bgp["asNumber"]["default"], 64512);
    assert_eq!(bgp["nodeToNodeMeshEnabled"]["default"], true);
    Ok(())
}

#[test]
fn metrics_are_scrapable_through_the_service() -> Result<()> {
    let objects = base_objects()?;
    let service = find(&objects, "Service", "brindle-metrics")?;
    let ds = find(&objects, "DaemonSet", "brindle-node")?;
    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .context("pod labels")?;
    for (k, v) in service["spec"]["selector"]
        .as_object()
        .context("selector")?
    {
        assert_eq!(labels.get(k), Some(v), "the Service selects no node pod");
    }
    let named_ports: BTreeMap<&str, &Value> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter_map(|p| Some((p["name"].as_str()?, &p["containerPort"])))
        .collect();
    for (port, number) in [(9091, "ctrl-metrics"), (9092, "vrouter-metrics")] {
        let p = named(&service["spec"]["ports"], number)?;
        assert_eq!(p["port"], port);
        assert_eq!(named_ports.get(number), Some(&&json!(port)));
    }
    assert_eq!(
        service["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    Ok(())
}

#[test]
fn the_etcd_overlay_switches_the_datastore() -> Result<()> {
    kubectl_present()?;
    let docs = documents()?.as_object().context("dump")?;
    let overlay = docs
        .iter()
        .find(|(k, _)| k.starts_with("kustomize") && k.ends_with("overlays/etcd"))
        .map(|(_, v)| v)
        .context("overlays/etcd was not rendered")?;
    let objects: Vec<&Value> = overlay.as_array().into_iter().flatten().collect();
    let ds = find(&objects, "DaemonSet", "brindle-node")?;
    let pod = &ds["spec"]["template"]["spec"];
    let ctrl = named(&pod["containers"], "brindle-ctrl")?;
    assert_eq!(
        named(&ctrl["env"], "BRINDLE_DATASTORE_TYPE")?["value"],
        "etcd"
    );
    assert_eq!(
        named(&ctrl["env"], "BRINDLE_DATASTORE_PREFIX")?["value"],
        "/brindle/"
    );
    // The base's variables survive the patch.
    named(&ctrl["env"], "BRINDLE_NODE_NAME")?;
    let tls = named(&pod["volumes"], "etcd-tls")?;
    assert_eq!(tls["secret"]["secretName"], "brindle-etcd-tls");
    for file in ["CA", "CERT", "KEY"] {
        let path = named(&ctrl["env"], &format!("BRINDLE_DATASTORE_ETCD_{file}_FILE"))?["value"]
            .as_str()
            .context("file path")?;
        let mount = ctrl["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "etcd-tls")
            .context("etcd-tls not mounted")?;
        assert!(path.starts_with(mount["mountPath"].as_str().unwrap_or("?")));
    }
    // Both daemons still run, and the base's objects are all there.
    named(&pod["containers"], "brindle-vrouter")?;
    assert_eq!(objects.len(), base_objects()?.len());
    Ok(())
}

// ===== the configuration files =====

/// `section.key -> value` of a flat TOML file (tables of scalars, which is
/// all node.toml and vrouter.toml have); comments and blank lines skipped.
fn toml_keys(text: &str) -> Result<BTreeMap<String, String>> {
    let mut section = String::new();
    let mut keys = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = format!("{name}.");
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| anyhow!("not key = value: {line:?}"))?;
        keys.insert(format!("{section}{}", key.trim()), value.trim().to_string());
    }
    Ok(keys)
}

#[test]
fn the_configmap_carries_the_deploy_files() -> Result<()> {
    let objects = base_objects()?;
    let data = &find(&objects, "ConfigMap", "brindle-config")?["data"];
    assert_eq!(
        data["10-brindle.conflist"].as_str(),
        Some(rendered_conflist()?.as_str()),
        "the ConfigMap's conflist differs from deploy/cni/10-brindle.conflist"
    );
    for (file, listen) in [
        ("node.toml", "0.0.0.0:9091"),
        ("vrouter.toml", "0.0.0.0:9092"),
    ] {
        let in_cluster = toml_keys(data[file].as_str().context(file)?)?;
        let on_host = toml_keys(&read(&deploy().join("systemd").join(file))?)?;
        let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<BTreeSet<_>>();
        assert_eq!(
            names(&in_cluster),
            names(&on_host),
            "{file}: the ConfigMap and deploy/systemd have different keys"
        );
        // Only the metrics address differs: Prometheus scrapes from another
        // pod in the cluster, while the host keeps it on loopback. And the
        // daemons' log format: JSON lines for the cluster's log
        // pipeline, plain text for journald on a host. And the Kubernetes
        // source: on in the cluster (its service account and RBAC are
        // there), off on a plain host.
        for (key, value) in &on_host {
            if key == "metrics.listen" {
                assert_eq!(in_cluster[key], format!("\"{listen}\""));
                assert!(value.starts_with("\"127.0.0.1:"), "{file} {key} = {value}");
            } else if key == "log_format" {
                assert_eq!(in_cluster[key], "\"json\"");
                assert_eq!(value, "\"text\"");
            } else if file == "node.toml" && key == "datastore.kubernetes.enabled" {
                assert_eq!(in_cluster[key], "true");
                assert_eq!(value, "false");
            } else {
                assert_eq!(&in_cluster[key], value, "{file} {key}");
            }
        }
    }
    // The defaults of the contracts.
    let node = toml_keys(&read(&deploy().join("systemd/node.toml"))?)?;
    for (key, value) in [
        ("api.socket", "\"/run/brindle/ctrl.sock\""),
        ("vrouter.socket", "\"/run/brindle/vrouter.sock\""),
        ("metrics.listen", "\"127.0.0.1:9091\""),
        ("datastore.type", "\"embedded\""),
        ("datastore.path", "\"/var/lib/brindle\""),
        ("bgp.as_number", "64512"),
        ("bgp.listen_port", "179"),
        ("bgp.node_to_node_mesh", "true"),
        ("ipam.default_pool_cidr", "\"10.244.0.0/16\""),
        ("ipam.block_size", "26"),
        ("ipam.encapsulation", "\"ipip\""),
        // Issue 14: kube-proxy's DNAT, kubelet's probes and natOutgoing
        // need the host port.
        ("vrouter.host_port", "\"brindle0\""),
    ] {
        assert_eq!(
            node.get(key).map(String::as_str),
            Some(value),
            "node.toml {key}"
        );
    }
    let vrouter = toml_keys(&read(&deploy().join("systemd/vrouter.toml"))?)?;
    for (key, value) in [
        ("api.socket", "\"/run/brindle/vrouter.sock\""),
        ("metrics.listen", "\"127.0.0.1:9092\""),
        ("encap.vxlan_port", "4789"),
        ("encap.vxlan_vni", "4096"),
    ] {
        assert_eq!(
            vrouter.get(key).map(String::as_str),
            Some(value),
            "vrouter.toml {key}"
        );
    }
    Ok(())
}

// ===== the image =====

/// The Containerfile's instructions, continuation lines joined, comments
/// dropped.
fn containerfile_instructions() -> Result<Vec<String>> {
    let text = read(&deploy().join("Containerfile"))?;
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(part) = trimmed.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            out.push(std::mem::take(&mut current));
        }
    }
    Ok(out)
}

/// `package name -> its binaries` of the workspace, from `cargo metadata`.
fn workspace_binaries() -> Result<BTreeMap<String, BTreeSet<String>>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(repo())
        .output()?;
    ensure!(
        out.status.success(),
        "cargo metadata: {}",
        output_text(&out)
    );
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    let mut bins = BTreeMap::new();
    for package in meta["packages"].as_array().context("packages")? {
        let names: BTreeSet<String> = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.contains(&json!("bin")))
            })
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        bins.insert(package["name"].as_str().unwrap_or("?").to_string(), names);
    }
    Ok(bins)
}

/// A `NAME="..."` assignment of deploy/image/build.sh.
fn build_sh_value(name: &str) -> Result<String> {
    let script = read(&deploy().join("image/build.sh"))?;
    script
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
        .and_then(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .with_context(|| format!("build.sh assigns no {name}"))
}

/// The image is built for real by the image test (root); this checks the
/// recipe without root: the Containerfile copies only what build.sh stages
/// (bin/ with the binaries it names, install-cni.sh, the conflist), those
/// binaries are the workspace's and build.sh's cargo build makes them, and
/// the base carries the run-time packages.
#[test]
fn the_containerfile_copies_what_build_sh_stages_and_the_workspace_builds() -> Result<()> {
    let instructions = containerfile_instructions()?;
    let froms: Vec<&String> = instructions
        .iter()
        .filter(|i| i.starts_with("FROM "))
        .collect();
    assert_eq!(
        froms.iter().map(|f| f.as_str()).collect::<Vec<_>>(),
        ["FROM ${BASE_IMAGE}"],
        "one stage on the base build.sh makes"
    );
    assert!(
        !instructions.iter().any(|i| i.starts_with("RUN ")),
        "nothing runs at build time (the base has the packages; no network)"
    );
    let staged: BTreeSet<String> = build_sh_value("BINARIES")?
        .split_whitespace()
        .map(String::from)
        .collect();
    let packages = build_sh_value("RUNTIME_PACKAGES")?;
    for p in [
        "iproute2",
        "iptables",
        "ca-certificates",
        "containernetworking-plugins",
    ] {
        assert!(packages.split(',').any(|x| x == p), "the base lacks {p}");
    }
    let script = read(&deploy().join("image/build.sh"))?;
    let build_line = script
        .lines()
        .skip_while(|l| {
            !l.trim_start()
                .starts_with("(cd \"$repo\" && cargo build --release --locked")
        })
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let workspace = workspace_binaries()?;
    let words: Vec<&str> = build_line
        .split_whitespace()
        .map(|w| w.trim_end_matches(')'))
        .collect();
    let mut built = BTreeSet::new();
    for pair in words.windows(2).filter(|w| w[0] == "-p") {
        let bins = workspace
            .get(pair[1])
            .with_context(|| format!("-p {} is not a workspace package", pair[1]))?;
        built.extend(bins.iter().cloned());
    }
    for bin in &staged {
        assert!(built.contains(bin), "{bin} is not built by: {build_line}");
    }
    let mut copied = BTreeMap::new();
    for copy in instructions.iter().filter(|i| i.starts_with("COPY ")) {
        let words: Vec<&str> = copy.split_whitespace().collect();
        assert!(!words[1].starts_with("--from"), "{copy}: no other stage");
        let (dest, sources) = words[1..]
            .split_last()
            .context("COPY without a destination")?;
        for source in sources {
            match source.strip_prefix("bin/") {
                Some(bin) => {
                    assert!(staged.contains(bin), "{bin} is not staged by build.sh");
                    copied.insert(bin.to_string(), dest.to_string());
                }
                None => assert!(
                    ["install-cni.sh", "10-brindle.conflist"].contains(source),
                    "COPY {source}: build.sh does not stage it"
                ),
            }
        }
    }
    for (bin, dir) in [
        ("brindle-ctrl", "/usr/local/bin/"),
        ("brindle-vrouter", "/usr/local/bin/"),
        ("brindlectl", "/usr/local/bin/"),
        ("brindle", "/opt/brindle/cni/bin/"),
        ("brindle-ipam", "/opt/brindle/cni/bin/"),
    ] {
        let dest = copied
            .get(bin)
            .with_context(|| format!("{bin} not in the image"))?;
        assert!(dest.starts_with(dir), "{bin} goes to {dest}, not {dir}");
    }
    assert!(
        instructions
            .iter()
            .any(|i| i.starts_with("COPY ") && i.ends_with(" /usr/local/bin/brindle-install-cni")),
        "brindle-install-cni is not in the image"
    );
    Ok(())
}

#[test]
fn install_cni_installs_plugins_and_conflist_and_keeps_the_hosts_own_plugins() -> Result<()> {
    let dir = TempDir::new("install-cni")?;
    let src = dir.path().join("image/opt/brindle/cni/bin");
    let reference = dir.path().join("image/usr/lib/cni");
    let host_bin = dir.path().join("host/opt/cni/bin");
    let host_net = dir.path().join("host/etc/cni/net.d");
    for plugin in ["brindle", "brindle-ipam"] {
        write_executable(&src.join(plugin), &format!("#!/bin/sh\necho {plugin} v2\n"))?;
    }
    for plugin in ["tuning", "bandwidth", "portmap"] {
        write_executable(&reference.join(plugin), "#!/bin/sh\necho image's own\n")?;
    }
    write_executable(&host_bin.join("tuning"), "#!/bin/sh\necho host's own\n")?;
    write_executable(&host_bin.join("brindle"), "#!/bin/sh\necho brindle v1\n")?;

    for _ in 0..2 {
        let out = Command::new("sh")
            .arg(deploy().join("image/install-cni.sh"))
            .env("BRINDLE_CNI_SRC_DIR", &src)
            .env("BRINDLE_CNI_REF_DIR", &reference)
            .env("BRINDLE_CNI_BIN_DIR", &host_bin)
            .env("BRINDLE_CNI_NET_DIR", &host_net)
            .env(
                "BRINDLE_CNI_CONFLIST",
                deploy().join("cni/10-brindle.conflist"),
            )
            .output()?;
        assert!(out.status.success(), "{}", output_text(&out));
    }
    for plugin in ["brindle", "brindle-ipam"] {
        assert_eq!(
            read(&host_bin.join(plugin))?,
            format!("#!/bin/sh\necho {plugin} v2\n")
        );
        assert_eq!(mode_of(&host_bin.join(plugin))?, 0o755);
    }
    assert_eq!(
        read(&host_bin.join("tuning"))?,
        "#!/bin/sh\necho host's own\n"
    );
    for plugin in ["bandwidth", "portmap"] {
        assert_eq!(
            read(&host_bin.join(plugin))?,
            "#!/bin/sh\necho image's own\n"
        );
    }
    let conflist = host_net.join("10-brindle.conflist");
    assert_eq!(
        read(&conflist)?,
        read(&deploy().join("cni/10-brindle.conflist"))?
    );
    assert_eq!(mode_of(&conflist)?, 0o644);
    // No temporary files left behind.
    for d in [&host_bin, &host_net] {
        for entry in fs::read_dir(d)? {
            let name = entry?.file_name();
            assert!(
                !name.to_string_lossy().contains(".brindle-new."),
                "{name:?} left"
            );
        }
    }
    Ok(())
}

// ===== systemd =====

#[test]
fn the_systemd_units_order_the_daemons_and_keep_their_capabilities() -> Result<()> {
    let unit = |name: &str| -> Result<BTreeMap<String, Vec<String>>> {
        let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in read(&deploy().join("systemd").join(name))?.lines() {
            if let Some((k, v)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
                keys.entry(k.to_string()).or_default().push(v.to_string());
            }
        }
        Ok(keys)
    };
    let one = |u: &BTreeMap<String, Vec<String>>, k: &str| -> String {
        u.get(k).map(|v| v.join(" ")).unwrap_or_default()
    };
    let ctrl = unit("brindle-ctrl.service")?;
    let vrouter = unit("brindle-vrouter.service")?;
    assert!(one(&ctrl, "Requires").contains("brindle-vrouter.service"));
    assert!(one(&ctrl, "After").contains("brindle-vrouter.service"));
    assert_eq!(
        one(&vrouter, "ExecStart"),
        "/usr/local/bin/brindle-vrouter serve --config /etc/brindle/vrouter.toml"
    );
    assert_eq!(
        one(&ctrl, "ExecStart"),
        "/usr/local/bin/brindle-ctrl --config /etc/brindle/node.toml"
    );
    for u in [&ctrl, &vrouter] {
        assert_eq!(one(u, "Restart"), "always");
        assert_eq!(one(u, "LimitMEMLOCK"), "infinity");
        assert_eq!(one(u, "RuntimeDirectory"), "brindle");
        assert_eq!(one(u, "RuntimeDirectoryMode"), "0700");
        // Both units share /run/brindle: without this, stopping one would
        // delete the other's socket.
        assert_eq!(one(u, "RuntimeDirectoryPreserve"), "yes");
        assert_eq!(one(u, "NoNewPrivileges"), "yes");
        assert_eq!(one(u, "ProtectSystem"), "strict");
        let caps = one(u, "CapabilityBoundingSet");
        for cap in [
            "CAP_NET_ADMIN",
            "CAP_SYS_ADMIN",
            "CAP_BPF",
            "CAP_NET_RAW",
            "CAP_IPC_LOCK",
        ] {
            assert!(
                caps.split_whitespace().any(|c| c == cap),
                "{cap} missing: {caps}"
            );
        }
        let families = one(u, "RestrictAddressFamilies");
        assert!(families.contains("AF_NETLINK") && families.contains("AF_UNIX"));
    }
    assert!(one(&vrouter, "RestrictAddressFamilies").contains("AF_XDP"));
    // TAP pods (the conflist's default) and the host port: the vrouter
    // opens /dev/net/tun and enters pods' network namespaces. A private
    // /dev has no /dev/net/tun.
    assert_ne!(one(&vrouter, "PrivateDevices"), "yes");
    assert_eq!(one(&vrouter, "DevicePolicy"), "closed");
    assert_eq!(one(&vrouter, "DeviceAllow"), "/dev/net/tun rw");
    assert_eq!(one(&vrouter, "RestrictNamespaces"), "net");
    assert_eq!(one(&ctrl, "StateDirectory"), "brindle");
    Ok(())
}

#[test]
fn install_sh_lays_out_a_host_whose_units_systemd_verifies() -> Result<()> {
    let dir = TempDir::new("install-sh")?;
    let bins = dir.path().join("bin");
    let root = dir.path().join("root");
    let install = |bins: &Path| -> Result<Output> {
        Ok(Command::new("sh")
            .arg(deploy().join("systemd/install.sh"))
            .env("BRINDLE_BIN_DIR", bins)
            .env("DESTDIR", &root)
            .output()?)
    };
    // Without the binaries it refuses, and says why.
    fs::create_dir_all(&bins)?;
    let out = install(&bins)?;
    assert!(!out.status.success());
    assert!(
        output_text(&out).contains("build the release binaries"),
        "{}",
        output_text(&out)
    );

    let all = [
        "brindle",
        "brindle-ipam",
        "brindle-ctrl",
        "brindle-vrouter",
        "brindlectl",
    ];
    for b in all {
        write_executable(&bins.join(b), &format!("#!/bin/sh\necho {b}\n"))?;
    }
    let out = install(&bins)?;
    assert!(out.status.success(), "{}", output_text(&out));
    for (b, dir) in [
        ("brindle", "opt/cni/bin"),
        ("brindle-ipam", "opt/cni/bin"),
        ("brindle-ctrl", "usr/local/bin"),
        ("brindle-vrouter", "usr/local/bin"),
        ("brindlectl", "usr/local/bin"),
    ] {
        let path = root.join(dir).join(b);
        assert_eq!(read(&path)?, format!("#!/bin/sh\necho {b}\n"));
        assert_eq!(mode_of(&path)?, 0o755);
    }
    assert_eq!(
        read(&root.join("etc/cni/net.d/10-brindle.conflist"))?,
        read(&deploy().join("cni/10-brindle.conflist"))?
    );
    for f in ["node.toml", "vrouter.toml"] {
        assert_eq!(
            read(&root.join("etc/brindle").join(f))?,
            read(&deploy().join("systemd").join(f))?
        );
    }
    // A second run keeps the operator's configuration.
    fs::write(root.join("etc/brindle/node.toml"), "# edited\n")?;
    let out = install(&bins)?;
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(read(&root.join("etc/brindle/node.toml"))?, "# edited\n");

    // systemd-analyze verify on the installed tree: it checks every key and
    // value, the dependencies, and that ExecStart's binaries exist. It needs
    // the distribution's units (sysinit.target and friends) in the root.
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not found: the units are not verified");
        return Ok(());
    };
    assert!(version.status.success());
    fs::create_dir_all(root.join("usr/lib/systemd"))?;
    let copy = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(root.join("usr/lib/systemd/"))
        .output()?;
    assert!(copy.status.success(), "{}", output_text(&copy));
    // ExecReload's kill(1) comes with the distribution too (procps).
    fs::create_dir_all(root.join("usr/bin"))?;
    fs::copy("/usr/bin/kill", root.join("usr/bin/kill"))?;
    let units = root.join("etc/systemd/system");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .arg(units.join("brindle-vrouter.service"))
        .arg(units.join("brindle-ctrl.service"))
        .output()?;
    let text = output_text(&out);
    let complaints: Vec<&str> = text.lines().filter(|l| l.contains("brindle")).collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "systemd-analyze verify:\n{text}"
    );
    Ok(())
}
