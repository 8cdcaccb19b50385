//! Executor push: every Spark task pushes its own partition straight to an
//! agent (`kindling_client.push.udf_command` through a `mapInArrow` relation, with
//! the module `kindling_client.push` (`deploy/python/kindling_client/push.py`) uploaded as a session file);
//! only one summary row per partition comes back to this process.

use std::time::Duration;

use arrow::array::RecordBatch;
use kindling_schemas::auth::Token;
use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::Split;

use super::FeedError;
use super::relay::Shards;
use crate::spark::{DataFrame, MapInArrowUdf};

/// The `kindling_client` Python package (`deploy/python`), shipped to the
/// executors as one zip: executor push (`kindling_client.push`) and
/// prediction (`kindling_client.predict`) use its one implementation of the
/// Flight protocol.
pub(crate) const KINDLING_CLIENT_PY: &[(&str, &str)] = &[
    (
        "__init__.py",
        include_str!("../../../deploy/python/kindling_client/__init__.py"),
    ),
    (
        "agent.py",
        include_str!("../../../deploy/python/kindling_client/agent.py"),
    ),
    (
        "errors.py",
        include_str!("../../../deploy/python/kindling_client/errors.py"),
    ),
    (
        "job.py",
        include_str!("../../../deploy/python/kindling_client/job.py"),
    ),
    (
        "messages.py",
        include_str!("../../../deploy/python/kindling_client/messages.py"),
    ),
    (
        "predict.py",
        include_str!("../../../deploy/python/kindling_client/predict.py"),
    ),
    (
        "push.py",
        include_str!("../../../deploy/python/kindling_client/push.py"),
    ),
];
/// `kindling_client.push.SUMMARY_DDL`: one row per pushed partition.
pub(crate) const PUSH_SUMMARY_DDL: &str = "partition_id int, attempt int, agent string, agent_id string, \
     producer string, batches long, rows long, committed_rows long, duplicate boolean, node string, \
     node_local boolean";

/// Where each pushed partition's rows are held: (split, partition, shard, rows).
pub(crate) type Placements = Vec<(Split, u32, usize, u64)>;

/// The job-wide facts a push needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PushCtx<'a> {
    pub job_id: &'a str,
    pub token: Option<&'a Token>,
    /// Local mode: agents on loopback, the token may travel in the plan.
    pub local: bool,
}

/// Settings of executor push (`Feed::ExecutorPush`).
///
/// ```
/// let push = kindling::feed::ExecutorPush::new().python_version("3.12").node_local(false);
/// assert_eq!(push.python(), "3.12");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorPush {
    python_version: String,
    node_local: bool,
    timeout: Duration,
    token_in_plan: Option<bool>,
    #[cfg(feature = "test-hooks")]
    fail_task: Option<(u32, u32)>,
    #[cfg(feature = "test-hooks")]
    stall_task: Option<(u32, u32, std::path::PathBuf)>,
}

/// The executors' Python when none is set: the Python of the Kindling executor
/// images and of `deploy/local` (`major.minor`).
pub const DEFAULT_EXECUTOR_PYTHON: &str = "3.11";

impl Default for ExecutorPush {
    fn default() -> Self {
        ExecutorPush {
            python_version: DEFAULT_EXECUTOR_PYTHON.into(),
            node_local: true,
            timeout: Duration::from_secs(60),
            token_in_plan: None,
            #[cfg(feature = "test-hooks")]
            fail_task: None,
            #[cfg(feature = "test-hooks")]
            stall_task: None,
        }
    }
}

impl ExecutorPush {
    /// Defaults: executors on Python [`DEFAULT_EXECUTOR_PYTHON`], node-local routing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The executors' Python `major.minor`, sent as the UDF's `python_ver`
    /// (Spark releases whose worker compares it refuse another version with
    /// `PYTHON_VERSION_MISMATCH`; `fit` names the version to set).
    pub fn python_version(mut self, version: impl Into<String>) -> Self {
        self.python_version = version.into();
        self
    }

    /// The executors' Python `major.minor`.
    pub fn python(&self) -> &str {
        &self.python_version
    }

    /// Push each partition to the agent of the executor's node
    /// (`KINDLING_AGENT_ADDRESS`) when that agent runs the job (default on);
    /// otherwise — off, or executors without the variable, as `local[N]`'s
    /// — partition `p` goes to shard `p mod num_slots`.
    pub fn node_local(mut self, on: bool) -> Self {
        self.node_local = on;
        self
    }

