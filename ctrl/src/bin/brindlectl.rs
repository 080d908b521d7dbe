//! The `brindlectl` binary.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindlectl: not built yet (see the node daemon issue)")
}
