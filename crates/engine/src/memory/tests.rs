//! Tests of the byte formulas, the estimate and the timeline against real storages.

use super::estimate::{policy_token_bytes, KindTokenBytes};
use super::*;
use crate::checkpoint::config::ModelConfig;
use crate::contract::AttentionKind;
use crate::kv::{
    new_storage, presets, CacheSpec, KvCache, KvPrecision, PrecisionPolicy, StorageShape,
};
use candle_core::{Device, Tensor};

fn tiny_config() -> ModelConfig {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny_gemma3/config.json");
    crate::checkpoint::config::hf::load_config(&path).expect("fixture config")
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
        // Below and past the rows a TurboQuant layer holds as f16 before it calibrates.
        for ((heads, dim), t) in [(1, 256), (2, 16), (4, 128)]
            .into_iter()
            .flat_map(|s| [(s, 3), (s, 600)])
        {
            let shape = StorageShape::new(heads, dim, Device::Cpu);
            let mut s = new_storage(p, shape).expect("storage");
            let x =
                Tensor::ones((heads, t, dim), candle_core::DType::F32, &Device::Cpu).expect("x");
            s.append(&x, &x).expect("append");
            assert_eq!(
                p.held_bytes(heads, dim, t).expect("bytes") as usize,
                s.bytes_used(),
                "{spec} {heads}x{dim} {t}"
            );
        }
    }
    // 256 dims: f16 512 B per vector, 3.5 bits 112 B + a 2 B norm.
    assert_eq!(KvPrecision::F16.token_bytes(1, 256).expect("f16"), 1024);
    assert_eq!(
        policy("tq3.5@all").full.token_bytes(1, 256).expect("tq"),
        228
    );
}

#[test]
fn estimate_equals_a_filled_cache_and_splits_by_kind() {
    let cfg = tiny_config();
    for spec in [
        "f32",
        "f16",
        "tq4",
        "tq3.5@all",
        "k4v3@sliding",
        "k4v3+qw@all",
    ] {
        let p = policy(spec);
        for tokens in [0, 5, 7, 8, 15, 16, 40, 600] {
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
fn the_allocated_estimate_bounds_what_a_cache_allocates_as_it_grows() {
    let cfg = tiny_config();
    for spec in [
        "f32",
        "f16",
        "tq4",
        "k4v3+qw@all",
        "tq3.5@all",
        "k4vf16@all",
    ] {
        let p = policy(spec);
        // Filled at once, and a token at a time past a prefill (decode's growth).
        for (prefill, steps) in [(5, 0), (16, 40), (100, 150), (600, 0), (300, 300)] {
            let mut cache = KvCache::new(&cfg, &p, &Device::Cpu).expect("cache");
            cache.set_rewind_margin(3);
            cache.fill_synthetic(prefill, 1).expect("fill");
            let mut most = cache.memory().total.1 as u64;
            for _ in 0..steps {
                cache.fill_synthetic(1, 1).expect("step");
                most = most.max(cache.memory().total.1 as u64);
            }
            let tokens = prefill + steps;
            let bound = estimate_kv_allocated(&cfg, &p, tokens, 3).expect("estimate");
            assert!(
                most <= bound,
                "{spec}, {prefill} + {steps} tokens: {most} allocated over the bound {bound}"
            );
            // And a dense cache's bound is not far above what it holds: a spare of an
            // eighth (coded sides reserve 128 rows a head, and a sliding one a segment more).
            let held = estimate_kv_bytes(&cfg, &p, tokens, 3).expect("estimate");
            if tokens >= 256 && p.is_dense() {
                assert!(
                    bound <= 2 * held,
                    "{spec}, {tokens} tokens: {bound} for {held}"
                );
            }
        }
    }
}

#[test]
fn preset_costs_follow_the_codec_layout() {
    // 4 sliding and 2 full layers of 2 KV heads × 16 dims.
    let costs = token_costs(&tiny_config());
    // llama.cpp's types need heads of whole 32-wide blocks: on 16 they are not offered.
    let fitting: Vec<_> = presets().into_iter().filter(|p| !p.llama_cpp).collect();
    assert_eq!(costs.len(), fitting.len());
    assert!(costs.iter().all(|c| c.spec != "q8_0"));
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
    // 4 bits × 16 dims = 8 B of codes + a 2 B norm per vector.
    assert_eq!(by("tq4+qw@all").full_bytes_per_token, 2 * 2 * 2 * 10);
    // k4v3: 8 + 2 and 6 + 2 bytes.
    assert_eq!(by("k4v3+qw@all").sliding_bytes_per_token, 4 * 2 * (10 + 8));
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
    let tq = |fits: &[DocumentFit]| {
        fits[0]
            .costs
            .iter()
            .find(|c| c.spec == "k4v3+qw@all")
            .unwrap()
            .bytes
    };
    // Only the 2 full layers grow: 2 heads × (10 + 8) B per token each; a document that
    // makes the cache calibrate (10 tokens held as f16, 30 after it) costs its tokens' codes.
    assert_eq!(tq(&document_fits(&cfg, 20, &[20], 16, 0)), 2 * 36 * 20);
    assert_eq!(tq(&document_fits(&cfg, 10, &[20], 16, 0)), 2 * 36 * 20);
    // Until TurboQuant layers have seen 16 tokens (the tiny model's calibration rows) they
    // hold f16 rows: f16's cost, on all 6 layers while the windows fill.
    assert_eq!(tq(&document_fits(&cfg, 2, &[5], 16, 0)), 6 * 128 * 5);
    // From then on, codes, and per layer one offset per side and the keys' weights (3 × 2
    // heads × 16 f32), the sliding layers' 7 tokens too.
    let at = |tokens| {
        context_costs(&cfg, tokens, 0)
            .into_iter()
            .find(|c| c.spec == "k4v3+qw@all")
            .unwrap()
            .bytes
    };
    assert_eq!(at(16), 2 * (36 * 16 + 384) + 4 * (36 * 7 + 384));
    assert_eq!(at(15), 2 * 128 * 15 + 4 * 128 * 7);
}

#[test]
fn kv_parts_sum_layers_per_kind_and_precision() {
    let cfg = tiny_config();
    let mut cache = KvCache::new(&cfg, &policy("tq3.5"), &Device::Cpu).expect("cache");
    cache.fill_synthetic(600, 1).expect("fill");
    let kv = KvBytes::of(&cache);
    let parts: Vec<(AttentionKind, &str, u64)> = kv
        .parts
        .iter()
        .map(|p| (p.kind, p.precision.as_str(), p.bytes.used))
        .collect();
    // Four sliding f16 layers (7 tokens held), two full TQ 3.5 ones (600 coded + offsets).
    assert_eq!(
        parts,
        [
            (AttentionKind::Sliding, "f16", 4 * 128 * 7),
            (AttentionKind::Full, "tq3.5", 2 * (36 * 600 + 256)),
        ]
    );
    assert_eq!(
        kv.parts.iter().map(|p| p.bytes.used).sum::<u64>(),
        kv.total_used
    );
}
