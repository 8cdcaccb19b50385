//! `kindling export` and `kindling train --init-from` as real processes
//! against the real Spark Connect server: a trained model exported as
//! safetensors and as ONNX (each with `kindling.json`), an unknown format
//! refused naming the formats, and the exported file starting a new job,
//! whose saved spec records it.

use crate::common;

use std::process::{Command, Output};

use common::spark_remote;

const SQL: &str = "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM \
    (SELECT rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range(500))";

fn kindling(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(args)
        .output()
        .expect("kindling")
}

fn train(remote: &str, output: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "--remote",
        remote,
        "--sql",
        SQL,
        "--features",
        "x1,x2",
        "--label",
        "y",
        "--model",
        "mlp:8",
        "--local",
        "--slots",
        "1",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "-o",
        output,
    ];
    args.extend_from_slice(extra);
    kindling(&args)
}

#[test]
fn export_writes_safetensors_and_onnx_and_the_export_starts_a_new_job() {
    let remote = spark_remote();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_str().expect("path").to_owned();
    let out = train(&remote, &path("model"), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    for (format, file) in [("safetensors", "model.safetensors"), ("onnx", "model.onnx")] {
        let to = path(format);
        let out = kindling(&["export", "--model", &path("model"), "--format", format, "-o", &to]);
        assert!(
            out.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = dir.path().join(format).join(file);
        assert!(
            std::fs::metadata(&written).map(|m| m.len() > 0).unwrap_or(false),
            "{written:?}"
        );
        let info: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(format).join("kindling.json")).expect("kindling.json"),
        )
        .expect("json");
        assert_eq!(info["format"], format);
        assert_eq!(info["file"], file);
        assert_eq!(info["features"][0]["name"], "x1");
    }

    let out = kindling(&[
        "export",
        "--model",
        &path("model"),
        "--format",
        "pickle",
        "-o",
        &path("x"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--format must be `safetensors` or `onnx`, got `pickle`"),
        "{err}"
    );
    assert!(
        !dir.path().join("x").exists(),
        "nothing written for a refused format"
    );

    let weights = dir.path().join("safetensors").join("model.safetensors");
    let out = train(
        &remote,
        &path("tuned"),
        &["--init-from", weights.to_str().expect("path")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec = std::fs::read_to_string(dir.path().join("tuned").join("spec.json")).expect("spec.json");
    let spec = kindling::JobSpec::from_json(&spec).expect("spec");
    let recorded = spec.init_from.expect("the spec records init_from");
    assert_eq!(recorded.format, "safetensors");
    assert!(recorded.file.ends_with("model.safetensors"), "{}", recorded.file);
}
