//! In-situ quantization of safetensors weights (mistral.rs's `--isq`): each matrix is read
//! from its file in row chunks, converted to f32 one chunk at a time and quantized into its
//! final blocks, the chunks spread over the cores (rayon). Only the quantized result and one
//! chunk per thread are ever in memory: the dense model is never resident.
//!
//! Reads go through positioned file reads rather than the memory map: pages of a map count
//! in the process's resident set until the kernel drops them, so quantizing a 10 GB
//! checkpoint through the map would show 10 GB resident at the peak; read pages stay in the
//! page cache, shared and reclaimable, and out of the process.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ8_0, GgmlType};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::{EngineError, Result};

/// Values converted per task: 1 Mi values (4 MiB of f32 per thread).
const CHUNK_VALUES: usize = 1 << 20;

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte offset of the data in its file.
    start: u64,
}

/// The tensor directory of a safetensors checkpoint (one file or shards), from the headers.
#[derive(Debug)]
pub(super) struct Index {
    files: Vec<(PathBuf, File)>,
    entries: HashMap<String, Entry>,
}

fn corrupt(path: &Path, reason: impl std::fmt::Display) -> EngineError {
    EngineError::CorruptFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn dtype_of(code: &str) -> Option<DType> {
    Some(match code {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        _ => return None,
    })
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        let n = file.seek_read(buf, offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

impl Index {
    /// Reads the headers of `shards` (8-byte length, then JSON). Tensors of types other than
    /// f32/f16/bf16 are left out (the loader then reads them through the map, as before).
    pub(super) fn open(shards: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(shards.len());
        let mut entries = HashMap::new();
        for (i, path) in shards.iter().enumerate() {
            let file = File::open(path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut len = [0u8; 8];
            read_at(&file, &mut len, 0).map_err(|e| corrupt(path, format!("header: {e}")))?;
            let len = u64::from_le_bytes(len);
            if len > size.saturating_sub(8) || len > 100 << 20 {
                return Err(corrupt(
                    path,
                    format!("header length {len} exceeds the file"),
                ));
            }
            let mut header = vec![0u8; len as usize];
            read_at(&file, &mut header, 8).map_err(|e| corrupt(path, format!("header: {e}")))?;
            let json: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&header).map_err(|e| corrupt(path, e))?;
            let base = 8 + len;
            for (name, info) in json {
                if name == "__metadata__" {
                    continue;
                }
                let Some(dtype) = info["dtype"].as_str().and_then(dtype_of) else {
                    continue;
                };
                let shape: Option<Vec<usize>> = info["shape"]
                    .as_array()
                    .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
                let offsets: Option<Vec<u64>> = info["data_offsets"]
                    .as_array()
                    .and_then(|a| a.iter().map(|d| d.as_u64()).collect());
                let (Some(shape), Some([begin, end])) = (shape, offsets.as_deref()) else {
                    return Err(corrupt(path, format!("tensor `{name}`: malformed entry")));
                };
                let bytes = shape.iter().product::<usize>() as u64 * dtype.size_in_bytes() as u64;
                if end < begin || end - begin != bytes || base + end > size {
                    return Err(corrupt(
                        path,
                        format!("tensor `{name}`: data offsets do not fit its shape or the file"),
                    ));
                }
                entries.insert(
                    name,
                    Entry {
                        file: i,
                        dtype,
                        shape,
                        start: base + begin,
                    },
                );
            }
            files.push((path.clone(), file));
        }
        Ok(Self { files, entries })
    }

    /// The stored dtype of `name`, if the index has it.
    pub(super) fn dtype(&self, name: &str) -> Option<DType> {
        self.entries.get(name).map(|e| e.dtype)
    }

    /// Quantizes rows `[first, first + count)` of the tensor `name` (any rank; rows run along
    /// the last dimension) into `target`, on `device`. `dims` is the result's shape.
    pub(super) fn quantize(
        &self,
        name: &str,
        first: usize,
        count: usize,
        dims: &[usize],
        target: GgmlDType,
        device: &Device,
    ) -> Result<QTensor> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| EngineError::invalid(format!("tensor `{name}` is not indexed")))?;
        let cols = e.shape.last().copied().unwrap_or(1);
        let (path, file) = &self.files[e.file];
        let src = Source {
            file,
            path,
            dtype: e.dtype,
            start: e.start + (first * cols * e.dtype.size_in_bytes()) as u64,
            values: count * cols,
        };
        let storage: Box<dyn candle_core::quantized::QuantizedType> = match target {
            GgmlDType::Q4K => Box::new(src.blocks::<BlockQ4K>()?),
            GgmlDType::Q8_0 => Box::new(src.blocks::<BlockQ8_0>()?),
            GgmlDType::F16 => Box::new(src.blocks::<f16>()?),
            GgmlDType::BF16 => Box::new(src.blocks::<bf16>()?),
            GgmlDType::F32 => Box::new(src.blocks::<f32>()?),
            other => {
                return Err(EngineError::invalid(format!(
                    "no in-situ quantization to {other:?}"
                )))
            }
        };
        let q = QTensor::new(QStorage::Cpu(storage), dims)?;
        if device.is_cpu() {
            return Ok(q);
        }
        // Other devices: quantized on the CPU, then uploaded once.
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
            target,
            &q.data()?,
            dims.to_vec(),
            device,
        )?)
    }
}

