//! Low-rate process memory sampling, emitted to the UI as the `memory-sample` event.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tauri::{AppHandle, Emitter, Runtime};

use crate::events::EngineMemory;

pub const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
pub const MEMORY_EVENT: &str = "memory-sample";

/// One reading of the app process's memory.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessMemorySample {
    /// Milliseconds since the Unix epoch.
    pub t_ms: u64,
    pub rss_bytes: u64,
    pub virtual_bytes: u64,
    /// The engine's weights, KV cache by kind and precision, and context length.
    pub engine: EngineMemory,
}

/// Reads this process's resident and virtual memory, or None where the OS does not say.
pub fn sample_process(sys: &mut sysinfo::System) -> Option<ProcessMemorySample> {
    let pid = sysinfo::get_current_pid().ok()?;
    sys.refresh_processes(sysinfo::ProcessesToUpdate::Some(&[pid]), true);
    let proc_ = sys.process(pid)?;
    let t_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Some(ProcessMemorySample {
        t_ms,
        rss_bytes: proc_.memory(),
        virtual_bytes: proc_.virtual_memory(),
        engine: EngineMemory::default(),
    })
}

/// Spawns a thread that emits a sample every `period` until the app exits; `engine` reads
/// the engine's snapshot (it must not wait for a generation).
pub fn spawn_memory_sampler<R: Runtime>(
    app: AppHandle<R>,
    engine: impl Fn() -> EngineMemory + Send + 'static,
    period: Duration,
) {
    std::thread::Builder::new()
        .name("memory-sampler".into())
        .spawn(move || {
            let mut sys = sysinfo::System::new();
            loop {
                if let Some(mut sample) = sample_process(&mut sys) {
                    sample.engine = engine();
                    if app.emit(MEMORY_EVENT, &sample).is_err() {
                        break;
                    }
                }
                std::thread::sleep(period);
            }
        })
        .map(|_| ())
        .unwrap_or_else(|e| tracing::warn!("memory sampler not started: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_sees_this_process_growing() {
        let mut sys = sysinfo::System::new();
        let before = sample_process(&mut sys).expect("sample");
        assert!(before.rss_bytes > 0);
        // Touch 64 MiB so the resident set must grow.
        let block = vec![1u8; 64 * 1024 * 1024];
        let after = sample_process(&mut sys).expect("sample");
        assert!(std::hint::black_box(&block).iter().all(|&b| b == 1));
        assert!(after.rss_bytes >= before.rss_bytes + 32 * 1024 * 1024);
    }
}
