//! RoPE cos/sin tables for a run of absolute positions, and their application to
//! `[t, heads, head_dim]` projections with candle's fused NeoX kernel.

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::config::RopeSpec;
use crate::error::Result;

/// cos and sin `[t, head_dim / 2]` for positions `start..start + t`.
#[derive(Debug, Clone)]
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl RopeTables {
    /// Angles in f64 (accurate at long positions), stored in `dtype`.
    pub fn new(
        spec: &RopeSpec,
        head_dim: usize,
        start: usize,
        t: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv = spec.inv_freq(head_dim);
        let half = inv.len();
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for p in start..start + t {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (t, half), device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (t, half), device)?.to_dtype(dtype)?,
        })
    }

    /// Rotates `x` `[t, heads, head_dim]` (contiguous) → same shape.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (t, h, d) = x.dims3()?;
        let x4 = x.reshape((1, t, h, d))?;
        Ok(candle_nn::rotary_emb::rope_thd(&x4, &self.cos, &self.sin)?.reshape((t, h, d))?)
    }
}
