//! The same tiny models through the other weight layouts: sharded safetensors with the
//! multimodal `model.language_model.` prefix (vision tensors skipped), and Gemma 4 GGUF files
//! written with llama.cpp's naming by this project's own writer. They pin the plumbing (quantized
//! types, per-layer keys); the naming itself is proven on llama.cpp's converter output in
//! tests/it/gguf_converted.rs.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::max_diff;
use kvlab_engine::contract::AttentionKind;
use kvlab_engine::lab::gguf_name;
use kvlab_engine::lab::KvSource;
use kvlab_engine::lab::{KvPrecision, Logits, Model, PrecisionPolicy};
use kvlab_engine::LoadOptions;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden(name: &str) -> (Vec<u32>, Tensor) {
    let g = candle_core::safetensors::load(dir(name).join("golden.safetensors"), &Device::Cpu)
        .expect("golden");
    let ids = g["input_ids"]
        .to_vec1::<i64>()
        .expect("ids")
        .into_iter()
        .map(|x| x as u32)
        .collect();
    (ids, g["logits_full"].clone())
}

fn full_logits(model: &Model, ids: &[u32]) -> Tensor {
    let mut cache = model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache");
    model
        .forward(ids, &mut cache, Logits::All)
        .expect("forward")
}

#[test]
fn sharded_multimodal_safetensors_load() {
    let tensors =
        candle_core::safetensors::load(dir("tiny_e").join("model.safetensors"), &Device::Cpu)
            .expect("load");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in tensors.into_iter().enumerate() {
        let renamed = name.replacen("model.", "model.language_model.", 1);
        let shard = if i % 2 == 0 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        weight_map.insert(renamed.clone(), shard.into());
        if i % 2 == 0 {
            a.insert(renamed, t)
        } else {
            b.insert(renamed, t)
        };
    }
    let vision = Tensor::zeros((3, 3), candle_core::DType::F32, &Device::Cpu).expect("zeros");
    a.insert("model.vision_tower.patch_embed.weight".into(), vision);
    weight_map.insert(
        "model.vision_tower.patch_embed.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    candle_core::safetensors::save(&a, tmp.path().join("model-00001-of-00002.safetensors"))
        .expect("save a");
    candle_core::safetensors::save(&b, tmp.path().join("model-00002-of-00002.safetensors"))
        .expect("save b");
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .expect("index");
    let text: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir("tiny_e").join("config_hub_style.json")).expect("cfg"),
    )
    .expect("json");
    let wrapped = serde_json::json!({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text});
    std::fs::write(tmp.path().join("config.json"), wrapped.to_string()).expect("config");

    let model = Model::load(tmp.path(), &LoadOptions::default()).expect("load sharded");
    let (ids, reference) = golden("tiny_e");
    let d = max_diff(&full_logits(&model, &ids), &reference);
    assert!(d <= 1e-3, "sharded tiny_e: {d}");
}

