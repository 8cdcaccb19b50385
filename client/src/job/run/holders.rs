//! Who holds each shard of a run: one agent per shard, until an elastic
//! shrink hands a lost agent's shards to survivors (or a job that may grow
//! deals more shards than agents, and hands some to a newcomer); the rows
//! each holds.

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

    /// Shard `s` held by `clients[s]` (`agent_ids[s]`) with `rows[0][s]`
    /// train and `rows[1][s]` eval rows: a detached job's holders, rebuilt
    /// by its follower from what each member keeps.
    pub fn held(clients: Vec<AgentClient>, agent_ids: Vec<String>, rows: [Vec<u64>; 2]) -> Self {
        Holders {
            rows,
            ..Holders::new(clients, agent_ids)
        }
    }

    /// `k` shards (at least one per agent) dealt round-robin onto the
    /// agents: a job that may grow holds one shard per agent it may grow to.
    pub fn dealt(self, k: usize) -> Self {
        let n = self.clients.len();
        if k <= n {
            return self;
        }
        let clients = (0..k).map(|s| self.clients[s % n].clone()).collect();
        let agent_ids = (0..k).map(|s| self.agent_ids[s % n].clone()).collect();
        Holders {
            rows: [vec![0; k], vec![0; k]],
            ..Holders::new(clients, agent_ids).starting_from(self.initial)
        }
    }

    /// How many shards the rows are dealt into.
    pub fn len(&self) -> usize {
        self.agent_ids.len()
    }

    /// The shards a newcomer to the gang takes, from the members holding the
    /// most: until it holds its fair share (at least one) or no member has
    /// one to spare. Empty when every member holds one shard.
    pub fn shards_for_newcomer(&self) -> Vec<usize> {
        let members = self.members();
        let mut held: Vec<Vec<usize>> = members
            .iter()
            .map(|&m| self.shards_of(&self.agent_ids[m]))
            .collect();
        let fair = (self.len() / (members.len() + 1)).max(1);
        let mut taken = Vec::new();
        while taken.len() < fair {
            let Some(most) = held.iter_mut().max_by_key(|h| h.len()) else {
                break;
            };
            if most.len() <= 1 {
                break;
            }
            taken.extend(most.pop());
        }
        taken.sort_unstable();
        taken
    }

    /// The rows shard `shard` holds of `split`, as last fed.
    pub fn shard_rows(&self, split: Split, shard: usize) -> u64 {
        self.rows[split_index(split)][shard]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn holders(agents: usize, k: usize) -> Holders {
        let clients = (0..agents)
            .map(|i| AgentClient::connect(&format!("http://127.0.0.1:{}", 1 + i), None).expect("client"))
            .collect();
        let ids = (0..agents).map(|i| format!("a{i}")).collect();
        Holders::new(clients, ids).dealt(k)
    }

    #[tokio::test]
    async fn shards_dealt_round_robin_move_to_a_newcomer_from_the_agents_holding_most() {
        let h = holders(2, 3);
        assert_eq!(h.agent_ids, ["a0", "a1", "a0"]);
        assert_eq!(h.members(), [0, 1]);
        assert_eq!(h.shards_for_newcomer(), [2], "a0 gives its second shard");
        let mut h = holders(2, 6);
        assert_eq!(h.shards_for_newcomer(), [4, 5], "two of six for the third agent");
        for s in [4, 5] {
            let (c, id) = (h.clients[1].clone(), "a2".to_owned());
            h.assign(s, c, id);
        }
        assert_eq!(h.members().len(), 3);
        assert_eq!(
            h.shards_for_newcomer(),
            [5],
            "a fourth takes one shard of one of the three"
        );
        assert!(holders(2, 2).shards_for_newcomer().is_empty(), "nothing to spare");
    }
}
