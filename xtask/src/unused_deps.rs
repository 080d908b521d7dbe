//! The unused-dependency check of `cargo xtask test`: every dependency a
//! crate's `Cargo.toml` declares (normal, dev, build, per target) must be
//! named in that crate's Rust sources (`name::`, `use name`, `#[name::…]`,
//! `extern crate name`), with `-` read as `_` and a renamed dependency by
//! its key. Comments do not count. A normal dependency must be named
//! outside `tests/`, `benches/` and `examples/`: one only they name belongs
//! in `[dev-dependencies]` (it would otherwise be built into the release). A dependency needed without being
//! named (a feature switch, a linked C library) is listed in the crate's
//! `[package.metadata.unused-deps] ignore = ["name"]`, which says why it
//! stays in a comment next to it.
//!
//! Like cargo-machete, this reads text rather than building: it cannot see
//! a name that only a macro expansion produces, and a name in a string
//! counts as a use. Unlike cargo-machete it needs no download and no build,
//! and it runs in a second.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One dependency nobody names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    /// The crate's manifest, relative to the workspace.
    pub manifest: PathBuf,
    /// The dependency's key in it.
    pub dependency: String,
    /// The table it is declared in (`dependencies`, `dev-dependencies`, ...).
    pub table: String,
}

/// Every unused dependency of every crate under `root` (crates in
/// `target/` and hidden directories skipped).
pub fn find(root: &Path) -> Result<Vec<Unused>> {
    let mut manifests = Vec::new();
    collect_manifests(root, &mut manifests)?;
    manifests.sort();
    let mut unused = Vec::new();
    for manifest in manifests {
        let dir = manifest.parent().context("a manifest has a directory")?;
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("reading {}", manifest.display()))?;
        let (deps, ignored) = declared(&text);
        if deps.is_empty() {
            continue;
        }
        let mut sources = Sources::default();
        collect_sources(dir, dir, &mut sources)?;
        let rel = manifest.strip_prefix(root).unwrap_or(&manifest);
        for (dependency, table) in deps {
            let named = if table == "dependencies" {
                mentioned(&sources.product, &dependency)
            } else {
                mentioned(&sources.product, &dependency) || mentioned(&sources.tests, &dependency)
            };
            if !ignored.contains(&dependency) && !named {
                unused.push(Unused {
                    manifest: rel.to_path_buf(),
                    dependency,
                    table,
                });
            }
        }
    }
    Ok(unused)
}

fn skipped(name: &str) -> bool {
    name == "target" || name.starts_with('.')
}

fn collect_manifests(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            if !skipped(&name) {
                collect_manifests(&path, out)?;
            }
        } else if name == "Cargo.toml" {
            out.push(path);
        }
    }
    Ok(())
}

/// A crate's Rust sources, comments removed.
#[derive(Default)]
struct Sources {
    /// Everything but `tests/`, `benches/` and `examples/`.
    product: String,
    /// `tests/`, `benches/` and `examples/`.
    tests: String,
}

/// The Rust sources of the crate at `krate`; directories holding another
/// crate are left to that crate.
fn collect_sources(krate: &Path, dir: &Path, out: &mut Sources) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            if !skipped(&name) && (path == krate || !path.join("Cargo.toml").exists()) {
                collect_sources(krate, &path, out)?;
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let in_tests = path
                .strip_prefix(krate)
                .ok()
                .and_then(|p| p.components().next())
                .is_some_and(|c| {
                    ["tests", "benches", "examples"].contains(&&*c.as_os_str().to_string_lossy())
                });
            let out = if in_tests {
                &mut out.tests
            } else {
                &mut out.product
            };
            for line in text.lines() {
                out.push_str(line.split("//").next().unwrap_or(""));
                out.push('\n');
            }
        }
    }
    Ok(())
}

