//! The `brindle` CNI plugin.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindle: not built yet (see the CNI issue)")
}
