//! Spark Connect fixture: one local server per machine, started once per test process.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The URL of the local Spark Connect server, starting it if needed.
///
/// Runs `deploy/local/spark-connect.sh start` once per process; the script is
/// idempotent, serialises concurrent starts with `flock`, and returns only when a
/// real query answers, so no test waits or sleeps on its own. Honours
/// `KINDLING_SPARK_PORT` (default 15002).
///
/// ```no_run
/// let url = kindling_tests::spark::spark_remote();
/// assert!(url.starts_with("sc://127.0.0.1:"));
/// ```
pub fn spark_remote() -> String {
    static REMOTE: OnceLock<String> = OnceLock::new();
    REMOTE
        .get_or_init(|| {
            let port = std::env::var("KINDLING_SPARK_PORT").unwrap_or_else(|_| "15002".into());
            // A server that already accepts connections is reused without the script:
            // the script's lock file descriptor is inherited by the server JVM it
            // starts, so a second `start` would wait on that lock forever.
            if listening(&port) {
                return format!("sc://127.0.0.1:{port}");
            }
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
            let status = Command::new("bash")
                .arg(&script)
                .arg("start")
                .env("KINDLING_SPARK_PORT", &port)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(status.success(), "{} start failed: {status}", script.display());
            format!("sc://127.0.0.1:{port}")
        })
        .clone()
}

fn listening(port: &str) -> bool {
    port.parse::<u16>().is_ok_and(|port| {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    })
}