/// The dependencies a manifest declares (key, table) and the keys its
/// `[package.metadata.unused-deps] ignore` lists.
pub fn declared(manifest: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut deps = Vec::new();
    let mut ignored = Vec::new();
    let mut table: Option<String> = None;
    let mut in_ignore_table = false;
    for raw in manifest.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let header = header.trim_matches(|c| c == '[' || c == ']').trim();
            in_ignore_table = header == "package.metadata.unused-deps";
            // `dependencies`, `dev-dependencies`, `target.'cfg(..)'.dependencies`,
            // or `dependencies.name` (one dependency as a table).
            let last_tables = ["dev-dependencies", "build-dependencies", "dependencies"];
            table = None;
            if let Some(kind) = last_tables.iter().find(|k| header.ends_with(*k)) {
                if !header.starts_with("workspace") {
                    table = Some((*kind).to_owned());
                }
            } else if let Some((kind, name)) = last_tables
                .iter()
                .find_map(|k| Some((*k, header.split_once(&format!("{k}."))?.1)))
                && !header.starts_with("workspace")
            {
                deps.push((name.trim_matches('"').to_owned(), kind.to_owned()));
            }
            continue;
        }
        if in_ignore_table && let Some(list) = line.strip_prefix("ignore") {
            ignored.extend(
                list.trim_start_matches([' ', '=', '['])
                    .split(',')
                    .map(|s| s.trim().trim_matches([']', '"', ' ']).to_owned())
                    .filter(|s| !s.is_empty()),
            );
            continue;
        }
        let Some(kind) = &table else { continue };
        // A key starts its line; indented lines continue a value.
        if raw.starts_with([' ', '\t']) {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let key = key.split('.').next().unwrap_or(key).trim_matches('"');
        if !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            deps.push((key.to_owned(), kind.clone()));
        }
    }
    (deps, ignored)
}

/// The dependency's crate name appears as a whole identifier.
pub fn mentioned(sources: &str, dependency: &str) -> bool {
    let ident = dependency.replace('-', "_");
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    sources.match_indices(&ident).any(|(at, _)| {
        let before = sources[..at].chars().next_back();
        let after = sources[at + ident.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"
[package]
name = "x"

[package.metadata.unused-deps]
ignore = ["openssl-sys"] # linked, never named

[dependencies]
anyhow.workspace = true
tokio-util = { workspace = true }
serde = { version = "1", features = [
    "derive",
] }
renamed = { package = "real-name", version = "1" }
openssl-sys = "0.9"

[target.'cfg(unix)'.dependencies]
nix.workspace = true

[dev-dependencies]
tempfile.workspace = true

[dependencies.futures]
version = "0.3"

[workspace.dependencies]
notadep = "1"
"#;

    #[test]
    fn every_kind_of_declaration_is_read() {
        let (deps, ignored) = declared(MANIFEST);
        let names: Vec<&str> = deps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "anyhow",
                "tokio-util",
                "serde",
                "renamed",
                "openssl-sys",
                "nix",
                "tempfile",
                "futures"
            ]
        );
        assert_eq!(deps[6].1, "dev-dependencies");
        assert_eq!(ignored, ["openssl-sys"]);
    }

    #[test]
    fn a_dependency_counts_only_as_a_whole_identifier_outside_comments() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("Cargo.toml"), MANIFEST).unwrap();
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(
            dir.join("src/lib.rs"),
            "use anyhow::Result;\n#[derive(serde::Serialize)]\nstruct S;\n\
             // tokio_util::sync is not used\nfn f() { let my_nix = 1; renamed::go(); }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("src/t.rs"),
            "#[cfg(test)] use tempfile::TempDir;\n",
        )
        .unwrap();
        // A normal dependency named only by a test belongs in
        // dev-dependencies: nix and futures stay unused.
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(
            dir.join("tests/it.rs"),
            "use nix::unistd;\nuse futures::Stream;\n",
        )
        .unwrap();
        let unused: Vec<String> = find(&dir)
            .unwrap()
            .into_iter()
            .map(|u| u.dependency)
            .collect();
        assert_eq!(unused, ["tokio-util", "nix", "futures"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh directory (xtask has no tempfile dependency).
    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xtask-unused-deps-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
