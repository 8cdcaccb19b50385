//! Executor push (deploy/python/kindling_client/push.py): Spark partitions stream
//! straight into agents, one producer `partition-<p>` per partition, so a
//! retried or repeated task never adds rows twice.

use crate::python_common;

use kindling_schemas::action::AgentJobState;
use kindling_schemas::descriptor::Split;
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use kindling_tests::cluster::*;
use serde_json::{Value, json};

fn spec() -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(64)
        .epochs(2)
        .seed(3)
        .build()
        .expect("spec")
}

/// Rows committed on each agent according to job_status.
async fn rows_train(cluster: &kindling::local::LocalCluster, job_id: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..2 {
        out.push(status(&agent_client(cluster, i), job_id).await.rows_train);
    }
    out
}

/// Sends end_of_data with the expected rows to both agents and waits for success.
async fn finish_training(cluster: &kindling::local::LocalCluster, job_id: &str, expected: &[u64]) {
    for (i, &rows) in expected.iter().enumerate() {
        let r = end_of_data(&agent_client(cluster, i), job_id, Split::Train, Some(rows)).await;
        assert_eq!(r.rows, rows);
    }
    for (i, &rows) in expected.iter().enumerate() {
        let s = wait_done(&agent_client(cluster, i), job_id).await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{s:#?}");
        assert_eq!(s.rows_train, rows);
    }
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("`{key}` in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spark_executors_push_each_partition_exactly_once() {
    const ROWS: u64 = 3000;
    const PARTITIONS: u64 = 6;
    let remote = kindling_tests::spark::spark_remote();
    let (cluster, _dir) = cluster(2).await;
    start_job(&cluster, "py-push", &spec(), &[0, 1]).await;
    let agents = cluster.agent_urls();
    let args = json!({
        "remote": remote,
        "agents": agents,
        "token": cluster.token().expect("token").expose(),
        "job_id": "py-push",
        "rows": ROWS,
        "partitions": PARTITIONS,
        "batch_rows": 200,
        "package": python_common::repo_root().join("deploy/python/kindling_client"),
    });
    let out = python_common::run_script("push_spark.py", &args).await;
    let mut agent_ids = Vec::new();
    for i in 0..2 {
        agent_ids.push(status(&agent_client(&cluster, i), "py-push").await.agent_id);
    }

    let mut first = out["first"].as_array().expect("summaries").clone();
    first.sort_by_key(|s| u64_of(s, "partition_id"));
    assert_eq!(
        first.len() as u64,
        PARTITIONS,
        "one summary per partition: {first:?}"
    );
    let mut per_agent = [0u64; 2];
    for (p, s) in first.iter().enumerate() {
        assert_eq!(u64_of(s, "partition_id"), p as u64);
        assert_eq!(s["producer"], json!(format!("partition-{p}")));
        assert_eq!(
            s["agent"],
            json!(agents[p % 2]),
            "partition p goes to agent p mod 2"
        );
        assert_eq!(s["attempt"], json!(0));
        assert_eq!(s["duplicate"], json!(false), "{s}");
        // spark.range splits 3000 rows evenly; batches of at most 200 rows.
        assert_eq!(u64_of(s, "rows"), ROWS / PARTITIONS, "{s}");
        assert_eq!(u64_of(s, "batches"), (ROWS / PARTITIONS).div_ceil(200), "{s}");
        assert_eq!(u64_of(s, "committed_rows"), u64_of(s, "rows"), "{s}");
        per_agent[p % 2] += u64_of(s, "committed_rows");
    }

    // Running the plan again commits nothing: every producer is a duplicate.
    let again = out["again"].as_array().expect("second run");
    assert_eq!(again.len() as u64, PARTITIONS);
    for s in again {
        assert_eq!(s["duplicate"], json!(true), "{s}");
        assert_eq!(u64_of(s, "committed_rows"), 0, "{s}");
    }

    let rows = rows_train(&cluster, "py-push").await;
    assert_eq!(
        rows,
        per_agent.to_vec(),
        "agents hold exactly the summarised rows"
    );
    assert_eq!(rows.iter().sum::<u64>(), ROWS);
    finish_training(&cluster, "py-push", &rows).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_retried_and_speculative_attempts_count_rows_once() {
    const PARTITIONS: u64 = 4;
    const ROWS_PER_PARTITION: u64 = 500;
    let (cluster, _dir) = cluster(2).await;
    start_job(&cluster, "py-retry", &spec(), &[0, 1]).await;
    let agents = cluster.agent_urls();
    let args = json!({
        "agents": agents,
        "token": cluster.token().expect("token").expose(),
        "job_id": "py-retry",
        "partitions": PARTITIONS,
        "rows_per_partition": ROWS_PER_PARTITION,
        "batch_rows": 100,
    });
    let out = python_common::run_script("push_retry.py", &args).await;

    // Attempt 0 of partition 0 raised mid-stream and left nothing behind.
    let raised = &out["events"][0];
    assert!(
        raised["error"]
            .as_str()
            .is_some_and(|e| e.contains("injected failure")),
        "{raised}"
    );
    assert_eq!(out["rows_after_raise"], json!([0, 0]));
    // Attempt 0 of partition 1 died with its process mid-stream: nothing either.
    assert_eq!(out["events"][1], json!({"what": "die", "exit_code": 17}));
    assert_eq!(out["rows_after_die"], json!([0, 0]));

    assert_eq!(
        out["udf_ddl"],
        json!(
            "partition_id int, attempt int, agent string, agent_id string, producer string, \
             batches long, rows long, committed_rows long, duplicate boolean, node string, \
             node_local boolean"
        )
    );
    assert!(
        out["udf_unknown_option"]
            .as_str()
            .is_some_and(|e| e.contains("unknown option(s) ['agent']")),
        "{}",
        out["udf_unknown_option"]
    );
    let summaries = out["summaries"].as_array().expect("summaries");
    assert_eq!(summaries.len() as u64, PARTITIONS);
    let mut per_agent = [0u64; 2];
    for (p, s) in summaries.iter().enumerate() {
        assert_eq!(s["attempt"], json!(if p < 2 { 1 } else { 0 }));
        assert_eq!(s["duplicate"], json!(false), "{s}");
        assert_eq!(u64_of(s, "committed_rows"), ROWS_PER_PARTITION, "{s}");
        // The last partition found its agent through KINDLING_AGENT_ADDRESS.
        assert_eq!(s["agent"], json!(agents[p % 2]), "{s}");
        // Where the task ran, and whether it pushed to its node's agent.
        let last = p as u64 == PARTITIONS - 1;
        assert_eq!(s["node_local"], json!(last), "{s}");
        let node = if last {
            json!("node-a")
        } else {
            out["hostname"].clone()
        };
        assert_eq!(s["node"], node, "{s}");
        per_agent[p % 2] += ROWS_PER_PARTITION;
    }
    assert_eq!(out["rows_after_retries"], json!(per_agent));

    // The speculative copy of partition 2 sent every row and committed none.
    let spec_copy = &out["speculative"];
    assert_eq!(spec_copy["duplicate"], json!(true), "{spec_copy}");
    assert_eq!(u64_of(spec_copy, "rows"), ROWS_PER_PARTITION);
    assert_eq!(u64_of(spec_copy, "committed_rows"), 0);
    // Neither it nor a late attempt dying mid-stream changed the counts.
    assert_eq!(out["rows_final"], json!(per_agent));
    assert_eq!(per_agent.iter().sum::<u64>(), PARTITIONS * ROWS_PER_PARTITION);
    finish_training(&cluster, "py-retry", &per_agent).await;
    cluster.shutdown().await;
}

/// The push helper over mutual TLS: with `KINDLING_TLS_*` it pushes into an
/// agent that speaks only TLS; without a client certificate the push fails
/// and stores nothing; a token is never sent in plaintext off loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_push_helper_pushes_over_mutual_tls() {
    let (cluster, _dir, client, _) = tls_cluster(1).await;
    let mut one = spec();
    one.num_slots = 1;
    start_job(&cluster, "tls-push", &one, &[0]).await;
    let url = cluster.agent_url(0).expect("agent");
    assert!(url.starts_with("https://"), "{url}");
    let script = r#"
import json, sys
import numpy as np, pyarrow as pa
from kindling_client.push import PushError, push_batches
url, token = sys.argv[1], sys.argv[2]
x1 = np.linspace(-1, 1, 500); x2 = np.linspace(1, -1, 500)
t = pa.table({"x1": x1, "x2": x2.astype(np.float32), "y": (x1 + 2 * x2 > 0.1).astype(np.int32)})
out = {}
try:
    n, rows, final = push_batches(url, "tls-push", t.to_batches(max_chunksize=100), producer="p0", token=token, timeout=30)
    out["rows"] = rows
except PushError as e:
    out["error"] = str(e)
try:
    push_batches("http://10.255.0.1:50051", "tls-push", t.to_batches(), producer="p1", token=token)
except PushError as e:
    out["plaintext"] = str(e)
print(json.dumps(out))
"#;
    let run = |with_cert: bool| {
        let mut cmd = std::process::Command::new(python_common::python_bin());
        cmd.arg("-c")
            .arg(script)
            .arg(&url)
            .arg(cluster.token().expect("token").expose())
            .env("PYTHONPATH", python_common::repo_root().join("deploy/python"))
            .env("KINDLING_TLS_CA", &client.ca)
            .env_remove("KINDLING_ALLOW_PLAINTEXT_TOKEN");
        if with_cert {
            cmd.env("KINDLING_TLS_CERT", &client.cert)
                .env("KINDLING_TLS_KEY", &client.key);
        } else {
            cmd.env_remove("KINDLING_TLS_CERT").env_remove("KINDLING_TLS_KEY");
        }
        cmd
    };
    let (status_code, stdout, stderr) = python_common::output(run(false)).await;
    assert!(status_code.success(), "{stdout}\n{stderr}");
    let anonymous: Value =
        serde_json::from_str(stdout.trim().lines().last().unwrap_or_default()).expect("json");
    assert!(
        anonymous.get("error").is_some(),
        "no client certificate, no push: {anonymous}"
    );
    assert!(
        anonymous["plaintext"]
            .as_str()
            .unwrap_or_default()
            .contains("plaintext"),
        "{anonymous}"
    );
    assert_eq!(status(&agent_client(&cluster, 0), "tls-push").await.rows_train, 0);

    let (status_code, stdout, stderr) = python_common::output(run(true)).await;
    assert!(status_code.success(), "{stdout}\n{stderr}");
    let pushed: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or_default()).expect("json");
    assert_eq!(pushed["rows"], 500, "{pushed}");
    assert_eq!(
        status(&agent_client(&cluster, 0), "tls-push").await.rows_train,
        500
    );
    cluster.shutdown().await;
}
