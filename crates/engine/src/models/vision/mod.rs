//! Gemma 4's vision tower and projector: an image's patches in (see [`preprocess`]), its soft
//! tokens out, in the text decoder's embedding space, ready to take the places of the
//! `<|image|>` tokens of a prompt. Loaded from a multimodal safetensors checkpoint
//! (`model.vision_tower.*`, `model.embed_vision.*`) or from llama.cpp's mmproj GGUF
//! (`v.*`, `mm.*`); computed as transformers' `Gemma4VisionModel` and
//! `Gemma4MultimodalEmbedder` compute it, in f32, on the patches of one image without the
//! processor's padding (padding patches are masked out of attention and pooling there, so the
//! real ones come out the same).

pub mod config;
pub mod preprocess;

use std::path::Path;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor, D};

use super::common::{Linear, RmsNorm};
use crate::checkpoint::weights::{Matrix, WeightStore};
use crate::checkpoint::LoadOptions;
use crate::error::{EngineError, Result};
use config::{ImageTokens, VisionConfig};
pub use preprocess::Patches;

/// Query rows attended at once: bounds the score matrix of a large image (10,080 patches at
/// 1,120 soft tokens) to `rows × patches` per head.
const QUERY_BLOCK: usize = 1024;

/// Where the tower's tensors are named: a transformers checkpoint or an mmproj GGUF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    Hf,
    Gguf,
}

impl Names {
    fn layer(self, i: usize, part: &str) -> String {
        match self {
            Names::Hf => format!("vision_tower.encoder.layers.{i}.{part}"),
            Names::Gguf => {
                let short = match part {
                    "input_layernorm.weight" => "ln1.weight",
                    "post_attention_layernorm.weight" => "attn_post_norm.weight",
                    "pre_feedforward_layernorm.weight" => "ln2.weight",
                    "post_feedforward_layernorm.weight" => "ffn_post_norm.weight",
                    "self_attn.q_norm.weight" => "attn_q_norm.weight",
                    "self_attn.k_norm.weight" => "attn_k_norm.weight",
                    "self_attn.q_proj" => "attn_q",
                    "self_attn.k_proj" => "attn_k",
                    "self_attn.v_proj" => "attn_v",
                    "self_attn.o_proj" => "attn_out",
                    "mlp.gate_proj" => "ffn_gate",
                    "mlp.up_proj" => "ffn_up",
                    "mlp.down_proj" => "ffn_down",
                    other => other,
                };
                format!("v.blk.{i}.{short}")
            }
        }
    }

    /// A clippable linear's weight, and the prefix of its bounds.
    fn linear(self, i: usize, part: &str) -> (String, String) {
        let base = self.layer(i, part);
        match self {
            Names::Hf => (format!("{base}.linear.weight"), base),
            Names::Gguf => (format!("{base}.weight"), base),
        }
    }

