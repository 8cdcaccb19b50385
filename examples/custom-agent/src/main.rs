//! The agent binary of a crate with a model of its own: the stock agent
//! (same flags, `KINDLING_*` variables, probes and signals) with the
//! crate's registry.

fn main() -> anyhow::Result<()> {
    kindling_agent::run(kindling_example_agent::registry())
}
