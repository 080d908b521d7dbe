//! The one error type of every view and `Repr` in this crate.

/// Why a buffer could not be viewed, parsed or emitted into.
///
/// Deliberately small and `Copy`: the fast path turns it into a drop-reason
/// counter, it never formats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the header, or than a length field says.
    #[error("truncated: the buffer is shorter than the header or its length field")]
    Truncated,
    /// A field has a value the format does not allow (version, header
    /// length, a length field shorter than the header, a missing flag).
    #[error("malformed: a header field has a value the format does not allow")]
    Malformed,
    /// The format is valid but not one this crate handles (for example ARP
    /// for a hardware type other than Ethernet).
    #[error("unsupported: a valid header this crate does not handle")]
    Unsupported,
    /// The checksum does not verify.
    #[error("bad checksum")]
    Checksum,
    /// The output buffer is too small for what is being emitted.
    #[error("the output buffer is too small")]
    BufferTooSmall,
}

/// Result of every fallible operation in this crate.
pub type Result<T> = core::result::Result<T, Error>;
