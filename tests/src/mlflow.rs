//! A real MLflow tracking server (`mlflow server` from the venv
//! `deploy/local/setup.sh` makes) on a free loopback port with its own
//! SQLite store and artifact directory, started, killed (SIGKILL) and
//! restarted by tests; and reads of what it holds through its REST API.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `mlflow` executable: `KINDLING_MLFLOW_BIN`, else the venv's.
pub fn mlflow_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("KINDLING_MLFLOW_BIN") {
        return PathBuf::from(bin);
    }
    let home = std::env::var("KINDLING_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/kindling"));
    home.join("mlflow/bin/mlflow")
}

/// One MLflow server process group and its store.
#[derive(Debug)]
pub struct MlflowServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl MlflowServer {
    /// Starts a server and returns once it answers `/health`.
    pub fn start() -> MlflowServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut server = MlflowServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.restart();
        server
    }

    /// Starts the server again on the same port and store (after
    /// [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        let bin = mlflow_bin();
        assert!(
            bin.exists(),
            "{} not found: run deploy/local/setup.sh or set KINDLING_MLFLOW_BIN",
            bin.display()
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("log");
        let child = Command::new(&bin)
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!(
                "sqlite:///{}",
                self.dir.path().join("mlflow.db").display()
            ))
            .arg("--artifacts-destination")
            .arg(self.dir.path().join("artifacts"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(180);
        while !self.healthy() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("mlflow server exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "mlflow server not healthy after 180 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGKILLs the server's process group and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The child leads its own group (`process_group(0)`): its
            // uvicorn workers die with it.
            let group = child.id();
            assert!(group > 1, "a real process group");
            // `--` ends the options: `-<pgid>` is the group, not a signal.
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{group}")])
                .status();
            let _ = child.wait();
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn healthy(&self) -> bool {
        ureq::get(format!("{}/health", self.url()))
            .call()
            .is_ok_and(|r| r.status() == 200)
    }

    /// `GET /api/2.0/mlflow/<endpoint>?<query>` as JSON.
    pub fn get(&self, endpoint: &str, query: &[(&str, &str)]) -> Value {
        let mut request = ureq::get(format!("{}/api/2.0/mlflow/{endpoint}", self.url()));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        let mut response = request.call().unwrap_or_else(|e| panic!("GET {endpoint}: {e}"));
        serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json")
    }

    /// The runs of `experiment` (by name), newest first.
    pub fn runs(&self, experiment: &str) -> Vec<Value> {
        let e = self.get("experiments/get-by-name", &[("experiment_name", experiment)]);
        let id = e["experiment"]["experiment_id"]
            .as_str()
            .expect("experiment id")
            .to_owned();
        let mut response = ureq::post(format!("{}/api/2.0/mlflow/runs/search", self.url()))
            .send_json(json!({ "experiment_ids": [id] }))
            .expect("search");
        let found: Value =
            serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
        found["runs"].as_array().cloned().unwrap_or_default()
    }

    /// A run's history of `metric`: `(step, value)` in step order.
    pub fn history(&self, run_id: &str, metric: &str) -> Vec<(u64, f64)> {
        let h = self.get(
            "metrics/get-history",
            &[("run_id", run_id), ("metric_key", metric)],
        );
        let mut out: Vec<(u64, f64)> = h["metrics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                let step = m["step"]
                    .as_u64()
                    .or_else(|| m["step"].as_str().and_then(|s| s.parse().ok()));
                (step.unwrap_or(0), m["value"].as_f64().expect("value"))
            })
            .collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// The file names of a run's artifacts under `path`.
    pub fn artifacts(&self, run_id: &str, path: &str) -> Vec<String> {
        let listed = self.get("artifacts/list", &[("run_id", run_id), ("path", path)]);
        listed["files"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|f| {
                f["path"]
                    .as_str()
                    .map(|p| p.rsplit('/').next().unwrap_or(p).to_owned())
            })
            .collect()
    }

    /// The bytes of a run's artifact at `path` (through the artifact proxy).
    pub fn artifact(&self, run: &Value, path: &str) -> Vec<u8> {
        let uri = run["info"]["artifact_uri"].as_str().expect("artifact uri");
        let base = uri
            .trim_start_matches("mlflow-artifacts:")
            .trim_start_matches('/');
        let mut response = ureq::get(format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{base}/{path}",
            self.url()
        ))
        .call()
        .expect("artifact");
        response.body_mut().read_to_vec().expect("bytes")
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        self.kill();
    }
}
