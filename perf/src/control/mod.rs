//! The control-path mode, `brindle-perf control`: how long the node takes
//! to bring a pod up and down (CNI ADD/DEL through the real plugin) and to
//! learn routes over BGP into the vrouter's FIB.

use anyhow::{Result, bail};
use clap::Parser;

/// Options of `brindle-perf control`.
#[derive(Parser, Debug)]
pub struct ControlArgs {}

/// Runs the control-path measurements.
pub fn run(_args: ControlArgs) -> Result<()> {
    bail!("the control-path mode is not built yet")
}
