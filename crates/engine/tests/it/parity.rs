//! Parity with the reference transformers implementation on the tiny golden fixtures:
//! full-sequence logits, chunked incremental logits (the fixture's schedule), and greedy
//! generation, for both config spellings.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use common::max_diff;
use kvlab_engine::lab::PrecisionPolicy;
use kvlab_engine::lab::{KvPrecision, Logits, Model};
use kvlab_engine::LoadOptions;

const FIXTURES: [&str; 4] = ["tiny_e", "tiny_dense", "tiny_moe", "tiny_gemma3"];
const TOL: f32 = 1e-3;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn configs(name: &str) -> Vec<PathBuf> {
    ["config.json", "config_hub_style.json"]
        .iter()
        .map(|c| dir(name).join(c))
        .filter(|p| p.exists())
        .collect()
}

fn golden(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir(name).join("golden.safetensors"), &Device::Cpu)
        .expect("golden")
}

fn ids_of(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .expect("ids")
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

fn load(cfg: &Path, name: &str) -> Model {
    Model::from_hf(
        cfg,
        &dir(name).join("model.safetensors"),
        &LoadOptions::default(),
    )
    .expect("load fixture")
}

fn f32_policy() -> PrecisionPolicy {
    PrecisionPolicy::uniform(KvPrecision::F32)
}

#[test]
fn full_logits_match_reference() {
    for name in FIXTURES {
        let g = golden(name);
        let ids = ids_of(&g["input_ids"]);
        for cfg in configs(name) {
            let model = load(&cfg, name);
            let mut cache = model.new_cache(&f32_policy()).expect("cache");
            let logits = model
                .forward(&ids, &mut cache, Logits::All)
                .expect("forward");
            let d = max_diff(&logits, &g["logits_full"]);
            println!(
                "{name} [{}] full: max|Δ| = {d:.3e}",
                cfg.file_name().unwrap_or_default().to_string_lossy()
            );
            assert!(d <= TOL, "{name} {cfg:?}: full logits differ by {d}");
        }
    }
}

#[test]
fn incremental_logits_match_reference() {
    for name in FIXTURES {
        let g = golden(name);
        let ids = ids_of(&g["input_ids"]);
        let chunks: Vec<usize> = g["chunk_sizes"]
            .to_vec1::<i64>()
            .expect("chunks")
            .into_iter()
            .map(|c| c as usize)
            .collect();
        assert_eq!(chunks.iter().sum::<usize>(), ids.len());
        for cfg in configs(name) {
            let model = load(&cfg, name);
            let mut cache = model.new_cache(&f32_policy()).expect("cache");
            let mut outs = Vec::new();
            let mut at = 0;
            for c in &chunks {
                outs.push(
                    model
                        .forward(&ids[at..at + c], &mut cache, Logits::All)
                        .expect("chunk"),
                );
                at += c;
            }
            assert_eq!(cache.seq_len(), ids.len());
            let logits = Tensor::cat(&outs, 0).expect("cat");
            let d = max_diff(&logits, &g["logits_incremental"]);
            println!(
                "{name} [{}] incremental: max|Δ| = {d:.3e}",
                cfg.file_name().unwrap_or_default().to_string_lossy()
            );
            assert!(d <= TOL, "{name} {cfg:?}: incremental logits differ by {d}");
        }
    }
}

#[test]
fn greedy_generation_matches_reference() {
    for name in FIXTURES {
        let g = golden(name);
        let expect = ids_of(&g["greedy_ids"]);
        for cfg in configs(name) {
            let model = load(&cfg, name);
            let mut cache = model.new_cache(&f32_policy()).expect("cache");
            let mut out = expect[..12].to_vec();
            let mut logits = model
                .forward(&out, &mut cache, Logits::Last)
                .expect("prompt");
            while out.len() < expect.len() {
                let next = logits
                    .argmax(0)
                    .expect("argmax")
                    .to_scalar::<u32>()
                    .expect("id");
                out.push(next);
                if out.len() < expect.len() {
                    logits = model
                        .forward(&[next], &mut cache, Logits::Last)
                        .expect("step");
                }
            }
            assert_eq!(out, expect, "{name} {cfg:?}: greedy ids differ");
        }
    }
}
