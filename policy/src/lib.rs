//! Network policy for Brindle: see README.md.
#![forbid(unsafe_code)]

pub mod resource;
pub mod selector;
