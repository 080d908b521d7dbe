//! Zero-copy wire views for the vrouter's fast path. See `vrouter/README.md`.
#![forbid(unsafe_code)]
