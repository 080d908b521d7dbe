//! Helpers for Brindle's whole-node tests: namespaces and veths with unique
//! names, torn down on drop (also when a test fails).
#![forbid(unsafe_code)]

pub mod lab;
pub mod netns;
pub mod tls_etcd;
