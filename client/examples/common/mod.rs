//! What the client's benchmark programs share: readings of this machine and
//! of processes from `/proc`.

use std::path::{Path, PathBuf};

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A field of `/proc/<pid>/status` or `/proc/<pid>/io`, in bytes (0 if absent).
pub fn proc_field(pid: &str, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    let value: u64 = text
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if file == "status" { value * 1024 } else { value }
}

/// user + system CPU seconds of this process (all threads).
pub fn cpu_seconds() -> f64 {
    process_cpu_seconds("self")
}

/// user + system CPU seconds of process `pid` (all threads; 0 if it is gone).
pub fn process_cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The Spark Connect server's pid: `--spark-pid`, else the one
/// `deploy/local/spark-connect.sh` recorded for a server on this machine.
pub fn spark_pid(remote: &str, explicit: Option<String>) -> Option<String> {
    let pid = explicit.or_else(|| {
        let local = ["sc://127.0.0.1:", "sc://localhost:"]
            .iter()
            .find_map(|prefix| remote.strip_prefix(prefix))?;
        let port: String = local.chars().take_while(char::is_ascii_digit).collect();
        let home = std::env::var("KINDLING_HOME")
            .map(PathBuf::from)
            .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache/kindling")))
            .ok()?;
        let pid = std::fs::read_to_string(home.join(format!("spark-{port}/server.pid"))).ok()?;
        Some(pid.trim().to_string())
    })?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains("SparkConnectServer")
        .then_some(pid)
}
