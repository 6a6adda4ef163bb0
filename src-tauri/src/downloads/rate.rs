//! Transfer speed and time left, from (elapsed time, bytes done) samples over a sliding
//! window, so one slow or fast chunk does not swing the figures. Pure: the caller supplies
//! the clock, which keeps it testable without timing.

use std::collections::VecDeque;
use std::time::Duration;

/// Speed needs at least this much time between samples to mean anything.
const MIN_SPAN: Duration = Duration::from_millis(200);

/// A sliding-window rate meter.
#[derive(Debug, Clone)]
pub struct Rate {
    window: Duration,
    samples: VecDeque<(Duration, u64)>,
}

impl Rate {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Records that `done` bytes were on disk `at` after the start.
    pub fn push(&mut self, at: Duration, done: u64) {
        if self.samples.back().is_some_and(|&(_, d)| done < d) {
            // Bytes went back (a file restarted): old samples no longer describe this run.
            self.samples.clear();
        }
        self.samples.push_back((at, done));
        // Keep one sample at or beyond the window's start so the span covers the window.
        while self.samples.len() > 2 && at.saturating_sub(self.samples[1].0) >= self.window {
            self.samples.pop_front();
        }
    }

    /// Bytes per second over the window, once it spans enough time.
    pub fn bytes_per_sec(&self) -> Option<f64> {
        let (&(t0, d0), &(t1, d1)) = (self.samples.front()?, self.samples.back()?);
        let span = t1.checked_sub(t0)?;
        (span >= MIN_SPAN).then(|| (d1 - d0) as f64 / span.as_secs_f64())
    }

    /// Seconds until `total` at the current speed; `None` while the speed is unknown or zero.
    pub fn eta_secs(&self, total: u64) -> Option<f64> {
        let speed = self.bytes_per_sec().filter(|s| *s > 0.0)?;
        let done = self.samples.back()?.1;
        Some(total.saturating_sub(done) as f64 / speed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn speed_and_eta_come_from_the_window() {
        let mut r = Rate::new(ms(2000));
        r.push(ms(0), 0);
        assert_eq!(r.bytes_per_sec(), None, "one sample has no speed");
        r.push(ms(100), 50);
        assert_eq!(r.bytes_per_sec(), None, "100 ms is too short to tell");
        r.push(ms(1000), 1000);
        assert_eq!(r.bytes_per_sec(), Some(1000.0));
        assert_eq!(r.eta_secs(5000), Some(4.0));
        // Later, faster: the first second drops out of a 2 s window.
        r.push(ms(3000), 9000);
        r.push(ms(4000), 13000);
        assert_eq!(r.bytes_per_sec(), Some(4000.0));
        assert_eq!(r.eta_secs(21000), Some(2.0));
    }

    #[test]
    fn stalls_and_restarts_are_honest() {
        let mut r = Rate::new(ms(1000));
        r.push(ms(0), 100);
        r.push(ms(500), 100);
        assert_eq!(r.bytes_per_sec(), Some(0.0));
        assert_eq!(r.eta_secs(1000), None, "no ETA at zero speed");
        r.push(ms(600), 10);
        assert_eq!(r.bytes_per_sec(), None, "a restart forgets the old samples");
        r.push(ms(1100), 510);
        assert_eq!(r.bytes_per_sec(), Some(1000.0));
    }
}
