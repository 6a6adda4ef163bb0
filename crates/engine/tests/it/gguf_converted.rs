//! GGUF files as llama.cpp's own converter writes them (`convert_hf_to_gguf.py` from the
//! llama-cpp-python 0.3.36 sdist, run by `tests/fixtures/gguf/make_gguf.sh` on the tiny
//! reference checkpoints): the Gemma 4 files reproduce the transformers goldens, full and
//! chunked, and the Gemma 3 files load with llama.cpp's assumptions, stated as warnings.

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use common::{fixture, golden, ids, max_diff};
use kvlab_engine::contract::AttentionKind;
use kvlab_engine::contract::Family as TokFamily;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::KvSource;
use kvlab_engine::lab::{KvPrecision, Logits, Model, PrecisionPolicy};
use kvlab_engine::LoadOptions;

const GEMMA4: [&str; 3] = ["tiny_e", "tiny_dense", "tiny_moe"];
/// f32 files hold the reference's own weights: the engine's usual parity bound.
const TOL_F32: f32 = 1e-3;
/// f16 files round every matrix to 11 significant bits (norms stay f32), and Gemma 4's
/// unscaled attention amplifies that. Measured max |Δ logit| (logits reach ±20), full and
/// chunked alike: tiny_e 1.30e-1, tiny_dense 4.0e-2, tiny_moe 6.5e-2, tiny_gemma3 4.9e-2
/// (against its f32 reading). The bound is 1.5× the worst.
const TOL_F16: f32 = 0.2;

fn gguf(name: &str, outtype: &str) -> PathBuf {
    fixture("gguf").join(format!("{name}.{outtype}.gguf"))
}

fn f32_cache(model: &Model) -> kvlab_engine::lab::KvCache {
    model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache")
}

fn full(model: &Model, ids: &[u32]) -> Tensor {
    let mut cache = f32_cache(model);
    model
        .forward(ids, &mut cache, Logits::All)
        .expect("forward")
}

fn chunked(model: &Model, ids: &[u32], chunks: &[usize]) -> Tensor {
    let mut cache = f32_cache(model);
    let mut at = 0;
    let mut outs = Vec::new();
    for &c in chunks {
        outs.push(
            model
                .forward(&ids[at..at + c], &mut cache, Logits::All)
                .expect("chunk"),
        );
        at += c;
    }
    Tensor::cat(&outs, 0).expect("cat")
}

fn load(path: &Path) -> Model {
    Model::load(path, &LoadOptions::default()).expect("load converted GGUF")
}

#[test]
fn converted_gemma4_files_match_the_transformers_goldens() {
    for name in GEMMA4 {
        let g = golden(name);
        let input = ids(&g["input_ids"]);
        let chunks: Vec<usize> = ids(&g["chunk_sizes"])
            .into_iter()
            .map(|c| c as usize)
            .collect();
        for (outtype, tol) in [("f32", TOL_F32), ("f16", TOL_F16)] {
            let model = load(&gguf(name, outtype));
            // Every key and tensor of llama.cpp's conversion is read: nothing ignored or assumed.
            assert_eq!(
                model.config().warnings,
                Vec::<String>::new(),
                "{name}.{outtype}"
            );
            let d_full = max_diff(&full(&model, &input), &g["logits_full"]);
            let d_inc = max_diff(&chunked(&model, &input, &chunks), &g["logits_incremental"]);
            println!("{name}.{outtype}: full {d_full:.2e}, chunked {d_inc:.2e}");
            assert!(
                d_full <= tol,
                "{name}.{outtype}: full logits off by {d_full}"
            );
            assert!(
                d_inc <= tol,
                "{name}.{outtype}: chunked logits off by {d_inc}"
            );
        }
    }
}

