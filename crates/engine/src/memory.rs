//! Memory accounting shared by the app and the CLI: one serde [`MemorySample`] holds the
//! exact KV bytes (per layer, per attention kind, per precision; used and allocated), the
//! weights' bytes, the process resident set, and optionally a precision-switch marker with
//! its before/after bytes.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::AttentionKind;
use crate::error::Result;
use crate::kv::{KvCache, KvMemoryReport, PrecisionPolicy};

/// Bytes holding live tokens and bytes reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteCount {
    /// Bytes that hold live tokens.
    pub used: u64,
    /// Bytes reserved, live or not.
    pub allocated: u64,
}

impl ByteCount {
    fn add(&mut self, used: usize, allocated: usize) {
        self.used += used as u64;
        self.allocated += allocated as u64;
    }
}

/// KV bytes per attention kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindBytes {
    /// Sliding-window layers.
    pub sliding: ByteCount,
    /// Full-attention layers.
    pub full: ByteCount,
}

/// One cache-owning layer's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerBytes {
    /// Layer index.
    pub layer: usize,
    /// Sliding or full.
    pub kind: AttentionKind,
    /// Precision in SPEC form (`f16`, `tq4`, `k4v3`).
    pub precision: String,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes.
    pub bytes: ByteCount,
}

/// The whole cache's bytes, broken down three ways (each adds up to the totals).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBytes {
    /// Per attention kind.
    pub by_kind: KindBytes,
    /// Per precision, keyed by its SPEC form (`f16`, `tq4`, …).
    pub by_precision: BTreeMap<String, ByteCount>,
    /// Every cache-owning layer (KV-sharing consumers own nothing and are left out).
    pub layers: Vec<LayerBytes>,
    /// Bytes holding live tokens, all layers.
    pub total_used: u64,
    /// Bytes reserved, all layers.
    pub total_allocated: u64,
}

impl KvBytes {
    /// The breakdown of a cache's memory report.
    pub fn from_report(r: &KvMemoryReport) -> Self {
        let mut out = KvBytes::default();
        for l in &r.layers {
            let Some(p) = l.precision else { continue };
            let name = p.to_string();
            match l.kind {
                AttentionKind::Sliding => out.by_kind.sliding.add(l.bytes_used, l.bytes_allocated),
                AttentionKind::Full => out.by_kind.full.add(l.bytes_used, l.bytes_allocated),
            }
            out.by_precision
                .entry(name.clone())
                .or_default()
                .add(l.bytes_used, l.bytes_allocated);
            out.total_used += l.bytes_used as u64;
            out.total_allocated += l.bytes_allocated as u64;
            out.layers.push(LayerBytes {
                layer: l.layer,
                kind: l.kind,
                precision: name,
                tokens: l.tokens,
                bytes: ByteCount {
                    used: l.bytes_used as u64,
                    allocated: l.bytes_allocated as u64,
                },
            });
        }
        out
    }

    /// The breakdown of `cache` now.
    pub fn of(cache: &KvCache) -> Self {
        Self::from_report(&cache.memory())
    }
}

/// A precision switch, as a marker on the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchEvent {
    /// Owning layers' precisions before, in SPEC form per layer kind (`sliding=f16 full=f16`).
    pub from: String,
    /// After.
    pub to: String,
    /// Tokens converted (the context length at the switch).
    pub tokens: usize,
    /// KV bytes before the switch.
    pub kv_before: ByteCount,
    /// KV bytes after the switch.
    pub kv_after: ByteCount,
    /// Process resident bytes before (0 when unknown).
    pub rss_before: u64,
    /// Process resident bytes after (0 when unknown).
    pub rss_after: u64,
    /// Wall time of the conversion.
    pub duration_ms: f64,
}

/// One point of the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Milliseconds since the timeline started.
    pub t_ms: u64,
    /// Tokens processed so far (the next token's position).
    pub tokens_in_context: usize,
    /// Exact KV bytes.
    pub kv: KvBytes,
    /// Bytes of the model's weights as held.
    pub weights_bytes: u64,
    /// Process resident set (0 when the platform does not report it).
    pub rss_bytes: u64,
    /// Set on the sample taken right after a precision switch.
    pub event: Option<SwitchEvent>,
}

