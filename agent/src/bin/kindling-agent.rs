//! `kindling-agent`: one training agent per node (Kubernetes DaemonSet),
//! training the built-in models. A crate with models of its own builds its
//! agent the same way, with its registry (see `kindling_agent::run`).

fn main() -> anyhow::Result<()> {
    kindling_agent::run(kindling_agent::ModelRegistry::builtin())
}
