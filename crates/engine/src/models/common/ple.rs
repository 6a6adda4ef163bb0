//! Per-layer embeddings (Gemma 4 E-series): a token table and a projection of the main
//! embedding give each layer a small extra input, which the layer gates into its stream.

use candle_core::{DType, Tensor};

use super::linear::{Linear, RmsNorm, Splits};
use crate::checkpoint::config::{ModelConfig, PleSpec};
use crate::checkpoint::weights::{Table, WeightStore};
use crate::error::Result;

/// Model-level PLE weights: computes every layer's input for a chunk.
#[derive(Debug, Clone)]
pub struct PleInputs {
    spec: PleSpec,
    layers: usize,
    table: Table,
    projection: Linear,
    norm: RmsNorm,
    tok_scale: f64,
    proj_scale: f64,
}

/// A layer's PLE gate, projection and norm.
#[derive(Debug, Clone)]
pub struct PleLayer {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

/// `sqrt(n)` rounded to `dtype`, as transformers casts the scale to the weight dtype.
pub(crate) fn scale_in(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        _ => x,
    }
}

impl PleInputs {
    /// Loads the model-level PLE weights.
    pub fn load(ws: &WeightStore, cfg: &ModelConfig, spec: PleSpec) -> Result<Self> {
        let l = cfg.num_layers();
        let h = cfg.hidden_size;
        Ok(Self {
            spec,
            layers: l,
            table: ws.table(
                "embed_tokens_per_layer.weight",
                spec.vocab_size,
                l * spec.dim,
                false,
            )?,
            projection: Linear::load(ws, "per_layer_model_projection.weight", l * spec.dim, h)?,
            norm: RmsNorm::load(
                ws,
                "per_layer_projection_norm.weight",
                spec.dim,
                cfg.rms_norm_eps,
                cfg.norm_weight_offset,
            )?,
            tok_scale: scale_in(ws.dtype(), (spec.dim as f64).sqrt()),
            proj_scale: (h as f64).powf(-0.5),
        })
    }

    /// Bytes of the token table (a step gathers one row of it).
    pub fn table_bytes(&self) -> usize {
        self.table.bytes()
    }

    /// `[t, layers, p]` inputs from token `ids` and the scaled main embedding `[t, H]`.
    pub fn compute(&self, ids: &Tensor, embeds: &Tensor, splits: &Splits) -> Result<Tensor> {
        let t = ids.dim(0)?;
        let (l, p) = (self.layers, self.spec.dim);
        let tok = (self.table.lookup(ids, embeds.dtype())? * self.tok_scale)?.reshape((t, l, p))?;
        let ctx = (self.projection.forward_split(embeds, splits)? * self.proj_scale)?
            .reshape((t, l, p))?;
        let ctx = self.norm.forward(&ctx)?;
        Ok(((ctx + tok)? * std::f64::consts::FRAC_1_SQRT_2)?)
    }
}

impl PleLayer {
    /// Loads layer `layer`'s PLE weights.
    pub fn load(ws: &WeightStore, cfg: &ModelConfig, spec: PleSpec, layer: usize) -> Result<Self> {
        let p = format!("layers.{layer}.");
        let h = cfg.hidden_size;
        Ok(Self {
            gate: Linear::load(ws, &format!("{p}per_layer_input_gate.weight"), spec.dim, h)?,
            projection: Linear::load(ws, &format!("{p}per_layer_projection.weight"), h, spec.dim)?,
            norm: RmsNorm::load(
                ws,
                &format!("{p}post_per_layer_input_norm.weight"),
                h,
                cfg.rms_norm_eps,
                cfg.norm_weight_offset,
            )?,
        })
    }

    /// `x + norm(proj(gelu(gate x) · input))` with `input` `[t, p]`.
    pub fn forward(&self, x: &Tensor, input: &Tensor, splits: &Splits) -> Result<Tensor> {
        let g = self.gate.forward_split(x, splits)?;
        let g = super::fused::gelu_mul(&g, &input.contiguous()?)?;
        Ok((x + self
            .norm
            .forward(&self.projection.forward_split(&g, splits)?)?)?)
    }
}