impl MemorySample {
    /// Samples `cache` and the process now.
    pub fn capture(t_ms: u64, cache: &KvCache, weights_bytes: usize, probe: &mut RssProbe) -> Self {
        Self {
            t_ms,
            tokens_in_context: cache.seq_len(),
            kv: KvBytes::of(cache),
            weights_bytes: weights_bytes as u64,
            rss_bytes: probe.rss_bytes(),
            event: None,
        }
    }
}

/// Reads this process's resident memory through `sysinfo` (reuses its buffers).
pub struct RssProbe {
    sys: sysinfo::System,
    pid: Option<sysinfo::Pid>,
}

impl std::fmt::Debug for RssProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RssProbe").field("pid", &self.pid).finish()
    }
}

impl Default for RssProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl RssProbe {
    /// A probe for the current process.
    pub fn new() -> Self {
        Self {
            sys: sysinfo::System::new(),
            pid: sysinfo::get_current_pid().ok(),
        }
    }

    /// Current resident set size in bytes (0 if unavailable).
    pub fn rss_bytes(&mut self) -> u64 {
        let Some(pid) = self.pid else { return 0 };
        self.sys.refresh_processes_specifics(
            sysinfo::ProcessesToUpdate::Some(&[pid]),
            false,
            sysinfo::ProcessRefreshKind::nothing().with_memory(),
        );
        self.sys.process(pid).map_or(0, |p| p.memory())
    }
}

/// Peak resident set of this process so far (`VmHWM` on Linux); `None` elsewhere, where
/// callers fall back to the largest [`RssProbe`] sample they took.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Restarts the peak counter behind [`peak_rss_bytes`] at the current resident size (Linux:
/// writes `5` to `/proc/self/clear_refs`), so a benchmark can measure the peak of one phase
/// (e.g. after the model load's transients). Returns false where unsupported.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn malloc_trim(pad: usize) -> i32;
}

/// Hands freed heap memory back to the operating system where the allocator keeps it
/// (glibc: `malloc_trim`), so resident memory drops after a cache shrinks (e.g. a switch
/// from f16 to TurboQuant) instead of staying at its high-water mark. No-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; it takes no pointers from us.
    unsafe {
        malloc_trim(0);
    }
}

/// Summary of the owning layers' precisions (`sliding=f16 full=tq4`).
fn precision_summary(r: &KvMemoryReport) -> String {
    let mut kinds: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for l in &r.layers {
        if let Some(p) = l.precision {
            let k = match l.kind {
                AttentionKind::Sliding => "sliding",
                AttentionKind::Full => "full",
            };
            let v = kinds.entry(k).or_default();
            let s = p.to_string();
            if !v.contains(&s) {
                v.push(s);
            }
        }
    }
    kinds
        .into_iter()
        .map(|(k, v)| format!("{k}={}", v.join(",")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Converts `cache` to `policy` ([`KvCache::convert`]: layer by layer, a failed layer keeps
/// its old storage) and returns the switch marker with bytes before and after.
pub fn switch_precision(
    cache: &mut KvCache,
    policy: &PrecisionPolicy,
    probe: &mut RssProbe,
) -> Result<SwitchEvent> {
    let before = cache.memory();
    let rss_before = probe.rss_bytes();
    let t0 = Instant::now();
    cache.convert(policy)?;
    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
    release_free_memory();
    let after = cache.memory();
    Ok(SwitchEvent {
        from: precision_summary(&before),
        to: precision_summary(&after),
        tokens: cache.seq_len(),
        kv_before: ByteCount {
            used: before.total.0 as u64,
            allocated: before.total.1 as u64,
        },
        kv_after: ByteCount {
            used: after.total.0 as u64,
            allocated: after.total.1 as u64,
        },
        rss_before,
        rss_after: probe.rss_bytes(),
        duration_ms,
    })
}
