//! Model files that lie, fed to the engine thread the way the app loads a model: each header
//! that declares more than its file holds (tensor and metadata counts, string and array
//! lengths, dimensions, offsets, vocabulary arrays, a safetensors header over its limit), each
//! config that contradicts its tensors, and weights holding NaN or Inf must come back as a
//! coded error, with the model loaded before still loaded and usable. Each test is named
//! `hostile_*` and prints `HOSTILE <fault> -> <code>` for the tally (scripts/hostile.sh).

use crate::common;

// HOSTILE lines go to the stderr handle itself, which libtest does not capture, so
// scripts/hostile.sh finds them in an ordinary `cargo test` log.
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ErrorCode, Event};
use kvlab_engine::GenerateRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};
use kvlab_engine::{JobError, LoadRequest};

/// An engine with the tiny dense fixture loaded: what the user had before the hostile file.
struct Lab {
    engine: EngineHandle,
    tokenizer: PathBuf,
    dir: tempfile::TempDir,
}

fn request(path: &Path, tokenizer: &Path) -> LoadRequest {
    LoadRequest {
        tokenizer: Some(tokenizer.to_path_buf()),
        cache: CacheSelection::Spec("f32".into()),
        ..LoadRequest::new(ModelSource::Local {
            path: path.to_path_buf(),
        })
    }
}

fn lab() -> Lab {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    let good = common::fixture("tiny_dense").join("model.safetensors");
    engine
        .submit(request(&good, &tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("load the fixture");
    Lab {
        engine,
        tokenizer,
        dir,
    }
}

impl Lab {
    /// Writes `bytes` as `name` in the lab's directory.
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    }

    /// Loads `path`, which must be refused with `code` and a message holding `says`; the
    /// model loaded before stays loaded and still generates.
    fn refused(&self, row: &str, path: &Path, code: ErrorCode, says: &str) -> JobError {
        let before = self.engine.status().model.expect("a model before");
        let err = self
            .engine
            .submit(request(path, &self.tokenizer))
            .and_then(|t| t.wait(|_| true))
            .expect_err("a lying file must be refused");
        let _ = std::io::stderr()
            .lock()
            .write_all(format!("{}\n", format_args!("HOSTILE {row} -> {}", err.code)).as_bytes());
        assert_eq!(err.code, code, "{row}: {err}");
        assert!(err.message.contains(says), "{row}: {}", err.message);
        let after = self.engine.status().model.expect("the model is kept");
        assert_eq!(after.name, before.name, "{row}");
        assert_eq!(generate(&self.engine).len(), 3, "{row}: still generates");
        err
    }
}

/// Three greedy tokens, or the error's code.
fn try_generate(engine: &EngineHandle) -> Result<Vec<u32>, ErrorCode> {
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: 3,
        ..GenerateRequest::new(Prompt::Ids {
            ids: vec![2, 9, 17, 33],
        })
    };
    let rx = engine.submit(req).expect("send");
    for ev in rx.events() {
        match ev {
            Event::Done { token_ids, .. } => return Ok(token_ids),
            Event::Error { code, .. } => return Err(code),
            _ => {}
        }
    }
    panic!("the generation ended without done or error")
}

fn generate(engine: &EngineHandle) -> Vec<u32> {
    try_generate(engine).expect("generate")
}

/// A GGUF header written by hand, so that it can lie.
struct Raw(Vec<u8>);

