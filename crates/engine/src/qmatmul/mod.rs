//! The seam between candle and our quantized CPU kernels (`kvlab_cpu::qmatmul`): ggml
//! tensors repacked at load ([`from_qtensor`]), matmuls as candle ops on the activations
//! ([`forward`], [`forward_group`]), run on candle's compute pool ([`CandlePool`]). Other
//! devices keep candle's own kernels.

#[cfg(feature = "lab")]
pub mod bench;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{CpuStorage, CustomOp1, Layout as TensorLayout, Shape, Tensor};
pub(crate) use kvlab_cpu::qmatmul::{packed_bytes, PackedMatrix, QFormat};

use crate::error::{EngineError, Result};

/// candle's barrier pool as the kernels' [`kvlab_cpu::Parallel`]: the pool candle's own CPU
/// ops run on, whose workers spin a while after each op, so the next matmul starts at once.
pub(crate) struct CandlePool;

impl kvlab_cpu::Parallel for CandlePool {
    fn for_ranges(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        candle_core::utils::barrier_pool().execute_chunked(n, f);
    }
}

impl From<kvlab_cpu::CpuError> for EngineError {
    fn from(e: kvlab_cpu::CpuError) -> Self {
        EngineError::invalid(e.0)
    }
}

/// Our format of a ggml type, if a kernel of ours reads it.
pub(crate) fn format_of(t: GgmlDType) -> Option<QFormat> {
    Some(match t {
        GgmlDType::Q4_0 => QFormat::Q4_0,
        GgmlDType::Q5_0 => QFormat::Q5_0,
        GgmlDType::Q8_0 => QFormat::Q8_0,
        GgmlDType::Q4K => QFormat::Q4K,
        GgmlDType::Q5K => QFormat::Q5K,
        GgmlDType::Q6K => QFormat::Q6K,
        _ => return None,
    })
}

/// The ggml type of one of our formats.
pub(crate) fn ggml_type(f: QFormat) -> GgmlDType {
    match f {
        QFormat::Q4_0 => GgmlDType::Q4_0,
        QFormat::Q5_0 => GgmlDType::Q5_0,
        QFormat::Q8_0 => GgmlDType::Q8_0,
        QFormat::Q4K => GgmlDType::Q4K,
        QFormat::Q5K => GgmlDType::Q5K,
        QFormat::Q6K => GgmlDType::Q6K,
    }
}

/// Repacks a CPU `QTensor` `[rows, cols]` of a supported type; `None` for other types.
pub(crate) fn from_qtensor(q: &candle_core::quantized::QTensor) -> Result<Option<PackedMatrix>> {
    let Some(format) = format_of(q.dtype()) else {
        return Ok(None);
    };
    let (rows, cols) = q.shape().dims2()?;
    if !cols.is_multiple_of(format.geometry().sb) {
        return Ok(None);
    }
    Ok(Some(PackedMatrix::from_ggml(
        format,
        &q.data()?,
        rows,
        cols,
    )?))
}

/// `x · Wᵀ` for an f32 CPU tensor `x` `[.., cols]` → `[.., rows]`.
pub(crate) fn forward(w: &Arc<PackedMatrix>, x: &Tensor) -> Result<Tensor> {
    Ok(x.apply_op1_no_bwd(&MatmulOp(Arc::clone(w)))?)
}

/// `x · Wᵢᵀ` for every matrix of `mats` over f32 CPU tensors: `x` `[.., cols]` → one
/// `[.., rowsᵢ]` per matrix, the activations quantized once and every matrix's tiles one
/// work list for the pool ([`kvlab_cpu::qmatmul::matmul_group`]).
pub(crate) fn forward_group(mats: &[&PackedMatrix], x: &Tensor) -> Result<Vec<Tensor>> {
    let x = x.contiguous()?;
    let cols = x.dim(candle_core::D::Minus1)?;
    let m = x.elem_count() / cols.max(1);
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![0f32; m * w.rows()]).collect();
    {
        let (storage, layout) = x.storage_and_layout();
        let candle_core::Storage::Cpu(CpuStorage::F32(data)) = &*storage else {
            return Err(EngineError::invalid(
                "a grouped matmul takes f32 CPU activations",
            ));
        };
        let (a, b) = layout
            .contiguous_offsets()
            .ok_or_else(|| EngineError::invalid("non-contiguous activations"))?;
        let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        kvlab_cpu::qmatmul::matmul_group(&CandlePool, mats, &data[a..b], m, &mut views)?;
    }
    let lead = &x.dims()[..x.rank() - 1];
    outs.into_iter()
        .zip(mats)
        .map(|(o, w)| {
            let mut dims = lead.to_vec();
            dims.push(w.rows());
            Ok(Tensor::from_vec(o, dims, x.device())?)
        })
        .collect()
}

/// The matmul as a candle op on the activations (CPU only).
struct MatmulOp(Arc<PackedMatrix>);

impl CustomOp1 for MatmulOp {
    fn name(&self) -> &'static str {
        "kvlab-qmatmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &TensorLayout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let w = &self.0;
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("kvlab-qmatmul takes f32 activations")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("kvlab-qmatmul takes contiguous activations")
        };
        let mut dims = layout.shape().dims().to_vec();
        if dims.last() != Some(&w.cols()) {
            candle_core::bail!(
                "activations {:?} against a [{}, {}] matrix",
                dims,
                w.rows(),
                w.cols()
            )
        }
        let x = &data[start..end];
        let m = x.len() / w.cols();
        let mut out = vec![0f32; m * w.rows()];
        w.matmul(&CandlePool, x, m, &mut out)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        if let Some(last) = dims.last_mut() {
            *last = w.rows();
        }
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}
