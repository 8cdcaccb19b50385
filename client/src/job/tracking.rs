//! Experiment tracking in MLflow over its REST API (`/api/2.0/mlflow`): the
//! job's spec as params, every epoch's metrics by step, early stopping as
//! tags, the saved model as artifacts, and the run's end. (MLflow ships no
//! Rust client; its REST API is small and stable.)
//!
//! A thread of its own sends them, so a tracking server that is down or
//! slow never fails or holds up training: updates wait in order in a
//! bounded queue and are retried with backoff while the server does not
//! answer (each request gives up after [`REQUEST_TIMEOUT`]); one warning
//! per outage. At the end `fit` waits at most the flush timeout for the
//! queue to drain. A run whose updates all reached the server ends
//! `FINISHED` (`FAILED` when training failed); one that lost updates (the
//! server refused them, or the queue overflowed) ends `FAILED` with the tag
//! `kindling.incomplete`; one whose server stayed away past the flush
//! timeout stays `RUNNING` there.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kindling_schemas::action::EpochMetrics;
use kindling_schemas::spec::JobSpec;
use serde_json::{Value, json};

use super::{JobError, TrainedModel};

/// The longest one request to the tracking server may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Updates the queue holds while the server is away; more are lost (and
/// the run marked incomplete).
const MAX_QUEUED: usize = 10_000;
/// Longest wait between two tries while the server is away.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// MLflow's bound on a param's value.
const MAX_PARAM_CHARS: usize = 6000;
/// MLflow's bound on params per `log-batch`.
const PARAMS_PER_BATCH: usize = 100;

/// Where and under which experiment a job's run is logged.
#[derive(Debug, Clone, PartialEq)]
pub struct MlflowTracking {
    /// The tracking server, e.g. `http://mlflow:5000`.
    pub url: String,
    /// The experiment (created when missing).
    pub experiment: String,
    /// How long `fit` waits at the end for the last updates to reach the
    /// server (default 10 s).
    pub flush_timeout: Duration,
}

impl MlflowTracking {
    /// Logs to `experiment` on the server at `url`.
    pub fn new(url: impl Into<String>, experiment: impl Into<String>) -> Self {
        MlflowTracking {
            url: url.into().trim_end_matches('/').to_owned(),
            experiment: experiment.into(),
            flush_timeout: Duration::from_secs(10),
        }
    }

    /// The bearer token from `MLFLOW_TRACKING_TOKEN`, refused over plain
    /// HTTP to anything but this machine.
    fn token(&self) -> Result<Option<String>, JobError> {
        let Ok(token) = std::env::var("MLFLOW_TRACKING_TOKEN") else {
            return Ok(None);
        };
        let host = self.url.strip_prefix("http://").map(|rest| {
            let authority = rest.split('/').next().unwrap_or_default();
            match authority.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => authority.split(':').next().unwrap_or_default(),
            }
        });
        match host {
            Some(h) if !matches!(h, "127.0.0.1" | "localhost" | "::1") => Err(JobError::Setting {
                setting: "mlflow",
                reason: format!(
                    "MLFLOW_TRACKING_TOKEN is set and {} is plain HTTP off this machine: use https:// \
                     (the token is never sent in plaintext)",
                    self.url
                ),
            }),
            _ => Ok(Some(token)),
        }
    }
}

/// What `fit` tells the tracking thread.
#[derive(Debug)]
enum Msg {
    Started {
        job_id: String,
    },
    Epoch(EpochMetrics),
    Tags(Vec<(String, String)>),
    Finish {
        model_dir: Option<PathBuf>,
        failed: bool,
    },
}

/// The tracking of one `fit`: a thread and the channel to it.
#[derive(Debug)]
pub(crate) struct Tracker {
    tx: mpsc::Sender<Msg>,
    done: mpsc::Receiver<()>,
    config: MlflowTracking,
    run_id: RunId,
}

/// A run's id once MLflow created it (a search's run, its trials' parent).
pub(crate) type RunId = Arc<OnceLock<String>>;

