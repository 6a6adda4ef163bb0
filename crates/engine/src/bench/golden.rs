//! A loaded model against a golden reference file (`input_ids`, `logits_full` and optionally
//! `chunk_sizes` + `logits_incremental`, as the tiny fixtures' `golden.safetensors` written
//! by the reference implementation): the whole sequence in one forward, then the same ids
//! in the file's chunk schedule (so cached decode steps are checked too), on the model's
//! device, dtype and cache policy. `kvlab bench decode --golden` uses it to smoke-test a
//! device (Metal) against references made on the CPU.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::kv::PrecisionPolicy;
use crate::models::common::{Logits, Model};

/// How far a model's logits are from the golden ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoldenReport {
    /// Positions compared.
    pub tokens: usize,
    /// Largest |logit − reference| over every position, sequence in one forward.
    pub full_max_abs_diff: f32,
    /// The same for the chunked run (`None` when the file has no schedule).
    pub incremental_max_abs_diff: Option<f32>,
    /// Fraction of positions whose top token equals the reference's (one-forward run).
    pub top1_agreement: f64,
}

impl GoldenReport {
    /// The larger of the two runs' differences.
    pub fn max_abs_diff(&self) -> f32 {
        self.full_max_abs_diff
            .max(self.incremental_max_abs_diff.unwrap_or(0.0))
    }
}

fn corrupt(path: &Path, reason: impl Into<String>) -> EngineError {
    EngineError::CorruptFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Non-negative integers of a 1-D integer tensor of the golden file.
fn ints(
    g: &std::collections::HashMap<String, Tensor>,
    name: &str,
    path: &Path,
) -> Result<Vec<usize>> {
    let t = g
        .get(name)
        .ok_or_else(|| corrupt(path, format!("no `{name}` tensor")))?;
    let v = t
        .to_dtype(DType::I64)
        .and_then(|t| t.to_vec1::<i64>())
        .map_err(|e| corrupt(path, format!("`{name}`: {e}")))?;
    v.into_iter()
        .map(|x| usize::try_from(x).map_err(|_| corrupt(path, format!("`{name}` holds {x}"))))
        .collect()
}

/// Largest |a − b| of two f32 tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor, what: &str) -> Result<f32> {
    if a.dims() != b.dims() {
        return Err(EngineError::invalid(format!(
            "{what}: logits {:?} against golden {:?}",
            a.dims(),
            b.dims()
        )));
    }
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

/// f32 host copy of the model's logits.
fn host(t: Tensor) -> Result<Tensor> {
    Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?)
}

/// Runs the golden file's ids through `model` with fresh caches of `policy` (see the module
/// doc) and measures the logits against the reference.
pub fn check_golden(model: &Model, policy: &PrecisionPolicy, path: &Path) -> Result<GoldenReport> {
    std::fs::metadata(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let g = candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| corrupt(path, e.to_string()))?;
    let ids: Vec<u32> = ints(&g, "input_ids", path)?
        .into_iter()
        .map(|i| u32::try_from(i).map_err(|_| corrupt(path, format!("token id {i}"))))
        .collect::<Result<_>>()?;
    if ids.is_empty() {
        return Err(corrupt(path, "`input_ids` is empty"));
    }
    let reference = host(
        g.get("logits_full")
            .ok_or_else(|| corrupt(path, "no `logits_full` tensor"))?
            .clone(),
    )?;
    let mut cache = model.new_cache(policy)?;
    let full = host(model.forward(&ids, &mut cache, Logits::All)?)?;
    let full_max_abs_diff = max_abs_diff(&full, &reference, "one forward")?;
    let agree = full
        .argmax(1)?
        .eq(&reference.argmax(1)?)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    let incremental_max_abs_diff = match g.get("logits_incremental") {
        None => None,
        Some(inc) => {
            let chunks = ints(&g, "chunk_sizes", path)?;
            if chunks.iter().sum::<usize>() != ids.len() || chunks.contains(&0) {
                return Err(corrupt(path, "`chunk_sizes` do not cut `input_ids`"));
            }
            let mut cache = model.new_cache(policy)?;
            let mut outs = Vec::with_capacity(chunks.len());
            let mut at = 0;
            for c in chunks {
                outs.push(host(model.forward(
                    &ids[at..at + c],
                    &mut cache,
                    Logits::All,
                )?)?);
                at += c;
            }
            let got = Tensor::cat(&outs, 0)?;
            Some(max_abs_diff(&got, &host(inc.clone())?, "chunked")?)
        }
    };
    Ok(GoldenReport {
        tokens: ids.len(),
        full_max_abs_diff,
        incremental_max_abs_diff,
        top1_agreement: agree as f64 / ids.len() as f64,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::kv::{CacheSpec, KvPrecision};
    use crate::LoadOptions;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    #[test]
    fn the_tiny_fixtures_match_their_goldens_and_a_wrong_cache_does_not() -> Result<()> {
        for name in ["tiny_gemma3", "tiny_e"] {
            let model = Model::load(&fixture(name), &LoadOptions::default())?;
            let golden = fixture(name).join("golden.safetensors");
            let f32p = PrecisionPolicy::uniform(KvPrecision::F32);
            let r = check_golden(&model, &f32p, &golden)?;
            assert_eq!(r.tokens, 40);
            assert!(r.max_abs_diff() <= 1e-3, "{name}: {r:?}");
            assert!(r.incremental_max_abs_diff.is_some());
            assert_eq!(r.top1_agreement, 1.0);
            // 2-bit codes everywhere move the logits far past the f32 tolerance.
            let tq2 = CacheSpec::parse("tq2@all")?.to_policy();
            let r = check_golden(&model, &tq2, &golden)?;
            assert!(r.max_abs_diff() > 1e-2, "{name}: {r:?}");
        }
        Ok(())
    }

    #[test]
    fn missing_and_malformed_files_are_typed_errors() -> Result<()> {
        let model = Model::load(&fixture("tiny_gemma3"), &LoadOptions::default())?;
        let f32p = PrecisionPolicy::uniform(KvPrecision::F32);
        let dir = tempfile::tempdir().map_err(|e| EngineError::invalid(e.to_string()))?;
        let missing = dir.path().join("none.safetensors");
        assert!(matches!(
            check_golden(&model, &f32p, &missing),
            Err(EngineError::Io { .. })
        ));
        let garbage = dir.path().join("garbage.safetensors");
        std::fs::write(&garbage, b"not a safetensors file").map_err(|source| EngineError::Io {
            path: garbage.clone(),
            source,
        })?;
        assert!(matches!(
            check_golden(&model, &f32p, &garbage),
            Err(EngineError::CorruptFile { .. })
        ));
        // The model weights hold no `input_ids`.
        let weights = fixture("tiny_gemma3").join("model.safetensors");
        assert!(matches!(
            check_golden(&model, &f32p, &weights),
            Err(EngineError::CorruptFile { .. })
        ));
        Ok(())
    }
}
