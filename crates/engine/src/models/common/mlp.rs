//! Feed-forward blocks: the GeGLU MLP `down(gelu_tanh(gate x) · up x)` and Gemma 4's
//! mixture of experts (softmax router, renormalised top-k, per-expert scale), written with
//! plain candle ops so it runs on every device.

use candle_core::{DType, Device, Tensor, D};

use super::linear::{Linear, RmsNorm, Splits};
use crate::checkpoint::config::{ModelConfig, MoeSpec};
use crate::checkpoint::weights::WeightStore;
use crate::error::Result;
use crate::profile;

/// GeGLU MLP.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Loads `{prefix}{gate,up,down}_proj.weight` of width `width`.
    pub fn load(ws: &WeightStore, prefix: &str, hidden: usize, width: usize) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(ws, &format!("{prefix}gate_proj.weight"), width, hidden)?,
            up: Linear::load(ws, &format!("{prefix}up_proj.weight"), width, hidden)?,
            down: Linear::load(ws, &format!("{prefix}down_proj.weight"), hidden, width)?,
        })
    }

    /// `x` `[t, hidden]` (sequences of `splits` rows) → `[t, hidden]`.
    pub fn forward(&self, x: &Tensor, splits: &Splits) -> Result<Tensor> {
        let [g, u]: [Tensor; 2] = Linear::forward_group(&[&self.gate, &self.up], x, splits)?
            .try_into()
            .map_err(|_| crate::error::EngineError::invalid("gate/up projections"))?;
        let h = {
            let _span = profile::span("elementwise");
            super::fused::gelu_mul(&g, &u)?
        };
        self.down.forward_split(&h, splits)
    }
}

/// One expert: fused gate/up `[2I, H]` and down `[H, I]`.
#[derive(Debug, Clone)]
struct Expert {
    gate_up: Linear,
    down: Linear,
}

/// Gemma 4's expert block with its router and the norms around it.
#[derive(Debug, Clone)]
pub struct Moe {
    spec: MoeSpec,
    router_proj: Tensor,
    /// `router.scale · hidden^-½`, f32 `[H]`.
    router_scale: Tensor,
    per_expert_scale: Vec<f32>,
    experts: Vec<Expert>,
    router_norm: RmsNorm,
    pre_norm: RmsNorm,
    post_norm_1: RmsNorm,
    post_norm_2: RmsNorm,
}

impl Moe {
    /// Loads layer `layer`'s router, experts and extra norms.
    pub fn load(ws: &WeightStore, cfg: &ModelConfig, spec: MoeSpec, layer: usize) -> Result<Self> {
        let p = format!("layers.{layer}.");
        let (h, e, i) = (cfg.hidden_size, spec.num_experts, spec.expert_width);
        let (eps, off) = (cfg.rms_norm_eps, cfg.norm_weight_offset);
        let gu = ws.stacked_linears(&format!("{p}experts.gate_up_proj"), e, 2 * i, h)?;
        let dn = ws.stacked_linears(&format!("{p}experts.down_proj"), e, h, i)?;
        let experts = gu
            .into_iter()
            .zip(dn)
            .map(|(g, d)| Expert {
                gate_up: Linear::new(g),
                down: Linear::new(d),
            })
            .collect();
        let scale = ws.tensor_as(&format!("{p}router.scale"), &[h], DType::F32)?;
        Ok(Self {
            spec,
            router_proj: ws.tensor_as(&format!("{p}router.proj.weight"), &[e, h], DType::F32)?,
            router_scale: (scale * (h as f64).powf(-0.5))?,
            per_expert_scale: ws
                .tensor_as(&format!("{p}router.per_expert_scale"), &[e], DType::F32)?
                .to_vec1()?,
            experts,
            router_norm: RmsNorm::unit(h, eps, DType::F32, ws.device())?,
            pre_norm: RmsNorm::load(
                ws,
                &format!("{p}pre_feedforward_layernorm_2.weight"),
                h,
                eps,
                off,
            )?,
            post_norm_1: RmsNorm::load(
                ws,
                &format!("{p}post_feedforward_layernorm_1.weight"),
                h,
                eps,
                off,
            )?,
            post_norm_2: RmsNorm::load(
                ws,
                &format!("{p}post_feedforward_layernorm_2.weight"),
                h,
                eps,
                off,
            )?,
        })
    }