impl Raw {
    fn new(tensors: u64, metadata: u64) -> Self {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(metadata.to_le_bytes());
        Raw(b)
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> Self {
        let mut r = self.u64(s.len() as u64);
        r.0.extend(s.as_bytes());
        r
    }
    /// A string array (GGUF type 9 of type 8).
    fn strings(self, key: &str, items: &[&str]) -> Self {
        let mut r = self.str(key).u32(9).u32(8).u64(items.len() as u64);
        for s in items {
            r = r.str(s);
        }
        r
    }
    /// Zero padding, as if tensor data followed.
    fn pad(mut self, n: usize) -> Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

#[test]
fn hostile_gguf_tensor_count_over_file_length() {
    let lab = lab();
    let p = lab.file("count.gguf", &Raw::new(1 << 40, 0).pad(64).0);
    lab.refused(
        "gguf tensor count over the file's length",
        &p,
        ErrorCode::BadModelFile,
        "1099511627776 tensors",
    );
}

#[test]
fn hostile_gguf_metadata_count_over_file_length() {
    let lab = lab();
    let p = lab.file("kv.gguf", &Raw::new(0, u64::MAX / 2).pad(64).0);
    lab.refused(
        "gguf metadata count over the file's length",
        &p,
        ErrorCode::BadModelFile,
        "metadata entries",
    );
}

#[test]
fn hostile_gguf_string_length_over_file_length() {
    let lab = lab();
    let raw = Raw::new(0, 1)
        .str("general.architecture")
        .u32(8)
        .u64(1 << 29)
        .pad(64);
    let p = lab.file("string.gguf", &raw.0);
    lab.refused(
        "gguf metadata string longer than the file",
        &p,
        ErrorCode::BadModelFile,
        "needs 536870912 bytes",
    );
}

#[test]
fn hostile_gguf_array_length_over_file_length() {
    let lab = lab();
    // 2^40 f32 scores would be 4 TiB: the file holds 64 bytes after the count.
    let raw = Raw::new(0, 1)
        .str("tokenizer.ggml.scores")
        .u32(9)
        .u32(6)
        .u64(1 << 40)
        .pad(64);
    let p = lab.file("array.gguf", &raw.0);
    lab.refused(
        "gguf metadata array longer than the file",
        &p,
        ErrorCode::BadModelFile,
        "1099511627776 entries",
    );
}

#[test]
fn hostile_gguf_tensor_dims_overflow() {
    let lab = lab();
    let raw = Raw::new(1, 0)
        .str("token_embd.weight")
        .u32(4)
        .u64(1 << 20)
        .u64(1 << 20)
        .u64(1 << 20)
        .u64(1 << 20)
        .u32(0)
        .u64(0)
        .pad(64);
    let p = lab.file("dims.gguf", &raw.0);
    lab.refused(
        "gguf tensor dimensions that overflow",
        &p,
        ErrorCode::BadModelFile,
        "overflow",
    );
    let raw = Raw::new(1, 0).str("w").u32(9).pad(128);
    let p = lab.file("ndims.gguf", &raw.0);
    lab.refused(
        "gguf tensor with 9 dimensions",
        &p,
        ErrorCode::BadModelFile,
        "9 dimensions",
    );
}

#[test]
fn hostile_gguf_tensor_offset_past_the_end() {
    let lab = lab();
    let raw = Raw::new(1, 0)
        .str("output_norm.weight")
        .u32(1)
        .u64(8)
        .u32(0)
        .u64(1 << 40)
        .pad(96);
    let p = lab.file("offset.gguf", &raw.0);
    lab.refused(
        "gguf tensor offset past the end of the file",
        &p,
        ErrorCode::BadModelFile,
        "needs 32 bytes at data offset 1099511627776",
    );
}

#[test]
fn hostile_gguf_vocabulary_arrays_disagree() {
    let lab = lab();
    let raw = Raw::new(0, 2)
        .strings("tokenizer.ggml.tokens", &["<pad>", "<eos>", "<bos>"])
        .str("tokenizer.ggml.scores")
        .u32(9)
        .u32(6)
        .u64(2)
        .u32(0)
        .u32(0)
        .pad(64);
    let p = lab.file("vocab.gguf", &raw.0);
    lab.refused(
        "gguf tokenizer scores fewer than its tokens",
        &p,
        ErrorCode::BadModelFile,
        "has 2 entries for 3 tokens",
    );
}

#[test]
fn hostile_gguf_vocabulary_piece_too_long() {
    let lab = lab();
    let long = "a".repeat(4096);
    let raw = Raw::new(0, 1)
        .strings("tokenizer.ggml.tokens", &["<pad>", &long])
        .pad(64);
    let p = lab.file("piece.gguf", &raw.0);
    lab.refused(
        "gguf tokenizer piece of 4096 bytes",
        &p,
        ErrorCode::BadModelFile,
        "4096 bytes long",
    );
}

#[test]
fn hostile_gguf_layer_count_no_model_has() {
    let lab = lab();
    let p = lab.dir.path().join("layers.gguf");
    common::write_tiny_gguf(&p, 1 << 30);
    lab.refused(
        "gguf config declaring 2^30 layers",
        &p,
        ErrorCode::BadModelFile,
        "1073741824 layers",
    );
}

#[test]
fn hostile_gguf_layer_count_contradicts_tensors() {
    let lab = lab();
    let p = lab.dir.path().join("two.gguf");
    common::write_tiny_gguf(&p, 2);
    lab.refused(
        "gguf config declaring 2 layers over tensors for 1",
        &p,
        ErrorCode::BadModelFile,
        "declares 2 layers, but the checkpoint holds tensors for 1",
    );
    // The same file telling the truth loads: the refusals above are about the lies.
    let ok = lab.dir.path().join("one.gguf");
    common::write_tiny_gguf(&ok, 1);
    let t64 = lab.dir.path().join("t64");
    std::fs::create_dir_all(&t64).expect("dir");
    let tok = common::write_tokenizer(&t64, 64);
    lab.engine
        .submit(request(&ok, &tok))
        .and_then(|t| t.wait(|_| true))
        .expect("the honest file loads");
}

/// A safetensors file of `header` (as JSON) over `data` bytes, with the fixture's config.
fn write_safetensors(dir: &Path, header: &[u8], data: &[u8]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header);
    b.extend(data);
    let p = dir.join("model.safetensors");
    std::fs::write(&p, b).expect("write");
    let config = common::fixture("tiny_dense").join("config.json");
    std::fs::copy(config, dir.join("config.json")).expect("config");
    p
}

#[test]
fn hostile_safetensors_header_over_its_limit() {
    let lab = lab();
    let dir = lab.dir.path().join("limit");
    let p = write_safetensors(&dir, b"{}", &[0; 64]);
    // The length prefix claims 200 MB, over the format's 100 MB limit.
    let mut bytes = std::fs::read(&p).expect("read");
    bytes[..8].copy_from_slice(&200_000_000u64.to_le_bytes());
    std::fs::write(&p, bytes).expect("write");
    lab.refused(
        "safetensors header over its 100 MB limit",
        &p,
        ErrorCode::BadModelFile,
        "over the format's limit",
    );
}

#[test]
fn hostile_safetensors_header_longer_than_the_file() {
    let lab = lab();
    let dir = lab.dir.path().join("long");
    let p = write_safetensors(&dir, b"{}", &[0; 64]);
    let mut bytes = std::fs::read(&p).expect("read");
    bytes[..8].copy_from_slice(&4096u64.to_le_bytes());
    std::fs::write(&p, bytes).expect("write");
    lab.refused(
        "safetensors header longer than the file",
        &p,
        ErrorCode::BadModelFile,
        "declares 4096 bytes, but the file holds 66",
    );
}

/// The fixture's header and data, split.
fn fixture_parts() -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let bytes = std::fs::read(common::fixture("tiny_dense").join("model.safetensors")).expect("r");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).expect("json");
    (header, bytes[8 + n..].to_vec())
}

