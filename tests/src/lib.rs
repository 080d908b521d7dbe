//! Helpers for Brindle's whole-node tests: namespaces and veths with unique
//! names, torn down on drop (also when a test fails).
#![forbid(unsafe_code)]

pub mod lab;
pub mod netns;
pub mod tls_etcd;

/// The directory of the workspace binaries a test execs: `$<env_var>` if
/// set, else the one beside the running test (`<target>/<profile>`, where
/// `cargo build --workspace --bins`, run by `cargo xtask test` before the
/// tests, puts them). Cargo cannot be run from inside a test (the build
/// lock), so the binaries must be built before.
pub fn built_binaries(env_var: &str) -> std::path::PathBuf {
    std::env::var_os(env_var).map_or_else(
        || {
            let exe = std::env::current_exe().expect("the test's own path");
            // <target>/<profile>/deps/<test>-<hash> -> <target>/<profile>
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("the test runs from <target>/<profile>/deps")
                .to_path_buf()
        },
        std::path::PathBuf::from,
    )
}
