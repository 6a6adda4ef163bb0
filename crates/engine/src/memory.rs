//! Memory accounting shared by the app and the CLI: one serde [`MemorySample`] holds the
//! exact KV bytes (per layer, per attention kind, per precision; used and allocated), the
//! weights' bytes, the process resident set, and optionally a precision-switch marker with
//! its before/after bytes.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::config::{AttentionKind, ModelConfig};
use crate::error::Result;
use crate::kv::{presets, ConvertPlan, KvCache, KvMemoryReport, KvPrecision, PrecisionPolicy};

/// Bytes holding live tokens and bytes reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KindBytes {
    /// Sliding-window layers.
    pub sliding: ByteCount,
    /// Full-attention layers.
    pub full: ByteCount,
}

/// One cache-owning layer's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
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

/// The bytes of the layers of one attention kind stored in one precision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KvPart {
    /// Sliding or full.
    pub kind: AttentionKind,
    /// Precision in SPEC form.
    pub precision: String,
    /// Their bytes.
    pub bytes: ByteCount,
}

/// The whole cache's bytes, broken down four ways (each adds up to the totals).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KvBytes {
    /// Per attention kind.
    pub by_kind: KindBytes,
    /// Per precision, keyed by its SPEC form (`f16`, `tq4`, …).
    pub by_precision: BTreeMap<String, ByteCount>,
    /// Per attention kind and precision together, in layer order of first appearance (the
    /// memory timeline's stacked series).
    pub parts: Vec<KvPart>,
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
            match out
                .parts
                .iter_mut()
                .find(|p| p.kind == l.kind && p.precision == name)
            {
                Some(p) => p.bytes.add(l.bytes_used, l.bytes_allocated),
                None => out.parts.push(KvPart {
                    kind: l.kind,
                    precision: name.clone(),
                    bytes: ByteCount {
                        used: l.bytes_used as u64,
                        allocated: l.bytes_allocated as u64,
                    },
                }),
            }
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

/// Bytes one token's key and value take in one layer (see [`KvPrecision::token_bytes`]).
pub fn token_bytes(precision: KvPrecision, n_kv_heads: usize, head_dim: usize) -> Result<usize> {
    precision.token_bytes(n_kv_heads, head_dim)
}

/// KV bytes one token costs under `policy` over `config`'s cache-owning layers, per
/// attention kind (sliding layers stop growing once their window is full).
pub fn policy_token_bytes(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
) -> Result<KindTokenBytes> {
    let mut out = KindTokenBytes::default();
    for l in config.cache_owning_layers() {
        let b = token_bytes(policy.for_layer(l.index, l.kind), l.n_kv_heads, l.head_dim)? as u64;
        match l.kind {
            AttentionKind::Sliding => out.sliding += b,
            AttentionKind::Full => out.full += b,
        }
    }
    Ok(out)
}

/// Per-token KV bytes split by attention kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KindTokenBytes {
    /// Over sliding-window layers.
    pub sliding: u64,
    /// Over full-attention layers.
    pub full: u64,
}

/// The KV bytes a context of `tokens` holds under `policy`, before anything is loaded:
/// full layers keep every token; sliding layers the last `window − 1` plus `rewind_margin`
/// (what [`KvCache`] keeps between steps once [`KvCache::set_rewind_margin`] is set); a
/// TurboQuant layer adds its per-head offsets once it holds a token. Equal to a filled
/// cache's bytes (tested).
pub fn estimate_kv_bytes(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
    tokens: usize,
    rewind_margin: usize,
) -> Result<u64> {
    let mut total = 0u64;
    for l in config.cache_owning_layers() {
        let held = match l.sliding_window {
            Some(w) => tokens.min(w.saturating_sub(1).saturating_add(rewind_margin)),
            None => tokens,
        };
        let precision = policy.for_layer(l.index, l.kind);
        total = total.saturating_add(precision.held_bytes(l.n_kv_heads, l.head_dim, held)?);
    }
    Ok(total)
}

/// What one token costs under one preset (applied to all layers), per attention kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct TokenCost {
    /// The preset's label (`TQ 3.5`).
    pub label: String,
    /// Its canonical SPEC on all layers.
    pub spec: String,
    /// Bytes per token over the full-attention layers (these grow with every token).
    pub full_bytes_per_token: u64,
    /// Bytes per token over the sliding layers (these stop growing at their window).
    pub sliding_bytes_per_token: u64,
}

