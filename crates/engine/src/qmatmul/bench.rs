//! `kvlab bench matmul` (cargo feature `bench`): our CPU kernels against candle's quantized
//! matmul on the same random matrices, one format and shape at a time. A one-row product
//! cycles through enough copies of the matrix to leave the caches (as a decode step reads
//! ~1 GB of weights), so its rate is memory bandwidth (unless asked to stay in the caches);
//! a many-row product (prefill) is compute. Reports figures; asserts nothing.

use std::time::Instant;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use serde::Serialize;

use kvlab_cpu::qmatmul::Backend;

use super::{ggml_type, CandlePool, PackedMatrix, QFormat};
use crate::error::{EngineError, Result};

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulBenchRow {
    /// Weight type (`q4_k`, …).
    pub format: String,
    /// Output rows.
    pub n: usize,
    /// Weights per row.
    pub k: usize,
    /// Activation rows.
    pub m: usize,
    /// Milliseconds per product, ours.
    pub ours_ms: f64,
    /// Milliseconds per product, candle's `QMatMul`.
    pub candle_ms: f64,
    /// Weight bytes read per second, ours (GB/s).
    pub ours_gb_s: f64,
    /// Multiply-adds per second, ours (billions).
    pub ours_gmac_s: f64,
    /// The backend ours ran on.
    pub backend: String,
}

/// Bytes of weights a one-row product cycles through: far beyond the caches.
const COLD_BYTES: usize = 256 << 20;

/// Measures every `format` at every `(n, k)` shape for every row count in `rows`, for at
/// least `seconds` each. `cached`: one copy of each matrix, so a one-row product runs from
/// the caches and shows the kernels' compute ceiling rather than the memory's.
pub fn matmul_bench(
    formats: &[&str],
    shapes: &[(usize, usize)],
    rows: &[usize],
    seconds: f64,
    cached: bool,
) -> Result<Vec<MatmulBenchRow>> {
    let dev = Device::Cpu;
    let mut out = Vec::new();
    for name in formats {
        let format = [
            QFormat::Q4_0,
            QFormat::Q5_0,
            QFormat::Q8_0,
            QFormat::Q4K,
            QFormat::Q5K,
            QFormat::Q6K,
        ]
        .into_iter()
        .find(|f| f.name() == *name)
        .ok_or_else(|| EngineError::invalid(format!("unknown weight type `{name}`")))?;
        for &(n, k) in shapes {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let q = QTensor::quantize(&w, ggml_type(format))?;
            let bytes = q.data()?.to_vec();
            let copies = if cached {
                1
            } else {
                (COLD_BYTES / bytes.len().max(1)).max(1)
            };
            let ours: Vec<PackedMatrix> = (0..copies)
                .map(|_| Ok(PackedMatrix::from_ggml(format, &bytes, n, k)?))
                .collect::<Result<_>>()?;
            let theirs: Vec<QMatMul> = (0..copies)
                .map(|_| {
                    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                        ggml_type(format),
                        &bytes,
                        vec![n, k],
                        &dev,
                    )?;
                    Ok(QMatMul::from_qtensor(q)?)
                })
                .collect::<Result<_>>()?;
            for &m in rows {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
                let mut y = vec![0f32; m * n];
                // Many-row products reuse one matrix (compute-bound); one-row ones cycle.
                let cycle = if m == 1 { copies } else { 1 };
                let ours_s = time(seconds, cycle, |i| {
                    Ok(ours[i].matmul(&CandlePool, &xs, m, &mut y)?)
                })?;
                let candle_s = time(seconds, cycle, |i| {
                    theirs[i].forward(&x)?;
                    Ok(())
                })?;
                out.push(MatmulBenchRow {
                    format: format.name().into(),
                    n,
                    k,
                    m,
                    ours_ms: ours_s * 1e3,
                    candle_ms: candle_s * 1e3,
                    ours_gb_s: ours[0].held_bytes() as f64 / ours_s / 1e9,
                    ours_gmac_s: (m * n * k) as f64 / ours_s / 1e9,
                    backend: Backend::best().name().into(),
                });
            }
        }
    }
    Ok(out)
}

/// Seconds per call of `f(i)` for `i` cycling over `0..cycle`, after one warm-up pass.
fn time(seconds: f64, cycle: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    for i in 0..cycle {
        f(i)?;
    }
    let start = Instant::now();
    let mut calls = 0usize;
    while calls < cycle || start.elapsed().as_secs_f64() < seconds {
        f(calls % cycle)?;
        calls += 1;
    }
    Ok(start.elapsed().as_secs_f64() / calls as f64)
}