/// A run of values in a file.
struct Source<'a> {
    file: &'a File,
    path: &'a Path,
    dtype: DType,
    start: u64,
    values: usize,
}

impl Source<'_> {
    /// The values as blocks of `T`, converted in parallel chunks of whole blocks.
    fn blocks<T: GgmlType + Send + Sync>(&self) -> Result<Vec<T>> {
        let bs = T::BLCK_SIZE;
        if !self.values.is_multiple_of(bs) {
            return Err(EngineError::invalid(format!(
                "{} values do not fill blocks of {bs}",
                self.values
            )));
        }
        let mut out = vec![T::zeros(); self.values / bs];
        let per_task = (CHUNK_VALUES / bs).max(1);
        let esz = self.dtype.size_in_bytes();
        out.par_chunks_mut(per_task)
            .enumerate()
            .try_for_each(|(i, blocks)| -> Result<()> {
                let n = blocks.len() * bs;
                let mut raw = vec![0u8; n * esz];
                let at = self.start + (i * per_task * bs * esz) as u64;
                read_at(self.file, &mut raw, at)
                    .map_err(|e| corrupt(self.path, format!("reading weights: {e}")))?;
                let floats = to_f32(&raw, self.dtype);
                T::from_float(&floats, blocks);
                Ok(())
            })?;
        Ok(out)
    }
}

/// Little-endian f32/f16/bf16 bytes as f32.
fn to_f32(raw: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::BF16 => raw
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::F16 => raw
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    /// The chunked, parallel, file-reading quantizer writes the bytes candle's own
    /// `QTensor::quantize` writes from the whole tensor in memory, for every stored dtype and
    /// target, whole tensors and row ranges (one MoE expert) alike.
    #[test]
    fn chunked_quantization_equals_candles_whole_tensor_quantization() {
        let dir = tempfile::tempdir().expect("tempdir");
        // 2 × 2100 rows of 512: several chunks of 1 Mi values, the last one short.
        let t = Tensor::randn(0f32, 1.0, (2, 2100, 512), &Device::Cpu).expect("randn");
        for stored in [DType::F32, DType::BF16, DType::F16] {
            let path = dir.path().join(format!("{stored:?}.safetensors"));
            let ts = t.to_dtype(stored).expect("dtype");
            candle_core::safetensors::save(&HashMap::from([("w".to_string(), ts.clone())]), &path)
                .expect("save");
            let index = Index::open(std::slice::from_ref(&path)).expect("index");
            assert_eq!(index.dtype("w"), Some(stored));
            for target in [
                GgmlDType::Q4K,
                GgmlDType::Q8_0,
                GgmlDType::F16,
                GgmlDType::BF16,
            ] {
                let ours = index
                    .quantize("w", 0, 4200, &[4200, 512], target, &Device::Cpu)
                    .expect("quantize");
                let whole = ts.reshape((4200, 512)).expect("reshape");
                let theirs = QTensor::quantize(&whole, target).expect("candle");
                assert_eq!(ours.shape().dims(), &[4200, 512]);
                assert!(
                    ours.data().expect("data") == theirs.data().expect("data"),
                    "{stored:?} → {target:?}"
                );
                // The second of the stacked matrices alone.
                let second = index
                    .quantize("w", 2100, 2100, &[2100, 512], target, &Device::Cpu)
                    .expect("quantize");
                // A copy: candle quantizes a view's whole storage, ignoring its offset.
                let rows = ts
                    .get(1)
                    .and_then(|t| t.to_dtype(DType::F32)?.to_vec2::<f32>())
                    .expect("rows");
                let one = Tensor::new(rows, &Device::Cpu)
                    .and_then(|t| t.to_dtype(stored))
                    .expect("copy");
                let theirs = QTensor::quantize(&one, target).expect("candle");
                assert!(second.data().expect("data") == theirs.data().expect("data"));
            }
        }
    }

    #[test]
    fn a_header_that_overruns_its_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.safetensors");
        let header = br#"{"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0u8; 16]); // 16 of the 64 bytes
        std::fs::write(&path, bytes).expect("write");
        let err = Index::open(&[path]).unwrap_err();
        assert!(matches!(err, EngineError::CorruptFile { .. }), "{err}");
        assert!(err.to_string().contains("`w`"), "{err}");
    }
}