    /// Deadline of each Flight call an executor makes (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether the cluster token travels inside the Spark plan to the
    /// executors. Default: only in local mode (its token lives as long as the
    /// job); on a cluster the executors read `KINDLING_TOKEN` from their
    /// environment (the executor pod template sets it from the Secret).
    pub fn token_in_plan(mut self, on: bool) -> Self {
        self.token_in_plan = Some(on);
        self
    }

    /// **Test hook** (feature `test-hooks`, which only the test crates
    /// enable). Makes attempt 0 of the task of `partition` fail after it
    /// pushed `after_batches` batches (mid-stream), to prove that a retried
    /// task does not add rows twice.
    #[cfg(feature = "test-hooks")]
    pub fn fail_first_attempt_for_test(mut self, partition: u32, after_batches: u32) -> Self {
        self.fail_task = Some((partition, after_batches));
        self
    }

    /// **Test hook** (feature `test-hooks`). Makes attempt 0 of the task of
    /// `partition` write its Python worker's pid to `marker` after
    /// `after_batches` acknowledged batches and then wait mid-stream, so a
    /// test can SIGKILL its executor while the push is open.
    #[cfg(feature = "test-hooks")]
    pub fn stall_first_attempt_for_test(
        mut self,
        partition: u32,
        after_batches: u32,
        marker: std::path::PathBuf,
    ) -> Self {
        self.stall_task = Some((partition, after_batches, marker));
        self
    }
}

impl ExecutorPush {
    /// Checks the settings (`TrainingJob`'s builder calls it).
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        let ok = self.python_version.split_once('.').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        });
        if !ok {
            return Err((
                "executor push python_version",
                format!(
                    "the executors' Python version must be `major.minor` (e.g. \"3.11\"), got `{}`",
                    self.python_version
                ),
            ));
        }
        if self.timeout.is_zero() {
            return Err(("executor push timeout", "must be positive".into()));
        }
        Ok(())
    }
}

/// One partition an executor pushed ([`TrainingEvent::Fed`](crate::TrainingEvent::Fed), executor push).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedPartition {
    /// Spark partition id.
    pub partition: u32,
    /// Spark task attempt that reported it (from 0; above 0 after a retry).
    pub attempt: u32,
    /// The shard (agent) holding its rows; `None` for an empty partition.
    pub shard: Option<usize>,
    /// Rows in the partition.
    pub rows: u64,
    /// Rows this attempt committed (0 when an earlier attempt already had).
    pub committed_rows: u64,
    /// The agent already held the partition from an earlier attempt.
    pub duplicate: bool,
    /// The node the reporting task ran on: the executor's
    /// `KINDLING_NODE_NAME`, else its host name.
    pub node: String,
    /// The task pushed to its node's agent (`KINDLING_AGENT_ADDRESS`);
    /// false when it spread by partition (no agent on its node, or that
    /// agent not in the job) or re-sent to a route.
    pub node_local: bool,
}

/// Executor push: every Spark task pushes its partition to its agent
/// (`kindling_client.push.udf_command` through a `mapInArrow` relation); only one
/// summary row per partition comes back here. Checks the summaries against
/// the DataFrame's count and every shard's rows against its agent.
pub(crate) async fn push(
    ctx: &PushCtx<'_>,
    opts: &ExecutorPush,
    df: &DataFrame,
    split: Split,
    shards: Shards<'_>,
    placed: &mut Placements,
) -> Result<(Vec<u64>, Vec<PushedPartition>), FeedError> {
    let session = df.session();
    session
        .add_python_package("kindling_client", KINDLING_CLIENT_PY)
        .await?;
    #[cfg(feature = "test-hooks")]
    if test_hooks::args(opts).is_some() {
        session
            .add_python_file("kindling_test_hooks.py", test_hooks::MODULE_PY)
            .await?;
    }
    let config = task_config(ctx, opts, split, &shards, placed).await?;
    let udf = MapInArrowUdf::new(
        "kindling_client.push",
        "udf_command",
        PUSH_SUMMARY_DDL,
        opts.python(),
    )
    .arg(config.to_string());
    let summaries = df
        .map_in_arrow(&udf)?
        .collect()
        .await
        .map_err(|e| python_version_hint(e, opts.python()))?;
    let summary = parse_summaries(&summaries)?;
    let landed = place(&summary, split, &shards, placed)?;
    let pushed: u64 = summary.iter().map(|s| s.rows).sum();
    match shards.only {
        None => {
            let counted = df.count().await? as u64;
            if counted != pushed {
                return Err(FeedError::PushedRows {
                    split: split.as_str(),
                    counted,
                    pushed,
                    partitions: summary.len(),
                });
            }
        }
        Some(only) => {
            // Re-sent shards must hold what they held before.
            let before: u64 = placed
                .iter()
                .filter(|(sp, _, shard, _)| *sp == split && only.contains(shard))
                .map(|(_, _, _, r)| r)
                .sum();
            if before != pushed {
                return Err(FeedError::PushedRows {
                    split: split.as_str(),
                    counted: before,
                    pushed,
                    partitions: summary.len(),
                });
            }
            placed.retain(|(sp, _, shard, _)| !(*sp == split && only.contains(shard)));
        }
    }
    placed.extend(landed.placements);
    // An agent no partition reached (one partition for two shards; node-local
    // push while only some nodes run executors) still needs the split's
    // schema: its rank then trains with no rows of its own beside the others.
    if split == Split::Train {
        send_schema_where_nothing_landed(ctx.job_id, split, df, shards, placed).await?;
    }
    check_held(ctx.job_id, split, &shards, placed).await?;
    Ok((landed.rows, landed.report))
}

