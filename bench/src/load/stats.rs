//! Latency recording and percentiles: every request's latency is kept (a 10 s run holds at most a few
//! hundred thousand), and percentiles are exact nearest-rank values of the sorted samples.

use std::time::Duration;

/// Latencies of one kind of request.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    nanos: Vec<u64>,
}

impl Latencies {
    /// An empty recorder.
    pub fn new() -> Latencies {
        Latencies::default()
    }

    /// Records one request.
    pub fn record(&mut self, d: Duration) {
        self.nanos.push(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// Adds another recorder's samples.
    pub fn merge(&mut self, other: Latencies) {
        self.nanos.extend(other.nanos);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.nanos.is_empty()
    }

    /// Sorted summary.
    pub fn summary(mut self) -> Summary {
        self.nanos.sort_unstable();
        Summary { sorted: self.nanos }
    }
}

/// Sorted latencies.
#[derive(Debug, Clone)]
pub struct Summary {
    sorted: Vec<u64>,
}

impl Summary {
    /// The nearest-rank `q`-quantile (`q` in `[0, 1]`): the smallest sample with at least `q * n` samples at
    /// or below it. `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.sorted.len();
        if n == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        Some(Duration::from_nanos(self.sorted[rank.clamp(1, n) - 1]))
    }

    /// The quantile in milliseconds, 0 without samples.
    pub fn ms(&self, q: f64) -> f64 {
        self.quantile(q).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    }

    /// Mean in milliseconds, 0 without samples.
    pub fn mean_ms(&self) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        self.sorted.iter().map(|&n| n as f64).sum::<f64>() / self.sorted.len() as f64 / 1e6
    }

    /// Number of samples.
    pub fn count(&self) -> usize {
        self.sorted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ms: impl IntoIterator<Item = u64>) -> Summary {
        let mut l = Latencies::new();
        for m in ms {
            l.record(Duration::from_millis(m));
        }
        l.summary()
    }

    #[test]
    fn nearest_rank_percentiles_of_1_to_1000() {
        // Recorded in reverse so that sorting matters.
        let s = of((1..=1000).rev());
        assert_eq!(s.count(), 1000);
        assert_eq!(s.ms(0.5), 500.0);
        assert_eq!(s.ms(0.99), 990.0);
        assert_eq!(s.ms(0.999), 999.0);
        assert_eq!(s.ms(1.0), 1000.0);
        assert_eq!(s.ms(0.0), 1.0);
        assert_eq!(s.mean_ms(), 500.5);
    }

    #[test]
    fn small_and_empty_samples() {
        let one = of([7]);
        assert_eq!(one.ms(0.5), 7.0);
        assert_eq!(one.ms(0.999), 7.0);
        let two = of([1, 9]);
        assert_eq!(two.ms(0.5), 1.0);
        assert_eq!(two.ms(0.51), 9.0);
        let none = Latencies::new().summary();
        assert_eq!(none.quantile(0.5), None);
        assert_eq!(none.ms(0.99), 0.0);
        assert_eq!(none.mean_ms(), 0.0);
    }

    #[test]
    fn merge_keeps_all_samples() {
        let mut a = Latencies::new();
        a.record(Duration::from_millis(1));
        let mut b = Latencies::new();
        b.record(Duration::from_millis(3));
        b.record(Duration::from_millis(2));
        a.merge(b);
        assert_eq!(a.len(), 3);
        assert_eq!(a.summary().ms(0.5), 2.0);
    }
}
