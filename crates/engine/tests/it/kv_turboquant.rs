//! TurboQuant caches on the tiny fixture models: a live precision switch between two tokens
//! gives the same continuation as replaying the prefix and converting the cache the same
//! way; memory samples add up and equal the codec formula; fidelity of a cache against
//! itself is perfect and a coarse cache is measurably worse.

use std::path::PathBuf;

use kvlab_engine::contract::AttentionKind;
use kvlab_engine::contract::{KvBytes, MemorySample};
use kvlab_engine::host::RssProbe;
use kvlab_engine::lab::compare_caches;
use kvlab_engine::lab::{CacheSpec, KvCache, SideSpec};
use kvlab_engine::lab::{Logits, Model, PrecisionPolicy};
use kvlab_engine::LoadOptions;
use kvlab_turboquant::bytes_per_vector;

fn load(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Model::load(&dir, &LoadOptions::default()).expect("load fixture")
}

fn policy(s: &str) -> PrecisionPolicy {
    CacheSpec::parse(s).expect("spec").to_policy()
}

fn prompt(n: usize) -> Vec<u32> {
    let mut rng = kvlab_turboquant::Rng::new(11, 0);
    let mut ids = vec![2];
    while ids.len() < n {
        ids.push(3 + rng.below(500) as u32);
    }
    ids
}

fn argmax(model: &Model, ids: &[u32], cache: &mut KvCache) -> u32 {
    model
        .forward(ids, cache, Logits::Last)
        .expect("forward")
        .argmax(0)
        .expect("argmax")
        .to_scalar::<u32>()
        .expect("scalar")
}

/// Greedy decoding of `steps` tokens after `prompt`, converting the cache to `to` right
/// before generated token `switch_at` is fed back (between two tokens, as the worker does).
fn live_switch(
    model: &Model,
    prompt: &[u32],
    from: &PrecisionPolicy,
    to: &PrecisionPolicy,
    switch_at: usize,
    steps: usize,
) -> Vec<u32> {
    let mut cache = model.new_cache(from).expect("cache");
    let mut out = vec![argmax(model, prompt, &mut cache)];
    for i in 0..steps {
        if i == switch_at {
            cache.convert(to).expect("switch");
        }
        let next = argmax(model, &[out[out.len() - 1]], &mut cache);
        out.push(next);
    }
    out
}

#[test]
fn live_switch_equals_replay_then_convert() {
    let pairs = [
        ("f32", "tq4@all"),
        ("tq4@all", "tq3@all"),
        ("tq3.5", "f32"),
        ("f32", "k4vf16@all"),
        ("f32", "tq3+qw@all"),
    ];
    for name in ["tiny_gemma3", "tiny_e"] {
        let model = load(name);
        let p = prompt(12);
        for (from, to) in pairs {
            let (from, to) = (policy(from), policy(to));
            // Switch points before, at and well past the sliding window (8).
            for switch_at in [0usize, 5, 19] {
                let live = live_switch(&model, &p, &from, &to, switch_at, 24);
                // Replay: the same tokens in the old precision, then the same conversion,
                // then greedy decoding on the converted cache.
                let mut cache = model.new_cache(&from).expect("cache");
                let first = if from.full.is_dense() && from.sliding.is_dense() {
                    // Dense caches do not depend on how the prefix was cut: feed it at once.
                    let mut ids = p.clone();
                    ids.extend_from_slice(&live[..switch_at]);
                    argmax(&model, &ids, &mut cache)
                } else {
                    // TurboQuant fixes each head's offset from its first append: write the
                    // history in the live run's steps (the prompt, then one token at a time).
                    let mut next = argmax(&model, &p, &mut cache);
                    for &t in &live[..switch_at] {
                        assert_eq!(next, t, "{name} replay at {switch_at}");
                        next = argmax(&model, &[t], &mut cache);
                    }
                    next
                };
                assert_eq!(first, live[switch_at], "{name} switch at {switch_at}");
                cache.convert(&to).expect("convert");
                let mut replay = vec![first];
                for _ in switch_at..24 {
                    let next = argmax(&model, &[replay[replay.len() - 1]], &mut cache);
                    replay.push(next);
                }
                assert_eq!(
                    &live[switch_at..],
                    &replay[..],
                    "{name}: {from:?} → {to:?} at {switch_at}"
                );
            }
        }
    }
}

