//! A real Prometheus server (Debian's `prometheus`, installed by
//! `deploy/local/setup.sh`) scrapes a local cluster's agents and rendezvous
//! at `/metrics` during a real training job; the job's series are read back
//! through Prometheus' HTTP query API.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kindling_schemas::descriptor::Split;
use kindling_tests::cluster::*;
use tokio::io::AsyncWriteExt;

/// `GET path` on `addr`, with an optional bearer token: (status code, body).
async fn get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let headers: Vec<String> = token.map(kindling_tests::http::bearer).into_iter().collect();
    let r = kindling_tests::http::get(addr, path, &headers).await;
    (r.code, r.body)
}

struct Prometheus {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` every 200 ms with `token`.
    async fn start(dir: &std::path::Path, targets: &[String], token: &str) -> Prometheus {
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).expect("token file");
        let config = format!(
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\nscrape_configs:\n  - job_name: kindling\n    \
             authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: [{}]\n",
            token_file.display(),
            targets
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).expect("config");
        // A free port: bound, read, released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
            .spawn()
            .expect("prometheus is installed (deploy/local/setup.sh installs it)");
        let p = Prometheus {
            child,
            addr,
            log: dir.join("prometheus.log"),
        };
        p.wait_for("/-/ready", |body| body.contains("Ready")).await;
        p
    }

    /// Polls `path` until `done(body)`, failing after 60 s.
    async fn wait_for(&self, path: &str, done: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            if let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(&self.addr)).await
            {
                let _ = s.shutdown().await;
                let (code, body) = get(&self.addr, path, None).await;
                if code == 200 && done(&body) {
                    return body;
                }
                last = format!("{code} {body}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{path}: not there in 60 s; last answer: {last}; prometheus log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The values of an instant query's series, with their labels.
    async fn query(
        &self,
        promql: &str,
        done: impl Fn(&[(serde_json::Value, f64)]) -> bool,
    ) -> Vec<(serde_json::Value, f64)> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let mut last = Vec::new();
        let body = self
            .wait_for(&path, |body| {
                let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
                let series: Vec<(serde_json::Value, f64)> = v["data"]["result"]
                    .as_array()
                    .map(|r| {
                        r.iter()
                            .map(|s| {
                                let value = s["value"][1]
                                    .as_str()
                                    .and_then(|x| x.parse().ok())
                                    .unwrap_or(f64::NAN);
                                (s["metric"].clone(), value)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                done(&series)
            })
            .await;
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        for s in v["data"]["result"].as_array().into_iter().flatten() {
            let value = s["value"][1]
                .as_str()
                .and_then(|x| x.parse().ok())
                .unwrap_or(f64::NAN);
            last.push((s["metric"].clone(), value));
        }
        last
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_a_training_job_with_its_labels_and_plausible_values() {
    let (cluster, dir) = cluster(2).await;
    let token = cluster.token().expect("token").expose().to_owned();
    let host = |url: String| url.trim_start_matches("http://").to_owned();
    let agents: Vec<String> = (0..2)
        .map(|i| host(cluster.agent_url(i).expect("agent")))
        .collect();
    let rendezvous = host(cluster.rendezvous_url());

    // Without the token (or with another), /metrics is refused like any call.
    assert_eq!(get(&agents[0], "/metrics", None).await.0, 401);
    assert_eq!(get(&agents[0], "/metrics", Some("wrong")).await.0, 401);
    assert_eq!(get(&rendezvous, "/metrics", None).await.0, 401);
    let (code, page) = get(&agents[0], "/metrics", Some(&token)).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("# TYPE kindling_agent_cache_bytes gauge"), "{page}");

    let mut targets = agents.clone();
    targets.push(rendezvous.clone());
    let prometheus = Prometheus::start(dir.path(), &targets, &token).await;

    let mut spec = linear_spec(3);
    spec.num_slots = 2;
    start_job(&cluster, "watched", &spec, &[0, 1]).await;
    for i in 0..2 {
        let c = agent_client(&cluster, i);
        put(
            &c,
            "watched",
            Split::Train,
            "p",
            &[rule_batch(1000, i as u64 + 1)],
        )
        .await
        .expect("rows");
        end_of_data(&c, "watched", Split::Train, Some(1000)).await;
    }
    // During the job: every target is up, and the job's rows are there.
    let up = prometheus
        .query("up", |s| s.len() == 3 && s.iter().all(|(_, v)| *v == 1.0))
        .await;
    assert_eq!(up.len(), 3, "{up:?}");
    let rows = prometheus
        .query(r#"kindling_job_rows{job_id="watched",split="train"}"#, |s| {
            s.len() == 2 && s.iter().all(|(_, v)| *v == 1000.0)
        })
        .await;
    let labelled: Vec<&str> = rows.iter().filter_map(|(m, _)| m["agent"].as_str()).collect();
    assert_eq!(labelled.len(), 2, "one series per agent: {rows:?}");
    for i in 0..2 {
        wait_done(&agent_client(&cluster, i), "watched").await;
    }

    // After the first epoch: rows trained == the dataset's rows, on each rank.
    let trained = prometheus
        .query(r#"kindling_job_rows_trained{job_id="watched"}"#, |s| {
            s.len() == 2 && s.iter().all(|(_, v)| *v == 2000.0)
        })
        .await;
    let ranks: Vec<&str> = trained.iter().filter_map(|(m, _)| m["rank"].as_str()).collect();
    assert!(ranks.contains(&"0") && ranks.contains(&"1"), "{trained:?}");
    let loss = prometheus
        .query(r#"kindling_job_train_loss{job_id="watched"}"#, |s| s.len() == 2)
        .await;
    assert!(
        loss.iter().all(|(_, v)| v.is_finite() && *v > 0.0 && *v < 10.0),
        "{loss:?}"
    );
    let epochs = prometheus
        .query(r#"kindling_job_epochs_done{job_id="watched"}"#, |s| {
            s.len() == 2 && s.iter().all(|(_, v)| *v == 3.0)
        })
        .await;
    assert_eq!(epochs.len(), 2);
    // The ring's all-reduces: counted, with bytes and a time histogram.
    let reduces = prometheus
        .query(r#"kindling_allreduce_total{job_id="watched"}"#, |s| {
            s.len() == 2 && s.iter().all(|(_, v)| *v > 0.0)
        })
        .await;
    let count = prometheus
        .query(r#"kindling_allreduce_seconds_count{job_id="watched"}"#, |s| {
            s.len() == 2
        })
        .await;
    assert_eq!(
        reduces.iter().map(|(_, v)| *v).sum::<f64>(),
        count.iter().map(|(_, v)| *v).sum::<f64>(),
        "the histogram counts every all-reduce"
    );
    let bytes = prometheus
        .query(r#"kindling_allreduce_bytes_total{job_id="watched"}"#, |s| {
            s.len() == 2
        })
        .await;
    assert!(bytes.iter().all(|(_, v)| *v > 0.0), "{bytes:?}");
    // The rendezvous: the job succeeded, both agents registered.
    prometheus
        .query(r#"kindling_rendezvous_jobs{state="succeeded"}"#, |s| {
            s.len() == 1 && s[0].1 >= 1.0
        })
        .await;
    prometheus
        .query("kindling_rendezvous_agents", |s| s.len() == 1 && s[0].1 == 2.0)
        .await;
    // Pages with the job's series parse: every target's last scrape is up.
    prometheus
        .query("up", |s| s.len() == 3 && s.iter().all(|(_, v)| *v == 1.0))
        .await;
    cluster.shutdown().await;
}
