//! What the operator console draws: a handler's counters sampled every
//! [`STEP`] over the last 15 minutes, and its batch and guest durations over
//! the last minute. Kept in memory on each host, a few hundred KiB per
//! handler; a Prometheus scraper of `/metrics` keeps the long history.

use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::time::Duration;

/// How often a host samples its handlers' counters (the registry's sampler).
pub const STEP: Duration = Duration::from_secs(2);

/// 15 minutes of steps, plus the sample the first difference starts from.
const KEEP: usize = 15 * 60 / STEP.as_secs() as usize + 1;

/// The console's "last minute": rates and latency percentiles span this much.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Latency histograms kept: one per step of the last minute.
const LATENCY_STEPS: usize = (WINDOW.as_secs() / STEP.as_secs()) as usize;

/// One minute in microseconds: a longer guest call or batch is clamped (the
/// guest's own deadline is shorter).
const MAX_MICROS: u64 = 60_000_000;

/// A handler's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub consumed: u64,
    pub applied: u64,
    pub duplicates: u64,
    /// Failed guest calls of every kind, including ones retried successfully.
    pub failures: u64,
    pub dead_lettered: u64,
    /// Failed host statements, transient and permanent (see `pipeline::host_errors`).
    pub host_errors: u64,
}

/// Events per second between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Rates {
    pub consumed: f64,
    pub applied: f64,
    pub duplicates: f64,
    pub failures: f64,
    pub dead_lettered: f64,
}

impl Rates {
    fn between(from: &(i64, Counts), to: &(i64, Counts)) -> Self {
        let secs = (to.0 - from.0) as f64 / 1000.0;
        if secs <= 0.0 {
            return Self::default();
        }
        let per_second = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let (a, b) = (&from.1, &to.1);
        Self {
            consumed: per_second(a.consumed, b.consumed),
            applied: per_second(a.applied, b.applied),
            duplicates: per_second(a.duplicates, b.duplicates),
            failures: per_second(a.failures, b.failures),
            dead_lettered: per_second(a.dead_lettered, b.dead_lettered),
        }
    }
}

/// Counters sampled every [`STEP`], oldest first.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<(i64, Counts)>,
}

/// Per-step rates for a chart: `at_ms[i]` ends the step whose rates are at `i`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Series {
    pub step_ms: u64,
    pub at_ms: Vec<i64>,
    pub applied: Vec<f64>,
    pub duplicates: Vec<f64>,
    pub failures: Vec<f64>,
}

impl History {
    pub fn push(&mut self, at_ms: i64, counts: Counts) {
        if self.samples.len() == KEEP {
            self.samples.pop_front();
        }
        self.samples.push_back((at_ms, counts));
    }

    /// Rates from the sample a [`WINDOW`] before `now` (or the oldest one, for
    /// a handler that started since) up to `now`'s counts.
    pub fn rates(&self, now_ms: i64, now: Counts) -> Rates {
        let since = now_ms - WINDOW.as_millis() as i64;
        let from = self
            .samples
            .iter()
            .rev()
            .find(|(at, _)| *at <= since)
            .or_else(|| self.samples.front());
        from.map(|from| Rates::between(from, &(now_ms, now)))
            .unwrap_or_default()
    }

    pub fn series(&self) -> Series {
        let mut series = Series {
            step_ms: STEP.as_millis() as u64,
            ..Series::default()
        };
        for (from, to) in self.samples.iter().zip(self.samples.iter().skip(1)) {
            let rates = Rates::between(from, to);
            series.at_ms.push(to.0);
            series.applied.push(round(rates.applied));
            series.duplicates.push(round(rates.duplicates));
            series.failures.push(round(rates.failures));
        }
        series
    }
}

/// One decimal is all a chart can show; it keeps the JSON small.
fn round(rate: f64) -> f64 {
    (rate * 10.0).round() / 10.0
}