#[test]
fn memory_samples_add_up_and_follow_the_codec_formula() {
    for name in ["tiny_gemma3", "tiny_e"] {
        let model = load(name);
        for spec in [
            "f16",
            "f32",
            "tq4",
            "tq3.5@all",
            "k4v2.5@sliding",
            "k4vf16@all",
            "k4v3+qw@all",
            // Dense sides in any dtype (the tiny models' 16-wide heads take no ggml blocks).
            "f32/tq3",
            "tq4/bf16@all",
        ] {
            let mut cache = model.new_cache(&policy(spec)).expect("cache");
            let ids = prompt(40);
            for c in ids.chunks(9) {
                model.forward(c, &mut cache, Logits::Last).expect("forward");
            }
            let mut probe = RssProbe::new();
            let s =
                MemorySample::capture(5, &cache, &policy(spec), model.weights_bytes(), &mut probe);
            assert_eq!(s.tokens_in_context, 40);
            assert_eq!(s.cache_spec, policy(spec).spec_string());
            assert!(s.weights_bytes > 0 && s.rss_bytes > 0);
            let kv: &KvBytes = &s.kv;
            let sum_layers: u64 = kv.layers.iter().map(|l| l.bytes.used).sum();
            let sum_alloc: u64 = kv.layers.iter().map(|l| l.bytes.allocated).sum();
            let sum_prec: u64 = kv.by_precision.values().map(|b| b.used).sum();
            let sum_prec_alloc: u64 = kv.by_precision.values().map(|b| b.allocated).sum();
            assert_eq!(sum_layers, kv.total_used, "{name} {spec}");
            assert_eq!(sum_prec, kv.total_used, "{name} {spec}");
            assert_eq!(sum_alloc, kv.total_allocated, "{name} {spec}");
            assert_eq!(sum_prec_alloc, kv.total_allocated, "{name} {spec}");
            assert_eq!(
                kv.by_kind.sliding.used + kv.by_kind.full.used,
                kv.total_used
            );
            // Each layer's bytes are the formula: tokens × kv heads × (K + V bytes/vector).
            for l in &kv.layers {
                let cfg = &model.config().layers[l.layer];
                let prec = cache.storage(l.layer).expect("owning layer").precision();
                let (bk, bv) = match prec {
                    kvlab_engine::lab::KvPrecision::Split(p) => {
                        let b = |s: &SideSpec| match *s {
                            SideSpec::F16 | SideSpec::BF16 => 2 * cfg.head_dim,
                            SideSpec::F32 => 4 * cfg.head_dim,
                            SideSpec::Codes(c) => {
                                bytes_per_vector(cfg.head_dim, &c).expect("codec")
                            }
                            SideSpec::Blocks(t) => t.row_bytes(cfg.head_dim).expect("blocks"),
                        };
                        (b(&p.key), b(&p.value))
                    }
                    kvlab_engine::lab::KvPrecision::F32 => (4 * cfg.head_dim, 4 * cfg.head_dim),
                    _ => (2 * cfg.head_dim, 2 * cfg.head_dim),
                };
                // Plus, per centered coded side (the default), one f32 offset per kv head, and
                // with `+qw` one f32 row of key weights per kv head.
                let offsets = match prec {
                    kvlab_engine::lab::KvPrecision::Split(p) => {
                        let coded = [p.key, p.value]
                            .iter()
                            .filter(|s| matches!(s, SideSpec::Codes(_)))
                            .count();
                        usize::from(p.center) * coded + usize::from(p.weigh_keys)
                    }
                    _ => 0,
                };
                let want = l.tokens * cfg.n_kv_heads * (bk + bv)
                    + offsets * cfg.n_kv_heads * cfg.head_dim * 4;
                assert_eq!(l.bytes.used, want as u64, "{name} {spec} layer {}", l.layer);
                assert!(l.bytes.allocated >= l.bytes.used);
                let expect_tokens = match cfg.kind {
                    AttentionKind::Full => 40,
                    AttentionKind::Sliding => cfg.sliding_window.expect("window") - 1,
                };
                assert_eq!(l.tokens, expect_tokens);
            }
            let json = serde_json::to_string(&s).expect("json");
            let back: MemorySample = serde_json::from_str(&json).expect("parse");
            assert_eq!(back, s);
        }
    }
}