    fn top(self, hf: &'static str) -> &'static str {
        match (self, hf) {
            (Names::Hf, n) => n,
            (Names::Gguf, "vision_tower.patch_embedder.input_proj.weight") => "v.patch_embd.weight",
            (Names::Gguf, "vision_tower.patch_embedder.position_embedding_table") => {
                "v.position_embd.weight"
            }
            (Names::Gguf, "vision_tower.std_bias") => "v.std_bias",
            (Names::Gguf, "vision_tower.std_scale") => "v.std_scale",
            (Names::Gguf, "embed_vision.embedding_projection.weight") => {
                "mm.input_projection.weight"
            }
            (Names::Gguf, n) => n,
        }
    }
}

/// A linear layer whose input and output may be clamped to stored bounds.
#[derive(Debug, Clone)]
struct ClippedLinear {
    linear: Linear,
    bounds: Option<[f64; 4]>,
}

impl ClippedLinear {
    fn load(
        ws: &WeightStore,
        names: Names,
        cfg: &VisionConfig,
        i: usize,
        part: &str,
        out: usize,
        inp: usize,
    ) -> Result<Self> {
        let (weight, base) = names.linear(i, part);
        let linear = Linear::load(ws, &weight, out, inp)?;
        let bounds = if cfg.clipped_linears {
            let scalar = |suffix: &str| -> Result<f64> {
                let name = format!("{base}.{suffix}");
                let shape: &[usize] = if names == Names::Hf { &[] } else { &[1] };
                let v = ws
                    .tensor_as(&name, shape, DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?[0];
                if v.is_nan() {
                    return Err(EngineError::CorruptFile {
                        path: ws.path().to_path_buf(),
                        reason: format!("clip bound `{name}` is NaN"),
                    });
                }
                Ok(f64::from(v))
            };
            Some([
                scalar("input_min")?,
                scalar("input_max")?,
                scalar("output_min")?,
                scalar("output_max")?,
            ])
        } else {
            None
        };
        Ok(Self { linear, bounds })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.bounds {
            None => self.linear.forward_as("vision matmul", x),
            Some([imin, imax, omin, omax]) => {
                let y = self
                    .linear
                    .forward_as("vision matmul", &x.clamp(imin, imax)?)?;
                Ok(y.clamp(omin, omax)?)
            }
        }
    }
}

#[derive(Debug, Clone)]
struct EncoderLayer {
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
    pre_ffw_norm: RmsNorm,
    post_ffw_norm: RmsNorm,
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    o: ClippedLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    v_norm: RmsNorm,
    gate: ClippedLinear,
    up: ClippedLinear,
    down: ClippedLinear,
}

impl EncoderLayer {
    fn load(ws: &WeightStore, names: Names, cfg: &VisionConfig, i: usize) -> Result<Self> {
        let (h, f, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let eps = cfg.rms_norm_eps;
        let norm = |part: &str, dim: usize| RmsNorm::load(ws, &names.layer(i, part), dim, eps, 0.0);
        let lin = |part: &str, out: usize, inp: usize| {
            ClippedLinear::load(ws, names, cfg, i, part, out, inp)
        };
        Ok(Self {
            input_norm: norm("input_layernorm.weight", h)?,
            post_attention_norm: norm("post_attention_layernorm.weight", h)?,
            pre_ffw_norm: norm("pre_feedforward_layernorm.weight", h)?,
            post_ffw_norm: norm("post_feedforward_layernorm.weight", h)?,
            q: lin("self_attn.q_proj", cfg.num_heads * hd, h)?,
            k: lin("self_attn.k_proj", cfg.num_kv_heads * hd, h)?,
            v: lin("self_attn.v_proj", cfg.num_kv_heads * hd, h)?,
            o: lin("self_attn.o_proj", h, cfg.num_heads * hd)?,
            q_norm: norm("self_attn.q_norm.weight", hd)?,
            k_norm: norm("self_attn.k_norm.weight", hd)?,
            v_norm: RmsNorm::unit(hd, eps, DType::F32, ws.device())?,
            gate: lin("mlp.gate_proj", f, h)?,
            up: lin("mlp.up_proj", f, h)?,
            down: lin("mlp.down_proj", h, f)?,
        })
    }

    fn forward(&self, x: &Tensor, rope: &AxialRope, cfg: &VisionConfig) -> Result<Tensor> {
        let n = x.dim(0)?;
        let (heads, kv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let h = self.input_norm.forward(x)?;
        let q = self
            .q_norm
            .forward(&self.q.forward(&h)?.reshape((n, heads, hd))?)?;
        let k = self
            .k_norm
            .forward(&self.k.forward(&h)?.reshape((n, kv, hd))?)?;
        let v = self
            .v_norm
            .forward(&self.v.forward(&h)?.reshape((n, kv, hd))?)?;
        let q = rope.apply(&q)?.transpose(0, 1)?.contiguous()?; // [heads, n, hd]
        let k = rope.apply(&k)?.transpose(0, 1)?.contiguous()?;
        let v = v.transpose(0, 1)?.contiguous()?;
        let group = heads / kv;
        let mut outs = Vec::with_capacity(heads);
        for head in 0..heads {
            let (qh, kh, vh) = (q.get(head)?, k.get(head / group)?, v.get(head / group)?);
            let kt = kh.t()?.contiguous()?;
            let mut rows = Vec::new();
            for start in (0..n).step_by(QUERY_BLOCK) {
                let len = QUERY_BLOCK.min(n - start);
                // Scale 1: the query and key norms carry it.
                let scores = qh.narrow(0, start, len)?.matmul(&kt)?;
                let p = candle_nn::ops::softmax_last_dim(&scores)?;
                rows.push(p.matmul(&vh)?);
            }
            outs.push(Tensor::cat(&rows, 0)?);
        }
        let attn = Tensor::stack(&outs, 1)?.reshape((n, heads * hd))?;
        let x = (x + self.post_attention_norm.forward(&self.o.forward(&attn)?)?)?;
        let h = self.pre_ffw_norm.forward(&x)?;
        let g = (self.gate.forward(&h)?.gelu()? * self.up.forward(&h)?)?;
        Ok((&x + self.post_ffw_norm.forward(&self.down.forward(&g)?)?)?)
    }
}

/// Axial 2-D rotary tables: the first half of each head turns with the patch's column, the
/// second with its row, each half rotated as a whole (`rotate_half` within the half).
struct AxialRope {
    cos: Tensor,
    sin: Tensor,
    head_dim: usize,
}

impl AxialRope {
    fn new(cfg: &VisionConfig, positions: &[(u32, u32)], device: &Device) -> Result<Self> {
        let hd = cfg.head_dim;
        let quarter = hd / 4;
        let half = hd / 2;
        let inv: Vec<f32> = (0..quarter)
            .map(|j| (1.0 / cfg.rope_theta.powf((2 * j) as f64 / half as f64)) as f32)
            .collect();
        let n = positions.len();
        let (mut cos, mut sin) = (Vec::with_capacity(n * hd), Vec::with_capacity(n * hd));
        for &(x, y) in positions {
            for p in [x, y] {
                for _ in 0..2 {
                    for f in &inv {
                        let a = p as f32 * f;
                        cos.push(a.cos());
                        sin.push(a.sin());
                    }
                }
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, 1, hd), device)?,
            sin: Tensor::from_vec(sin, (n, 1, hd), device)?,
            head_dim: hd,
        })
    }

