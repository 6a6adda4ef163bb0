//! Config parsing: both spellings of the Gemma 4 fixtures resolve to the same per-layer
//! description; KV sharing, double-wide MLP, k_eq_v and Gemma 3 scaling resolve as the
//! reference implementation defines them; nested `text_config` and legacy RoPE fields parse.

use std::path::PathBuf;

use kvlab_engine::contract::{AttentionKind, Family};
use kvlab_engine::lab::{KvSource, RopeKind};
use kvlab_engine::EngineError;

fn cfg_path(name: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join(file)
}

fn text(name: &str, file: &str) -> String {
    std::fs::read_to_string(cfg_path(name, file)).expect("config")
}

#[test]
fn both_spellings_resolve_identically() {
    for name in ["tiny_e", "tiny_dense", "tiny_moe"] {
        let a = kvlab_engine::lab::load_hf_config(&cfg_path(name, "config.json"))
            .expect("transformers spelling");
        let b = kvlab_engine::lab::load_hf_config(&cfg_path(name, "config_hub_style.json"))
            .expect("hub spelling");
        assert_eq!(a.layers, b.layers, "{name}");
        assert!(a.warnings.is_empty(), "{name}: {:?}", a.warnings);
        assert!(b.warnings.is_empty(), "{name}: {:?}", b.warnings);
    }
}

#[test]
fn tiny_e_sharing_and_double_wide_mlp() {
    let c = kvlab_engine::lab::load_hf_config(&cfg_path("tiny_e", "config.json")).expect("config");
    assert_eq!(c.family, Family::Gemma4);
    let sources: Vec<KvSource> = c.layers.iter().map(|l| l.kv_source).collect();
    let shared = |p| KvSource::Shared { producer: p };
    assert_eq!(
        sources,
        vec![
            KvSource::Own,
            KvSource::Own,
            KvSource::Own,
            KvSource::Own,
            shared(2),
            shared(2),
            shared(2),
            shared(3)
        ]
    );
    let widths: Vec<usize> = c.layers.iter().map(|l| l.mlp_width).collect();
    assert_eq!(widths, vec![128, 128, 128, 128, 256, 256, 256, 256]);
    let dims: Vec<usize> = c.layers.iter().map(|l| l.head_dim).collect();
    assert_eq!(dims, vec![16, 16, 16, 32, 16, 16, 16, 32]);
    assert!(c
        .layers
        .iter()
        .all(|l| l.n_kv_heads == 1 && !l.k_eq_v && l.v_norm && l.attn_scale == 1.0));
    assert_eq!(c.ple.map(|p| (p.dim, p.vocab_size)), Some((8, 512)));
    let full = &c.layers[3];
    assert_eq!(full.kind, AttentionKind::Full);
    assert_eq!(full.sliding_window, None);
    assert_eq!(
        full.rope.kind,
        RopeKind::Proportional {
            partial_rotary_factor: 0.25
        }
    );
    assert_eq!(c.layers[0].sliding_window, Some(8));
}

#[test]
fn k_eq_v_uses_global_kv_heads_on_full_layers_only() {
    let c = kvlab_engine::lab::load_hf_config(&cfg_path("tiny_moe", "config_hub_style.json"))
        .expect("config");
    let kv: Vec<(usize, bool)> = c.layers.iter().map(|l| (l.n_kv_heads, l.k_eq_v)).collect();
    assert_eq!(
        kv,
        vec![
            (2, false),
            (2, false),
            (1, true),
            (2, false),
            (2, false),
            (1, true)
        ]
    );
    let moe = c.moe.expect("moe");
    assert_eq!((moe.num_experts, moe.top_k, moe.expert_width), (4, 2, 32));
}

#[test]
fn gemma3_scale_rope_and_norm_offset() {
    let c =
        kvlab_engine::lab::load_hf_config(&cfg_path("tiny_gemma3", "config.json")).expect("config");
    assert_eq!(c.family, Family::Gemma3);
    assert_eq!(c.norm_weight_offset, 1.0);
    assert_eq!(c.final_logit_softcap, None);
    assert!(c
        .layers
        .iter()
        .all(|l| (l.attn_scale - 24f64.powf(-0.5)).abs() < 1e-15 && !l.v_norm));
    assert_eq!(c.layers[2].rope.kind, RopeKind::Linear { factor: 8.0 });
    assert_eq!(c.layers[2].rope.theta, 1e6);
    assert_eq!(c.layers[0].rope.theta, 1e4);
}

#[test]
fn nested_text_config_and_legacy_rope_fields() {
    let json = r#"{
        "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "vision_config": {"hidden_size": 1152},
        "text_config": {
            "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16,
            "sliding_window": 8, "sliding_window_pattern": 6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}
        }
    }"#;
    let c = kvlab_engine::lab::parse_hf_config(json, "inline").expect("config");
    assert_eq!(c.eos_token_ids, vec![1, 106]);
    let kinds: Vec<AttentionKind> = c.layers.iter().map(|l| l.kind).collect();
    assert_eq!(kinds[5], AttentionKind::Full);
    assert!(kinds[..5].iter().all(|k| *k == AttentionKind::Sliding));
    assert_eq!(c.layers[5].rope.kind, RopeKind::Linear { factor: 8.0 });
    assert_eq!(c.layers[0].rope.theta, 1e4);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("sliding_window_pattern")));
}

#[test]
fn contradictions_are_errors() {
    let base = text("tiny_e", "config.json");
    let cases = [
        base.replace("\"num_kv_shared_layers\": 4", "\"num_kv_shared_layers\": 8"),
        base.replace("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3"),
        base.replace(
            "\"3\": {\n      \"head_dim\": 32\n    }",
            "\"3\": {\n      \"head_dim\": 32\n    },\n    \"9\": {\"head_dim\": 32}",
        ),
    ];
    for (i, c) in cases.iter().enumerate() {
        assert_ne!(c, &base, "case {i} did not apply");
        match kvlab_engine::lab::parse_hf_config(c, "case") {
            Err(EngineError::ConfigContradiction(_)) => {}
            other => panic!("case {i}: expected ConfigContradiction, got {other:?}"),
        }
    }
    let bad_type = base.replace("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
    assert!(matches!(
        kvlab_engine::lab::parse_hf_config(&bad_type, "yarn"),
        Err(EngineError::ConfigParse { .. })
    ));
    assert!(matches!(
        kvlab_engine::lab::parse_hf_config("[1, 2]", "array"),
        Err(EngineError::ConfigParse { .. })
    ));
}