#[test]
fn fidelity_against_itself_is_perfect_and_coarse_caches_diverge() {
    let model = load("tiny_gemma3");
    let ids = prompt(48);
    let same = compare_caches(
        &model,
        &ids,
        &policy("f32"),
        &policy("f32"),
        16,
        &mut |_, _| {},
    )
    .expect("fidelity");
    assert_eq!(same.tokens_scored, 47);
    assert_eq!(same.mean_kld, 0.0);
    assert_eq!(same.top1_agreement, 1.0);
    assert_eq!(same.max_logit_error, 0.0);
    assert_eq!(same.ppl, same.ppl_reference);
    let coarse = compare_caches(
        &model,
        &ids,
        &policy("f32"),
        &policy("tq2@all"),
        16,
        &mut |_, _| {},
    )
    .expect("fidelity");
    let fine = compare_caches(
        &model,
        &ids,
        &policy("f32"),
        &policy("tq4@all"),
        16,
        &mut |_, _| {},
    )
    .expect("fidelity");
    assert_eq!(coarse.ppl_reference, same.ppl_reference);
    assert!(coarse.mean_kld > 0.0 && coarse.max_logit_error > 0.0);
    assert!(
        fine.mean_kld < coarse.mean_kld,
        "tq4 {} vs tq2 {}",
        fine.mean_kld,
        coarse.mean_kld
    );
    assert_eq!(coarse.positions.len(), 47);
    let mean: f64 = coarse.positions.iter().map(|p| p.kld).sum::<f64>() / 47.0;
    assert!((mean - coarse.mean_kld).abs() < 1e-12);
}

#[test]
fn scoring_from_a_position_equals_the_full_comparison_filtered() {
    let model = load("tiny_gemma3");
    let ids = prompt(40);
    let (f32p, tq) = (policy("f32"), policy("tq2@all"));
    let full = compare_caches(&model, &ids, &f32p, &tq, 7, &mut |_, _| {}).expect("full");
    let tail =
        kvlab_engine::lab::compare_caches_from(&model, &ids, &f32p, &tq, 7, 21, &mut |_, _| {})
            .expect("from 21");
    // Chunks wholly before position 21 (0..7, 7..14, 14..21) run without logits.
    assert_eq!(tail.positions.first().map(|p| p.pos), Some(21));
    let want: Vec<_> = full.positions.iter().filter(|p| p.pos >= 21).collect();
    assert_eq!(tail.positions.len(), want.len());
    for (a, b) in tail.positions.iter().zip(want) {
        assert_eq!(a.pos, b.pos);
        assert!((a.kld - b.kld).abs() < 1e-9 && a.top1_agree == b.top1_agree);
    }
}

#[test]
fn caches_scored_in_lockstep_equal_each_scored_alone() {
    let model = load("tiny_gemma3");
    let ids = prompt(40);
    let reference = policy("f32");
    let tests = [policy("tq2@all"), policy("f32"), policy("k4v3@all")];
    let mut steps = Vec::new();
    let together = kvlab_engine::lab::compare_many_from(
        &model,
        &ids,
        &reference,
        &tests,
        9,
        0,
        &mut |done, total| {
            steps.push((done, total));
            true
        },
    )
    .expect("lockstep");
    assert_eq!(steps, [(9, 40), (18, 40), (27, 40), (36, 40), (40, 40)]);
    for (test, report) in tests.iter().zip(&together) {
        let alone =
            compare_caches(&model, &ids, &reference, test, 9, &mut |_, _| {}).expect("alone");
        // The same arithmetic on the same logits: equal, not merely close.
        assert_eq!(report, &alone);
    }
    assert_eq!(together[1].mean_kld, 0.0);
    assert!(together[0].mean_kld > together[2].mean_kld && together[2].mean_kld > 0.0);
    // Stopped after the second chunk: the positions scored so far.
    let stopped = kvlab_engine::lab::compare_many_from(
        &model,
        &ids,
        &reference,
        &tests[..1],
        9,
        0,
        &mut |done, _| done < 18,
    )
    .expect("stopped");
    assert_eq!(stopped[0].positions, together[0].positions[..18]);
}

