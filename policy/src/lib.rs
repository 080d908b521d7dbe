//! Network policy for Brindle: see README.md.
#![forbid(unsafe_code)]

pub mod classify;
pub mod compile;
pub mod conntrack;
pub mod ipset;
pub mod program;
pub mod resource;
pub mod selector;
