//! Who holds each shard of a run: one agent per shard, until an elastic
//! shrink hands a lost agent's shards to survivors; the rows each holds.

use std::collections::HashSet;
use std::sync::Arc;

use kindling_schemas::descriptor::Split;

use crate::feed::AgentClient;
use crate::feed::relay::Shards;

/// Who holds each shard: shard `s` lives on `clients[s]` (`agent_ids[s]`).
/// One shard per agent, until an elastic shrink hands a lost agent's shards
/// to survivors, which then hold several.
pub(crate) struct Holders {
    pub clients: Vec<AgentClient>,
    pub agent_ids: Vec<String>,
    /// Rows each shard holds, as last fed: train, eval.
    rows: [Vec<u64>; 2],
    /// The initial weights (`init_from`) every agent starting the job gets,
    /// a replacement too.
    pub initial: Option<Arc<str>>,
}

fn split_index(split: Split) -> usize {
    match split {
        Split::Train => 0,
        Split::Eval => 1,
    }
}

impl Holders {
    pub fn new(clients: Vec<AgentClient>, agent_ids: Vec<String>) -> Self {
        let n = clients.len();
        Holders {
            clients,
            agent_ids,
            rows: [vec![0; n], vec![0; n]],
            initial: None,
        }
    }

    /// With the initial weights every agent of the job starts from.
    pub fn starting_from(self, initial: Option<Arc<str>>) -> Self {
        Holders { initial, ..self }
    }

    /// The shards to feed (`only`: just these).
    pub fn shards<'a>(&'a self, only: Option<&'a [usize]>) -> Shards<'a> {
        Shards {
            clients: &self.clients,
            agent_ids: &self.agent_ids,
            only,
        }
    }

    /// The first shard of each agent, in shard order: one per gang member.
    pub fn members(&self) -> Vec<usize> {
        let mut seen = HashSet::new();
        (0..self.agent_ids.len())
            .filter(|&s| seen.insert(self.agent_ids[s].as_str()))
            .collect()
    }

    /// Every agent's client, once.
    pub fn member_clients(&self) -> Vec<AgentClient> {
        self.members()
            .into_iter()
            .map(|s| self.clients[s].clone())
            .collect()
    }

    /// The shards `agent_id` holds.
    pub fn shards_of(&self, agent_id: &str) -> Vec<usize> {
        (0..self.agent_ids.len())
            .filter(|&s| self.agent_ids[s] == agent_id)
            .collect()
    }

    /// Records the rows a feed of `split` put into the shards it fed.
    pub fn record(&mut self, split: Split, rows: &[u64], fed: impl Fn(usize) -> bool) {
        let held = &mut self.rows[split_index(split)];
        for (s, &r) in rows.iter().enumerate() {
            if fed(s) {
                held[s] = r;
            }
        }
    }

    /// The rows of `split` the holder of shard `shard` must have committed:
    /// those of every shard it holds.
    pub fn agent_rows(&self, split: Split, shard: usize) -> u64 {
        let held = &self.rows[split_index(split)];
        self.shards_of(&self.agent_ids[shard])
            .into_iter()
            .map(|s| held[s])
            .sum()
    }

    pub fn assign(&mut self, shard: usize, client: AgentClient, agent_id: String) {
        self.clients[shard] = client;
        self.agent_ids[shard] = agent_id;
    }
}
