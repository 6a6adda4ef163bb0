//! Opens safetensors checkpoints (one file, or shards listed by
//! `model.safetensors.index.json`) memory-mapped, and detects the tensor-name prefix.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;

use crate::error::{EngineError, Result};

fn corrupt(path: &Path, reason: impl std::fmt::Display) -> EngineError {
    EngineError::CorruptFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn ensure_readable(path: &Path) -> Result<()> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// An open checkpoint: the mapping, the path to cite in errors, and its shard files.
pub(super) type Opened = (MmapedSafetensors, PathBuf, Vec<PathBuf>);

/// Maps a single file, a directory with `model.safetensors`, or a directory with a sharded
/// index.
pub(super) fn open(path: &Path) -> Result<Opened> {
    ensure_readable(path)?;
    if path.is_dir() {
        let index = path.join("model.safetensors.index.json");
        if index.exists() {
            return open_sharded(path, &index);
        }
        return open(&path.join("model.safetensors"));
    }
    if path.file_name().and_then(|n| n.to_str()) == Some("model.safetensors.index.json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        return open_sharded(dir, path);
    }
    super::safetensors_check::check_file(path).map_err(|e| corrupt(path, e))?;
    // SAFETY: the mapping is read-only; a file modified while mapped is the caller's
    // responsibility, as with every memory-mapped loader.
    let st = unsafe { MmapedSafetensors::new(path) }.map_err(|e| corrupt(path, e))?;
    Ok((st, path.to_path_buf(), vec![path.to_path_buf()]))
}

fn open_sharded(dir: &Path, index: &Path) -> Result<Opened> {
    let text = std::fs::read_to_string(index).map_err(|source| EngineError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| corrupt(index, e))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| corrupt(index, "no `weight_map` object"))?;
    let mut shards = BTreeSet::new();
    for (name, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| corrupt(index, format!("shard of `{name}` is not a file name")))?;
        if f.contains("..") || Path::new(f).is_absolute() {
            return Err(corrupt(
                index,
                format!("shard path `{f}` leaves the model directory"),
            ));
        }
        shards.insert(dir.join(f));
    }
    if shards.is_empty() {
        return Err(corrupt(index, "empty weight_map"));
    }
    let shards: Vec<PathBuf> = shards.into_iter().collect();
    for s in &shards {
        ensure_readable(s)?;
        super::safetensors_check::check_file(s).map_err(|e| corrupt(s, e))?;
    }
    // SAFETY: as in `open`: read-only mappings.
    let st = unsafe { MmapedSafetensors::multi(&shards) }.map_err(|e| corrupt(index, e))?;
    Ok((st, index.to_path_buf(), shards))
}

/// `model.language_model.` (multimodal checkpoints), `model.` (text-only) or nothing.
pub(super) fn detect_prefix(st: &MmapedSafetensors) -> String {
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    for p in ["model.language_model.", "model."] {
        if names
            .iter()
            .any(|n| n.starts_with(p) && n.ends_with("embed_tokens.weight"))
        {
            return p.to_string();
        }
    }
    String::new()
}
