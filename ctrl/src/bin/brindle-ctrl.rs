//! The `brindle-ctrl` binary.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindle-ctrl: not built yet (see the node daemon issue)")
}
