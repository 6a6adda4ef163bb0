//! Low-rate memory sampling for the timeline: every period, the engine's own
//! [`MemorySample`] (exact KV bytes by layer kind and precision, and per conversation and
//! tier, weights, the process's resident set) is emitted to the UI as the `memory-sample`
//! event, and the pool's new markers (demotions, spills, restores, drops) as
//! `memory-marker` events.

use std::time::Duration;

use kvlab_engine::contract::{MemorySample, SwitchEvent};
use kvlab_engine::host::{unix_ms, RssProbe};
use tauri::{AppHandle, Emitter, Runtime};

pub const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
pub const MEMORY_EVENT: &str = "memory-sample";
pub const MARKER_EVENT: &str = "memory-marker";

/// Spawns a thread that emits a sample every `period` until the app exits; `sample` reads the
/// engine's snapshot (it must not wait for a generation), `markers` the pool's markers after
/// a number.
pub fn spawn_memory_sampler<R: Runtime>(
    app: AppHandle<R>,
    sample: impl Fn(u64, &mut RssProbe) -> MemorySample + Send + 'static,
    markers: impl Fn(u64) -> (Vec<SwitchEvent>, u64) + Send + 'static,
    period: Duration,
) {
    std::thread::Builder::new()
        .name("memory-sampler".into())
        .spawn(move || {
            let mut probe = RssProbe::new();
            let mut seen = 0;
            loop {
                let (new, last) = markers(seen);
                seen = last;
                for m in new {
                    let _ = app.emit(MARKER_EVENT, m);
                }
                if app
                    .emit(MEMORY_EVENT, sample(unix_ms(), &mut probe))
                    .is_err()
                {
                    break;
                }
                std::thread::sleep(period);
            }
        })
        .map(|_| ())
        .unwrap_or_else(|e| tracing::warn!("memory sampler not started: {e}"));
}
