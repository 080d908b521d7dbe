//! The `brindle` CNI plugin's library. See `cni/README.md`.
#![forbid(unsafe_code)]
