//! `brindle-ipam`: Calico-style address management. See `ipam/README.md`.
#![forbid(unsafe_code)]