/// Where the progress reporter sends the events a run records.
#[derive(Debug, Clone)]
pub(crate) struct TrackerHandle {
    tx: mpsc::Sender<Msg>,
}

impl Tracker {
    /// Starts tracking a job with `spec` (nothing is sent before the job's
    /// id is known).
    pub(crate) fn start(config: &MlflowTracking, spec: &JobSpec) -> Result<Tracker, JobError> {
        Self::start_child(config, spec, None)
    }

    /// Like [`start`](Self::start), the run a child of `parent`'s (MLflow's
    /// `mlflow.parentRunId` tag), once the parent has an id.
    pub(crate) fn start_child(
        config: &MlflowTracking,
        spec: &JobSpec,
        parent: Option<RunId>,
    ) -> Result<Tracker, JobError> {
        let token = config.token()?;
        let run_id = RunId::default();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        let (tx, rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let mut worker = Worker {
            agent,
            base: config.url.clone(),
            token,
            experiment: config.experiment.clone(),
            experiment_id: None,
            run: None,
            params: params(spec),
            queue: VecDeque::new(),
            lost: 0,
            failed: false,
            warned: false,
            parent,
            run_id: run_id.clone(),
        };
        std::thread::Builder::new()
            .name("kindling-mlflow".into())
            .spawn(move || {
                worker.run(rx);
                let _ = done_tx.send(());
            })
            .map_err(|e| JobError::Io {
                context: "starting the MLflow tracking thread".into(),
                source: e,
            })?;
        Ok(Tracker {
            tx,
            done,
            config: config.clone(),
            run_id,
        })
    }

    /// The run's id, set once MLflow created the run.
    pub(crate) fn run_id(&self) -> RunId {
        self.run_id.clone()
    }

    /// The sender the progress reporter passes events to.
    pub(crate) fn handle(&self) -> TrackerHandle {
        TrackerHandle { tx: self.tx.clone() }
    }
}

impl TrackerHandle {
    /// Sets tags on the run (never blocks).
    pub(crate) fn tags(&self, tags: Vec<(String, String)>) {
        let _ = self.tx.send(Msg::Tags(tags));
    }

    /// Passes on the events MLflow records (never blocks).
    pub(crate) fn observe(&self, event: &super::TrainingEvent) {
        use super::TrainingEvent as E;
        let msg = match event {
            E::Started { job_id, .. } => Msg::Started {
                job_id: job_id.clone(),
            },
            E::Epoch(m) => Msg::Epoch(m.clone()),
            E::EarlyStopped { epoch, best_epoch } => {
                let mut tags = vec![("kindling.stopped_early_after_epoch".to_owned(), epoch.to_string())];
                tags.extend(best_epoch.map(|b| ("kindling.best_epoch".to_owned(), b.to_string())));
                Msg::Tags(tags)
            }
            _ => return,
        };
        let _ = self.tx.send(msg);
    }
}

impl Tracker {
    /// Ends the run: the model as artifacts when training succeeded, then
    /// its status; waits at most the flush timeout for the queue to drain.
    pub(crate) async fn finish(self, result: &Result<TrainedModel, JobError>) {
        self.finish_with(result.as_ref().ok(), result.is_err()).await
    }

    /// Ends the run with `model` (if any) as its artifacts, `failed` or not.
    pub(crate) async fn finish_with(self, model: Option<&TrainedModel>, failed: bool) {
        let model_dir = match model {
            Some(model) => {
                let dir =
                    std::env::temp_dir().join(format!("kindling-mlflow-{}", uuid::Uuid::new_v4().simple()));
                match model.save(&dir) {
                    Ok(()) => Some(dir),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not save the model for MLflow; the run has no model artifacts");
                        None
                    }
                }
            }
            None => None,
        };
        let _ = self.tx.send(Msg::Finish { model_dir, failed });
        let (done, wait, url) = (self.done, self.config.flush_timeout, self.config.url.clone());
        let finished = tokio::task::spawn_blocking(move || done.recv_timeout(wait).is_ok())
            .await
            .unwrap_or(false);
        if !finished {
            tracing::warn!(
                mlflow = %url,
                "MLflow did not take the run's last updates within {:.0} s: the run stays RUNNING (incomplete) there",
                wait.as_secs_f64()
            );
        }
    }
}

