//! The rendezvous' status page in a real headless Chromium (Debian's
//! `chromium`, installed by `deploy/local/setup.sh`) during and after a real
//! training job on a local cluster: the job is listed with its state, the
//! loss chart has one point per finished epoch, and a screenshot is kept
//! under the test's output directory. The page and its data refuse callers
//! without a token, as every other call on that port; the viewer token
//! reads them and can call nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kindling_schemas::descriptor::Split;
use kindling_tests::cluster::*;

async fn get(addr: &str, path: &str, headers: &[String]) -> (u16, String, String) {
    let r = kindling_tests::http::get(addr, path, headers).await;
    (r.code, r.head, r.body)
}

/// The page's data, polled until `done` (60 s at most).
async fn wait_status(
    addr: &str,
    token: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let (code, _, body) = get(addr, "/api/status", &[format!("authorization: Bearer {token}")]).await;
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        if done(&v) {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the status never got there: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job<'a>(v: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    v["jobs"].as_array()?.iter().find(|j| j["job_id"] == id)
}

/// Headless Chromium on `url`: `--dump-dom` (the rendered DOM, after the
/// page's scripts ran) or `--screenshot` into `out`.
fn chromium(url: &str, dir: &Path, what: &str) -> String {
    let profile = tempfile::tempdir_in(dir).expect("profile dir");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,1800",
            // Virtual time: the page's polls and timers run until the budget
            // is spent, and network fetches are waited for.
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(what)
        .arg(url)
        .output()
        .expect("chromium is installed (deploy/local/setup.sh installs it)");
    assert!(
        output.status.success(),
        "chromium {what}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The opening tags named `tag` whose attributes include every one of `with`.
fn tags<'a>(dom: &'a str, tag: &str, with: &[&str]) -> Vec<&'a str> {
    dom.split(&format!("<{tag} "))
        .skip(1)
        .filter_map(|rest| rest.split_once('>').map(|(attrs, _)| attrs))
        .filter(|attrs| with.iter().all(|w| attrs.contains(w)))
        .collect()
}

fn attr<'a>(attrs: &'a str, name: &str) -> Option<&'a str> {
    attrs
        .split(&format!("{name}=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
}

fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status_page");
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_job_live_and_its_loss_per_epoch_in_chromium() {
    let viewer = "viewer-token-of-this-test";
    let (cluster, dir) = cluster_with(2, |c| {
        c.viewer_token = Some(kindling_schemas::auth::Token::new(viewer));
    })
    .await;
    let operator = cluster.token().expect("token").clone();
    let rv = cluster.rendezvous_url().trim_start_matches("http://").to_owned();
    // The page is read with the viewer token, which can read and do nothing
    // else: the rendezvous' and the agents' RPCs refuse it.
    let token = viewer.to_owned();
    let as_viewer = kindling_schemas::rendezvous::RendezvousClient::connect(
        cluster.rendezvous_url(),
        Some(&kindling_schemas::auth::Token::new(viewer)),
    )
    .await
    .expect("client");
    let refused = as_viewer
        .list_agents()
        .await
        .expect_err("a viewer lists no agents");
    assert_eq!(refused.code(), Some(tonic::Code::Unauthenticated), "{refused}");
    let agent_as_viewer = kindling::feed::AgentClient::connect(
        &cluster.agent_url(0).expect("agent"),
        Some(&kindling_schemas::auth::Token::new(viewer)),
    )
    .expect("client");
    let refused = agent_as_viewer
        .job_status("any")
        .await
        .expect_err("a viewer reads no job");
    assert_eq!(refused.code(), Some(tonic::Code::Unauthenticated), "{refused}");
    let agent = cluster
        .agent_url(0)
        .expect("agent")
        .trim_start_matches("http://")
        .to_owned();
    let (code, _, metrics) = get(&agent, "/metrics", &[format!("authorization: Bearer {viewer}")]).await;
    assert_eq!(code, 200, "the viewer reads an agent's metrics: {metrics}");
    let (code, _, _) = get(
        &rv,
        "/metrics",
        &[format!("authorization: Bearer {}", operator.expose())],
    )
    .await;
    assert_eq!(code, 200, "the operator reads them too");

    // Without the token the page, its data and the metrics are refused; a
    // job credential would be too (they span every job).
    for path in ["/", "/api/status", "/metrics"] {
        let (code, _, body) = get(&rv, path, &[]).await;
        assert_eq!(code, 401, "{path}: {body}");
    }
    // A browser's first visit with the token: a cookie, and a redirect that
    // drops the token from the address.
    let (code, head, _) = get(&rv, &format!("/?token={token}"), &[]).await;
    assert_eq!(code, 303, "{head}");
    assert!(head.contains("location: /\r\n"), "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("a cookie")
        .to_owned();
    let (code, _, page) = get(&rv, "/", &[format!("cookie: {cookie}")]).await;
    assert_eq!(code, 200);
    assert!(
        page.contains("<svg") || page.contains("loss-chart"),
        "the embedded page"
    );

    // A job that trains its first epoch while its rows arrive: running
    // until the producers say they are done.
    let epochs = 3;
    let mut spec = linear_spec(epochs);
    spec.num_slots = 2;
    // A schedule (a learning-rate curve) and early stopping's watch (a best
    // epoch marked on the loss chart).
    spec.schedule = kindling::Schedule::Cosine {
        warmup_epochs: 0.0,
        min_factor: 0.1,
    };
    spec.early_stopping = Some(kindling::EarlyStopping::new(kindling::Metric::TrainLoss, 5));
    start_job(&cluster, "watched", &spec, &[0, 1]).await;
    for i in 0..2 {
        put(
            &agent_client(&cluster, i),
            "watched",
            Split::Train,
            "p",
            &[rule_batch(1000, i as u64 + 1)],
        )
        .await
        .expect("rows");
    }
    wait_status(&rv, &token, |v| {
        job(v, "watched")
            .is_some_and(|j| j["state"] == "running" && j["ranks"].as_array().is_some_and(|r| r.len() == 2))
    })
    .await;
    let out = output_dir();
    let url = format!("http://{rv}/?token={token}");
    let during = chromium(&url, dir.path(), "--dump-dom");
    let section = tags(&during, "section", &["data-job-id=\"watched\""]);
    assert_eq!(section.len(), 1, "the job has one card:\n{during}");
    assert_eq!(attr(section[0], "data-state"), Some("running"), "{}", section[0]);
    let rows = tags(&during, "tr", &["data-job-id=\"watched\""]);
    assert_eq!(rows.len(), 1, "one row in the overview:\n{during}");
    assert_eq!(
        tags(&during, "circle", &["class=\"point train\""]).len(),
        0,
        "no epoch finished yet"
    );
    assert!(during.contains("data-loaded=\"1\""), "the page rendered its data");

    for i in 0..2 {
        end_of_data(&agent_client(&cluster, i), "watched", Split::Train, Some(1000)).await;
    }
    for i in 0..2 {
        wait_done(&agent_client(&cluster, i), "watched").await;
    }
    let v = wait_status(&rv, &token, |v| {
        job(v, "watched").is_some_and(|j| {
            j["state"] == "succeeded"
                && j["history"]
                    .as_array()
                    .is_some_and(|h| h.len() == epochs as usize)
        })
    })
    .await;
    let j = job(&v, "watched").expect("job");
    assert!(
        j["step_losses"].as_array().is_some_and(|s| !s.is_empty()),
        "sampled step losses: {j:#}"
    );
    assert!(
        j["history"][0]["wall_secs"].as_f64().is_some_and(|w| w > 0.0),
        "each epoch's wall time: {j:#}"
    );
    let after = chromium(&url, dir.path(), "--dump-dom");
    let section = tags(&after, "section", &["data-job-id=\"watched\""]);
    assert_eq!(
        attr(section[0], "data-state"),
        Some("succeeded"),
        "{}",
        section[0]
    );
    let charts = tags(
        &after,
        "svg",
        &["class=\"loss-chart\"", "data-job-id=\"watched\""],
    );
    assert_eq!(charts.len(), 1, "{after}");
    assert_eq!(attr(charts[0], "data-epochs"), Some("3"));
    let points = tags(&after, "circle", &["class=\"point train\""]);
    assert_eq!(
        points.len(),
        epochs as usize,
        "one point per finished epoch:\n{after}"
    );
    let mut drawn: Vec<&str> = points.iter().filter_map(|p| attr(p, "data-epoch")).collect();
    drawn.sort();
    assert_eq!(drawn, ["1", "2", "3"]);
    // The learning rate per epoch, and the best epoch on the loss chart.
    let lr = tags(&after, "svg", &["class=\"lr-chart\""]);
    assert_eq!(lr.len(), 1, "{after}");
    assert_eq!(attr(lr[0], "data-epochs"), Some("3"));
    assert_eq!(tags(&after, "circle", &["class=\"lr-dot\""]).len(), 3);
    let best = j["best_epoch"].as_u64().expect("a best epoch");
    let marker = tags(&after, "line", &["class=\"best-marker\""]);
    assert_eq!(marker.len(), 1, "{after}");
    assert_eq!(attr(marker[0], "data-epoch"), Some(best.to_string().as_str()));
    assert!(
        j["history"][2]["learning_rate"].as_f64() < j["history"][0]["learning_rate"].as_f64(),
        "the cosine schedule lowers the rate: {j:#}"
    );
    // Nothing scrolls sideways at 1,400 px.
    assert!(
        after.contains("data-fits=\"1\""),
        "the page is wider than the window"
    );

    let shot = out.join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(&url, dir.path(), &format!("--screenshot={}", shot.display()));
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real picture"
    );
    eprintln!("status page screenshot: {}", shot.display());
    cluster.shutdown().await;
}