/// Writes fixture `name` as a `gemma4` GGUF (all tensors f32) with llama.cpp's key names.
fn write_gemma4_gguf(name: &str, path: &std::path::Path, rope_freqs: Option<&[f32]>) {
    let cfg = kvlab_engine::lab::load_hf_config(&dir(name).join("config.json")).expect("config");
    let tensors = candle_core::safetensors::load(dir(name).join("model.safetensors"), &Device::Cpu)
        .expect("load");
    let n = cfg.num_layers();
    let arr_u32 =
        |v: Vec<usize>| Value::Array(v.into_iter().map(|x| Value::U32(x as u32)).collect());
    let full = cfg
        .layers
        .iter()
        .find(|l| l.kind == AttentionKind::Full)
        .expect("full layer");
    let swa = cfg
        .layers
        .iter()
        .find(|l| l.kind == AttentionKind::Sliding)
        .expect("sliding layer");
    let shared = cfg
        .layers
        .iter()
        .filter(|l| matches!(l.kv_source, KvSource::Shared { .. }))
        .count();
    let mut md: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("gemma4".into()),
        ),
        ("gemma4.block_count".into(), Value::U32(n as u32)),
        (
            "gemma4.embedding_length".into(),
            Value::U32(cfg.hidden_size as u32),
        ),
        (
            "gemma4.feed_forward_length".into(),
            arr_u32(cfg.layers.iter().map(|l| l.mlp_width).collect()),
        ),
        (
            "gemma4.attention.head_count".into(),
            Value::U32(cfg.layers[0].n_heads as u32),
        ),
        (
            "gemma4.attention.head_count_kv".into(),
            arr_u32(cfg.layers.iter().map(|l| l.n_kv_heads).collect()),
        ),
        (
            "gemma4.attention.sliding_window_pattern".into(),
            Value::Array(
                cfg.layers
                    .iter()
                    .map(|l| Value::Bool(l.kind == AttentionKind::Sliding))
                    .collect(),
            ),
        ),
        (
            "gemma4.attention.sliding_window".into(),
            Value::U32(cfg.sliding_window as u32),
        ),
        (
            "gemma4.attention.key_length".into(),
            Value::U32(full.head_dim as u32),
        ),
        (
            "gemma4.attention.key_length_swa".into(),
            Value::U32(swa.head_dim as u32),
        ),
        (
            "gemma4.attention.value_length".into(),
            Value::U32(full.head_dim as u32),
        ),
        (
            "gemma4.attention.value_length_swa".into(),
            Value::U32(swa.head_dim as u32),
        ),
        ("gemma4.rope.freq_base".into(), Value::F32(1e6)),
        ("gemma4.rope.freq_base_swa".into(), Value::F32(1e4)),
        (
            "gemma4.attention.layer_norm_rms_epsilon".into(),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        ("gemma4.final_logit_softcapping".into(), Value::F32(30.0)),
        (
            "gemma4.attention.shared_kv_layers".into(),
            Value::U32(shared as u32),
        ),
        ("gemma4.context_length".into(), Value::U32(256)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
    ];
    if let Some(p) = cfg.ple {
        md.push((
            "gemma4.embedding_length_per_layer_input".into(),
            Value::U32(p.dim as u32),
        ));
    }
    if let Some(m) = cfg.moe {
        md.push((
            "gemma4.expert_count".into(),
            Value::U32(m.num_experts as u32),
        ));
        md.push((
            "gemma4.expert_used_count".into(),
            Value::U32(m.top_k as u32),
        ));
        md.push((
            "gemma4.expert_feed_forward_length".into(),
            Value::U32(m.expert_width as u32),
        ));
    }
    let mut qt: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(k, t)| {
            let logical = k.strip_prefix("model.").unwrap_or(k);
            (
                gguf_name(logical),
                QTensor::quantize(t, GgmlDType::F32).expect("f32 qtensor"),
            )
        })
        .collect();
    if let Some(factors) = rope_freqs {
        let t = Tensor::new(factors, &Device::Cpu).expect("rope_freqs");
        qt.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).expect("q"),
        ));
    }
    let mut f = std::fs::File::create(path).expect("create");
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qt.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md_refs, &t_refs).expect("write gguf");
}

#[test]
fn gemma4_gguf_matches_the_safetensors_model() {
    for name in ["tiny_e", "tiny_dense", "tiny_moe"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = tmp.path().join(format!("{name}.gguf"));
        write_gemma4_gguf(name, &p, None);
        let model = Model::load(&p, &LoadOptions::default()).expect("load gguf");
        let from_hf =
            kvlab_engine::lab::load_hf_config(&dir(name).join("config.json")).expect("config");
        assert_eq!(
            model.config().layers,
            from_hf.layers,
            "{name}: GGUF config resolves differently"
        );
        let (ids, reference) = golden(name);
        let d = max_diff(&full_logits(&model, &ids), &reference);
        println!("{name} via GGUF: max|Δ| = {d:.2e}");
        assert!(d <= 1e-3, "{name} via GGUF: {d}");
    }
}

#[test]
fn gemma4_gguf_reads_proportional_rope_from_freq_factors() {
    // Full head dim 32: 16 pairs, 4 rotated (factor 1), 12 identity (factor 1e30) = 0.25.
    let mut factors = vec![1.0f32; 4];
    factors.extend(std::iter::repeat_n(1e30f32, 12));
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("tiny_e.gguf");
    write_gemma4_gguf("tiny_e", &p, Some(&factors));
    let model = Model::load(&p, &LoadOptions::default()).expect("load gguf");
    assert!(!model
        .config()
        .warnings
        .iter()
        .any(|w| w.contains("partial_rotary_factor")));
    let (ids, reference) = golden("tiny_e");
    assert!(max_diff(&full_logits(&model, &ids), &reference) <= 1e-3);

    // Half the pairs rotated: a different (wrong for this checkpoint) model, visibly so.
    let mut half = vec![1.0f32; 8];
    half.extend(std::iter::repeat_n(1e30f32, 8));
    write_gemma4_gguf("tiny_e", &p, Some(&half));
    let model = Model::load(&p, &LoadOptions::default()).expect("load gguf");
    let full = model
        .config()
        .layers
        .iter()
        .find(|l| l.kind == AttentionKind::Full)
        .expect("full");
    assert_eq!(
        full.rope.kind,
        kvlab_engine::lab::RopeKind::Proportional {
            partial_rotary_factor: 0.5
        }
    );
    assert!(max_diff(&full_logits(&model, &ids), &reference) > 1e-2);
}
