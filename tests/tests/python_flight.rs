//! A pyarrow client drives agents through the Flight contract of docs/protocol.md:
//! start_job, DoPut with per-batch metadata and acks, end_of_data, job_status,
//! the model table and DoExchange predictions. Rust only starts the cluster;
//! the script (tests/python/flight_client.py) uses `pyarrow.flight` calls
//! only — no gRPC stubs, no import from this repository — and creates the
//! job through an agent's `create_job` action.

use crate::python_common;

use kindling_schemas::rendezvous::{JobState, RendezvousClient};
use kindling_tests::cluster::cluster;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pyarrow_client_trains_reads_the_model_and_predicts() {
    let (cluster, _dir) = cluster(2).await;
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    let args = json!({
        "agents": cluster.agent_urls(),
        "token": cluster.token().expect("token").expose(),
        "rendezvous": cluster.rendezvous_url(),
        "job_id": "py-flight",
        "rows_per_agent": 2000,
        "eval_rows_per_agent": 500,
    });
    let out = python_common::run_script("flight_client.py", &args).await;

    // The job was created at the agents' rendezvous over Flight, idempotently.
    let created = json!({"job_id": "py-flight", "attempt": 1, "rendezvous": cluster.rendezvous_url()});
    assert_eq!(out["created"], created);
    assert_eq!(out["created_again"], created);
    let status = rv
        .status("py-flight")
        .await
        .expect("the job is at the rendezvous");
    assert_eq!((status.num_slots, status.max_attempts), (2, 2));
    assert!(
        !matches!(status.state, JobState::Failed | JobState::Cancelled),
        "{status:?}"
    );

    // Both agents joined, and a repeated start_job with the same spec is accepted.
    let ids = out["agent_ids"].as_array().expect("agent ids");
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert_eq!(out["restart_agent_id"], ids[0]);

    for (i, put) in out["puts"].as_array().expect("puts").iter().enumerate() {
        // The stream abandoned after 2 of its batches left no rows behind.
        assert!(
            put["aborted_error"]
                .as_str()
                .is_some_and(|e| e.contains("injected failure")),
            "{put}"
        );
        assert_eq!(put["rows_after_abort"], json!(0), "agent {i}");
        // One ack per batch of 500, staged (not yet committed), then the commit.
        let acks = put["acks"].as_array().expect("acks");
        assert_eq!(acks.len(), 4, "agent {i}: {put}");
        for (seq, ack) in acks.iter().enumerate() {
            assert_eq!(
                ack,
                &json!({"seq": seq, "rows": 500, "duplicate": false, "committed": false}),
                "agent {i}"
            );
        }
        assert_eq!(
            put["final"],
            json!({"producer": format!("py-{i}"), "rows": 2000, "duplicate": false, "committed": true})
        );
        // The same producer streamed again stores nothing.
        assert_eq!(
            put["retry_acks_duplicate"],
            json!([true, true, true, true]),
            "agent {i}"
        );
        assert_eq!(put["retry_final"]["duplicate"], json!(true), "agent {i}: {put}");
        assert_eq!(put["eval_final_rows"], json!(500));
        assert_eq!(put["end_of_data_rows"], json!(2000));
    }

    assert_eq!(
        out["states"],
        json!(["succeeded", "succeeded"]),
        "errors: {}",
        out["errors"]
    );
    assert_eq!(out["rows_train"], json!([2000, 2000]));
    assert_eq!(out["rows_eval"], json!([500, 500]));
    assert_eq!(out["world_sizes"], json!([2, 2]));
    assert_eq!(out["ranks"], json!([0, 1]));
    let history = out["history"].as_array().expect("history");
    assert_eq!(history.len(), 8, "one entry per epoch: {history:?}");
    let accuracy = history
        .last()
        .and_then(|h| h["eval_accuracy"].as_f64())
        .expect("accuracy");
    assert!(accuracy > 0.9, "eval accuracy {accuracy}: {history:?}");

    // Linear model, 2 features -> 2 classes: a [2, 2] weight and a [2] bias.
    assert_eq!(out["model_columns"], json!(["name", "shape", "values"]));
    let params = out["model_params"].as_array().expect("params");
    assert_eq!(out["model_rows"].as_u64(), Some(params.len() as u64));
    let mut shapes: Vec<Vec<u64>> = params
        .iter()
        .map(|p| {
            let shape: Vec<u64> = serde_json::from_value(p["shape"].clone()).expect("shape");
            assert_eq!(p["len"].as_u64(), Some(shape.iter().product()), "{p}");
            shape
        })
        .collect();
    shapes.sort();
    assert_eq!(shapes, vec![vec![2], vec![2, 2]], "{params:?}");

    assert_eq!(out["predict_rows"], json!(1000));
    assert_eq!(
        out["predict_columns"],
        json!(["id", "x1", "x2", "prediction", "probabilities"])
    );
    assert_eq!(out["predict_types"]["prediction"], json!("int64"));
    assert_eq!(
        out["predict_types"]["probabilities"],
        json!("list<item: float not null>")
    );
    assert_eq!(out["predict_ids_in_order"], json!(true));
    // The documented layout of the model table reproduces DoExchange.
    let diff = out["table_vs_exchange_max_diff"]
        .as_f64()
        .expect("table vs exchange");
    assert!(
        diff < 1e-5,
        "x @ W + b from the model table vs DoExchange: {diff}"
    );
    assert_eq!(out["probabilities_len"], json!([2]));
    assert_eq!(out["probabilities_sum_ok"], json!(true));
    let predict_accuracy = out["predict_accuracy"].as_f64().expect("predict accuracy");
    assert!(predict_accuracy > 0.9, "prediction accuracy {predict_accuracy}");
    // A refused DoExchange surfaces as docs/protocol.md says: the exception
    // of its code's row, at the call, `begin`, a write or the first read
    // (which of them is a race between the call's opening and the agent's
    // answer), and nothing predicted (a read that returned would say
    // `where: null` with its rows).
    for (case, class) in [
        ("exchange_wrong_token", "FlightUnauthenticatedError"),
        ("exchange_unknown_model", "ArrowKeyError"),
    ] {
        let refusal = &out[case];
        assert_eq!(refusal["type"], class, "{case}: {refusal}");
        assert!(
            ["call", "begin", "write", "read"].contains(&refusal["where"].as_str().unwrap_or_default()),
            "{case}: {refusal}"
        );
    }
    cluster.shutdown().await;
}
