//! Small building blocks shared by the decoder: a dtype-safe linear layer over a held
//! [`Matrix`] (our CPU kernels, or candle's `QMatMul`) and an RMS norm over candle's fused
//! kernel.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

use crate::checkpoint::weights::{Matrix, WeightStore};
use crate::error::Result;
use crate::profile;

/// Rows from which a quantized CPU matmul goes through a dequantized GEMM.
const DEQUANT_MIN_ROWS: usize = 32;
/// Largest matrix (elements) dequantized on the fly (64 MiB of f32).
const DEQUANT_MAX_ELEMS: usize = 16 << 20;

/// `x·Wᵀ` with W dense or quantized; quantized kernels take f32, so other activations
/// are converted around them.
#[derive(Debug, Clone)]
pub struct Linear(Matrix);

impl Linear {
    /// Loads `[out, inp]` weights `name`.
    pub fn load(ws: &WeightStore, name: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self(ws.linear(name, out, inp)?))
    }

    /// A layer over a matrix already held.
    pub fn new(matrix: Matrix) -> Self {
        Self(matrix)
    }

    /// Whether each output row depends on its own input row alone, bit for bit whatever the
    /// other rows: our kernels quantize and multiply each row by itself. candle's kernels
    /// choose their blocking (and a dequantized GEMM past [`DEQUANT_MIN_ROWS`]) by the row
    /// count, so a row's sum may round differently beside others.
    fn rows_alone(&self) -> bool {
        matches!(self.0, Matrix::Packed(_))
    }

    /// [`Linear::forward`] over `x` `[t, inp]` holding sequences of `splits` rows end to end
    /// (a batched step): one pass when the kernels keep rows apart, else one per sequence,
    /// so each sequence's rows come out as they would alone.
    pub fn forward_split(&self, x: &Tensor, splits: &Splits) -> Result<Tensor> {
        self.forward_split_as(self.0.profile_label(), x, splits)
    }

    /// [`Linear::forward_split`], profiled under `label`.
    pub fn forward_split_as(
        &self,
        label: &'static str,
        x: &Tensor,
        splits: &Splits,
    ) -> Result<Tensor> {
        if self.rows_alone() || splits.0.len() < 2 {
            return self.forward_as(label, x);
        }
        splits.each(x, |part| self.forward_as(label, part))
    }

    /// `x·Wᵢᵀ` for several layers that read the same input (a layer's q/k/v, its gate and
    /// up projections): one pass of the CPU kernels when every matrix is held for them
    /// (see [`crate::qmatmul::forward_group`]), else one layer after another.
    pub fn forward_group(layers: &[&Linear], x: &Tensor, splits: &Splits) -> Result<Vec<Tensor>> {
        let packed: Option<Vec<&crate::qmatmul::PackedMatrix>> = layers
            .iter()
            .map(|l| match &l.0 {
                Matrix::Packed(p) => Some(p.as_ref()),
                Matrix::Candle(_) => None,
            })
            .collect();
        match packed {
            Some(mats) if layers.len() > 1 => {
                let label = layers[0].0.profile_label();
                let same = layers.iter().all(|l| l.0.profile_label() == label);
                let _span = profile::span(if same { label } else { "matmul mixed types" });
                let outs = crate::qmatmul::forward_group(&mats, &x.to_dtype(DType::F32)?)?;
                outs.into_iter()
                    .map(|y| Ok(y.to_dtype(x.dtype())?))
                    .collect()
            }
            _ => layers.iter().map(|l| l.forward_split(x, splits)).collect(),
        }
    }

    /// [`Linear::forward`], profiled under `label` (the vocabulary projection is its own row).
    pub fn forward_as(&self, label: &'static str, x: &Tensor) -> Result<Tensor> {
        let _span = profile::span(label);
        let q = match &self.0 {
            Matrix::Packed(p) => {
                let y = crate::qmatmul::forward(p, &x.to_dtype(DType::F32)?.contiguous()?)?;
                return Ok(y.to_dtype(x.dtype())?);
            }
            Matrix::Candle(q) => q,
        };
        match q {
            // candle's quantized CPU matmul is a dot product per output row with no tiling;
            // for a many-row chunk (prefill), dequantizing the matrix once and using the
            // blocked f32 GEMM is several times faster. Bounded to keep the temporary small.
            QMatMul::QTensor(q)
                if x.device().is_cpu()
                    && x.elem_count() / x.dim(candle_core::D::Minus1)? >= DEQUANT_MIN_ROWS
                    && q.shape().elem_count() <= DEQUANT_MAX_ELEMS =>
            {
                let w = q.dequantize(x.device())?.to_dtype(x.dtype())?;
                let (rows, inp) = (
                    x.elem_count() / x.dim(candle_core::D::Minus1)?,
                    x.dim(candle_core::D::Minus1)?,
                );
                let mut dims = x.dims().to_vec();
                let last = dims.len() - 1;
                dims[last] = w.dim(0)?;
                Ok(x.reshape((rows, inp))?.matmul(&w.t()?)?.reshape(dims)?)
            }
            QMatMul::QTensor(_) if x.dtype() != DType::F32 => {
                let y = q.forward(&x.to_dtype(DType::F32)?)?;
                Ok(y.to_dtype(x.dtype())?)
            }
            // A dense weight held in another dtype than the activations (`--weights bf16` with
            // f16 activations on a GPU): multiply in the weight's dtype.
            QMatMul::Tensor(w) | QMatMul::TensorF16(w) if w.dtype() != x.dtype() => {
                let y = q.forward(&x.to_dtype(w.dtype())?)?;
                Ok(y.to_dtype(x.dtype())?)
            }
            _ => Ok(q.forward(x)?),
        }
    }
}

/// The row counts of the sequences laid end to end in a batched step's activations (one
/// entry for a lone sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splits(pub Vec<usize>);

impl Splits {
    /// `f` over each sequence's rows of `x` `[t, ..]`, the results stacked back along rows.
    pub fn each(&self, x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let mut at = 0;
        let mut outs = Vec::with_capacity(self.0.len());
        for &n in &self.0 {
            if n > 0 {
                outs.push(f(&x.narrow(0, at, n)?)?);
            }
            at += n;
        }
        Ok(Tensor::cat(&outs, 0)?)
    }
}

/// RMS norm over the last dim: `x·(mean(x²)+eps)^-½·w`, `w` already including any `+1`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Loads a norm weight of width `dim`, adding `offset` (1.0 for `(1+w)` checkpoints).
    pub fn load(ws: &WeightStore, name: &str, dim: usize, eps: f64, offset: f64) -> Result<Self> {
        let w = ws.tensor_as(name, &[dim], DType::F32)?;
        let w = if offset != 0.0 { (w + offset)? } else { w };
        Ok(Self {
            weight: w.to_dtype(ws.dtype())?,
            eps: eps as f32,
        })
    }

    /// A norm without weight (Gemma 4's v-norm and router norm).
    pub fn unit(dim: usize, eps: f64, dtype: DType, device: &candle_core::Device) -> Result<Self> {
        Ok(Self {
            weight: Tensor::ones(dim, dtype, device)?,
            eps: eps as f32,
        })
    }

    /// Normalizes `x` over its last dim.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _span = profile::span("norm");
        let x = if x.is_contiguous() {
            x.clone()
        } else {
            x.contiguous()?
        };
        super::fused::rms_norm(&x, &self.weight, self.eps)
    }
}