/// Durations of one kind over the last minute: one histogram per step.
#[derive(Debug)]
pub struct Latencies {
    current: Histogram<u32>,
    past: VecDeque<Histogram<u32>>,
}

/// The median and 99th percentile, in milliseconds; `None` without a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

fn histogram() -> Histogram<u32> {
    // One significant digit (values within 10%) keeps a histogram at ~1.5 KiB,
    // so a minute of them per handler stays small.
    Histogram::new_with_bounds(1, MAX_MICROS, 1).expect("valid histogram bounds")
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            current: histogram(),
            past: VecDeque::with_capacity(LATENCY_STEPS),
        }
    }
}

impl Latencies {
    pub fn record(&mut self, took: Duration) {
        let micros = (took.as_micros() as u64).clamp(1, MAX_MICROS);
        self.current.saturating_record(micros);
    }

    /// Closes the current step. The oldest step's histogram is reused, so a
    /// running host allocates nothing here.
    pub fn step(&mut self) {
        let mut next = if self.past.len() + 1 >= LATENCY_STEPS {
            self.past.pop_front().unwrap_or_else(histogram)
        } else {
            histogram()
        };
        next.reset();
        let closed = std::mem::replace(&mut self.current, next);
        self.past.push_back(closed);
    }

    pub fn percentiles(&self) -> Percentiles {
        let mut all = histogram();
        for step in self.past.iter().chain(std::iter::once(&self.current)) {
            // Same bounds and precision: adding cannot fail.
            let _ = all.add(step);
        }
        if all.is_empty() {
            return Percentiles::default();
        }
        let ms = |q: f64| Some(all.value_at_quantile(q) as f64 / 1000.0);
        Percentiles {
            count: all.len(),
            p50_ms: ms(0.50),
            p99_ms: ms(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(applied: u64, duplicates: u64) -> Counts {
        Counts {
            consumed: applied + duplicates,
            applied,
            duplicates,
            ..Counts::default()
        }
    }

    #[test]
    fn rates_span_the_last_minute_and_the_series_each_step() {
        let mut history = History::default();
        // 100 applied/s for 90 s, then 10 duplicates/s.
        for step in 0..=45 {
            history.push(step * 2000, counts(step as u64 * 200, 0));
        }
        let rates = history.rates(100_000, counts(9000, 100));
        // From the sample at 40 s (applied 4000): 5000 applied and 100 duplicates in 60 s.
        assert!((rates.applied - 5000.0 / 60.0).abs() < 1e-9, "{rates:?}");
        assert!((rates.duplicates - 100.0 / 60.0).abs() < 1e-9, "{rates:?}");
        let series = history.series();
        assert_eq!(series.at_ms.len(), 45);
        assert_eq!(series.at_ms[0], 2000);
        assert!(series.applied.iter().all(|r| *r == 100.0), "{series:?}");
    }

    #[test]
    fn the_history_keeps_fifteen_minutes() {
        let mut history = History::default();
        for step in 0..1000 {
            history.push(step * 2000, counts(step as u64, 0));
        }
        assert_eq!(history.series().at_ms.len(), 450);
        assert_eq!(history.series().at_ms[0], (1000 - 450) * 2000);
    }

    #[test]
    fn latency_percentiles_cover_one_minute_of_steps() {
        let mut latencies = Latencies::default();
        assert_eq!(latencies.percentiles().p50_ms, None);
        for _ in 0..99 {
            latencies.record(Duration::from_millis(2));
        }
        latencies.record(Duration::from_millis(800));
        latencies.step();
        let p = latencies.percentiles();
        assert_eq!(p.count, 100);
        let p50 = p.p50_ms.unwrap();
        assert!((1.8..=2.2).contains(&p50), "{p:?}");
        assert!(p.p99_ms.unwrap() <= 2.2, "{p:?}");
        // A minute later those samples are gone.
        for _ in 0..LATENCY_STEPS {
            latencies.step();
        }
        assert_eq!(latencies.percentiles().count, 0);
    }
}