#[test]
fn converted_gemma4_structure_is_the_checkpoints() {
    // KV sharing (tiny_e: sliding consumers read layer 2, the full one layer 3), k_eq_v full
    // layers without attn_v (tiny_dense), per-layer kv heads and experts (tiny_moe).
    let e = load(&gguf("tiny_e", "f32"));
    let c = e.config();
    assert_eq!(c.ple.map(|p| p.dim), Some(8));
    let sources: Vec<KvSource> = c.layers.iter().map(|l| l.kv_source).collect();
    assert_eq!(sources[4], KvSource::Shared { producer: 2 });
    assert_eq!(sources[7], KvSource::Shared { producer: 3 });
    assert_eq!(
        c.layers[4].mlp_width, 256,
        "double-wide MLP on shared layers"
    );
    let d = load(&gguf("tiny_dense", "f16"));
    let full = &d.config().layers[2];
    assert_eq!(full.kind, AttentionKind::Full);
    assert!(full.k_eq_v && full.n_kv_heads == 1 && full.head_dim == 32);
    let m = load(&gguf("tiny_moe", "f32"));
    assert_eq!(
        m.config().moe.map(|s| (s.num_experts, s.top_k)),
        Some((4, 2))
    );
}

#[test]
fn converted_gemma4_vocabulary_is_a_working_tokenizer() {
    // The converter writes Gemma 4's vocabulary as `gemma4`: BPE with the tokenizer.json's
    // merges (make_gguf.py's: `▁ t`, `h e`, `▁t he`, …), byte fallback for the rest.
    let path = gguf("tiny_e", "f32");
    let tok = GemmaTokenizer::from_tokenizer(
        kvlab_engine::lab::gguf_tokenizer_from_file(&path).expect("tokenizer from the GGUF"),
        TokFamily::Gemma4,
    )
    .expect("wrap");
    let inner = tok.inner();
    let the = inner.token_to_id("▁the").expect("merged piece");
    let ids = tok.encode(" the", false).expect("encode");
    assert_eq!(ids, vec![the]);
    let ids = tok.encode("the é", true).expect("encode");
    assert_eq!(ids[0], 2, "<bos> first");
    assert_eq!(tok.decode(&ids[1..], true).expect("decode"), "the é");
}

/// The tiny Gemma 3 checkpoint as llama.cpp reads its GGUF: every 6th layer full (the file
/// has no layer types), attention scale 1/√head_dim (no query_pre_attn_scalar).
fn llama_cpp_reading_of_tiny_gemma3(dir: &Path) -> PathBuf {
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny_gemma3").join("config.json")).expect("config"),
    )
    .expect("json");
    let s = "sliding_attention";
    cfg["layer_types"] = serde_json::json!([s, s, s, s, s, "full_attention"]);
    cfg["query_pre_attn_scalar"] = cfg["head_dim"].clone();
    let path = dir.join("config.json");
    std::fs::write(&path, cfg.to_string()).expect("write config");
    path
}

#[test]
fn converted_gemma3_files_load_with_llama_cpp_assumptions_stated() {
    let g = golden("tiny_gemma3");
    let input = ids(&g["input_ids"]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let reference = Model::from_hf(
        &llama_cpp_reading_of_tiny_gemma3(tmp.path()),
        &fixture("tiny_gemma3").join("model.safetensors"),
        &LoadOptions::default(),
    )
    .expect("reference");
    let expect = full(&reference, &input);
    for (outtype, tol) in [("f32", TOL_F32), ("f16", TOL_F16)] {
        let model = load(&gguf("tiny_gemma3", outtype));
        let w = model.config().warnings.join("\n");
        assert!(w.contains("layer types"), "{outtype}: {w}");
        assert!(w.contains("query_pre_attn_scalar"), "{outtype}: {w}");
        let kinds: Vec<AttentionKind> = model.config().layers.iter().map(|l| l.kind).collect();
        assert_eq!(kinds[4], AttentionKind::Sliding);
        assert_eq!(kinds[5], AttentionKind::Full);
        let logits = full(&model, &input);
        let d = max_diff(&logits, &expect);
        println!("tiny_gemma3.{outtype}: {d:.2e} from the safetensors under llama.cpp's reading");
        assert!(d <= tol, "tiny_gemma3.{outtype}: off by {d}");
        // What the assumptions cost on this checkpoint (query_pre_attn_scalar 24, layer 2
        // full): far from the transformers goldens, as llama.cpp itself would be.
        assert!(max_diff(&logits, &g["logits_full"]) > 1.0);
    }
}