    /// `x` `[n, heads, hd]` rotated.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let q = self.head_dim / 4;
        let part = |i: usize| x.narrow(D::Minus1, i * q, q);
        let rotated = Tensor::cat(
            &[part(1)?.neg()?, part(0)?, part(3)?.neg()?, part(2)?],
            D::Minus1,
        )?;
        Ok((x.broadcast_mul(&self.cos)? + rotated.broadcast_mul(&self.sin)?)?)
    }
}

/// A loaded vision tower and projector.
#[derive(Debug)]
pub struct VisionTower {
    config: VisionConfig,
    tokens: Option<ImageTokens>,
    patch_proj: Linear,
    position_table: Tensor,
    layers: Vec<EncoderLayer>,
    standardize: Option<(Tensor, Tensor)>,
    projector_norm: RmsNorm,
    projector: Linear,
    device: Device,
    weights_bytes: usize,
    /// Soft tokens an image takes at most, as the checkpoint's processor sets it.
    soft_token_budget: usize,
}

/// What [`VisionTower::encode`] computes, at both ends of the projector.
#[derive(Debug)]
pub struct Encoded {
    /// The pooled (and standardized) tower output `[soft tokens, vision hidden]`.
    pub tower: Tensor,
    /// The soft tokens in the text decoder's space `[soft tokens, text hidden]`.
    pub soft_tokens: Tensor,
}

impl VisionTower {
    /// The tower of a multimodal safetensors checkpoint (`dir` holds `config.json` and the
    /// weights), or `None` when its config has no `vision_config`.
    pub fn from_safetensors(dir: &Path, opts: &LoadOptions) -> Result<Option<Self>> {
        let dir = crate::checkpoint::weights::checkpoint_dir(dir);
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
            path: path.clone(),
            source,
        })?;
        let origin = path.display().to_string();
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| EngineError::ConfigParse {
                origin: origin.clone(),
                reason: e.to_string(),
            })?;
        let Some((cfg, tokens)) = VisionConfig::from_hf(&json, &origin)? else {
            return Ok(None);
        };
        let ws = WeightStore::open_safetensors_prefixed(&dir, opts, "model.")?;
        let mut tower = Self::load(&ws, Names::Hf, cfg, Some(tokens))?;
        // The processor's budget beside the weights (`max_soft_tokens`), as transformers'
        // processor reads it; a value Gemma 4 does not take is refused when used.
        let budget = std::fs::read_to_string(dir.join("preprocessor_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|j| j.get("max_soft_tokens").and_then(|v| v.as_u64()));
        if let Some(b) = budget {
            tower.soft_token_budget = usize::try_from(b).unwrap_or(usize::MAX);
        }
        Ok(Some(tower))
    }

    /// The tower of an mmproj GGUF written by llama.cpp's converter (projector `gemma4v`).
    pub fn from_mmproj(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let ws = WeightStore::open_gguf(path, opts)?;
        let content = ws
            .gguf_content()
            .ok_or_else(|| EngineError::invalid("an mmproj must be a GGUF file"))?;
        let origin = path.display().to_string();
        let table = content
            .tensor_infos
            .get("v.position_embd.weight")
            .ok_or_else(|| EngineError::MissingTensor {
                name: "v.position_embd.weight".into(),
                origin: origin.clone(),
            })?;
        let positions = match table.shape.dims() {
            [2, p, _] => *p,
            other => {
                return Err(EngineError::ShapeMismatch {
                    name: "v.position_embd.weight".into(),
                    expected: vec![2, 0, 0],
                    actual: other.to_vec(),
                })
            }
        };
        let cfg = VisionConfig::from_mmproj(content, &origin, positions)?;
        Self::load(&ws, Names::Gguf, cfg, None)
    }

    fn load(
        ws: &WeightStore,
        names: Names,
        cfg: VisionConfig,
        tokens: Option<ImageTokens>,
    ) -> Result<Self> {
        let (h, p) = (cfg.hidden_size, cfg.patch_size);
        let patch = 3 * p * p;
        let patch_proj = match names {
            Names::Hf => Linear::load(
                ws,
                names.top("vision_tower.patch_embedder.input_proj.weight"),
                h,
                patch,
            )?,
            // llama.cpp stores the patch embedding as a convolution kernel [h, 3, p, p];
            // transformers flattens each patch row by row, channels innermost.
            Names::Gguf => {
                let w = ws.tensor_as(
                    names.top("vision_tower.patch_embedder.input_proj.weight"),
                    &[h, 3, p, p],
                    DType::F32,
                )?;
                let w = w.permute((0, 2, 3, 1))?.reshape((h, patch))?.contiguous()?;
                Linear::new(Matrix::Candle(QMatMul::Tensor(w)))
            }
        };
        let position_table = ws.tensor_as(
            names.top("vision_tower.patch_embedder.position_embedding_table"),
            &[2, cfg.position_embedding_size, h],
            DType::F32,
        )?;
        let layers = (0..cfg.num_layers)
            .map(|i| EncoderLayer::load(ws, names, &cfg, i))
            .collect::<Result<Vec<_>>>()?;
        let standardize = if cfg.standardize {
            Some((
                ws.tensor_as(names.top("vision_tower.std_bias"), &[h], DType::F32)?,
                ws.tensor_as(names.top("vision_tower.std_scale"), &[h], DType::F32)?,
            ))
        } else {
            None
        };
        let projector = Linear::load(
            ws,
            names.top("embed_vision.embedding_projection.weight"),
            cfg.text_hidden_size,
            h,
        )?;
        Ok(Self {
            projector_norm: RmsNorm::unit(h, cfg.rms_norm_eps, DType::F32, ws.device())?,
            projector,
            patch_proj,
            position_table,
            layers,
            standardize,
            tokens,
            device: ws.device().clone(),
            weights_bytes: ws.loaded_bytes(),
            config: cfg,
            soft_token_budget: preprocess::DEFAULT_SOFT_TOKENS,
        })
    }

    /// The tower's shape.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The image marker ids the checkpoint's config names (an mmproj leaves them to the text
    /// model's vocabulary).
    pub fn tokens(&self) -> Option<ImageTokens> {
        self.tokens
    }

    /// Soft tokens an image takes at most: the checkpoint's `preprocessor_config.json`
    /// says (`max_soft_tokens`), else Gemma 4's default.
    pub fn soft_token_budget(&self) -> usize {
        self.soft_token_budget
    }

    /// Bytes of the tower's weights as held.
    pub fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// One image's soft tokens from its patches.
    pub fn encode(&self, patches: &Patches) -> Result<Encoded> {
        let cfg = &self.config;
        let k = cfg.pooling_kernel_size;
        let n = patches.positions.len();
        let width = 3 * cfg.patch_size * cfg.patch_size;
        if n == 0 || patches.values.len() != n * width || !n.is_multiple_of(k * k) {
            return Err(EngineError::invalid(format!(
                "{n} patches of {} values do not make whole {k}×{k} soft tokens of {width}-value patches",
                patches.values.len()
            )));
        }
        let max = cfg.position_embedding_size as u32;
        if let Some(&(x, y)) = patches
            .positions
            .iter()
            .find(|(x, y)| *x >= max || *y >= max)
        {
            return Err(EngineError::invalid(format!(
                "patch ({x}, {y}) is past the tower's {max} positions per side"
            )));
        }
        // Pooling reads the patches as a grid of whole k×k squares: each bin below must be
        // one of the `n / k²` soft tokens.
        let grid = patches.positions.iter().fold((0, 0), |(w, h), &(x, y)| {
            (w.max(x as usize + 1), h.max(y as usize + 1))
        });
        if grid.0 * grid.1 != n || !grid.0.is_multiple_of(k) || !grid.1.is_multiple_of(k) {
            return Err(EngineError::invalid(format!(
                "{n} patches spanning {}×{} do not tile whole {k}×{k} squares",
                grid.0, grid.1
            )));
        }
        let pixels = Tensor::from_slice(&patches.values, (n, width), &self.device)?;
        // Pixels in [0, 1] become [-1, 1] in the model (its processor does not normalize).
        let pixels = ((pixels - 0.5)? * 2.0)?;
        let (xs, ys): (Vec<u32>, Vec<u32>) = patches.positions.iter().copied().unzip();
        let xs = Tensor::new(xs.as_slice(), &self.device)?;
        let ys = Tensor::new(ys.as_slice(), &self.device)?;
        let pos = (self.position_table.get(0)?.index_select(&xs, 0)?
            + self.position_table.get(1)?.index_select(&ys, 0)?)?;
        let mut x = (self.patch_proj.forward_as("vision matmul", &pixels)? + pos)?;
        let rope = AxialRope::new(cfg, &patches.positions, &self.device)?;
        for layer in &self.layers {
            x = layer.forward(&x, &rope, cfg)?;
        }
        // Average each k×k square of patches into one soft token, in row-major order of
        // the squares, then scale by √hidden (in f32, as the reference does).
        let per_row = grid.0 / k;
        let bins: Vec<u32> = patches
            .positions
            .iter()
            .map(|&(x, y)| (x as usize / k + per_row * (y as usize / k)) as u32)
            .collect();
        let soft = n / (k * k);
        let bins = Tensor::new(bins.as_slice(), &self.device)?;
        let pooled = Tensor::zeros((soft, cfg.hidden_size), DType::F32, &self.device)?
            .index_add(&bins, &x, 0)?;
        let mut tower = (pooled * ((cfg.hidden_size as f64).sqrt() / (k * k) as f64))?;
        if let Some((bias, scale)) = &self.standardize {
            tower = tower.broadcast_sub(bias)?.broadcast_mul(scale)?;
        }
        let soft_tokens = self
            .projector
            .forward_as("vision projector", &self.projector_norm.forward(&tower)?)?;
        Ok(Encoded { tower, soft_tokens })
    }
}