    /// Top-k experts and their weights per token, from the router over `residual` `[t, H]`
    /// (sequences of `splits` rows, each routed as it would be alone).
    fn route(&self, residual: &Tensor, splits: &Splits) -> Result<Vec<Vec<(usize, f32)>>> {
        let r = self.router_norm.forward(&residual.to_dtype(DType::F32)?)?;
        let r = r.broadcast_mul(&self.router_scale)?;
        let proj = self.router_proj.t()?;
        let logits = splits.each(&r, |part| Ok(part.matmul(&proj)?))?;
        let probs = candle_nn::ops::softmax_last_dim(&logits)?
            .to_device(&Device::Cpu)?
            .to_vec2::<f32>()?;
        Ok(probs
            .into_iter()
            .map(|row| {
                let mut idx: Vec<usize> = (0..row.len()).collect();
                // Stable: equal probabilities keep the lower expert first, as torch.topk does here.
                idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                idx.truncate(self.spec.top_k);
                let sum: f32 = idx.iter().map(|&e| row[e]).sum();
                idx.into_iter()
                    .map(|e| (e, row[e] / sum * self.per_expert_scale[e]))
                    .collect()
            })
            .collect())
    }

    /// `mlp_out` is the dense MLP's output, `residual` the stream after attention:
    /// returns `post_norm_1(mlp_out) + post_norm_2(experts(pre_norm_2(residual)))`.
    pub fn forward(&self, residual: &Tensor, mlp_out: &Tensor, splits: &Splits) -> Result<Tensor> {
        // Routing, gathers and scatters; the experts' matmuls and norms are their own rows.
        let _span = profile::span("moe routing");
        let (t, h) = residual.dims2()?;
        let routes = self.route(residual, splits)?;
        // Which sequence each token belongs to, to split an expert's rows the same way.
        let owner: Vec<usize> = splits
            .0
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| std::iter::repeat_n(s, n))
            .collect();
        let xin = self.pre_norm.forward(residual)?;
        let mut per_expert: Vec<(Vec<u32>, Vec<f32>)> =
            vec![(Vec::new(), Vec::new()); self.experts.len()];
        for (tok, r) in routes.iter().enumerate() {
            for &(e, w) in r {
                per_expert[e].0.push(tok as u32);
                per_expert[e].1.push(w);
            }
        }
        let dev = residual.device();
        let mut out = Tensor::zeros((t, h), xin.dtype(), dev)?;
        let iw = self.spec.expert_width;
        for (e, (toks, ws)) in per_expert.into_iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let n = toks.len();
            let mut rows = Splits(vec![0; splits.0.len()]);
            for &tok in &toks {
                rows.0[owner.get(tok as usize).copied().unwrap_or(0)] += 1;
            }
            let ids = Tensor::from_vec(toks, n, dev)?;
            let x = xin.index_select(&ids, 0)?;
            let gu = self.experts[e].gate_up.forward_split(&x, &rows)?;
            let y = super::fused::gelu_mul(
                &gu.narrow(D::Minus1, 0, iw)?.contiguous()?,
                &gu.narrow(D::Minus1, iw, iw)?.contiguous()?,
            )?;
            let y = self.experts[e].down.forward_split(&y, &rows)?;
            let w = Tensor::from_vec(ws, (n, 1), dev)?.to_dtype(y.dtype())?;
            out = out.index_add(&ids, &y.broadcast_mul(&w)?, 0)?;
        }
        Ok((self.post_norm_1.forward(mlp_out)? + self.post_norm_2.forward(&out)?)?)
    }
}