#[test]
fn hostile_safetensors_shape_contradicts_its_span() {
    let lab = lab();
    let (mut header, data) = fixture_parts();
    header["model.layers.0.self_attn.q_proj.weight"]["shape"] = serde_json::json!([64, 4096]);
    let dir = lab.dir.path().join("span");
    let p = write_safetensors(
        &dir,
        serde_json::to_string(&header).expect("j").as_bytes(),
        &data,
    );
    lab.refused(
        "safetensors tensor shape larger than its byte span",
        &p,
        ErrorCode::BadModelFile,
        "needs 1048576 bytes, its span holds 16384",
    );
    let (mut header, data) = fixture_parts();
    header["model.norm.weight"]["data_offsets"] =
        serde_json::json!([1u64 << 50, (1u64 << 50) + 256]);
    let dir = lab.dir.path().join("past");
    let p = write_safetensors(
        &dir,
        serde_json::to_string(&header).expect("j").as_bytes(),
        &data,
    );
    lab.refused(
        "safetensors tensor offset past the end of the file",
        &p,
        ErrorCode::BadModelFile,
        "past the",
    );
}

/// The fixture's tensors with its config edited by `edit`, in a fresh directory.
fn fixture_with_config(
    lab: &Lab,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let dir = lab.dir.path().join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    let src = common::fixture("tiny_dense");
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).expect("copy");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("read"))
            .expect("json");
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write");
    dir.join("model.safetensors")
}

#[test]
fn hostile_config_dims_contradict_the_tensors() {
    let lab = lab();
    let p = fixture_with_config(&lab, "fewer", |c| {
        c["num_hidden_layers"] = 5.into();
        c["layer_types"].as_array_mut().expect("types").pop();
        c["per_layer_config"]
            .as_object_mut()
            .expect("o")
            .remove("5");
    });
    lab.refused(
        "config declaring 5 layers over tensors for 6",
        &p,
        ErrorCode::BadModelFile,
        "declares 5 layers, but the checkpoint holds tensors for 6",
    );
    let p = fixture_with_config(&lab, "wide", |c| c["intermediate_size"] = 256.into());
    lab.refused(
        "config whose MLP width contradicts the tensors",
        &p,
        ErrorCode::BadModelFile,
        "mlp",
    );
    let p = fixture_with_config(&lab, "huge", |c| c["hidden_size"] = (1u64 << 40).into());
    lab.refused(
        "config declaring a hidden size of 2^40",
        &p,
        ErrorCode::BadModelFile,
        "hidden_size is 1099511627776",
    );
}

