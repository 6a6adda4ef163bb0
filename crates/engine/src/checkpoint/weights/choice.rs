//! The precision a safetensors checkpoint's matrices are held in once loaded (in-situ
//! quantization, `--weights`), and the one rule that maps a choice and a matrix's row
//! length to its held type: the loader and the pre-load estimate both ask it.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// How the matrices of a safetensors checkpoint are held. GGUF files keep the types they
/// were quantized to; this choice does not apply to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
pub enum WeightsChoice {
    /// llama.cpp's Q4_K: 4.5 bits per weight in blocks of 256 (rows of other lengths fall
    /// back to Q8_0).
    #[serde(rename = "q4_k")]
    Q4K,
    /// Q8_0: 8.5 bits per weight in blocks of 32, nearly lossless.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// IEEE half precision.
    #[serde(rename = "f16")]
    F16,
    /// bfloat16, the released checkpoints' own type.
    #[serde(rename = "bf16")]
    Bf16,
    /// Dense f32 (tables keep their stored 16-bit form).
    #[serde(rename = "f32")]
    F32,
}

/// Every choice, in menu order.
pub const WEIGHTS_CHOICES: [WeightsChoice; 5] = [
    WeightsChoice::Q4K,
    WeightsChoice::Q8_0,
    WeightsChoice::F16,
    WeightsChoice::Bf16,
    WeightsChoice::F32,
];

/// How one tensor is held: quantized blocks (including ggml's F16/BF16 rows on the CPU,
/// whose matmul kernels read them directly) or a dense candle tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A `QTensor` of this type.
    Quantized(GgmlDType),
    /// A dense tensor of this dtype.
    Dense(DType),
}

impl Held {
    /// Bytes `elements` values take held this way.
    pub fn bytes(self, elements: u64) -> u64 {
        match self {
            Held::Quantized(q) => elements / q.block_size() as u64 * q.type_size() as u64,
            Held::Dense(d) => elements * d.size_in_bytes() as u64,
        }
    }
}

impl WeightsChoice {
    /// The name used by the CLI, the settings file and the UI.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightsChoice::Q4K => "q4_k",
            WeightsChoice::Q8_0 => "q8_0",
            WeightsChoice::F16 => "f16",
            WeightsChoice::Bf16 => "bf16",
            WeightsChoice::F32 => "f32",
        }
    }

    /// The default on a device. CPU: Q8_0 (candle's CPU matmul has SIMD kernels for it, it is
    /// a quarter of f32 and nearly lossless; the CPU cannot multiply bf16 directly). Metal and
    /// CUDA: bf16, the checkpoints' own type, which their matmul kernels take natively.
    pub fn default_for(device: &Device) -> Self {
        if device.is_cpu() {
            WeightsChoice::Q8_0
        } else {
            WeightsChoice::Bf16
        }
    }

    /// How a matrix with rows of `cols` values is held on `device`. Quantized types need the
    /// row length to be a multiple of their block: Q4_K falls back to Q8_0, and Q8_0 to
    /// f16 (only the tiny test models have such rows).
    pub fn matrix(self, cols: usize, device: &Device) -> Held {
        let fits = |q: GgmlDType| cols.is_multiple_of(q.block_size());
        let half = |q: GgmlDType, d: DType| {
            if device.is_cpu() {
                Held::Quantized(q)
            } else {
                Held::Dense(d)
            }
        };
        match self {
            WeightsChoice::Q4K if fits(GgmlDType::Q4K) => Held::Quantized(GgmlDType::Q4K),
            WeightsChoice::Q4K | WeightsChoice::Q8_0 if fits(GgmlDType::Q8_0) => {
                Held::Quantized(GgmlDType::Q8_0)
            }
            WeightsChoice::Q4K | WeightsChoice::Q8_0 | WeightsChoice::F16 => {
                half(GgmlDType::F16, DType::F16)
            }
            WeightsChoice::Bf16 => half(GgmlDType::BF16, DType::BF16),
            WeightsChoice::F32 => Held::Dense(DType::F32),
        }
    }

    /// How an embedding table stored as `stored` is held: as a matrix, except that f32 keeps
    /// a 16-bit table in its stored form (a row lookup needs no f32 copy of the table, which
    /// for Gemma 4's per-layer table would be ≈ 9 GiB).
    pub fn table(self, cols: usize, stored: DType, device: &Device) -> Held {
        match (self, stored) {
            (WeightsChoice::F32, DType::BF16) => WeightsChoice::Bf16.matrix(cols, device),
            (WeightsChoice::F32, DType::F16) => WeightsChoice::F16.matrix(cols, device),
            _ => self.matrix(cols, device),
        }
    }
}

impl std::fmt::Display for WeightsChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WeightsChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        WEIGHTS_CHOICES
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown weights `{s}` (q4_k, q8_0, f16, bf16, f32)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for c in WEIGHTS_CHOICES {
            assert_eq!(c.as_str().parse::<WeightsChoice>(), Ok(c));
            assert_eq!(
                serde_json::to_value(c).expect("json"),
                serde_json::json!(c.as_str())
            );
        }
        assert!("q4".parse::<WeightsChoice>().is_err());
    }

    #[test]
    fn rows_pick_the_held_type() {
        let cpu = Device::Cpu;
        let q = |t| Held::Quantized(t);
        assert_eq!(WeightsChoice::Q4K.matrix(1536, &cpu), q(GgmlDType::Q4K));
        assert_eq!(WeightsChoice::Q4K.matrix(64, &cpu), q(GgmlDType::Q8_0));
        assert_eq!(WeightsChoice::Q8_0.matrix(8, &cpu), q(GgmlDType::F16));
        assert_eq!(WeightsChoice::Bf16.matrix(8, &cpu), q(GgmlDType::BF16));
        assert_eq!(WeightsChoice::F32.matrix(64, &cpu), Held::Dense(DType::F32));
        assert_eq!(
            WeightsChoice::F32.table(256, DType::BF16, &cpu),
            q(GgmlDType::BF16)
        );
        assert_eq!(
            WeightsChoice::F32.table(256, DType::F32, &cpu),
            Held::Dense(DType::F32)
        );
        // Q4_K: 144 bytes per 256 weights; Q8_0: 34 per 32.
        assert_eq!(Held::Quantized(GgmlDType::Q4K).bytes(512), 288);
        assert_eq!(Held::Quantized(GgmlDType::Q8_0).bytes(64), 68);
        assert_eq!(WeightsChoice::default_for(&cpu), WeightsChoice::Q8_0);
    }
}