/// The push task's configuration (`kindling_client/push.py`): the job, the split,
/// the agents, the credential the executors send, and on a re-send the
/// agent each partition goes back to.
async fn task_config(
    ctx: &PushCtx<'_>,
    opts: &ExecutorPush,
    split: Split,
    shards: &Shards<'_>,
    placed: &Placements,
) -> Result<serde_json::Value, FeedError> {
    let clients = shards.clients;
    let agents: Vec<String> = clients.iter().map(|c| c.url().to_owned()).collect();
    let mut config = serde_json::json!({
        "job_id": ctx.job_id,
        "split": split.as_str(),
        "agents": agents,
        "timeout": opts.timeout.as_secs_f64(),
        // Executors without KINDLING_AGENT_ADDRESS (local mode's `local[N]`)
        // spread by partition anyway.
        "node_local": opts.node_local,
    });
    // Executors get a producer credential: it can put rows into this job
    // and nothing else, and expires; it may travel in the plan. Agents
    // without a credential key issue none: then the operator token, in the
    // plan only where allowed (local mode by default), else from the
    // executors' environment. The plan reaches the executors inside the
    // task binary Spark broadcasts: over Spark's authenticated, encrypted
    // wire in the manifests, but readable to code on any executor of this
    // Spark Connect, which shares the JVMs anyway. A job-independent secret
    // in a mounted file, or one that fetches credentials per task, would
    // give such code every job's (docs/operations.md, "Threat model").
    match clients[0]
        .issue_credential(ctx.job_id, Role::Producer, PRODUCER_CREDENTIAL_TTL_SECS)
        .await?
    {
        Some(credential) => config["token"] = credential.into(),
        None => {
            if opts.token_in_plan.unwrap_or(ctx.local)
                && let Some(t) = ctx.token
            {
                config["token"] = t.expose().into();
            }
        }
    }
    if let Some(only) = shards.only {
        let routes: serde_json::Map<String, serde_json::Value> = placed
            .iter()
            .filter(|(sp, _, shard, _)| *sp == split && only.contains(shard))
            .map(|(_, p, shard, _)| (p.to_string(), agents[*shard].clone().into()))
            .collect();
        config["routes"] = routes.into();
    }
    #[cfg(feature = "test-hooks")]
    if let Some(args) = test_hooks::args(opts) {
        config["after_batch"] = serde_json::json!({"function": test_hooks::FUNCTION, "args": args});
    }
    Ok(config)
}

/// Where the partitions the tasks summarised landed.
struct Landed {
    /// Rows per shard.
    rows: Vec<u64>,
    /// (split, partition, shard, rows) of each partition that sent rows.
    placements: Placements,
    /// One line per partition, by partition.
    report: Vec<PushedPartition>,
}

