//! The standard `process_*` metrics, read from `/proc/self` at scrape time.
//!
//! prometheus-client has no process collector and the crates that add one
//! pull in a whole procfs library for six numbers, so this reads the few
//! files itself. Names and meanings follow the Go client's collector, which
//! dashboards and alert rules expect. On other systems nothing is exported.
//!
//! Like Go's `procfs`, CPU and start times assume `USER_HZ` = 100, which
//! Linux fixes for every architecture it exports `/proc` times in.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second in `/proc/<pid>/stat`.
const USER_HZ: f64 = 100.0;

/// The numbers behind the `process_*` metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None`: unlimited).
    pub max_fds: Option<u64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// Reads this process's numbers; `None` where `/proc` is not there.
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) is in parentheses and may hold spaces:
        // the fields after it start past the last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state), so field n is f[n - 3].
        let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let cpu_ticks = field(14)? + field(15)?;
        let start_ticks = field(22)?;
        let virtual_bytes = field(23)?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let resident_bytes = kib_line(&status, "VmRSS:").unwrap_or(0) * 1024;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| max_open_files(&l));
        Some(ProcessStats {
            cpu_seconds: cpu_ticks as f64 / USER_HZ,
            resident_bytes,
            virtual_bytes,
            open_fds,
            max_fds,
            start_time_seconds: boot_time as f64 + start_ticks as f64 / USER_HZ,
        })
    }
}

/// `VmRSS:   1234 kB` -> 1234.
fn kib_line(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit from `Max open files  1024  4096  files`; `None` when
/// unlimited or unreadable.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Exports [`ProcessStats`] on every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(s) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        // Counters get their `_total` suffix from the encoder.
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let mut gauge = |name: &str, help: &str, v: f64| {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes as f64,
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes as f64,
        )?;
        gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds as f64,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            )?;
        }
        gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_limits_and_status() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            max_open_files("Max open files  unlimited  unlimited  files\n"),
            None
        );
        assert_eq!(
            kib_line("Name:\tx\nVmRSS:\t   5120 kB\n", "VmRSS:"),
            Some(5120)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read().expect("/proc/self");
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started within the last day, not in the future (btime has 1 s
        // resolution and ticks 10 ms).
        assert!(s.start_time_seconds <= now + 2.0 && s.start_time_seconds > now - 86_400.0);
    }
}
