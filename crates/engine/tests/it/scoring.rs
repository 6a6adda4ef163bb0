//! Scoring on the tiny golden fixtures: per-position next-token log-probabilities from
//! chunked runs equal those of the reference's full-sequence logits, and scheduled
//! all-position logits equal the reference's incremental logits.

use crate::common;

use candle_core::{Tensor, D};
use kvlab_engine::lab::{chunked_logits, next_token_logprobs, ChunkSchedule};
use kvlab_engine::lab::{KvPrecision, Model, PrecisionPolicy};
use kvlab_engine::LoadOptions;

fn reference_logprobs(logits: &Tensor, ids: &[u32]) -> Vec<f32> {
    let n = ids.len() - 1;
    let lsm = candle_nn::ops::log_softmax(&logits.narrow(0, 0, n).expect("narrow"), D::Minus1)
        .expect("log_softmax");
    let targets = Tensor::from_slice(&ids[1..], (n, 1), logits.device()).expect("targets");
    lsm.gather(&targets, 1)
        .and_then(|t| t.squeeze(1))
        .and_then(|t| t.to_vec1::<f32>())
        .expect("gather")
}

#[test]
fn chunked_logprobs_equal_the_reference() {
    for name in ["tiny_gemma3", "tiny_e"] {
        let g = common::golden(name);
        let ids = common::ids(&g["input_ids"]);
        let want = reference_logprobs(&g["logits_full"], &ids);
        let model = Model::load(
            &common::fixture(name).join("model.safetensors"),
            &LoadOptions::default(),
        )
        .expect("model");
        for chunk in [1, 7, 40] {
            let mut cache = model
                .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
                .expect("cache");
            let mut progress = Vec::new();
            let got =
                next_token_logprobs(&model, &mut cache, &ids, chunk, &mut |d| progress.push(d))
                    .expect("score");
            assert_eq!(got.len(), ids.len() - 1);
            assert_eq!(progress.last(), Some(&ids.len()));
            let d = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d <= 1e-3, "{name} chunk {chunk}: max |Δ log p| = {d}");
        }
    }
}

#[test]
fn scheduled_logits_equal_the_incremental_reference() {
    let g = common::golden("tiny_dense");
    let ids = common::ids(&g["input_ids"]);
    let model = Model::load(
        &common::fixture("tiny_dense").join("model.safetensors"),
        &LoadOptions::default(),
    )
    .expect("model");
    let mut cache = model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache");
    let schedule = ChunkSchedule::parse("10,1,3,1,5").expect("schedule");
    let got = chunked_logits(&model, &mut cache, &ids, &schedule).expect("logits");
    let d = (got - &g["logits_incremental"])
        .and_then(|t| t.abs())
        .and_then(|t| t.max_all())
        .and_then(|t| t.to_scalar::<f32>())
        .expect("diff");
    assert!(d <= 1e-3, "max |Δ| = {d}");
    assert_eq!(cache.seq_len(), 40);
}
