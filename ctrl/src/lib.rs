//! `brindle-ctrl`: the node daemon's library (BGP, registry, endpoint API,
//! vrouter programming). See `ctrl/README.md`.
#![forbid(unsafe_code)]
