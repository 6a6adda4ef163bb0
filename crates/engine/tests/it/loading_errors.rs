//! Broken inputs are named, typed errors, never panics: missing tensor, wrong shape,
//! unsupported architecture, truncated file, corrupt header, contradictory config.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use kvlab_engine::lab::Model;
use kvlab_engine::{EngineError, LoadOptions};

use crate::common::{self, fixture};

/// A temp dir holding tiny_dense's config and the given tensors.
fn write_model(tensors: &HashMap<String, Tensor>, config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    candle_core::safetensors::save(tensors, dir.path().join("model.safetensors")).expect("save");
    std::fs::write(dir.path().join("config.json"), config).expect("config");
    dir
}

fn dense_tensors() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture("tiny_dense/model.safetensors"), &Device::Cpu)
        .expect("fixture")
}

fn dense_config() -> String {
    std::fs::read_to_string(fixture("tiny_dense/config.json")).expect("config")
}

fn load_dir(dir: &Path) -> Result<Model, EngineError> {
    Model::load(dir, &LoadOptions::default())
}

#[test]
fn missing_tensor_is_named() {
    let mut t = dense_tensors();
    t.remove("model.layers.1.mlp.up_proj.weight");
    let dir = write_model(&t, &dense_config());
    match load_dir(dir.path()) {
        Err(EngineError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.1.mlp.up_proj.weight")
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn wrong_shape_reports_both_shapes() {
    let mut t = dense_tensors();
    t.insert(
        "model.layers.0.self_attn.q_proj.weight".into(),
        Tensor::zeros((60, 64), candle_core::DType::F32, &Device::Cpu).expect("zeros"),
    );
    let dir = write_model(&t, &dense_config());
    match load_dir(dir.path()) {
        Err(EngineError::ShapeMismatch {
            name,
            expected,
            actual,
        }) => {
            assert_eq!(name, "model.layers.0.self_attn.q_proj.weight");
            assert_eq!(expected, vec![64, 64]);
            assert_eq!(actual, vec![60, 64]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let cfg = dense_config().replace("\"gemma4_text\"", "\"llama\"");
    let dir = write_model(&dense_tensors(), &cfg);
    match load_dir(dir.path()) {
        Err(EngineError::UnsupportedArchitecture(a)) => assert_eq!(a, "llama"),
        other => panic!("expected UnsupportedArchitecture, got {other:?}"),
    }
}

#[test]
fn contradictory_layer_types_are_rejected() {
    let cfg = dense_config().replace("\"num_hidden_layers\": 6", "\"num_hidden_layers\": 7");
    let dir = write_model(&dense_tensors(), &cfg);
    match load_dir(dir.path()) {
        Err(EngineError::ConfigContradiction(m)) => {
            assert!(
                m.contains("layer_types has 6 entries") && m.contains("7"),
                "{m}"
            )
        }
        other => panic!("expected ConfigContradiction, got {other:?}"),
    }
}

#[test]
fn contradictory_head_dims_are_rejected() {
    // Hub spelling and transformers spelling disagreeing on the full-layer head dim.
    let cfg = dense_config().replace(
        "\"head_dim\": 16,",
        "\"head_dim\": 16, \"global_head_dim\": 64,",
    );
    let dir = write_model(&dense_tensors(), &cfg);
    assert!(matches!(
        load_dir(dir.path()),
        Err(EngineError::ConfigContradiction(_))
    ));
}

#[test]
fn unknown_config_fields_become_warnings() {
    let cfg = dense_config().replace(
        "\"head_dim\": 16,",
        "\"head_dim\": 16, \"fancy_new_knob\": 3,",
    );
    let dir = write_model(&dense_tensors(), &cfg);
    let model = load_dir(dir.path()).expect("loads");
    assert!(model
        .config()
        .warnings
        .iter()
        .any(|w| w.contains("fancy_new_knob")));
}

#[test]
fn truncated_safetensors_is_corrupt_file() {
    let bytes = std::fs::read(fixture("tiny_dense/model.safetensors")).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .expect("write");
    std::fs::write(dir.path().join("config.json"), dense_config()).expect("config");
    match load_dir(dir.path()) {
        Err(EngineError::CorruptFile { path, .. }) => assert!(path.ends_with("model.safetensors")),
        other => panic!("expected CorruptFile, got {other:?}"),
    }
}

#[test]
fn corrupt_safetensors_header_is_corrupt_file() {
    let mut bytes = std::fs::read(fixture("tiny_dense/model.safetensors")).expect("read");
    for b in bytes.iter_mut().skip(8).take(16) {
        *b = b'#';
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("model.safetensors"), &bytes).expect("write");
    std::fs::write(dir.path().join("config.json"), dense_config()).expect("config");
    assert!(matches!(
        load_dir(dir.path()),
        Err(EngineError::CorruptFile { .. })
    ));
}

#[test]
fn missing_config_is_io_error_with_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    match load_dir(dir.path()) {
        Err(EngineError::Io { path, .. }) => assert!(path.ends_with("config.json")),
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn minimal_gguf_loads_and_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("m.gguf");
    common::write_tiny_gguf(&p, 1);
    let model = Model::load(&p, &LoadOptions::default()).expect("load");
    let mut cache = model
        .new_cache(&kvlab_engine::lab::PrecisionPolicy::uniform(
            kvlab_engine::lab::KvPrecision::F32,
        ))
        .expect("cache");
    let l = model
        .forward(&[2, 5, 7], &mut cache, kvlab_engine::lab::Logits::All)
        .expect("forward");
    assert_eq!(l.dims(), &[3, 64]);
}

#[test]
fn gguf_of_other_architecture_is_unsupported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("m.gguf");
    common::write_tiny_gguf_as(&p, "llama", 1);
    match Model::load(&p, &LoadOptions::default()) {
        Err(EngineError::UnsupportedArchitecture(a)) => assert_eq!(a, "llama"),
        other => panic!("expected UnsupportedArchitecture, got {other:?}"),
    }
}

#[test]
fn truncated_gguf_is_corrupt_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("m.gguf");
    common::write_tiny_gguf(&p, 1);
    let bytes = std::fs::read(&p).expect("read");
    std::fs::write(&p, &bytes[..bytes.len() - 100]).expect("truncate");
    match Model::load(&p, &LoadOptions::default()) {
        Err(EngineError::CorruptFile { reason, .. }) => assert!(
            reason.contains("blk.0")
                || reason.contains("token_embd")
                || reason.contains("output_norm"),
            "{reason}"
        ),
        other => panic!("expected CorruptFile, got {other:?}"),
    }
    // A header cut short is corrupt too.
    std::fs::write(&p, &bytes[..40]).expect("truncate");
    assert!(matches!(
        Model::load(&p, &LoadOptions::default()),
        Err(EngineError::CorruptFile { .. })
    ));
}

#[test]
fn bad_gguf_magic_is_corrupt_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, b"NOPE0000000000000000000000000000").expect("write");
    assert!(matches!(
        Model::load(&p, &LoadOptions::default()),
        Err(EngineError::CorruptFile { .. })
    ));
}
