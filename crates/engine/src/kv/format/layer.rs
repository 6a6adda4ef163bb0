//! What a layer\'s keys and values are stored as: a dense dtype ([`DenseType`]), and for a
//! split layer each side's own format ([`SideSpec`]: dense, TurboQuant codes, or one of
//! llama.cpp's block types) with the options that tune them ([`LayerPrecision`]). The SPEC
//! grammar (docs/cache-options.md) parses and prints these; the storages (`kv::dense`, `kv::split`)
//! hold them.

use kvlab_turboquant::ggml::BlockType;
use kvlab_turboquant::Spec;
use serde::{Deserialize, Serialize};

/// A dense float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseType {
    /// 32-bit floats (reference precision).
    F32,
    /// IEEE half precision (what llama.cpp stores by default).
    F16,
    /// bfloat16.
    Bf16,
}

impl DenseType {
    /// Its lowercase name (`f32`, `f16`, `bf16`), as a SPEC writes it.
    pub fn name(self) -> &'static str {
        match self {
            DenseType::F32 => "f32",
            DenseType::F16 => "f16",
            DenseType::Bf16 => "bf16",
        }
    }

    /// The tensor dtype.
    pub fn dtype(self) -> candle_core::DType {
        match self {
            DenseType::F32 => candle_core::DType::F32,
            DenseType::F16 => candle_core::DType::F16,
            DenseType::Bf16 => candle_core::DType::BF16,
        }
    }

    /// Bytes of one coordinate.
    pub fn bytes(self) -> usize {
        self.dtype().size_in_bytes()
    }
}

/// How one side (keys or values) of a split layer is stored: by its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideSpec {
    /// Dense floats (e.g. values kept exact while keys are quantized).
    Dense(DenseType),
    /// TurboQuant codes under this codec spec.
    Codes(Spec),
    /// One of llama.cpp's block types (`q8_0`, `q4_0`, …), bit for bit as ggml stores it.
    Blocks(BlockType),
}

impl SideSpec {
    /// Dense f16.
    pub const F16: SideSpec = SideSpec::Dense(DenseType::F16);
    /// Dense bf16.
    pub const BF16: SideSpec = SideSpec::Dense(DenseType::Bf16);
    /// Dense f32.
    pub const F32: SideSpec = SideSpec::Dense(DenseType::F32);

    /// The codec spec, if this side is TurboQuant codes.
    pub fn spec(&self) -> Option<&Spec> {
        match self {
            SideSpec::Codes(s) => Some(s),
            _ => None,
        }
    }

    /// The llama.cpp block type, if this side is one.
    pub fn block(&self) -> Option<BlockType> {
        match self {
            SideSpec::Blocks(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether this side holds dense floats (every token as it came).
    pub fn is_dense(&self) -> bool {
        matches!(self, SideSpec::Dense(_))
    }

    /// The dtype of a dense side.
    pub fn dense_dtype(&self) -> Option<candle_core::DType> {
        match self {
            SideSpec::Dense(d) => Some(d.dtype()),
            _ => None,
        }
    }
}

/// The precision of a split layer: keys and values each stored in their own format (dense,
/// TurboQuant codes or a llama.cpp block type), and the options that tune those formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerPrecision {
    /// How keys are stored.
    pub key: SideSpec,
    /// How values are stored.
    pub value: SideSpec,
    /// Whether coded sides store vectors relative to a per-head offset (docs/cache-options.md).
    #[serde(default = "center_by_default")]
    pub center: bool,
    /// Whether coded keys are weighted per channel by the queries' energy (`+qw`, docs/cache-options.md).
    #[serde(default)]
    pub weigh_keys: bool,
    /// Whether block-type sides are stored Hadamard-rotated as upstream llama.cpp does
    /// (`+norot` turns it off; docs/cache-options.md). TurboQuant sides always rotate.
    #[serde(default = "rotate_by_default")]
    pub rotate: bool,
    /// Whether compressed sides (blocks or TurboQuant codes) keep their first token as an
    /// f16 row as well (`+sink`; docs/cache-options.md).
    #[serde(default)]
    pub sink: bool,
}

fn rotate_by_default() -> bool {
    true
}

fn center_by_default() -> bool {
    true
}

impl LayerPrecision {
    /// Whether the keys (`is_key`) or the values calibrate on their first rows (docs/cache-options.md):
    /// a coded side that is centered, or coded keys weighted by the queries (`+qw`).
    pub(crate) fn calibrates(&self, is_key: bool) -> bool {
        let side = if is_key { self.key } else { self.value };
        side.spec().is_some() && (self.center || (is_key && self.weigh_keys))
    }

    /// Keys and values as given, centered (the default).
    pub fn new(key: SideSpec, value: SideSpec) -> Self {
        Self {
            key,
            value,
            center: true,
            weigh_keys: false,
            rotate: true,
            sink: false,
        }
    }

    /// Bytes a layer of `n_kv_heads × head_dim` holds for its first token as f16 rows, one
    /// per `+sink` side that is not dense (blocks or codes) and head.
    pub(crate) fn sink_bytes(&self, n_kv_heads: usize, head_dim: usize) -> usize {
        if !self.sink {
            return 0;
        }
        let sides = [self.key, self.value]
            .iter()
            .filter(|s| !s.is_dense())
            .count();
        sides * n_kv_heads * head_dim * std::mem::size_of::<half::f16>()
    }

    /// Why a precision cannot be: `+sink` with only dense sides, which hold every token
    /// as it is already.
    pub(crate) fn refusal(&self) -> Option<&'static str> {
        (self.sink && !self.has_block() && !self.has_codes())
            .then_some("`+sink` keeps the first token of compressed sides; this cache has none")
    }

    /// Whether a side is one of llama.cpp's block types (the SPEC then takes the
    /// `key/value` form and covers every layer unless scoped).
    pub fn has_block(&self) -> bool {
        self.key.block().is_some() || self.value.block().is_some()
    }

    /// Whether a side is TurboQuant codes.
    pub fn has_codes(&self) -> bool {
        self.key.spec().is_some() || self.value.spec().is_some()
    }
}