/// The per-token cost of every preset over `config`'s layers.
pub fn token_costs(config: &ModelConfig) -> Vec<TokenCost> {
    presets()
        .into_iter()
        .filter_map(|p| {
            let policy = crate::kv::CacheSpec::parse(&p.specs.all).ok()?.to_policy();
            let b = policy_token_bytes(config, &policy).ok()?;
            Some(TokenCost {
                label: p.label,
                spec: p.specs.all,
                full_bytes_per_token: b.full,
                sliding_bytes_per_token: b.sliding,
            })
        })
        .collect()
}

/// KV bytes under one preset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct ContextCost {
    /// The preset's label.
    pub label: String,
    /// Its canonical SPEC on all layers.
    pub spec: String,
    /// The bytes.
    pub bytes: u64,
}

/// The KV bytes of a context of `tokens` under every preset (all layers).
pub fn context_costs(
    config: &ModelConfig,
    tokens: usize,
    rewind_margin: usize,
) -> Vec<ContextCost> {
    costs_between(config, 0, tokens, rewind_margin)
}

/// Per preset: the bytes a context of `to` tokens holds minus those of `from` tokens.
fn costs_between(config: &ModelConfig, from: usize, to: usize, margin: usize) -> Vec<ContextCost> {
    presets()
        .into_iter()
        .filter_map(|p| {
            let policy = crate::kv::CacheSpec::parse(&p.specs.all).ok()?.to_policy();
            let at = |t| estimate_kv_bytes(config, &policy, t, margin).ok();
            Some(ContextCost {
                label: p.label,
                spec: p.specs.all,
                bytes: at(to)?.saturating_sub(at(from)?),
            })
        })
        .collect()
}

/// What attaching a document costs before it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct DocumentFit {
    /// The document's tokens.
    pub tokens: usize,
    /// Extra KV bytes it adds to the context, under each preset.
    pub costs: Vec<ContextCost>,
    /// Context tokens after the documents up to this one and room for the answer.
    pub context_after: usize,
    /// Whether that still fits the model's context.
    pub fits: bool,
}

/// The cost of each of `documents` (token counts, in attachment order) added to a context of
/// `context_tokens`, each on top of the ones before it, leaving `reserve` tokens for the
/// answer.
pub fn document_fits(
    config: &ModelConfig,
    context_tokens: usize,
    documents: &[usize],
    reserve: usize,
    rewind_margin: usize,
) -> Vec<DocumentFit> {
    let mut at = context_tokens;
    documents
        .iter()
        .map(|&tokens| {
            let after = at + tokens;
            let fit = DocumentFit {
                tokens,
                costs: costs_between(config, at, after, rewind_margin),
                context_after: after + reserve,
                fits: after + reserve <= config.max_position_embeddings,
            };
            at = after;
            fit
        })
        .collect()
}

/// A precision switch, as a marker on the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct SwitchEvent {
    /// When it happened, in milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// The policy before, as its canonical SPEC ([`PrecisionPolicy::spec_string`]).
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

impl SwitchEvent {
    /// The marker of a switch from policy `from` (whose cache was `before`) to `to` (now
    /// `after`), `tokens` converted in `duration_ms`, with the resident set `(before, after)`.
    pub fn between(
        (from, before): (&PrecisionPolicy, &KvMemoryReport),
        (to, after): (&PrecisionPolicy, &KvMemoryReport),
        tokens: usize,
        rss: (u64, u64),
        duration_ms: f64,
    ) -> Self {
        let bytes = |r: &KvMemoryReport| ByteCount {
            used: r.total.0 as u64,
            allocated: r.total.1 as u64,
        };
        SwitchEvent {
            t_ms: unix_ms(),
            from: from.spec_string(),
            to: to.spec_string(),
            tokens,
            kv_before: bytes(before),
            kv_after: bytes(after),
            rss_before: rss.0,
            rss_after: rss.1,
            duration_ms,
        }
    }
}

/// Bytes for a message: `512 B`, `3.4 KiB`, `1.25 GiB` (binary units, three significant
/// digits).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {}", UNITS[unit])
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One point of the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct MemorySample {
    /// When it was taken: milliseconds since the Unix epoch (the app), or since the
    /// timeline started (benchmarks).
    pub t_ms: u64,
    /// Tokens processed so far (the next token's position).
    pub tokens_in_context: usize,
    /// Exact KV bytes.
    pub kv: KvBytes,
    /// Bytes of the model's weights as held.
    pub weights_bytes: u64,
    /// Process resident set (0 when the platform does not report it).
    pub rss_bytes: u64,
    /// The cache's policy at that moment, as its canonical SPEC (so a figure and its label
    /// always come from the same instant).
    pub cache_spec: String,
}

