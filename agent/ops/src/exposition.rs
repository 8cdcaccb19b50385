//! Prometheus metrics at `/metrics` on the agent's and the rendezvous' own
//! port (served by [`crate::web`]: the same TLS as every other call there,
//! the operator or the viewer token), through `prometheus-client`: the
//! OpenMetrics text format, each family written by a [`Collector`] from the
//! live state on every scrape, so no series outlives what it describes — a
//! job's series go when the agent drops the job (`--finished-retention-secs`,
//! 1 h after it ends), a rendezvous job's with its retention. Every page
//! also has `kindling_build_info` and the process' own metrics
//! ([`ProcessCollector`]). The families themselves are the binaries' own:
//! `kindling_agent::process::metrics` and `kindling_rendezvous::metrics`.

use std::borrow::Cow;
use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry for `binary` (`agent` or `rendezvous`) with its build info,
/// the process collector and `families`.
pub fn registry(binary: &'static str, families: impl Collector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(BuildInfo(binary)));
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(Box::new(families));
    registry
}

/// The page of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut page = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut page, registry) {
        let _ = writeln!(page, "# encoding failed: {e}");
    }
    page
}

/// One family being written: its descriptor once, then a sample per label set.
#[derive(Debug)]
pub struct Family<'a> {
    encoder: prometheus_client::encoding::MetricEncoder<'a>,
    kind: MetricType,
}

/// Starts family `name` (a counter's name without its `_total`, which the
/// format adds) on `encoder`.
pub fn family<'a>(
    encoder: &'a mut DescriptorEncoder<'_>,
    name: &'a str,
    help: &str,
    kind: MetricType,
) -> Result<Family<'a>, std::fmt::Error> {
    Ok(Family {
        encoder: encoder.encode_descriptor(name, help, None, kind)?,
        kind,
    })
}

/// `labels` with their values escaped as the format wants (prometheus-client
/// writes label values as given).
fn escaped<'l>(labels: &[(&'l str, &'l str)]) -> Vec<(&'l str, Cow<'l, str>)> {
    labels
        .iter()
        .map(|&(k, v)| {
            let v = if v.contains(['\\', '"', '\n']) {
                Cow::Owned(v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
            } else {
                Cow::Borrowed(v)
            };
            (k, v)
        })
        .collect()
}

/// A family of one sample without labels.
pub fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let sample = encoder.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(sample),
        _ => ConstGauge::new(value).encode(sample),
    }
}

impl Family<'_> {
    /// One sample with `labels`: an integer value.
    pub fn int(&mut self, labels: &[(&str, &str)], value: i64) -> Result<(), std::fmt::Error> {
        let labels = escaped(labels);
        let sample = self.encoder.encode_family(&labels)?;
        match self.kind {
            MetricType::Counter => ConstCounter::new(value.max(0) as u64).encode(sample),
            _ => ConstGauge::new(value).encode(sample),
        }
    }

    /// One sample with `labels`: a float value.
    pub fn float(&mut self, labels: &[(&str, &str)], value: f64) -> Result<(), std::fmt::Error> {
        let labels = escaped(labels);
        let sample = self.encoder.encode_family(&labels)?;
        match self.kind {
            MetricType::Counter => ConstCounter::new(value).encode(sample),
            _ => ConstGauge::new(value).encode(sample),
        }
    }

    /// One histogram with `labels`: its sum, count and per-bucket (not
    /// cumulative) counts by upper bound; what exceeds the last bound goes
    /// to `+Inf`.
    pub fn histogram(
        &mut self,
        labels: &[(&str, &str)],
        sum: f64,
        count: u64,
        buckets: &[(f64, u64)],
    ) -> Result<(), std::fmt::Error> {
        let within: u64 = buckets.iter().map(|(_, n)| n).sum();
        let mut all = buckets.to_vec();
        all.push((f64::MAX, count.saturating_sub(within)));
        let labels = escaped(labels);
        self.encoder
            .encode_family(&labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &all, None)
    }
}

