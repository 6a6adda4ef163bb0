//! The side-format registry: one row per format a cache's keys or values can take (dense
//! dtypes, each TurboQuant width, each of llama.cpp's block types), as ggml's `type_traits`
//! is for tensors. A row gives the format's menu value, its SPEC token, its label, its
//! nominal bits per coordinate and the storage side it stands for; the bytes a stored vector
//! takes are [`side_bytes`]. The SPEC grammar (`kv::spec`), the menus and choices
//! (`kv::spec::presets`), the estimate and the card read these. Adding a format is a row here plus
//! its storage segment and kernels (`kv::split`'s `Seg`, the codec's `ggml`).

use kvlab_turboquant::ggml::BlockType;
use kvlab_turboquant::{Bits, Spec};
use serde::{Deserialize, Serialize};
use ts_rs::TS;

mod layer;
mod precision;

pub use layer::{DenseType, LayerPrecision, SideSpec};
pub(crate) use precision::TQ_ROW_GRAIN;
pub use precision::{calibration_rows, KvPrecision, CALIBRATION_ROWS, MIN_CALIBRATION_ROWS};

use crate::error::{EngineError, Result};

/// How one side (keys or values) is stored, as a menu choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
pub enum SideFormat {
    /// 32-bit floats.
    #[serde(rename = "f32")]
    F32,
    /// IEEE half precision.
    #[serde(rename = "f16")]
    F16,
    /// bfloat16.
    #[serde(rename = "bf16")]
    Bf16,
    /// TurboQuant, 8 bits per coordinate.
    #[serde(rename = "8")]
    Tq8,
    /// TurboQuant, 6 bits.
    #[serde(rename = "6")]
    Tq6,
    /// TurboQuant, 5 bits.
    #[serde(rename = "5")]
    Tq5,
    /// TurboQuant, 4.5 bits (half the coordinates at 5, half at 4).
    #[serde(rename = "4.5")]
    Tq4_5,
    /// TurboQuant, 4 bits per coordinate.
    #[serde(rename = "4")]
    Tq4,
    /// TurboQuant, 3.5 bits (half the coordinates at 4, half at 3).
    #[serde(rename = "3.5")]
    Tq3_5,
    /// TurboQuant, 3 bits.
    #[serde(rename = "3")]
    Tq3,
    /// TurboQuant, 2.5 bits.
    #[serde(rename = "2.5")]
    Tq2_5,
    /// TurboQuant, 2 bits.
    #[serde(rename = "2")]
    Tq2,
    /// llama.cpp's q8_0: 8.5 bits.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// llama.cpp's q5_1: 6 bits.
    #[serde(rename = "q5_1")]
    Q5_1,
    /// llama.cpp's q5_0: 5.5 bits.
    #[serde(rename = "q5_0")]
    Q5_0,
    /// llama.cpp's q4_1: 5 bits.
    #[serde(rename = "q4_1")]
    Q4_1,
    /// llama.cpp's q4_0: 4.5 bits.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// llama.cpp's iq4_nl: 4.5 bits, non-linear levels.
    #[serde(rename = "iq4_nl")]
    Iq4Nl,
}

/// What a format is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// Dense floats of this many bytes.
    Dense(usize),
    /// TurboQuant codes at these bits.
    TurboQuant(Bits),
    /// One of ggml's block types.
    Block(BlockType),
}

/// One registry row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FormatRow {
    pub(crate) format: SideFormat,
    /// The side's token in a `key/value` SPEC.
    pub(crate) token: &'static str,
    /// What a menu shows.
    pub(crate) label: &'static str,
    pub(crate) kind: Kind,
}

const fn row(
    format: SideFormat,
    token: &'static str,
    label: &'static str,
    kind: Kind,
) -> FormatRow {
    FormatRow {
        format,
        token,
        label,
        kind,
    }
}

/// Every format, in menu order: dense, TurboQuant from most to fewest bits, llama.cpp's
/// types from most to fewest bits.
pub(crate) const REGISTRY: [FormatRow; 18] = {
    use Kind::*;
    use SideFormat as F;
    [
        row(F::F32, "f32", "FP32", Dense(4)),
        row(F::F16, "f16", "FP16", Dense(2)),
        row(F::Bf16, "bf16", "BF16", Dense(2)),
        row(F::Tq8, "tq8", "TQ 8", TurboQuant(Bits::B8)),
        row(F::Tq6, "tq6", "TQ 6", TurboQuant(Bits::B6)),
        row(F::Tq5, "tq5", "TQ 5", TurboQuant(Bits::B5)),
        row(F::Tq4_5, "tq4.5", "TQ 4.5", TurboQuant(Bits::B4_5)),
        row(F::Tq4, "tq4", "TQ 4", TurboQuant(Bits::B4)),
        row(F::Tq3_5, "tq3.5", "TQ 3.5", TurboQuant(Bits::B3_5)),
        row(F::Tq3, "tq3", "TQ 3", TurboQuant(Bits::B3)),
        row(F::Tq2_5, "tq2.5", "TQ 2.5", TurboQuant(Bits::B2_5)),
        row(F::Tq2, "tq2", "TQ 2", TurboQuant(Bits::B2)),
        row(F::Q8_0, "q8_0", "q8_0", Block(BlockType::Q8_0)),
        row(F::Q5_1, "q5_1", "q5_1", Block(BlockType::Q5_1)),
        row(F::Q5_0, "q5_0", "q5_0", Block(BlockType::Q5_0)),
        row(F::Q4_1, "q4_1", "q4_1", Block(BlockType::Q4_1)),
        row(F::Q4_0, "q4_0", "q4_0", Block(BlockType::Q4_0)),
        row(F::Iq4Nl, "iq4_nl", "iq4_nl", Block(BlockType::Iq4Nl)),
    ]
};

