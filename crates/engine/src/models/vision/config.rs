//! The vision tower's shape, read from where each checkpoint format keeps it: the
//! `vision_config` of a multimodal `config.json`, or the `clip.vision.*` metadata of an
//! mmproj GGUF (which leaves the rotary base, the pooling kernel and the head width to the
//! projector type, as llama.cpp's `clip.cpp` does for `gemma4v`).

use candle_core::quantized::gguf_file;
use serde_json::Value;

use crate::error::{EngineError, Result};

/// Gemma 4's vision tower and projector, as far as the encoder needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Width of the tower's stream.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Side of a square patch, in pixels.
    pub patch_size: usize,
    /// Side of the square of patches averaged into one soft token.
    pub pooling_kernel_size: usize,
    /// Rows of each axis' learned position table (the widest image, in patches).
    pub position_embedding_size: usize,
    /// Base of the axial rotary frequencies.
    pub rope_theta: f64,
    /// RMS norm epsilon.
    pub rms_norm_eps: f64,
    /// Linear layers clamp their inputs and outputs to stored bounds (E2B, E4B).
    pub clipped_linears: bool,
    /// The pooled soft tokens are shifted and scaled by stored vectors (26B, 31B).
    pub standardize: bool,
    /// The text decoder's width, the projector's output.
    pub text_hidden_size: usize,
}

/// Ids of the image markers a prompt holds (`<|image>`, `<|image|>`, `<image|>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    /// Opens an image.
    pub begin: u32,
    /// One soft token's place.
    pub soft: u32,
    /// Closes an image.
    pub end: u32,
}

fn bad(origin: &str, reason: impl Into<String>) -> EngineError {
    EngineError::ConfigParse {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

/// Largest tower dimension accepted from a file (the real towers are 768 and 1152 wide).
const MAX_DIM: usize = 1 << 16;

impl VisionConfig {
    /// The tower of a multimodal `config.json` (`None` when it has no `vision_config`).
    pub fn from_hf(json: &Value, origin: &str) -> Result<Option<(Self, ImageTokens)>> {
        let Some(v) = json.get("vision_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let num = |obj: &Value, key: &str, default: Option<usize>| -> Result<usize> {
            match obj.get(key) {
                Some(x) => x
                    .as_u64()
                    .map(|n| n as usize)
                    .filter(|n| *n > 0 && *n <= MAX_DIM)
                    .ok_or_else(|| bad(origin, format!("vision_config.{key} is not a size: {x}"))),
                None => default.ok_or_else(|| bad(origin, format!("vision_config.{key} missing"))),
            }
        };
        let id = |key: &str| -> Result<u32> {
            json.get(key)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(origin, format!("{key} missing from a vision checkpoint")))
        };
        let text = json.get("text_config").unwrap_or(json);
        let heads = num(v, "num_attention_heads", None)?;
        let hidden = num(v, "hidden_size", None)?;
        let cfg = Self {
            hidden_size: hidden,
            intermediate_size: num(v, "intermediate_size", None)?,
            num_layers: num(v, "num_hidden_layers", None)?,
            num_heads: heads,
            num_kv_heads: num(v, "num_key_value_heads", Some(heads))?,
            head_dim: num(v, "head_dim", Some(hidden / heads))?,
            patch_size: num(v, "patch_size", Some(16))?,
            pooling_kernel_size: num(v, "pooling_kernel_size", Some(3))?,
            position_embedding_size: num(v, "position_embedding_size", Some(10240))?,
            rope_theta: v
                .get("rope_parameters")
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(100.0),
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            clipped_linears: v
                .get("use_clipped_linears")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            standardize: v
                .get("standardize")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            text_hidden_size: num(text, "hidden_size", None)?,
        };
        if let Some(a) = v.get("hidden_activation").and_then(Value::as_str) {
            if a != "gelu_pytorch_tanh" {
                return Err(bad(
                    origin,
                    format!("vision activation `{a}` not supported"),
                ));
            }
        }
        let tokens = ImageTokens {
            begin: id("boi_token_id")?,
            soft: id("image_token_id")?,
            end: id("eoi_token_id")?,
        };
        cfg.check(origin)?;
        Ok(Some((cfg, tokens)))
    }

    /// The tower an mmproj GGUF describes (`clip.vision.*`, projector `gemma4v`), given the
    /// width its position table and projection are stored at.
    pub fn from_mmproj(
        content: &gguf_file::Content,
        origin: &str,
        position_embedding_size: usize,
    ) -> Result<Self> {
        let md = &content.metadata;
        let u = |key: &str| -> Result<usize> {
            md.get(key)
                .and_then(|v| v.to_u32().ok())
                .map(|n| n as usize)
                .filter(|n| *n > 0 && *n <= MAX_DIM)
                .ok_or_else(|| bad(origin, format!("`{key}` missing or not a size")))
        };
        let projector = md
            .get("clip.vision.projector_type")
            .or_else(|| md.get("clip.projector_type"))
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if projector != "gemma4v" {
            return Err(bad(
                origin,
                format!("projector `{projector}` is not Gemma 4's vision projector (gemma4v)"),
            ));
        }
        let hidden = u("clip.vision.embedding_length")?;
        let heads = u("clip.vision.attention.head_count")?;
        let has = |name: &str| content.tensor_infos.contains_key(name);
        let cfg = Self {
            hidden_size: hidden,
            intermediate_size: u("clip.vision.feed_forward_length")?,
            num_layers: u("clip.vision.block_count")?,
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: hidden / heads,
            patch_size: u("clip.vision.patch_size")?,
            pooling_kernel_size: u("clip.vision.projector.scale_factor").unwrap_or(3),
            position_embedding_size,
            rope_theta: 100.0,
            rms_norm_eps: md
                .get("clip.vision.attention.layer_norm_epsilon")
                .and_then(|v| v.to_f32().ok())
                .map(f64::from)
                .unwrap_or(1e-6),
            clipped_linears: has("v.blk.0.attn_q.input_min"),
            standardize: has("v.std_bias"),
            text_hidden_size: u("clip.vision.projection_dim")?,
        };
        cfg.check(origin)?;
        Ok(cfg)
    }

    fn check(&self, origin: &str) -> Result<()> {
        if !self.head_dim.is_multiple_of(4) || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(
                origin,
                format!(
                    "vision heads of {} with {}/{} heads cannot take the axial rotary",
                    self.head_dim, self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if self.num_layers > 256 || self.pooling_kernel_size > 16 || self.patch_size > 64 {
            return Err(bad(origin, "vision tower sizes past any released model"));
        }
        Ok(())
    }
}
