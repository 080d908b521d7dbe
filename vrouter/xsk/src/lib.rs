//! AF_XDP and AF_PACKET by raw syscalls. The only crate of the workspace that
//! contains `unsafe` code. See `vrouter/README.md`.