/// One request to make, in order.
#[derive(Debug)]
enum Call {
    Experiment,
    CreateRun { name: String },
    Log(Value),
    Upload { dir: PathBuf },
    End,
}

#[derive(Debug)]
struct Run {
    id: String,
    artifact_uri: String,
}

/// Why a request did not go through.
#[derive(Debug)]
enum Failure {
    /// The server is away or overloaded: try again later.
    Retry(String),
    /// The server refused it: it will not take it later either.
    Refused(String),
}

struct Worker {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
    experiment: String,
    experiment_id: Option<String>,
    run: Option<Run>,
    params: Vec<(String, String)>,
    queue: VecDeque<Call>,
    lost: u64,
    failed: bool,
    warned: bool,
    parent: Option<RunId>,
    run_id: RunId,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Worker {
    fn run(&mut self, rx: mpsc::Receiver<Msg>) {
        let mut backoff = Duration::from_millis(250);
        let mut finishing = false;
        let mut retry_at: Option<Instant> = None;
        loop {
            // New messages: wait for one when idle, else take what is there.
            let wait = match (self.queue.is_empty(), retry_at) {
                (true, _) if finishing => return,
                (true, _) => None,
                (false, Some(at)) => Some(at.saturating_duration_since(Instant::now())),
                (false, None) => Some(Duration::ZERO),
            };
            let first = match wait {
                None => rx.recv().ok(),
                Some(d) => rx.recv_timeout(d).ok(),
            };
            if first.is_none() && wait.is_none() {
                return; // fit is gone without finishing
            }
            for msg in first.into_iter().chain(rx.try_iter()) {
                finishing |= matches!(msg, Msg::Finish { .. });
                self.take(msg);
            }
            if retry_at.is_some_and(|at| Instant::now() < at) {
                continue;
            }
            let Some(call) = self.queue.pop_front() else {
                continue;
            };
            match self.send(&call) {
                Ok(()) => {
                    retry_at = None;
                    backoff = Duration::from_millis(250);
                    if self.warned {
                        tracing::info!(mlflow = %self.base, "MLflow answers again; the run's updates continue");
                        self.warned = false;
                    }
                }
                Err(Failure::Retry(why)) => {
                    if !self.warned {
                        tracing::warn!(mlflow = %self.base, error = %why,
                            "MLflow does not answer; training goes on and the run's updates wait");
                        self.warned = true;
                    }
                    self.queue.push_front(call);
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(Failure::Refused(why)) => {
                    tracing::warn!(mlflow = %self.base, error = %why, "MLflow refused an update of the run");
                    if matches!(call, Call::Experiment | Call::CreateRun { .. }) {
                        // No run to log to: nothing else can go through.
                        self.queue.clear();
                        if finishing {
                            return;
                        }
                    }
                    self.lost += 1;
                }
            }
        }
    }

    /// Turns a message into the calls it needs, in order.
    fn take(&mut self, msg: Msg) {
        let calls = match msg {
            Msg::Started { job_id } => {
                let mut calls = vec![Call::Experiment, Call::CreateRun { name: job_id }];
                for chunk in self.params.chunks(PARAMS_PER_BATCH) {
                    let params: Vec<Value> =
                        chunk.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
                    calls.push(Call::Log(json!({ "params": params })));
                }
                calls
            }
            Msg::Epoch(m) => vec![Call::Log(json!({ "metrics": epoch_metrics(&m) }))],
            Msg::Tags(tags) => {
                let tags: Vec<Value> = tags.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
                vec![Call::Log(json!({ "tags": tags }))]
            }
            Msg::Finish { model_dir, failed } => {
                self.failed = failed;
                let mut calls: Vec<Call> = model_dir.into_iter().map(|dir| Call::Upload { dir }).collect();
                calls.push(Call::End);
                calls
            }
        };
        for call in calls {
            let last = matches!(call, Call::Upload { .. } | Call::End);
            if self.queue.len() >= MAX_QUEUED && !last {
                self.lost += 1;
                continue;
            }
            self.queue.push_back(call);
        }
    }

    fn send(&mut self, call: &Call) -> Result<(), Failure> {
        match call {
            Call::Experiment => {
                let url = format!("{}/api/2.0/mlflow/experiments/get-by-name", self.base);
                let request = self.agent.get(&url).query("experiment_name", &self.experiment);
                let (status, body) = self.finish_get(request.header("accept", "application/json"))?;
                let id = match status {
                    200 => body["experiment"]["experiment_id"].as_str().map(str::to_owned),
                    _ if body["error_code"] == "RESOURCE_DOES_NOT_EXIST" => {
                        let created = self.post("experiments/create", json!({ "name": self.experiment }))?;
                        created["experiment_id"].as_str().map(str::to_owned)
                    }
                    _ => return Err(refused(status, &body)),
                };
                self.experiment_id = Some(id.ok_or_else(|| Failure::Refused("no experiment id".into()))?);
            }
            Call::CreateRun { name } => {
                let mut tags = vec![json!({"key": "kindling.job_id", "value": name})];
                if let Some(parent) = self.parent.as_ref().and_then(|p| p.get()) {
                    tags.push(json!({"key": "mlflow.parentRunId", "value": parent}));
                }
                let body = json!({
                    "experiment_id": self.experiment_id,
                    "run_name": name,
                    "start_time": now_ms(),
                    "tags": tags,
                });
                let created = self.post("runs/create", body)?;
                let info = &created["run"]["info"];
                let id = info["run_id"].as_str().unwrap_or_default().to_owned();
                let _ = self.run_id.set(id.clone());
                self.run = Some(Run {
                    id,
                    artifact_uri: info["artifact_uri"].as_str().unwrap_or_default().to_owned(),
                });
            }
            Call::Log(batch) => {
                let mut batch = batch.clone();
                batch["run_id"] = json!(self.run_id()?);
                self.post("runs/log-batch", batch)?;
            }
            Call::Upload { dir } => {
                let uploaded = self.upload(dir);
                if uploaded.is_ok() || matches!(uploaded, Err(Failure::Refused(_))) {
                    let _ = std::fs::remove_dir_all(dir);
                }
                uploaded?;
            }
            Call::End => {
                let run_id = self.run_id()?.to_owned();
                if self.lost > 0 {
                    let tag = json!({"key": "kindling.incomplete",
                        "value": format!("{} update(s) did not reach MLflow", self.lost)});
                    self.post("runs/log-batch", json!({"run_id": run_id, "tags": [tag]}))?;
                }
                let status = match self.failed || self.lost > 0 {
                    true => "FAILED",
                    false => "FINISHED",
                };
                self.post(
                    "runs/update",
                    json!({"run_id": run_id, "status": status, "end_time": now_ms()}),
                )?;
            }
        }
        Ok(())
    }

    fn run_id(&self) -> Result<&str, Failure> {
        self.run
            .as_ref()
            .map(|r| r.id.as_str())
            .ok_or_else(|| Failure::Refused("no run".into()))
    }

    /// The saved model's files under the run's `model/` artifacts, through
    /// the server's artifact proxy (`mlflow server` serves artifacts by
    /// default); a run whose artifacts live elsewhere gets a tag instead.
    fn upload(&mut self, dir: &PathBuf) -> Result<(), Failure> {
        let uri = self
            .run
            .as_ref()
            .map(|r| r.artifact_uri.clone())
            .unwrap_or_default();
        let Some(path) = uri.strip_prefix("mlflow-artifacts:") else {
            tracing::warn!(artifact_uri = %uri, "the run's artifacts are not served by the tracking server: no model artifacts");
            return Ok(());
        };
        let path = path.trim_start_matches('/');
        let path = match path.split_once('/') {
            // `mlflow-artifacts://host:port/path`: the path after the host.
            Some((host, rest)) if uri.starts_with("mlflow-artifacts://") && !host.is_empty() => rest,
            _ => path,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| Failure::Refused(e.to_string()))?;
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for file in files {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            let bytes = std::fs::read(&file).map_err(|e| Failure::Refused(e.to_string()))?;
            let url = format!(
                "{}/api/2.0/mlflow-artifacts/artifacts/{path}/model/{name}",
                self.base
            );
            let request = self.agent.put(&url);
            self.finish_request(request.header("content-type", "application/octet-stream"), bytes)
                .and_then(|(status, body)| match status {
                    200..=299 => Ok(()),
                    _ => Err(refused(status, &body)),
                })?;
        }
        Ok(())
    }

    fn post(&mut self, endpoint: &str, body: Value) -> Result<Value, Failure> {
        let url = format!("{}/api/2.0/mlflow/{endpoint}", self.base);
        let request = self.agent.post(&url).header("content-type", "application/json");
        let (status, answer) = self.finish_request(request, body.to_string().into_bytes())?;
        match status {
            200..=299 => Ok(answer),
            _ => Err(refused(status, &answer)),
        }
    }

    /// Sends a request without a body (with the token).
    fn finish_get(
        &self,
        request: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
    ) -> Result<(u16, Value), Failure> {
        let request = match &self.token {
            Some(t) => request.header("authorization", format!("Bearer {t}")),
            None => request,
        };
        read(request.call())
    }

    /// Sends a request with `body` (with the token).
    fn finish_request(
        &self,
        request: ureq::RequestBuilder<ureq::typestate::WithBody>,
        body: Vec<u8>,
    ) -> Result<(u16, Value), Failure> {
        let request = match &self.token {
            Some(t) => request.header("authorization", format!("Bearer {t}")),
            None => request,
        };
        read(request.send(&body[..]))
    }
}

/// A response's status and JSON body; a transport error, a 5xx or a 429
/// is worth retrying.
fn read(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(u16, Value), Failure> {
    let mut response = response.map_err(|e| Failure::Retry(e.to_string()))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    if status >= 500 || status == 429 {
        return Err(Failure::Retry(format!("HTTP {status}")));
    }
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn refused(status: u16, body: &Value) -> Failure {
    Failure::Refused(format!(
        "HTTP {status}: {}",
        body["message"].as_str().unwrap_or("(no message)")
    ))
}

/// An epoch's metrics as MLflow metrics at step `epoch`.
fn epoch_metrics(m: &EpochMetrics) -> Vec<Value> {
    let ts = now_ms();
    let mut values = vec![
        ("train_loss", Some(m.train_loss)),
        ("samples_per_sec", Some(m.samples_per_sec)),
    ];
    values.extend([
        ("eval_loss", m.eval_loss),
        ("eval_accuracy", m.eval_accuracy),
        ("learning_rate", m.learning_rate),
    ]);
    let named = m.metrics.iter().map(|(k, v)| (k.as_str(), Some(*v)));
    values
        .into_iter()
        .chain(named)
        .filter_map(|(k, v)| v.filter(|v| v.is_finite()).map(|v| (k, v)))
        .map(|(key, value)| json!({"key": key, "value": value, "timestamp": ts, "step": m.epoch}))
        .collect()
}

/// The spec flattened into MLflow params: `optimizer.learning_rate`,
/// `schedule.kind`, … (lists as JSON).
fn params(spec: &JobSpec) -> Vec<(String, String)> {
    fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, v, out);
                }
            }
            Value::String(s) => out.push((prefix.to_owned(), s.clone())),
            other => out.push((prefix.to_owned(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    let spec: Value = serde_json::from_str(&spec.to_json()).unwrap_or(Value::Null);
    flatten("", &spec, &mut out);
    for (_, v) in &mut out {
        if v.len() > MAX_PARAM_CHARS {
            let mut cut = MAX_PARAM_CHARS;
            while !v.is_char_boundary(cut) {
                cut -= 1;
            }
            v.truncate(cut);
        }
    }
    out
}