/// The fixture with `value` written into the first element of every tensor named in `names`.
fn poisoned(lab: &Lab, name: &str, names: &[&str], value: f32) -> PathBuf {
    let dir = lab.dir.path().join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    let src = common::fixture("tiny_dense");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).expect("load");
    for n in names {
        let t = &tensors[*n];
        let mut v = t
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("f32");
        v[0] = value;
        let shape = t.shape().clone();
        tensors.insert(
            n.to_string(),
            Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor"),
        );
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("save");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).expect("config");
    dir.join("model.safetensors")
}

/// Loads `path` (which loads: the values are well-formed floats), then generates: the
/// non-finite logits are a coded error, the cache is emptied, the model loaded before the
/// poisoned one is gone only because the user replaced it, and loading it again works.
fn non_finite(lab: &Lab, row: &str, path: &Path) {
    lab.engine
        .submit(request(path, &lab.tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("a NaN is a valid f32: the file loads");
    let code = try_generate(&lab.engine).expect_err("non-finite logits are refused");
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{}\n", format_args!("HOSTILE {row} -> {code}")).as_bytes());
    assert_eq!(code, ErrorCode::NonFiniteLogits, "{row}");
    let status = lab.engine.status();
    assert_eq!(
        status.context_tokens, 0,
        "{row}: the poisoned cache is dropped"
    );
    assert_eq!(status.kv.total_used, 0, "{row}");
    let good = common::fixture("tiny_dense").join("model.safetensors");
    lab.engine
        .submit(request(&good, &lab.tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("reload");
    assert_eq!(generate(&lab.engine).len(), 3, "{row}: usable again");
}

#[test]
fn hostile_nan_weights_are_non_finite_logits() {
    let lab = lab();
    let p = poisoned(
        &lab,
        "nan",
        &["model.layers.0.mlp.down_proj.weight"],
        f32::NAN,
    );
    non_finite(&lab, "NaN in a weight", &p);
}

#[test]
fn hostile_inf_weights_are_non_finite_logits() {
    let lab = lab();
    let p = poisoned(
        &lab,
        "inf",
        &["model.layers.0.self_attn.v_proj.weight"],
        f32::INFINITY,
    );
    non_finite(&lab, "Inf in a weight", &p);
}

/// The tiny Gemma 3 GGUF with `patch` applied to its bytes.
fn gguf_patched(lab: &Lab, name: &str, patch: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let src = common::fixture("gguf").join("tiny_gemma3.f32.gguf");
    let mut bytes = std::fs::read(&src).expect("fixture");
    patch(&mut bytes);
    lab.file(name, &bytes)
}

#[test]
fn hostile_a_gguf_with_non_finite_numbers_is_refused_at_load() {
    let lab = lab();
    // A NaN as the first value of a weight read early (an f32 tensor here; a quantized one's
    // block scale is found the same way, by the unit test of the check).
    let p = gguf_patched(&lab, "nan-weight.gguf", |bytes| {
        let mut cursor = std::io::Cursor::new(bytes.as_slice());
        let content = candle_core::quantized::gguf_file::Content::read(&mut cursor).expect("read");
        let info = &content.tensor_infos["blk.0.ffn_down.weight"];
        let at = (content.tensor_data_offset + info.offset) as usize;
        bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    lab.refused(
        "gguf with a NaN weight scale",
        &p,
        ErrorCode::BadModelFile,
        "non-finite",
    );
    // A NaN RoPE base: the header's `gemma3.rope.freq_base` (an f32, type 6).
    let p = gguf_patched(&lab, "nan-rope.gguf", |bytes| {
        let key = b"gemma3.rope.freq_base";
        let at = bytes
            .windows(key.len() + 4)
            .position(|w| w.starts_with(key) && w[key.len()..] == 6u32.to_le_bytes())
            .expect("the key")
            + key.len()
            + 4;
        bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    lab.refused(
        "gguf with a NaN rope_freq_base",
        &p,
        ErrorCode::BadModelFile,
        "rope_theta",
    );
}
