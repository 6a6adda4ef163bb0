//! Fidelity sweeps: several caches scored against one reference on the same tokens, each
//! with the bits per coordinate it holds, which is the trade-off `kvlab fidelity sweep` prints
//! and the compare view charts. Bits are counted as held: a cache's bytes against an f32
//! cache's with the same layers and tokens, so norms, offsets, weights and dense layers count.

use std::ops::Range;

use crate::contract::SweepPoint;
use crate::error::Result;
use crate::generate::fidelity::FidelityReport;
use crate::kv::{KvPrecision, PrecisionPolicy};
use crate::memory::{estimate_kv_bytes, estimate_kv_bytes_at_once};
use crate::models::common::Model;

/// Bits per coordinate `policy` holds at `tokens` tokens once calibrated (as a comparison's
/// caches are, `Lockstep::calibrating_on_first_chunk`, and any cache past the model's
/// calibration rows): its bytes against an f32 cache's (exactly 32 bits per coordinate)
/// with the same layers and tokens held, both from the engine's byte formula
/// ([`estimate_kv_bytes_at_once`], which the storages' own counts equal).
pub fn bits_per_coordinate(model: &Model, policy: &PrecisionPolicy, tokens: usize) -> Result<f64> {
    let config = model.config();
    let held =
        |p: &PrecisionPolicy| estimate_kv_bytes_at_once(config, p, tokens, 0).map(|b| b as f64);
    let f32_bytes = held(&PrecisionPolicy::uniform(KvPrecision::F32))?;
    Ok(32.0 * held(policy)? / f32_bytes.max(1.0))
}

/// The value below which `q` of `xs` lie (nearest rank; 0 for none).
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The point of a set of scored positions (pooled over windows), for cache `kv` holding
/// `bits_per_coordinate`.
pub fn point(kv: String, bits_per_coordinate: f64, report: &FidelityReport) -> SweepPoint {
    let klds: Vec<f64> = report.positions.iter().map(|p| p.kld).collect();
    SweepPoint {
        kv,
        bits_per_coordinate,
        mean_kld: report.mean_kld,
        p99_kld: quantile(&klds, 0.99),
        top1_agreement: report.top1_agreement,
        ppl: report.ppl,
        ppl_reference: report.ppl_reference,
        tokens_scored: report.tokens_scored,
    }
}

/// Splits `tests` into consecutive groups to run in lockstep, each group's caches of `tokens`
/// tokens together with the reference's fitting in `room` bytes (a group holds at least one
/// test, whatever its size: the caller has admitted a single cache already).
pub fn lockstep_batches(
    model: &Model,
    reference: &PrecisionPolicy,
    tests: &[PrecisionPolicy],
    tokens: usize,
    room: u64,
) -> Result<Vec<Range<usize>>> {
    let bytes = |p: &PrecisionPolicy| estimate_kv_bytes(model.config(), p, tokens, 0);
    let base = bytes(reference)?;
    let mut batches = Vec::new();
    let (mut start, mut held) = (0, base);
    for (i, test) in tests.iter().enumerate() {
        // A test equal to the reference holds no cache of its own.
        let b = if test == reference { 0 } else { bytes(test)? };
        if i > start && held.saturating_add(b) > room {
            batches.push(start..i);
            (start, held) = (i, base);
        }
        held = held.saturating_add(b);
    }
    if start < tests.len() {
        batches.push(start..tests.len());
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_99th_percentile_is_a_nearest_rank() {
        let xs: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.99), 198.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }

    #[test]
    fn bits_per_coordinate_count_what_the_cache_holds() {
        use crate::kv::CacheSpec;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gguf/tiny_gemma3.f32.gguf");
        let model = Model::load(&path, &crate::LoadOptions::default()).unwrap();
        let bits = |s: &str| {
            bits_per_coordinate(&model, &CacheSpec::parse(s).unwrap().to_policy(), 100).unwrap()
        };
        assert_eq!(bits("f32"), 32.0);
        assert_eq!(bits("f16"), 16.0);
        // Codes plus each vector's norm and centering offset: on these 16-dim heads the
        // per-vector extras weigh far more than on a real model's 256.
        let tq4 = bits("tq4@all");
        assert!(tq4 > 4.0 && tq4 < 16.0, "{tq4}");
        assert!(bits("tq3@all") < tq4);
        // The key weights of `+qw` are one more row per head: a little more, never less.
        assert!(bits("tq4+qw@all") > tq4);
        // TurboQuant on the full layers only: between the two.
        let full = bits("tq4@full");
        assert!(full > tq4 && full < 16.0, "{full}");
    }

    #[test]
    fn lockstep_groups_hold_what_fits_in_the_room() {
        use crate::kv::CacheSpec;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gguf/tiny_gemma3.f32.gguf");
        let model = Model::load(&path, &crate::LoadOptions::default()).unwrap();
        let p = |s: &str| CacheSpec::parse(s).unwrap().to_policy();
        let (reference, tokens) = (p("f16"), 100);
        let tests = [p("tq4@all"), p("f16"), p("tq3@all"), p("f32")];
        let bytes = |q: &PrecisionPolicy| estimate_kv_bytes(model.config(), q, tokens, 0).unwrap();
        let groups = |room| -> Vec<(usize, usize)> {
            let batches = lockstep_batches(&model, &reference, &tests, tokens, room).unwrap();
            batches.into_iter().map(|r| (r.start, r.end)).collect()
        };
        assert_eq!(groups(u64::MAX), [(0, 4)]);
        // Room for the reference and the two TurboQuant caches: the f16 test is the reference
        // itself (no cache of its own), the f32 one starts a group of its own.
        let three = bytes(&reference) + bytes(&tests[0]) + bytes(&tests[2]);
        assert_eq!(groups(three), [(0, 3), (3, 4)]);
        assert_eq!(groups(three - 1), [(0, 2), (2, 3), (3, 4)]);
        // Not even one fits: one cache per group, never an empty one.
        assert_eq!(groups(0), [(0, 1), (1, 2), (2, 3), (3, 4)]);
    }
}
