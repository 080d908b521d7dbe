//! The `brindle-vrouter` binary.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindle-vrouter: the daemon is not built yet (see the vrouter issue)")
}
