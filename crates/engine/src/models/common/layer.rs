//! One decoder layer: attention and feed-forward residual blocks with Gemma's pre/post
//! norms, then the optional PLE block and `layer_scalar`.

use candle_core::{DType, Tensor};

use super::attention::Attention;
use super::linear::{RmsNorm, Splits};
use super::mlp::{Mlp, Moe};
use super::ple::PleLayer;
use super::Segment;
use crate::checkpoint::config::{LayerSpec, ModelConfig};
use crate::checkpoint::weights::WeightStore;
use crate::error::Result;
use crate::profile;

/// A decoder layer's weights.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    spec: LayerSpec,
    attn: Attention,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    mlp: Mlp,
    moe: Option<Moe>,
    ple: Option<PleLayer>,
    layer_scalar: Option<f64>,
}

impl DecoderLayer {
    /// Loads layer `spec.index`.
    pub fn load(ws: &WeightStore, cfg: &ModelConfig, spec: &LayerSpec) -> Result<Self> {
        let i = spec.index;
        let p = format!("layers.{i}.");
        let h = cfg.hidden_size;
        let norm = |n: &str| {
            RmsNorm::load(
                ws,
                &format!("{p}{n}.weight"),
                h,
                cfg.rms_norm_eps,
                cfg.norm_weight_offset,
            )
        };
        let layer_scalar = if cfg.layer_scalar {
            let s = ws
                .tensor_as(&format!("{p}layer_scalar"), &[1], DType::F32)?
                .to_vec1::<f32>()?;
            Some(f64::from(s[0]))
        } else {
            None
        };
        Ok(Self {
            spec: spec.clone(),
            attn: Attention::load(ws, cfg, spec)?,
            input_norm: norm("input_layernorm")?,
            post_attn_norm: norm("post_attention_layernorm")?,
            pre_ff_norm: norm("pre_feedforward_layernorm")?,
            post_ff_norm: norm("post_feedforward_layernorm")?,
            mlp: Mlp::load(ws, &format!("{p}mlp."), h, spec.mlp_width)?,
            moe: cfg.moe.map(|m| Moe::load(ws, cfg, m, i)).transpose()?,
            ple: cfg.ple.map(|s| PleLayer::load(ws, cfg, s, i)).transpose()?,
            layer_scalar,
        })
    }

    /// The layer's resolved description.
    pub fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    /// `x` `[t, H]` (the rows of every segment, end to end) → `[t, H]`; each segment's
    /// attention uses its `rope`-th table; `ple_input` is this layer's `[t, p]` slice, if any.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        segments: &mut [Segment<'_>],
        splits: &Splits,
        rope: usize,
        ple_input: Option<&Tensor>,
    ) -> Result<Tensor> {
        let a = self
            .attn
            .forward(&self.input_norm.forward(x)?, segments, splits, rope)?;
        let a = self.post_attn_norm.forward(&a)?;
        let x = residual_add(x, &a)?;
        let mut m = self.mlp.forward(&self.pre_ff_norm.forward(&x)?, splits)?;
        if let Some(moe) = &self.moe {
            m = moe.forward(&x, &m, splits)?;
        }
        let m = self.post_ff_norm.forward(&m)?;
        let mut x = residual_add(&x, &m)?;
        if let (Some(ple), Some(inp)) = (&self.ple, ple_input) {
            let _span = profile::span("per-layer embeddings");
            x = ple.forward(&x, inp, splits)?;
        }
        if let Some(s) = self.layer_scalar {
            let _span = profile::span("elementwise");
            x = (x * s)?;
        }
        Ok(x)
    }
}

/// `x + y`, profiled as an element-wise op.
fn residual_add(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let _span = profile::span("elementwise");
    Ok((x + y)?)
}