/// A decode shaped like one on Metal, on the CPU: f16 activations (Metal's dtype) and the
/// TurboQuant storages' home set apart from the model's device, so every attention call
/// crosses (query rows to the home, output back) as it does from a Metal model. No step may
/// decode the held tokens to dense K/V; each crossing moves exactly the query and output
/// rows; and crossing changes no result, bit for bit, against the same cache at home.
#[test]
fn metal_shaped_decode_crosses_with_queries_only_and_never_converts_to_dense() {
    use candle_core::{DType, Device};
    const STEPS: usize = 10;
    for name in ["tiny_gemma3", "tiny_e"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let opts = LoadOptions {
            device: Device::Cpu,
            dtype: DType::F16,
            weights: kvlab_engine::contract::WeightsChoice::F16,
        };
        let model = Model::load(&dir, &opts).expect("load fixture in f16");
        // Every layer attends once per step, shared layers into their producer's storage.
        let floats_per_step: u64 = model
            .config()
            .layers
            .iter()
            .map(|l| 2 * (l.n_heads * l.head_dim) as u64)
            .sum();
        let layers = model.config().layers.len() as u64;
        for spec in ["tq4@all", "k3.5vf16@all", "tq2.5"] {
            let pol = policy(spec);
            let mut apart = model
                .new_cache_with_home(&pol, Device::Cpu)
                .expect("cache apart");
            let mut home = model.new_cache(&pol).expect("cache at home");
            let p = prompt(12);
            let la = model
                .forward(&p, &mut apart, Logits::Last)
                .expect("prefill");
            let lh = model.forward(&p, &mut home, Logits::Last).expect("prefill");
            let after_prefill = apart.traffic();
            let mut next = la
                .argmax(0)
                .expect("argmax")
                .to_scalar::<u32>()
                .expect("id");
            let mut max_diff = (&la - &lh)
                .and_then(|d| d.abs()?.max_all()?.to_dtype(DType::F32)?.to_scalar::<f32>())
                .expect("diff");
            for _ in 0..STEPS {
                let la = model
                    .forward(&[next], &mut apart, Logits::Last)
                    .expect("step");
                let lh = model
                    .forward(&[next], &mut home, Logits::Last)
                    .expect("step");
                let d = (&la - &lh)
                    .and_then(|d| d.abs()?.max_all()?.to_dtype(DType::F32)?.to_scalar::<f32>())
                    .expect("diff");
                max_diff = max_diff.max(d);
                next = la
                    .argmax(0)
                    .expect("argmax")
                    .to_scalar::<u32>()
                    .expect("id");
            }
            let t = apart.traffic();
            assert_eq!(t.dense_conversions, 0, "{name} {spec}: {t:?}");
            assert_eq!(t.dense_rows, 0, "{name} {spec}");
            // TurboQuant layers cross once per step each; dense sliding layers (tq2.5 covers
            // full layers only) stay on the model's device and never cross.
            let tq_layers = model
                .config()
                .layers
                .iter()
                .filter(|l| {
                    let owner = match l.kv_source {
                        kvlab_engine::lab::KvSource::Shared { producer } => producer,
                        kvlab_engine::lab::KvSource::Own => l.index,
                    };
                    !apart
                        .storage(owner)
                        .expect("owning layer")
                        .precision()
                        .is_dense()
                })
                .collect::<Vec<_>>();
            let tq_floats: u64 = tq_layers
                .iter()
                .map(|l| 2 * (l.n_heads * l.head_dim) as u64)
                .sum();
            assert!(!tq_layers.is_empty(), "{name} {spec}: no TurboQuant layer");
            assert_eq!(
                t.crossings - after_prefill.crossings,
                STEPS as u64 * tq_layers.len() as u64,
                "{name} {spec}"
            );
            assert_eq!(
                t.crossed_floats - after_prefill.crossed_floats,
                STEPS as u64 * tq_floats,
                "{name} {spec}: a decode step moves 2 × heads × head_dim floats per layer"
            );
            if spec == "tq4@all" {
                assert_eq!(tq_layers.len() as u64, layers);
                assert_eq!(tq_floats, floats_per_step);
            }
            // At home on a CPU model nothing crosses; and crossing is lossless.
            let h = home.traffic();
            assert_eq!((h.crossings, h.dense_conversions), (0, 0), "{name} {spec}");
            assert_eq!(max_diff, 0.0, "{name} {spec}: crossing changed the logits");
            // The counter does count: a one-off conversion (what a precision switch reads).
            let first = tq_layers[0];
            let s = apart
                .storage(first.index)
                .expect("a TurboQuant layer owns a cache");
            let held = s.len() as u64;
            s.to_dense().expect("dense");
            let t = apart.traffic();
            assert_eq!(t.dense_conversions, 1, "{name} {spec}");
            let n_kv = first.n_kv_heads as u64;
            assert_eq!(t.dense_rows, held * n_kv, "{name} {spec}");
        }
    }
}
