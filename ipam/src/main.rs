//! The `brindle-ipam` CNI IPAM plugin.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindle-ipam: not built yet (see the IPAM issue)")
}