/// `kindling_build_info{binary, version} 1`.
#[derive(Debug)]
struct BuildInfo(&'static str);

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut f = family(
            &mut encoder,
            "kindling_build_info",
            "The binary and its version (always 1).",
            MetricType::Gauge,
        )?;
        f.int(&[("binary", self.0), ("version", env!("CARGO_PKG_VERSION"))], 1)
    }
}

/// The process' CPU time, memory, file descriptors and start time, the
/// standard `process_*` families, read from `/proc/self` on each scrape.
/// Written here because prometheus-client has no process collector (the
/// `prometheus` crate's belongs to its own registry type); on a system
/// without `/proc` the families are left out.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let floats = [
            (
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds.",
                MetricType::Counter,
                p.cpu_seconds,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                MetricType::Gauge,
                p.rss_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                MetricType::Gauge,
                p.vsize_bytes,
            ),
            (
                "process_open_fds",
                "Open file descriptors.",
                MetricType::Gauge,
                p.open_fds,
            ),
            (
                "process_max_fds",
                "The limit on open file descriptors.",
                MetricType::Gauge,
                p.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                MetricType::Gauge,
                p.start_time_seconds,
            ),
        ];
        for (name, help, kind, value) in floats {
            if let Some(v) = value {
                single(&mut encoder, name, help, kind, v)?;
            }
        }
        Ok(())
    }
}

/// What `/proc/self` says of this process.
#[derive(Debug, Default)]
struct ProcessStats {
    cpu_seconds: Option<f64>,
    rss_bytes: Option<f64>,
    vsize_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Clock ticks per second of `/proc`'s times (USER_HZ, 100 on Linux).
    const TICKS: f64 = 100.0;
    /// The page size `/proc/self/stat`'s RSS counts in.
    const PAGE: f64 = 4096.0;

    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which may hold spaces: field 3 is index 0.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let num = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<f64>().ok())
        });
        Some(ProcessStats {
            // utime and stime are fields 14 and 15; vsize 23, rss 24; starttime 22.
            cpu_seconds: num(11).zip(num(12)).map(|(u, s)| (u + s) / Self::TICKS),
            vsize_bytes: num(20),
            rss_bytes: num(21).map(|pages| pages * Self::PAGE),
            start_time_seconds: boot.zip(num(19)).map(|(b, t)| b + t / Self::TICKS),
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64),
            max_fds,
        })
    }
}

#[cfg(test)]
mod tests {
    use kindling_fixtures::assert_grouped;

    use super::*;

    /// A collector of one family `x`, as in a page.
    #[derive(Debug)]
    struct X;

    impl Collector for X {
        fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            family(&mut e, "x", "An x.", MetricType::Gauge)?.float(&[("job", "a\"b\\c\nd")], 1.5)?;
            single(&mut e, "y", "A y.", MetricType::Gauge, f64::INFINITY)
        }
    }

    fn page_of(c: impl Collector) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(c));
        encode(&registry)
    }

    #[test]
    fn samples_escape_their_labels_and_special_values() {
        let page = page_of(X);
        // Prometheus reads `inf` as it reads `+Inf` (Go's ParseFloat).
        assert_eq!(
            page,
            "# HELP x An x.\n# TYPE x gauge\nx{job=\"a\\\"b\\\\c\\nd\"} 1.5\n# HELP y A y.\n# TYPE y gauge\ny inf\n# EOF\n"
        );
    }

    #[test]
    fn every_page_has_build_info_and_the_process_families() {
        // Some CPU time to count (the kernel counts in 10 ms ticks).
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let page = encode(&registry("agent", X));
        assert_grouped(&page);
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            page.contains(&format!(
                "kindling_build_info{{binary=\"agent\",version=\"{version}\"}} 1"
            )),
            "{page}"
        );
        let value = |name: &str| -> f64 {
            let line = page
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name}:\n{page}"));
            line.rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .expect("a number")
        };
        // This test process: some CPU time, memory, descriptors, started before now.
        assert!(value("process_cpu_seconds_total") > 0.0);
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0 && value("process_open_fds") <= value("process_max_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("now")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "started {started}, now {now}"
        );
    }
}
