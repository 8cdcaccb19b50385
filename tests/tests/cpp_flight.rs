//! The contract from C++: tests/cpp/flight_contract.cc, built with g++
//! against the Arrow C++ Flight client the pyarrow wheel ships, runs a
//! 2-agent job (create_job, start_job on each agent, a DoPut shard each with
//! exactly-once metadata, end_of_data, job_status to the end, the model table
//! through DoGet) against a real rendezvous and agents, and reports how Arrow
//! C++ surfaces each refusal.

use crate::python_common;

use std::path::PathBuf;
use std::process::Command;

use kindling_tests::cluster::cluster;
use serde_json::{Value, json};

const ROWS: u64 = 1000;

/// Builds the program (tests/cpp/build.sh; rebuilt only when it changed).
async fn build() -> PathBuf {
    let root = python_common::repo_root();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cpp/flight_contract");
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("tests/cpp/build.sh"))
        .arg(python_common::python_bin())
        .arg(&out);
    let (status, stdout, stderr) = python_common::output(cmd).await;
    assert!(
        status.success(),
        "tests/cpp/build.sh failed ({status}); deploy/local/setup.sh installs g++ and the pyarrow venv:\n{stdout}\n{stderr}"
    );
    out
}

fn error<'a>(out: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(out, |v, k| &v[k])
}

fn assert_error(out: &Value, path: &[&str], arrow_code: &str, flight_code: Value, words: &str) {
    let e = error(out, path);
    assert_eq!(e["arrow_code"], json!(arrow_code), "{path:?}: {e}");
    assert_eq!(e["flight_code"], flight_code, "{path:?}: {e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.contains(words), "{path:?}: `{words}` not in {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cpp_flight_client_creates_feeds_follows_and_reads_a_job() {
    let program = build().await;
    let (cluster, _dir) = cluster(2).await;
    let mut cmd = Command::new(&program);
    cmd.arg("cpp-flight")
        .arg(cluster.token().expect("token").expose())
        .arg(ROWS.to_string())
        .args(
            cluster
                .agent_urls()
                .iter()
                .map(|u| u.replace("http://", "grpc+tcp://")),
        );
    let (status, stdout, stderr) = python_common::output(cmd).await;
    assert!(
        status.success(),
        "flight_contract failed ({status}):\n{stdout}\n{stderr}"
    );
    let out: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("flight_contract printed no JSON ({e}):\n{stdout}\n{stderr}"));

    // How Arrow C++ reports each gRPC code the agent answered with.
    assert_error(
        &out,
        &["errors", "malformed_body"],
        "Invalid",
        Value::Null,
        "invalid argument",
    );
    assert_error(
        &out,
        &["errors", "unknown_action"],
        "Invalid",
        Value::Null,
        "create_job",
    );
    assert_error(
        &out,
        &["errors", "status_unknown_job"],
        "Key error",
        Value::Null,
        "not found",
    );
    assert_error(
        &out,
        &["errors", "start_unknown_job_with_spec"],
        "Key error",
        Value::Null,
        "never-created",
    );
    assert_error(
        &out,
        &["errors", "no_token"],
        "IOError",
        json!("Unauthenticated"),
        "unauthenticated",
    );
    assert_error(
        &out,
        &["model_too_early"],
        "Invalid",
        Value::Null,
        "precondition failed",
    );
    // A refused DoPut: ReadMetadata gives no ack and Close() carries the
    // status, unless the refusal already arrived while the batch was being
    // written: then WriteWithMetadata returns it (a race the client cannot
    // control; both carry the agent's status).
    assert_error(&out, &["refused_put"], "Invalid", Value::Null, "`y`");
    let surfaced = &out["refused_put"]["surfaced_at"];
    assert!(
        *surfaced == json!("Close (ReadMetadata gave null)") || *surfaced == json!("WriteWithMetadata"),
        "{}",
        out["refused_put"]
    );

    assert_eq!(
        out["created"],
        json!({"job_id": "cpp-flight", "attempt": 1, "rendezvous": cluster.rendezvous_url()})
    );
    let started = out["started"].as_array().expect("started");
    assert_eq!(started.len(), 2);
    assert_ne!(started[0]["agent_id"], started[1]["agent_id"]);

    for (i, p) in out["puts"].as_array().expect("puts").iter().enumerate() {
        let acks = p["put"]["acks"].as_array().expect("acks");
        assert_eq!(acks.len(), 4, "agent {i}: {p}");
        for (seq, ack) in acks.iter().enumerate() {
            assert_eq!(
                ack,
                &json!({"producer": format!("cpp-{i}"), "seq": seq, "rows": 250, "duplicate": false,
                        "committed": false, "bytes": p["nbytes"]}),
                "agent {i}"
            );
        }
        // x1 float64 + x2 float32 + y int32: 16 bytes a row.
        assert_eq!(p["nbytes"], json!(250 * 16));
        assert_eq!(
            p["put"]["final"],
            json!({"producer": format!("cpp-{i}"), "seq": 3, "rows": ROWS, "duplicate": false,
                   "committed": true, "bytes": ROWS * 16, "stream_rows": ROWS})
        );
        assert_eq!(p["again_final"]["duplicate"], json!(true), "{p}");
        assert_eq!(p["again_final"]["stream_rows"], json!(0), "{p}");
        assert_error(
            p,
            &["end_of_data_wrong"],
            "Invalid",
            Value::Null,
            "precondition failed",
        );
        assert_eq!(p["end_of_data"]["rows"], json!(ROWS));
    }

    for s in out["statuses"].as_array().expect("statuses") {
        assert_eq!(s["state"], json!("succeeded"), "{s}");
        assert_eq!(s["rows_train"], json!(ROWS));
        assert_eq!(s["history"].as_array().map(Vec::len), Some(6), "{s}");
    }

    // Linear model on 2 features, 2 classes: dense.0.weight [2, 2], dense.0.bias [2].
    let model = &out["model"];
    assert_eq!(model["rows"], json!(2));
    assert_eq!(model["total_records"], json!(2));
    let schema = model["schema"].as_str().expect("schema");
    for column in ["name: string", "shape: list<", "values: list<"] {
        assert!(schema.contains(column), "{schema}");
    }
    let mut params: Vec<(String, Vec<u64>)> = model["params"]
        .as_array()
        .expect("params")
        .iter()
        .map(|p| {
            let shape: Vec<u64> = serde_json::from_value(p["shape"].clone()).expect("shape");
            assert_eq!(p["len"].as_u64(), Some(shape.iter().product()), "{p}");
            (p["name"].as_str().expect("name").to_owned(), shape)
        })
        .collect();
    params.sort();
    assert_eq!(
        params,
        vec![
            ("dense.0.bias".to_owned(), vec![2]),
            ("dense.0.weight".to_owned(), vec![2, 2])
        ]
    );
    cluster.shutdown().await;
}
