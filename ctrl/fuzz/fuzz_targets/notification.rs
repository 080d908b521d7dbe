//! Fuzz target: the notification decoder (first input octet picks the decode context).
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(data, 3));
