//! What the tests of every Brindle crate share: network namespaces with
//! unique names deleted on drop ([`netns`]), a real etcd with TLS
//! ([`tls_etcd`]), the directory of the built binaries
//! ([`built_binaries`]), one polling helper ([`wait_for`]) and one guard
//! for a daemon started as a child process ([`daemon::Daemon`]).
//!
//! It depends on no product crate, so that any crate (the CNI plugin
//! included) can use it as a dev-dependency without a cycle.
#![forbid(unsafe_code)]

pub mod daemon;
pub mod netns;
pub mod tls_etcd;
mod wait;

pub use wait::wait_for;

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
