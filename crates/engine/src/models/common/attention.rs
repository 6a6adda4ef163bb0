//! Self-attention of one layer: projections, q/k norms, weightless v-norm, RoPE, then the
//! attention itself delegated to the layer's KV storage (own cache or the producer's).

use candle_core::Tensor;

use super::linear::{Linear, RmsNorm, Splits};
use super::rope::RopeTables;
use super::Segment;
use crate::checkpoint::config::{KvSource, LayerSpec, ModelConfig};
use crate::checkpoint::weights::WeightStore;
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::profile;

/// K/V projections of a cache-owning layer.
#[derive(Debug, Clone)]
struct KvProj {
    k_proj: Linear,
    /// `None` when V is the raw K projection (`attention_k_eq_v`).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
    v_norm: Option<RmsNorm>,
}

/// One layer's attention block.
#[derive(Debug, Clone)]
pub struct Attention {
    spec: LayerSpec,
    q_proj: Linear,
    q_norm: RmsNorm,
    o_proj: Linear,
    kv: Option<KvProj>,
}

impl Attention {
    /// Loads layer `spec.index`'s attention weights.
    pub fn load(ws: &WeightStore, cfg: &ModelConfig, spec: &LayerSpec) -> Result<Self> {
        let p = format!("layers.{}.self_attn.", spec.index);
        let (h, d, kv) = (cfg.hidden_size, spec.head_dim, spec.n_kv_heads);
        let (eps, off) = (cfg.rms_norm_eps, cfg.norm_weight_offset);
        let kvp = match spec.kv_source {
            KvSource::Shared { .. } => None,
            KvSource::Own => Some(KvProj {
                k_proj: Linear::load(ws, &format!("{p}k_proj.weight"), kv * d, h)?,
                v_proj: if spec.k_eq_v {
                    None
                } else {
                    Some(Linear::load(ws, &format!("{p}v_proj.weight"), kv * d, h)?)
                },
                k_norm: RmsNorm::load(ws, &format!("{p}k_norm.weight"), d, eps, off)?,
                v_norm: if spec.v_norm {
                    Some(RmsNorm::unit(d, eps, ws.dtype(), ws.device())?)
                } else {
                    None
                },
            }),
        };
        Ok(Self {
            spec: spec.clone(),
            q_proj: Linear::load(ws, &format!("{p}q_proj.weight"), spec.n_heads * d, h)?,
            q_norm: RmsNorm::load(ws, &format!("{p}q_norm.weight"), d, eps, off)?,
            o_proj: Linear::load(ws, &format!("{p}o_proj.weight"), h, spec.n_heads * d)?,
            kv: kvp,
        })
    }

    /// `x` `[t, hidden]`, the rows of every segment end to end → `[t, hidden]`: the
    /// projections over all rows at once, then per segment its q/k norms, its `rope`-th
    /// table, its cache's append (when this layer owns one) and attention at its positions.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        segments: &mut [Segment<'_>],
        splits: &Splits,
        rope: usize,
    ) -> Result<Tensor> {
        // q, k and v from one pass over the input where the kernels allow it.
        let mut layers = vec![&self.q_proj];
        if let Some(kv) = &self.kv {
            layers.push(&kv.k_proj);
            layers.extend(&kv.v_proj);
        }
        let mut proj = Linear::forward_group(&layers, x, splits)?.into_iter();
        let q = proj
            .next()
            .ok_or_else(|| EngineError::invalid("no q projection"))?;
        let k = proj.next();
        let v = proj.next();
        let mut outs = Vec::with_capacity(segments.len());
        for s in segments.iter_mut() {
            let rows = |m: &Tensor| m.narrow(0, s.rows.start, s.rows.len());
            let tables = s
                .ropes
                .get(rope)
                .ok_or_else(|| EngineError::invalid("no rotary table for a layer"))?;
            let kv = match (&k, &self.kv) {
                (Some(k), Some(_)) => Some((rows(k)?, v.as_ref().map(rows).transpose()?)),
                _ => None,
            };
            // Gemma 4 lets an image's soft tokens see each other both ways on sliding layers
            // only (full layers stay causal), where the config asks for it.
            let both_ways = match self.spec.kind {
                AttentionKind::Sliding => s.both_ways,
                _ => None,
            };
            outs.push(self.attend_one(&rows(&q)?, kv, tables, s.cache, s.start, both_ways)?);
        }
        let a = if outs.len() == 1 {
            outs.pop()
                .ok_or_else(|| EngineError::invalid("no attention output"))?
        } else {
            let _span = profile::span("layout copies");
            Tensor::cat(&outs, 0)?
        };
        self.o_proj.forward_split(&a, splits)
    }

    /// One sequence's attention: `q` `[t, heads·d]` and, when this layer owns a cache, its
    /// raw `k` and `v` projections (`v` absent when V is K) at positions `start..start + t`
    /// → `[t, heads·d]`.
    fn attend_one(
        &self,
        q: &Tensor,
        kv_rows: Option<(Tensor, Option<Tensor>)>,
        rope: &RopeTables,
        cache: &mut KvCache,
        start: usize,
        both_ways: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let (t, _) = q.dims2()?;
        let (nh, d) = (self.spec.n_heads, self.spec.head_dim);
        let q = q.reshape((t, nh, d))?;
        let q = self.q_norm.forward(&q)?;
        let q = {
            let _span = profile::span("rope");
            rope.apply(&q)?
        };
        if let (Some(kv), Some((kr, vr))) = (&self.kv, kv_rows) {
            let nkv = self.spec.n_kv_heads;
            let kr = kr.reshape((t, nkv, d))?;
            let vr = match vr {
                Some(v) => v.reshape((t, nkv, d))?,
                None => kr.clone(),
            };
            let k = kv.k_norm.forward(&kr)?;
            let k = {
                let _span = profile::span("rope");
                rope.apply(&k)?
            };
            let v = match &kv.v_norm {
                Some(n) => n.forward(&vr)?,
                None => vr,
            };
            // Before the append: a `+qw` cache weighs these keys by these queries.
            cache.observe_queries(self.spec.index, &q)?;
            let _span = profile::span("kv append");
            cache.append(self.spec.index, &k.transpose(0, 1)?, &v.transpose(0, 1)?)?;
        }
        let q = {
            let _span = profile::span("layout copies");
            q.transpose(0, 1)?.contiguous()?
        };
        let a = {
            let _span = profile::span("attention");
            cache.attend(self.spec.index, &q, start, self.spec.attn_scale, both_ways)?
        };
        let _span = profile::span("layout copies");
        Ok(a.transpose(0, 1)?.contiguous()?.reshape((t, nh * d))?)
    }
}
