//! One forward pass for several sequences ([`Model::forward_batch`]) gives each sequence the
//! logits it gets alone, bit for bit: on every tiny fixture, with f32 weights and with
//! weights quantized at load (our Q8_0 kernels), for dense, TurboQuant and mixed caches in
//! one batch, with a prefill chunk sharing a step with decodes, and on Gemma 3 270M with
//! llama.cpp's q4_0 (+sink) beside f16 and TurboQuant. A sequence that cannot run leaves the
//! batch with its error; the others go on.

use crate::common;

use kvlab_assets::require_asset;
use kvlab_engine::contract::WeightsChoice;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::{BatchItem, KvCache, Logits, Model, PrecisionPolicy};
use kvlab_engine::LoadOptions;

fn policy(spec: &str) -> PrecisionPolicy {
    CacheSpec::parse(spec).expect("spec").to_policy()
}

fn bits(t: &candle_core::Tensor) -> Vec<u32> {
    t.flatten_all()
        .expect("flatten")
        .to_vec1::<f32>()
        .expect("f32 logits")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn argmax(t: &candle_core::Tensor) -> u32 {
    let v = t.to_vec1::<f32>().expect("logits");
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// Sequences with `specs` caches and prompts of different lengths run `steps` steps, all
/// batched in one set of caches and one by one in another: every step's logits are equal.
/// At step 3 the second sequence runs a prefill chunk of 5 tokens beside the others' decodes,
/// wanting all its rows' logits.
fn batched_equals_alone(model: &Model, specs: &[&str], prompt_base: u32, steps: usize) {
    let vocab = model.config().vocab_size as u32;
    let mut batched: Vec<KvCache> = specs
        .iter()
        .map(|s| model.new_cache(&policy(s)).expect("cache"))
        .collect();
    let mut alone: Vec<KvCache> = specs
        .iter()
        .map(|s| model.new_cache(&policy(s)).expect("cache"))
        .collect();
    // Prompts of 7, 12, 17, … tokens.
    let mut next: Vec<Vec<u32>> = (0..specs.len())
        .map(|i| {
            (0..7 + 5 * i as u32)
                .map(|j| (prompt_base + 13 * j + 31 * i as u32) % (vocab - 3) + 3)
                .collect()
        })
        .collect();
    for step in 0..steps {
        let which: Vec<Logits> = (0..specs.len())
            .map(|i| {
                if step == 3 && i == 1 {
                    Logits::All
                } else {
                    Logits::Last
                }
            })
            .collect();
        if step == 3 && specs.len() > 1 {
            let last = next[1][0];
            next[1] = (0..5).map(|j| (last + 7 * j) % (vocab - 3) + 3).collect();
        }
        let together = {
            let mut items: Vec<BatchItem<'_, '_>> = batched
                .iter_mut()
                .zip(&next)
                .zip(&which)
                .map(|((cache, ids), &which)| BatchItem {
                    ids,
                    cache,
                    which,
                    soft: &[],
                })
                .collect();
            model.forward_batch(&mut items)
        };
        for (i, got) in together.into_iter().enumerate() {
            let got = got.expect("batched step");
            let want = model
                .forward(&next[i], &mut alone[i], which[i])
                .expect("alone");
            assert_eq!(
                bits(&got),
                bits(&want),
                "{:?} step {step}: sequence {i} ({}) differs batched",
                model.config().family,
                specs[i]
            );
            assert_eq!(batched[i].seq_len(), alone[i].seq_len());
            let last = match which[i] {
                Logits::Last => got,
                Logits::All => got.get(got.dim(0).expect("rows") - 1).expect("row"),
            };
            next[i] = vec![argmax(&last)];
        }
    }
}

#[test]
fn a_batch_gives_each_sequence_its_own_logits_on_every_fixture() {
    let mixes: [&[&str]; 4] = [
        &["f32", "f32", "f32"],
        &["f16", "f32", "bf16"],
        &["tq4@all", "f16", "k4v3+qw@all", "tq3.5@all"],
        &["k4vf16@sliding", "tq4@all"],
    ];
    for name in ["tiny_e", "tiny_dense", "tiny_moe", "tiny_gemma3"] {
        for weights in [WeightsChoice::F32, WeightsChoice::Q8_0] {
            let opts = LoadOptions {
                weights,
                ..LoadOptions::default()
            };
            let model = Model::load(&common::fixture(name), &opts).expect("load");
            for (m, mix) in mixes.iter().enumerate() {
                batched_equals_alone(&model, mix, 5 + m as u32, 12);
            }
        }
    }
}

#[test]
fn a_sequence_that_cannot_run_leaves_the_batch_and_the_others_go_on() {
    let model =
        Model::load(&common::fixture("tiny_gemma3"), &LoadOptions::default()).expect("load");
    let other = Model::load(&common::fixture("tiny_e"), &LoadOptions::default()).expect("load");
    let f32p = policy("f32");
    let max = model.config().max_position_embeddings;
    let mut good = model.new_cache(&f32p).expect("cache");
    let mut full = model.new_cache(&f32p).expect("cache");
    let filler: Vec<u32> = (0..max as u32).map(|i| 3 + i % 50).collect();
    model
        .forward(&filler, &mut full, Logits::Last)
        .expect("fill");
    let mut foreign = other.new_cache(&f32p).expect("cache");
    let mut alone = model.new_cache(&f32p).expect("cache");
    let bad_id = [model.config().vocab_size as u32 + 1];
    for round in 0..20 {
        let ids = [3 + round as u32];
        let mut bad_ids_cache = model.new_cache(&f32p).expect("cache");
        let results = {
            let mut items = vec![
                BatchItem {
                    ids: &ids,
                    cache: &mut full,
                    which: Logits::Last,
                    soft: &[],
                },
                BatchItem {
                    ids: &ids,
                    cache: &mut good,
                    which: Logits::Last,
                    soft: &[],
                },
                BatchItem {
                    ids: &ids,
                    cache: &mut foreign,
                    which: Logits::Last,
                    soft: &[],
                },
                BatchItem {
                    ids: &bad_id,
                    cache: &mut bad_ids_cache,
                    which: Logits::Last,
                    soft: &[],
                },
                BatchItem {
                    ids: &[],
                    cache: &mut alone,
                    which: Logits::Last,
                    soft: &[],
                },
            ];
            model.forward_batch(&mut items)
        };
        let messages: Vec<String> = results
            .iter()
            .map(|r| match r {
                Ok(_) => "ok".to_string(),
                Err(e) => e.to_string(),
            })
            .collect();
        assert!(messages[0].contains("context full"), "{messages:?}");
        assert_eq!(messages[1], "ok");
        assert!(messages[2].contains("another model"), "{messages:?}");
        assert!(
            messages[3].contains("outside the vocabulary"),
            "{messages:?}"
        );
        assert!(messages[4].contains("empty"), "{messages:?}");
        assert_eq!(full.seq_len(), max);
        assert_eq!(good.seq_len(), round + 1);
        assert_eq!((foreign.seq_len(), bad_ids_cache.seq_len()), (0, 0));
        assert_eq!(alone.seq_len(), 0);
    }
}

/// The real model, its own GGUF kernels (Q4_K, Q6_K, Q8_0), and llama.cpp's block types
/// (head dim 256) beside f16 and TurboQuant in one batch.
#[test]
fn gemma3_270m_batched_equals_alone_with_q4_0_and_sink() {
    let Some(gguf) = require_asset!("gemma3-270m") else {
        return;
    };
    let model = Model::load(&gguf, &LoadOptions::default()).expect("load 270M");
    batched_equals_alone(
        &model,
        &["f16", "q4_0+sink", "tq4", "q8_0/q4_0", "f32"],
        100,
        6,
    );
}
