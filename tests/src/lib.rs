//! End-to-end tests and fixtures: a real Spark Connect server, agents and rendezvous on loopback.

pub mod cluster;
pub mod etcd;
pub mod events;
pub mod flight;
pub mod http;
pub mod mlflow;
pub mod netns;
pub mod procs;
pub mod proxy;
pub mod ring;
pub mod spark;

/// Runs the calling test again in a process of its own (this test binary,
/// that test alone) and says whether the caller is that process: `true`
/// there, where the test goes on; `false` in the test binary's process once
/// the other process has passed (it panics if that one failed).
///
/// For a test that measures its own process, such as its peak RSS: the
/// other tests of the shared test binary run beside it and would count.
///
/// ```no_run
/// if !kindling_tests::alone("spark_stream::five_million_rows_stream_with_flat_memory") {
///     return;
/// }
/// ```
pub fn alone(test: &str) -> bool {
    const CHILD: &str = "KINDLING_TEST_ALONE";
    if std::env::var(CHILD).is_ok_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test executable");
    let status = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .status()
        .expect("run the test in a process of its own");
    assert!(
        status.success(),
        "{test}, run in a process of its own, failed: {status}"
    );
    false
}
