//! Opt-in wall time per kind of operation, for `kvlab bench decode --profile`: the decoder
//! wraps each operation in a [`span`]; while profiling is off a span costs one relaxed atomic
//! load. Times are exclusive (a span's nested spans are subtracted from it), so the rows add
//! up to the profiled wall time and nothing is counted twice.
//!
//! On a GPU a kernel launch returns before the kernel ends, so while profiling each span
//! synchronizes the device it was given ([`enable`]) before it stops the clock: the figures
//! are then true per-op times, and the run as a whole is slower than an unprofiled one.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::quantized::GgmlDType;
use candle_core::Device;

static ENABLED: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<State> = Mutex::new(State {
    rows: BTreeMap::new(),
    sync: None,
});

struct State {
    rows: BTreeMap<&'static str, Row>,
    /// The device synchronized at the end of each span (GPUs only).
    sync: Option<Device>,
}

thread_local! {
    /// Time spent in nested spans, one accumulator per open span on this thread.
    static NESTED: RefCell<Vec<Duration>> = const { RefCell::new(Vec::new()) };
}

/// One kind of operation's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    /// Exclusive wall time.
    pub time: Duration,
    /// Spans closed.
    pub calls: u64,
}

/// Starts recording from empty totals. `device` is synchronized at the end of every span when
/// it is not the CPU.
pub fn enable(device: &Device) {
    if let Ok(mut s) = STATE.lock() {
        s.rows.clear();
        s.sync = (!device.is_cpu()).then(|| device.clone());
    }
    ENABLED.store(true, Ordering::Relaxed);
}

/// Stops recording and returns the totals, largest first.
pub fn finish() -> Vec<(&'static str, Row)> {
    ENABLED.store(false, Ordering::Relaxed);
    let mut rows: Vec<_> = match STATE.lock() {
        Ok(mut s) => {
            s.sync = None;
            std::mem::take(&mut s.rows).into_iter().collect()
        }
        Err(_) => Vec::new(),
    };
    rows.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(a.0.cmp(b.0)));
    rows
}

/// Whether spans are being recorded.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A running span; its time is recorded under its label when dropped.
#[must_use = "a span records when it is dropped"]
pub struct Span {
    label: &'static str,
    start: Instant,
}

/// Opens a span labelled `label`, or nothing while profiling is off.
pub fn span(label: &'static str) -> Option<Span> {
    if !enabled() {
        return None;
    }
    NESTED.with(|n| n.borrow_mut().push(Duration::ZERO));
    Some(Span {
        label,
        start: Instant::now(),
    })
}

impl Drop for Span {
    fn drop(&mut self) {
        let sync = STATE.lock().ok().and_then(|s| s.sync.clone());
        if let Some(device) = sync {
            // A failed synchronize only makes this figure a launch time; the run goes on.
            let _ = device.synchronize();
        }
        let total = self.start.elapsed();
        let nested = NESTED.with(|n| {
            let mut n = n.borrow_mut();
            let mine = n.pop().unwrap_or_default();
            if let Some(parent) = n.last_mut() {
                *parent += total;
            }
            mine
        });
        if let Ok(mut s) = STATE.lock() {
            let row = s.rows.entry(self.label).or_default();
            row.time += total.saturating_sub(nested);
            row.calls += 1;
        }
    }
}

/// The profile label of a matrix multiply by a weight of ggml type `q`.
pub fn quant_label(q: GgmlDType) -> &'static str {
    {
        match q {
            GgmlDType::F32 => "matmul f32 (ggml)",
            GgmlDType::F16 => "matmul f16 (ggml)",
            GgmlDType::BF16 => "matmul bf16 (ggml)",
            GgmlDType::Q4_0 => "matmul q4_0",
            GgmlDType::Q4_1 => "matmul q4_1",
            GgmlDType::Q5_0 => "matmul q5_0",
            GgmlDType::Q5_1 => "matmul q5_1",
            GgmlDType::Q8_0 => "matmul q8_0",
            GgmlDType::Q8_1 => "matmul q8_1",
            GgmlDType::Q2K => "matmul q2_k",
            GgmlDType::Q3K => "matmul q3_k",
            GgmlDType::Q4K => "matmul q4_k",
            GgmlDType::Q5K => "matmul q5_k",
            GgmlDType::Q6K => "matmul q6_k",
            GgmlDType::Q8K => "matmul q8_k",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    /// Exclusive times: the outer span's own time excludes the inner one, the two add up to
    /// the wall time, and nothing is recorded while profiling is off. (One test, because the
    /// recorder is process-wide.)
    #[test]
    fn spans_record_exclusive_time_only_while_enabled() {
        {
            let _off = span("off");
        }
        enable(&Device::Cpu);
        let wall = Instant::now();
        {
            let _outer = span("outer");
            busy(Duration::from_millis(20));
            for _ in 0..2 {
                let _inner = span("inner");
                busy(Duration::from_millis(15));
            }
        }
        let wall = wall.elapsed();
        let rows = finish();
        {
            let _after = span("after");
        }
        let get = |l: &str| rows.iter().find(|(k, _)| *k == l).map(|(_, r)| *r);
        assert!(get("off").is_none() && get("after").is_none(), "{rows:?}");
        let (outer, inner) = (get("outer").unwrap(), get("inner").unwrap());
        assert_eq!((outer.calls, inner.calls), (1, 2));
        assert!(inner.time >= Duration::from_millis(30), "{rows:?}");
        assert!(outer.time >= Duration::from_millis(20), "{rows:?}");
        // Exclusive: the outer row lacks the inner 30 ms, so the sum is the wall time.
        assert!(outer.time < Duration::from_millis(50), "{rows:?}");
        let sum = outer.time + inner.time;
        assert!(
            sum <= wall && wall - sum < Duration::from_millis(20),
            "{sum:?} vs {wall:?}"
        );
        // Largest first.
        assert_eq!(rows[0].0, "inner");
    }
}