impl MemorySample {
    /// Samples `cache`, stored as `policy`, and the process now.
    pub fn capture(
        t_ms: u64,
        cache: &KvCache,
        policy: &PrecisionPolicy,
        weights_bytes: usize,
        probe: &mut RssProbe,
    ) -> Self {
        Self {
            t_ms,
            tokens_in_context: cache.seq_len(),
            kv: KvBytes::of(cache),
            weights_bytes: weights_bytes as u64,
            rss_bytes: probe.rss_bytes(),
            cache_spec: policy.spec_string(),
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

/// The one way a cache changes precision: applies `plan` ([`KvCache::apply`]: all or
/// nothing) to `cache`, stored until now as `from`, and returns the switch marker with bytes
/// and resident memory before and after.
pub fn switch_precision(
    cache: &mut KvCache,
    from: &PrecisionPolicy,
    plan: &ConvertPlan,
    probe: &mut RssProbe,
) -> Result<SwitchEvent> {
    let before = cache.memory();
    let rss_before = probe.rss_bytes();
    let t0 = Instant::now();
    cache.apply(plan)?;
    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
    // A cache that shrank hands its pages back, so resident memory drops visibly.
    release_free_memory();
    Ok(SwitchEvent::between(
        (from, &before),
        (&plan.policy, &cache.memory()),
        cache.seq_len(),
        (rss_before, probe.rss_bytes()),
        duration_ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{new_storage, CacheSpec, StorageShape};
    use candle_core::{Device, Tensor};

    fn tiny_config() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny_gemma3/config.json");
        crate::config::hf::load_config(&path).expect("fixture config")
    }

    fn policy(spec: &str) -> PrecisionPolicy {
        CacheSpec::parse(spec).expect("spec").to_policy()
    }

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(10 << 20), "10.0 MiB");
        assert_eq!(format_bytes(300 << 30), "300 GiB");
        assert_eq!(format_bytes(u64::MAX), "16384 PiB");
    }

    #[test]
    fn token_bytes_match_what_a_storage_holds() {
        for spec in [
            "f32",
            "f16",
            "bf16",
            "tq4@all",
            "tq3.5@all",
            "tq2.5@all",
            "k4v3@all",
            "k4vf16@all",
            "tq3+prod@all",
        ] {
            let p = policy(spec).full;
            for (heads, dim) in [(1, 256), (2, 16), (4, 128)] {
                let shape = StorageShape::new(heads, dim, Device::Cpu);
                let mut s = new_storage(p, shape).expect("storage");
                let x = Tensor::ones((heads, 3, dim), candle_core::DType::F32, &Device::Cpu)
                    .expect("x");
                s.append(&x, &x).expect("append");
                assert_eq!(
                    p.held_bytes(heads, dim, 3).expect("bytes") as usize,
                    s.bytes_used(),
                    "{spec} {heads}x{dim}"
                );
            }
        }
        // 256 dims: f16 512 B per vector, 3.5 bits 112 B + a 2 B norm.
        assert_eq!(token_bytes(KvPrecision::F16, 1, 256).expect("f16"), 1024);
        assert_eq!(
            token_bytes(policy("tq3.5@all").full, 1, 256).expect("tq"),
            228
        );
    }

    #[test]
    fn estimate_equals_a_filled_cache_and_splits_by_kind() {
        let cfg = tiny_config();
        for spec in ["f32", "f16", "tq4", "tq3.5@all", "k4v3@sliding"] {
            let p = policy(spec);
            for tokens in [0, 5, 7, 8, 40] {
                let mut cache = KvCache::new(&cfg, &p, &Device::Cpu).expect("cache");
                cache.fill_synthetic(tokens, 1).expect("fill");
                assert_eq!(
                    estimate_kv_bytes(&cfg, &p, tokens, 0).expect("estimate"),
                    cache.memory().total.0 as u64,
                    "{spec} at {tokens} tokens"
                );
                // With a rewind margin sliding layers keep `window − 1 + margin` tokens.
                let mut cache = KvCache::new(&cfg, &p, &Device::Cpu).expect("cache");
                cache.set_rewind_margin(3);
                cache.fill_synthetic(tokens, 1).expect("fill");
                assert_eq!(
                    estimate_kv_bytes(&cfg, &p, tokens, 3).expect("estimate"),
                    cache.memory().total.0 as u64,
                    "{spec} at {tokens} tokens, margin 3"
                );
            }
        }
        // 4 sliding and 2 full layers of 2 KV heads × 16 dims: 128 B per layer-token in f16.
        let f16 = policy_token_bytes(&cfg, &policy("f16")).expect("f16");
        assert_eq!(
            f16,
            KindTokenBytes {
                sliding: 4 * 128,
                full: 2 * 128
            }
        );
        let tq = policy_token_bytes(&cfg, &policy("tq4")).expect("tq4");
        assert_eq!(tq.sliding, f16.sliding);
        assert!(tq.full < f16.full / 2, "{tq:?}");
    }

    #[test]
    fn preset_costs_follow_the_codec_layout() {
        // 4 sliding and 2 full layers of 2 KV heads × 16 dims.
        let costs = token_costs(&tiny_config());
        assert_eq!(costs.len(), presets().len());
        let by = |spec: &str| costs.iter().find(|c| c.spec == spec).expect(spec);
        // f16: 2 heads × (16 + 16 values) × 2 B = 128 B per layer.
        assert_eq!(
            (
                by("f16").sliding_bytes_per_token,
                by("f16").full_bytes_per_token
            ),
            (4 * 128, 2 * 128)
        );
        assert_eq!(by("f32").full_bytes_per_token, 2 * 256);
        // 3.5 bits × 16 dims = 7 B of codes + a 2 B norm per vector.
        assert_eq!(by("tq3.5@all").full_bytes_per_token, 2 * 2 * 2 * 9);
        // k4v3: 8 + 2 and 6 + 2 bytes.
        assert_eq!(by("k4v3@all").sliding_bytes_per_token, 4 * 2 * (10 + 8));
    }

    #[test]
    fn context_and_document_costs_are_differences_of_the_estimate() {
        // Window 8: sliding layers hold the last 7 tokens (plus the rewind margin).
        let cfg = tiny_config();
        let f16 = |costs: &[ContextCost]| costs.iter().find(|c| c.spec == "f16").unwrap().bytes;
        assert_eq!(
            f16(&context_costs(&cfg, 100, 0)),
            2 * 128 * 100 + 4 * 128 * 7
        );
        assert_eq!(
            f16(&context_costs(&cfg, 100, 16)),
            2 * 128 * 100 + 4 * 128 * (7 + 16)
        );
        let fits = document_fits(&cfg, 10, &[20, 300], 16, 0);
        // At 10 tokens the sliding layers are full already: only the full layers grow.
        assert_eq!(f16(&fits[0].costs), 2 * 128 * 20);
        assert_eq!((fits[0].context_after, fits[0].fits), (46, true));
        // The second document comes on top of the first, past the 256-token context.
        assert_eq!(f16(&fits[1].costs), 2 * 128 * 300);
        assert_eq!((fits[1].context_after, fits[1].fits), (346, false));
        let tq = fits[0]
            .costs
            .iter()
            .find(|c| c.spec == "tq3.5@all")
            .unwrap();
        assert_eq!(tq.bytes, 2 * 36 * 20);
    }

    #[test]
    fn kv_parts_sum_layers_per_kind_and_precision() {
        let cfg = tiny_config();
        let mut cache = KvCache::new(&cfg, &policy("tq3.5"), &Device::Cpu).expect("cache");
        cache.fill_synthetic(20, 1).expect("fill");
        let kv = KvBytes::of(&cache);
        let parts: Vec<(AttentionKind, &str, u64)> = kv
            .parts
            .iter()
            .map(|p| (p.kind, p.precision.as_str(), p.bytes.used))
            .collect();
        // Four sliding f16 layers (7 tokens held), two full TQ 3.5 ones (20 + offsets).
        assert_eq!(
            parts,
            [
                (AttentionKind::Sliding, "f16", 4 * 128 * 7),
                (AttentionKind::Full, "tq3.5", 2 * (36 * 20 + 256)),
            ]
        );
        assert_eq!(
            kv.parts.iter().map(|p| p.bytes.used).sum::<u64>(),
            kv.total_used
        );
    }
}
