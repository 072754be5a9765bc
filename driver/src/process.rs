//! The standard `process_*` metrics (the names every Prometheus client exports), read from
//! `/proc/self` at each scrape with the `procfs` crate.

use std::fmt;

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Encodes the process metrics; a value `/proc` does not give is left out.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

fn encode<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: M,
) -> fmt::Result {
    let kind = value.metric_type();
    value.encode(encoder.encode_descriptor(name, help, unit, kind)?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Ok(process) = Process::myself() else {
            return Ok(());
        };
        let (seconds, bytes) = (Unit::Seconds, Unit::Bytes);
        if let Ok(stat) = process.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            encode(
                &mut encoder,
                "process_cpu",
                "Total user and system CPU time spent",
                Some(&seconds),
                ConstCounter::new(cpu),
            )?;
            encode(
                &mut encoder,
                "process_resident_memory",
                "Resident memory size",
                Some(&bytes),
                ConstGauge::new((stat.rss * procfs::page_size()) as f64),
            )?;
            encode(
                &mut encoder,
                "process_virtual_memory",
                "Virtual memory size",
                Some(&bytes),
                ConstGauge::new(stat.vsize as f64),
            )?;
            encode(
                &mut encoder,
                "process_threads",
                "OS threads in the process",
                None,
                ConstGauge::new(stat.num_threads),
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                let started = boot as f64 + stat.starttime as f64 / ticks;
                encode(
                    &mut encoder,
                    "process_start_time",
                    "Start time of the process since the Unix epoch",
                    Some(&seconds),
                    ConstGauge::new(started),
                )?;
            }
        }
        if let Ok(open) = process.fd_count() {
            encode(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors",
                None,
                ConstGauge::new(open as i64),
            )?;
        }
        if let Ok(limits) = process.limits() {
            if let LimitValue::Value(max) = limits.max_open_files.soft_limit {
                encode(
                    &mut encoder,
                    "process_max_fds",
                    "Maximum number of open file descriptors",
                    None,
                    ConstGauge::new(max as i64),
                )?;
            }
        }
        Ok(())
    }
}
