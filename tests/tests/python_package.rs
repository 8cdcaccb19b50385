//! The installable Python package (deploy/python, `kindling-client`): pip
//! builds and installs it from a copy of its folder, with no network and no
//! build isolation, into a fresh target; its pytest suite then runs from that
//! install against a real rendezvous and two real agents on loopback that
//! speak mutual TLS only (the client certificate, key and CA reach pyarrow
//! through `KINDLING_TLS_*`).

use crate::python_common;

use std::path::Path;
use std::process::Command;

use kindling_tests::cluster::tls_cluster;

/// Copies the package's sources (not build outputs) so that the build leaves
/// nothing in the work tree.
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read package dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "__pycache__" || name == "build" || name.ends_with(".egg-info") || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&*name));
        } else {
            std::fs::copy(&path, to.join(&*name)).expect("copy");
        }
    }
}

/// `N passed` (and no `failed`/`error`) from pytest's closing line.
fn passed(stdout: &str) -> u64 {
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed") || l.contains(" failed") || l.contains(" error"))
        .unwrap_or_default();
    assert!(
        !last.contains("failed") && !last.contains("error") && !last.contains("skipped"),
        "pytest: {last}\n{stdout}"
    );
    last.split_whitespace()
        .zip(last.split_whitespace().skip(1))
        .find(|(_, word)| word.trim_end_matches(',').starts_with("passed"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_package_installs_and_its_pytest_suite_passes_against_real_agents() {
    let python = python_common::python_bin();
    assert!(
        python.exists(),
        "python {} not found: run deploy/local/setup.sh or set KINDLING_PYTHON_BIN",
        python.display()
    );
    let root = python_common::repo_root();
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("src");
    let site = work.path().join("site");
    copy_sources(&root.join("deploy/python"), &source);

    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
    ])
    .arg("--target")
    .arg(&site)
    .arg(&source)
    .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    let (status, stdout, stderr) = python_common::output(pip).await;
    assert!(
        status.success(),
        "pip install deploy/python: {status}\n{stdout}\n{stderr}"
    );
    assert!(
        site.join("kindling_client/py.typed").exists(),
        "py.typed is installed"
    );
    assert!(
        std::fs::read_dir(&site)
            .expect("site")
            .filter_map(Result::ok)
            .any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("kindling_client-0.1.0.dist-info")),
        "the distribution's metadata is installed"
    );

    let (cluster, _dir, client, _) = tls_cluster(2).await;
    assert!(cluster.agent_urls().iter().all(|u| u.starts_with("https://")));
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
        .arg(source.join("tests"))
        .current_dir(work.path())
        // The installed copy, not the work tree's sources.
        .env("PYTHONPATH", &site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("KINDLING_AGENTS", cluster.agent_urls().join(","))
        .env("KINDLING_TOKEN", cluster.token().expect("token").expose())
        .env("KINDLING_RENDEZVOUS", cluster.rendezvous_url())
        .env("KINDLING_PROTOCOL_MD", root.join("docs/protocol.md"))
        .env("KINDLING_TLS_CA", &client.ca)
        .env("KINDLING_TLS_CERT", &client.cert)
        .env("KINDLING_TLS_KEY", &client.key);
    let (status, stdout, stderr) = python_common::output(pytest).await;
    assert!(
        status.success(),
        "pytest failed ({status}):\n{stdout}\n--- stderr\n{stderr}"
    );
    let n = passed(&stdout);
    assert!(n >= 10, "pytest ran {n} tests:\n{stdout}");
    cluster.shutdown().await;
}
