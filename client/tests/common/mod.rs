//! What the CLI tests share.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The local Spark Connect server (`deploy/local/spark-connect.sh start` is
/// idempotent and returns once a query answers; a server already listening
/// is reused as is).
pub fn spark_remote() -> String {
    let port = std::env::var("KINDLING_SPARK_PORT").unwrap_or_else(|_| "15002".into());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
        let status = Command::new("bash")
            .arg(&script)
            .arg("start")
            .env("KINDLING_SPARK_PORT", &port)
            .status()
            .expect("spark-connect.sh");
        assert!(status.success(), "spark-connect.sh start: {status}");
    }
    format!("sc://{addr}")
}
