//! `brindle-perf`: the throughput and latency harness. See `perf/README.md`.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("brindle-perf: not built yet (see the perf issue)")
}