/// Places each summarised partition on the shard its agent holds: the
/// partition's own shard when it is re-sent (an agent may hold several
/// shards after an elastic shrink), else the holder's first. A partition
/// summarised twice, or pushed to an agent that holds none of the shards
/// fed, is an error.
fn place(
    summary: &[PushSummary],
    split: Split,
    shards: &Shards<'_>,
    placed: &Placements,
) -> Result<Landed, FeedError> {
    let n = shards.clients.len();
    let mut landed = Landed {
        rows: vec![0u64; n],
        placements: Vec::new(),
        report: Vec::with_capacity(summary.len()),
    };
    let mut seen = std::collections::BTreeSet::new();
    for s in summary {
        if !seen.insert(s.partition) {
            return Err(FeedError::PartitionSummarisedTwice {
                partition: s.partition,
            });
        }
        let mut line = PushedPartition {
            partition: s.partition,
            attempt: s.attempt,
            shard: None,
            rows: s.rows,
            committed_rows: s.committed_rows,
            duplicate: s.duplicate,
            node: s.node.clone(),
            node_local: s.node_local,
        };
        let Some(holder) = &s.agent_id else {
            landed.report.push(line); // an empty partition: nothing was sent
            continue;
        };
        let holds = |sh: usize| shards.feeds(sh) && shards.agent_ids[sh] == *holder;
        let before = placed
            .iter()
            .find(|(sp, p, _, _)| *sp == split && *p == s.partition)
            .map(|(_, _, sh, _)| *sh);
        let shard = before
            .filter(|&sh| holds(sh))
            .or_else(|| (0..n).find(|&sh| holds(sh)))
            .ok_or_else(|| FeedError::PushedElsewhere {
                partition: s.partition,
                agent_id: holder.clone(),
                address: s.agent.clone(),
                job_agents: shards.agent_ids.to_vec(),
            })?;
        landed.rows[shard] += s.rows;
        landed.placements.push((split, s.partition, shard, s.rows));
        line.shard = Some(shard);
        landed.report.push(line);
    }
    landed.report.sort_by_key(|p| p.partition);
    Ok(landed)
}

/// What each agent fed now holds of `split` must be what the partitions of
/// all its shards report.
async fn check_held(
    job_id: &str,
    split: Split,
    shards: &Shards<'_>,
    placed: &Placements,
) -> Result<(), FeedError> {
    let mut checked = std::collections::BTreeSet::new();
    for (s, c) in shards.clients.iter().enumerate() {
        let agent = &shards.agent_ids[s];
        if !shards.feeds(s) || !checked.insert(agent) {
            continue;
        }
        let expected: u64 = placed
            .iter()
            .filter(|(sp, _, sh, _)| *sp == split && shards.agent_ids[*sh] == *agent)
            .map(|(_, _, _, r)| r)
            .sum();
        let held = c.job_status(job_id).await?.rows(split);
        if held != expected {
            return Err(FeedError::RowMismatch {
                shard: s,
                agent: c.url().to_owned(),
                sent: expected,
                committed: held,
            });
        }
    }
    Ok(())
}

/// Opens and commits an empty `DoPut` stream (the schema alone, producer
/// `schema`) on every agent fed now that holds no partition of `split` — as
/// the driver relay's `CommittingWriter::finish` does for a shard it wrote
/// nothing to.
async fn send_schema_where_nothing_landed(
    job_id: &str,
    split: Split,
    df: &DataFrame,
    shards: Shards<'_>,
    placed: &Placements,
) -> Result<(), FeedError> {
    let mut holding: std::collections::BTreeSet<&str> = placed
        .iter()
        .filter(|(sp, _, _, _)| *sp == split)
        .map(|(_, _, shard, _)| shards.agent_ids[*shard].as_str())
        .collect();
    // Once per agent (an agent may hold several shards).
    let empty: Vec<usize> = (0..shards.clients.len())
        .filter(|&s| shards.feeds(s) && holding.insert(shards.agent_ids[s].as_str()))
        .collect();
    if empty.is_empty() {
        return Ok(());
    }
    let schema = df.schema().await?;
    let path = kindling_schemas::descriptor::DataPath::data(job_id, split);
    for s in empty {
        let client = &shards.clients[s];
        tracing::warn!(
            shard = s,
            agent = client.url(),
            "no partition reached this agent: it trains with no rows of its own"
        );
        client
            .put(&path, "schema", &schema, 1 << 20)
            .await?
            .finish()
            .await?;
    }
    Ok(())
}

/// One partition's summary row from `kindling_client.push`.
#[derive(Debug)]
struct PushSummary {
    partition: u32,
    attempt: u32,
    agent: String,
    agent_id: Option<String>,
    rows: u64,
    committed_rows: u64,
    duplicate: bool,
    node: String,
    node_local: bool,
}

