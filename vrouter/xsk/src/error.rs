//! Errors of the crate: typed, and each keeps the errno it came from.

use std::io;

/// What went wrong opening, binding or driving a socket or BPF object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range; checked before any syscall.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// The interface name does not exist (in this network namespace).
    #[error("interface {name:?} not found: {source}")]
    NoSuchInterface {
        /// The name looked up.
        name: String,
        /// The errno of `if_nametoindex`.
        source: io::Error,
    },
    /// Registering or pinning memory failed because of the locked-memory
    /// limit: the UMEM and ring pages count against `RLIMIT_MEMLOCK`.
    #[error(
        "{what}: {source}: {bytes} bytes do not fit under RLIMIT_MEMLOCK (soft {soft} bytes, hard {hard} bytes); \
         use fewer or smaller frames (e.g. 4096 x 2048 B = 8 MiB) or raise the limit"
    )]
    Memlock {
        /// The operation.
        what: &'static str,
        /// Bytes requested.
        bytes: u64,
        /// Soft RLIMIT_MEMLOCK in bytes.
        soft: u64,
        /// Hard RLIMIT_MEMLOCK in bytes.
        hard: u64,
        /// The errno (ENOBUFS, ENOMEM or EPERM).
        source: io::Error,
    },
    /// The driver refused zero-copy mode (forced by configuration).
    #[error("zero-copy AF_XDP refused by the driver of ifindex {ifindex}: {source}")]
    ZeroCopyUnsupported {
        /// Interface index.
        ifindex: u32,
        /// The errno (usually EOPNOTSUPP).
        source: io::Error,
    },
    /// A (interface, queue) already has a socket on this UMEM.
    #[error("ifindex {ifindex} queue {queue} already has a socket on this UMEM")]
    QueueTaken {
        /// Interface index.
        ifindex: u32,
        /// Queue id.
        queue: u32,
    },
    /// An interface of that name already exists (where a TAP was to be
    /// created).
    #[error("interface {name:?} already exists")]
    InterfaceExists {
        /// The name.
        name: String,
    },
    /// The interface is not a persistent, multi-queue TAP with a
    /// virtio-net header, so the vrouter will not attach to it.
    #[error("interface {name:?} is not a persistent multi-queue TAP with a virtio-net header")]
    NotPersistentTap {
        /// The name.
        name: String,
    },
    /// The BPF verifier refused a program; the log says why.
    #[error("BPF program {name} refused: {source}\n{log}")]
    Verifier {
        /// Program name.
        name: &'static str,
        /// The errno.
        source: io::Error,
        /// The verifier log.
        log: String,
    },
    /// Any other syscall failure, with the operation that made it.
    #[error("{what}: {source}")]
    Sys {
        /// The operation.
        what: &'static str,
        /// The errno.
        source: io::Error,
    },
}

/// The operation named in a [`Error::Sys`] from the live-frames generator.
pub(crate) const LIVE_FRAMES_OP: &str = "BPF_PROG_TEST_RUN (live frames)";

impl Error {
    /// Whether this is the kernel refusing `BPF_PROG_TEST_RUN` with live
    /// frames outright (EPERM), as some kernels do for a process without
    /// every capability (seen on a 6.18 VM kernel whose root lacks
    /// CAP_SYS_RESOURCE). Callers that can do without the live generator
    /// (tests, benchmarks with the AF_XDP generator) tell it from a failure.
    pub fn is_live_frames_refused(&self) -> bool {
        matches!(self, Error::Sys { what, source }
            if *what == LIVE_FRAMES_OP && source.raw_os_error() == Some(libc::EPERM))
    }

    /// The errno behind this error, if one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Config(_)
            | Error::QueueTaken { .. }
            | Error::InterfaceExists { .. }
            | Error::NotPersistentTap { .. } => None,
            Error::NoSuchInterface { source, .. }
            | Error::Memlock { source, .. }
            | Error::ZeroCopyUnsupported { source, .. }
            | Error::Verifier { source, .. }
            | Error::Sys { source, .. } => source.raw_os_error(),
        }
    }
}

/// Adds the operation to an `io::Error`.
pub(crate) trait Context<T> {
    fn ctx(self, what: &'static str) -> Result<T, Error>;
}

impl<T> Context<T> for io::Result<T> {
    fn ctx(self, what: &'static str) -> Result<T, Error> {
        self.map_err(|source| Error::Sys { what, source })
    }
}

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
