//! Runs the project's Python scripts (tests/python/*.py) with the venv interpreter.

use std::path::PathBuf;
use std::process::Stdio;

/// The Python interpreter: `KINDLING_PYTHON_BIN`, else the venv made by
/// `deploy/local/spark-connect.sh install`.
pub fn python_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("KINDLING_PYTHON_BIN") {
        return PathBuf::from(bin);
    }
    let home = std::env::var("KINDLING_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME is set")).join(".cache/kindling")
        });
    home.join("venv/bin/python")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `tests/python/<script>` with `args` (one JSON argument) and parses the
/// JSON object it prints as its last stdout line. Panics with its stderr on failure.
#[allow(dead_code)]
pub async fn run_script(script: &str, args: &serde_json::Value) -> serde_json::Value {
    let bin = python_bin();
    assert!(
        bin.exists(),
        "python {} not found: run deploy/local/spark-connect.sh install or set KINDLING_PYTHON_BIN",
        bin.display()
    );
    let path = repo_root().join("tests/python").join(script);
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(&path)
        .arg(args.to_string())
        .env("PYTHONPATH", repo_root().join("deploy/python"))
        .stdin(Stdio::null());
    // The agents run on this runtime's other workers while the script talks to them.
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("python runner")
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{script} printed no JSON result ({e}):\n{stdout}\n--- stderr\n{stderr}"))
}

/// Runs `cmd` on the blocking pool (the agents run on this runtime's other
/// workers meanwhile) and returns its exit status, stdout and stderr.
#[allow(dead_code)]
pub async fn output(mut cmd: std::process::Command) -> (std::process::ExitStatus, String, String) {
    let shown = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.stdin(Stdio::null()).output())
        .await
        .expect("command runner")
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