fn parse_summaries(batches: &[RecordBatch]) -> Result<Vec<PushSummary>, FeedError> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{DataType, Int64Type};
    let bad = |column: &'static str, reason: String| FeedError::MalformedSummary { column, reason };
    let mut out = Vec::new();
    for batch in batches {
        let column = |name: &'static str, ty: &DataType| {
            let c = batch
                .column_by_name(name)
                .ok_or_else(|| bad(name, "missing".into()))?;
            arrow::compute::cast(c, ty).map_err(|e| bad(name, e.to_string()))
        };
        let partition = column("partition_id", &DataType::Int64)?;
        let agent = column("agent", &DataType::Utf8)?;
        let agent_id = column("agent_id", &DataType::Utf8)?;
        let attempt = column("attempt", &DataType::Int64)?;
        let rows = column("rows", &DataType::Int64)?;
        let committed = column("committed_rows", &DataType::Int64)?;
        let duplicate = column("duplicate", &DataType::Boolean)?;
        let node = column("node", &DataType::Utf8)?;
        let node_local = column("node_local", &DataType::Boolean)?;
        let (partition, attempt, rows, committed) = (
            partition.as_primitive::<Int64Type>(),
            attempt.as_primitive::<Int64Type>(),
            rows.as_primitive::<Int64Type>(),
            committed.as_primitive::<Int64Type>(),
        );
        let (duplicate, node_local) = (duplicate.as_boolean(), node_local.as_boolean());
        let node = node.as_string::<i32>();
        let (agent, agent_id) = (agent.as_string::<i32>(), agent_id.as_string::<i32>());
        for i in 0..batch.num_rows() {
            out.push(PushSummary {
                partition: u32::try_from(partition.value(i))
                    .map_err(|e| bad("partition_id", e.to_string()))?,
                agent: agent.value(i).to_owned(),
                attempt: u32::try_from(attempt.value(i)).map_err(|e| bad("attempt", e.to_string()))?,
                agent_id: agent_id.is_valid(i).then(|| agent_id.value(i).to_owned()),
                rows: u64::try_from(rows.value(i)).map_err(|e| bad("rows", e.to_string()))?,
                committed_rows: u64::try_from(committed.value(i))
                    .map_err(|e| bad("committed_rows", e.to_string()))?,
                duplicate: duplicate.value(i),
                node: node.value(i).to_owned(),
                node_local: node_local.value(i),
            });
        }
    }
    Ok(out)
}

/// Names the setting to change when the executors run another Python.
fn python_version_hint(e: crate::spark::Error, configured: &str) -> FeedError {
    let text = e.to_string();
    if text.contains("PYTHON_VERSION_MISMATCH") || text.contains("has different version") {
        let executors = text
            .split("different version: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|v| v.trim_end_matches(',').to_owned());
        return FeedError::PythonMismatch {
            executors,
            configured: configured.to_owned(),
            source: Box::new(e),
        };
    }
    FeedError::Spark(e)
}

/// How long the executors' producer credential lives.
const PRODUCER_CREDENTIAL_TTL_SECS: u64 = 24 * 3600;

/// The faults the tests inject into executor push (feature `test-hooks`):
/// a test-only Python module shipped beside the package, called after each
/// acknowledged batch (`kindling_client.push`'s `after_batch`).
#[cfg(feature = "test-hooks")]
mod test_hooks {
    use super::ExecutorPush;

    /// `tests/python/kindling_test_hooks.py`.
    pub(super) const MODULE_PY: &str = include_str!("../../../tests/python/kindling_test_hooks.py");
    /// Its hook, as `udf_command`'s `after_batch` names it.
    pub(super) const FUNCTION: &str = "kindling_test_hooks:after_batch";

    /// The hook's arguments, when a fault is asked for.
    pub(super) fn args(opts: &ExecutorPush) -> Option<serde_json::Value> {
        if opts.fail_task.is_none() && opts.stall_task.is_none() {
            return None;
        }
        let mut args = serde_json::json!({});
        if let Some((partition, after)) = opts.fail_task {
            args["fail"] = serde_json::json!({"partition": partition, "attempt": 0, "after_batches": after});
        }
        if let Some((partition, after, marker)) = &opts.stall_task {
            args["stall"] = serde_json::json!({"partition": partition, "attempt": 0, "after_batches": after, "marker": marker});
        }
        Some(args)
    }
}