impl SideFormat {
    /// Every format, in menu order.
    pub fn all() -> impl Iterator<Item = SideFormat> {
        REGISTRY.iter().map(|r| r.format)
    }

    pub(crate) fn row(self) -> &'static FormatRow {
        // Every variant has its row (a test holds the registry to that).
        REGISTRY
            .iter()
            .find(|r| r.format == self)
            .unwrap_or(&REGISTRY[1])
    }

    /// The format a `key/value` SPEC token names.
    pub(crate) fn from_token(token: &str) -> Option<SideFormat> {
        REGISTRY.iter().find(|r| r.token == token).map(|r| r.format)
    }

    /// What a menu shows (`FP16`, `TQ 3.5`, `q8_0`).
    pub fn label(self) -> &'static str {
        self.row().label
    }

    /// The side's token in a SPEC (`f16`, `tq3.5`, `q8_0`).
    pub fn token(self) -> &'static str {
        self.row().token
    }

    /// Whether the side is dense floats.
    pub fn is_dense(self) -> bool {
        matches!(self.row().kind, Kind::Dense(_))
    }

    /// Whether the side is TurboQuant codes.
    pub fn is_turboquant(self) -> bool {
        matches!(self.row().kind, Kind::TurboQuant(_))
    }

    /// Whether the side is one of llama.cpp's block types.
    pub fn is_llama_cpp(self) -> bool {
        matches!(self.row().kind, Kind::Block(_))
    }

    /// Bits a coordinate takes as stored, before any per-layer offsets and weights.
    pub fn bits_per_coordinate(self) -> f64 {
        match self.row().kind {
            Kind::Dense(bytes) => (bytes * 8) as f64,
            Kind::TurboQuant(b) => b.value(),
            Kind::Block(t) => t.bits_per_coordinate(),
        }
    }

    /// The storage side this format stands for in a layer whose keys and values differ,
    /// with the defaults a SPEC gets (TurboQuant keys keep the unbiased norm scale,
    /// `kv::spec`).
    pub(crate) fn side(self, is_key: bool) -> SideSpec {
        match self.row().kind {
            Kind::Dense(_) => match self {
                SideFormat::F32 => SideSpec::F32,
                SideFormat::Bf16 => SideSpec::BF16,
                _ => SideSpec::F16,
            },
            Kind::TurboQuant(bits) => SideSpec::Codes(Spec {
                unbiased: is_key,
                ..Spec::mse(bits)
            }),
            Kind::Block(t) => SideSpec::Blocks(t),
        }
    }
}

/// Bytes one stored vector of `head_dim` coordinates takes on a side of a layer whose keys
/// and values differ: dense floats, TurboQuant codes as the codec lays them out, or ggml's
/// blocks.
pub(crate) fn side_bytes(side: &SideSpec, head_dim: usize) -> Result<usize> {
    match side {
        SideSpec::Codes(spec) => kvlab_turboquant::bytes_per_vector(head_dim, spec)
            .map_err(|e| EngineError::invalid(e.to_string())),
        SideSpec::Blocks(ty) => ty
            .row_bytes(head_dim)
            .map_err(|e| EngineError::invalid(format!("{}: {e}", ty.name()))),
        dense => dense
            .dense_dtype()
            .map(|dtype| head_dim * dtype.size_in_bytes())
            .ok_or_else(|| EngineError::invalid("a side with no byte formula")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_one_row_and_one_token() {
        let mut seen = std::collections::HashSet::new();
        for r in REGISTRY {
            assert!(seen.insert(r.format), "{:?} twice", r.format);
            assert_eq!(SideFormat::from_token(r.token), Some(r.format));
            // The menu value in JSON is the TurboQuant bits or the token itself.
            let json = serde_json::to_string(&r.format).unwrap();
            assert_eq!(json.trim_matches('"'), r.token.trim_start_matches("tq"));
        }
        assert_eq!(seen.len(), REGISTRY.len());
    }

    #[test]
    fn bytes_follow_the_formats() {
        // 256-wide heads: q8_0 8 blocks of 34 bytes, q4_0 of 18: 8.5 and 4.5 bits.
        let q8 = SideFormat::Q8_0.side(true);
        let q4 = SideFormat::Q4_0.side(false);
        assert_eq!(side_bytes(&q8, 256).unwrap() * 8, 256 * 17 / 2);
        assert_eq!(side_bytes(&q4, 256).unwrap() * 8, 256 * 9 / 2);
        assert_eq!(side_bytes(&SideSpec::F16, 256).unwrap(), 512);
        assert!(side_bytes(&q8, 80).is_err());
        assert_eq!(SideFormat::Q4_1.bits_per_coordinate(), 5.0);
        assert_eq!(SideFormat::Tq3_5.bits_per_coordinate(), 3.5);
        assert_eq!(SideFormat::F32.side(true), SideSpec::F32);
        assert_eq!(side_bytes(&SideSpec::F32, 256).unwrap(), 1024);
        assert_eq!(side_bytes(&SideSpec::BF16, 256).unwrap(), 512);
    }
}
