//! llama.cpp's KV cache block types (ggml's `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`,
//! `iq4_nl`): blocks of 32 coordinates with f16 scales, quantized and dequantized exactly as
//! ggml's reference code does (`quantize_row_*_ref`, `dequantize_row_*`: the same bytes and
//! the same floats, tests/ggml_blocks.rs), dotted with a quantized query as ggml's portable
//! `vec_dot` does (the same float), and upstream's Hadamard rotation of keys and
//! values (llama.cpp's `attn_rot_k`/`attn_rot_v`). The arithmetic is the reference's, in f32,
//! one rounding per operation, in its order: that is what makes the bytes equal.
//!
//! Each type is one row of [`TYPES`]: its name, block size, reference quantizer and level
//! reader; a new ggml type is a row there (and, for speed, a SIMD kernel in
//! `crate::kernels`). `codes` holds one block's arithmetic, `dots` the dot products and value
//! sums with their kernel choice, `rotation` upstream's Hadamard rotation.

mod codes;
pub(crate) mod dots;
mod rotation;
#[cfg(test)]
mod tests;

pub(crate) use codes::read_f16;
use codes::{
    check_len, levels_iq4_nl, levels_q4_0, levels_q4_1, levels_q5_0, levels_q5_1, levels_q8_0,
};
use codes::{
    quantize_iq4_nl, quantize_q4_0, quantize_q4_1, quantize_q5_0, quantize_q5_1, quantize_q8_0,
};
pub use rotation::{hadamard_rotate, key_rotation_width, value_rotation_width};

use crate::error::{Error, Result};

/// Coordinates per block, for every type here.
pub const BLOCK: usize = 32;

/// One of llama.cpp's KV block types (serialized by its llama.cpp name, `q8_0`); its facts
/// are its row of [`TYPES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockType {
    /// 8-bit codes, one f16 scale: 34 bytes a block, 8.5 bits a coordinate.
    Q8_0,
    /// 4-bit codes around 8, one f16 scale: 18 bytes, 4.5 bits.
    Q4_0,
    /// 4-bit codes, f16 scale and minimum: 20 bytes, 5 bits.
    Q4_1,
    /// 5-bit codes around 16 (high bits apart), one f16 scale: 22 bytes, 5.5 bits.
    Q5_0,
    /// 5-bit codes, f16 scale and minimum: 24 bytes, 6 bits.
    Q5_1,
    /// 4-bit indices into 16 non-linear levels, one f16 scale: 18 bytes, 4.5 bits.
    Iq4Nl,
}

/// What one block type is: every fact and function the rest of the codec reads of it but
/// the float association of its dot (`dots::block_term`, ggml's per type).
pub(crate) struct TypeRow {
    ty: BlockType,
    /// llama.cpp's name (`-ctk q8_0`).
    name: &'static str,
    /// Bytes of one block of [`BLOCK`] coordinates.
    block_bytes: usize,
    /// Whether a block holds a minimum beside its scale (q4_1, q5_1): its dequantized value
    /// is level × scale + minimum, and queries dotted with it are q8_1 (ggml's
    /// `vec_dot_type`), whose sum the minimum multiplies.
    affine: bool,
    /// Whether the SIMD kernels (`crate::kernels::blocks_*`) dot and sum it (q8_0, q4_0).
    simd: bool,
    /// Quantizes one block as ggml's `quantize_row_*_ref` does.
    quantize: fn(&[f32; BLOCK], &mut [u8]),
    /// Each coordinate's integer level in one block: what its scale multiplies (and its
    /// minimum is added to). The one reading of the type's layout.
    levels: fn(&[u8]) -> [i32; BLOCK],
}

/// Every type, in llama.cpp's `-ctk` menu order, one row each (the order of [`BlockType`]).
pub(crate) const TYPES: [TypeRow; 6] = [
    TypeRow {
        ty: BlockType::Q8_0,
        name: "q8_0",
        block_bytes: 2 + BLOCK,
        affine: false,
        simd: true,
        quantize: quantize_q8_0,
        levels: levels_q8_0,
    },
    TypeRow {
        ty: BlockType::Q4_0,
        name: "q4_0",
        block_bytes: 2 + BLOCK / 2,
        affine: false,
        simd: true,
        quantize: quantize_q4_0,
        levels: levels_q4_0,
    },
    TypeRow {
        ty: BlockType::Q4_1,
        name: "q4_1",
        block_bytes: 4 + BLOCK / 2,
        affine: true,
        simd: false,
        quantize: quantize_q4_1,
        levels: levels_q4_1,
    },
    TypeRow {
        ty: BlockType::Q5_0,
        name: "q5_0",
        block_bytes: 2 + 4 + BLOCK / 2,
        affine: false,
        simd: false,
        quantize: quantize_q5_0,
        levels: levels_q5_0,
    },
    TypeRow {
        ty: BlockType::Q5_1,
        name: "q5_1",
        block_bytes: 4 + 4 + BLOCK / 2,
        affine: true,
        simd: false,
        quantize: quantize_q5_1,
        levels: levels_q5_1,
    },
    TypeRow {
        ty: BlockType::Iq4Nl,
        name: "iq4_nl",
        block_bytes: 2 + BLOCK / 2,
        affine: false,
        simd: false,
        quantize: quantize_iq4_nl,
        levels: levels_iq4_nl,
    },
];

// Each row sits at its type's index, which `BlockType::row` relies on.
const _: () = {
    let mut i = 0;
    while i < TYPES.len() {
        assert!(TYPES[i].ty as usize == i);
        i += 1;
    }
};

impl BlockType {
    /// Every type, in llama.cpp's `-ctk` menu order.
    pub const ALL: [BlockType; 6] = {
        let mut all = [BlockType::Q8_0; 6];
        let mut i = 0;
        while i < TYPES.len() {
            all[i] = TYPES[i].ty;
            i += 1;
        }
        all
    };

    /// This type's row of [`TYPES`].
    #[inline(always)]
    pub(crate) const fn row(self) -> &'static TypeRow {
        &TYPES[self as usize]
    }

    /// The name llama.cpp gives it (`-ctk q8_0`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The type named `name` (as [`BlockType::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        TYPES.iter().find(|t| t.name == name).map(|t| t.ty)
    }

    /// Bytes of one block of [`BLOCK`] coordinates.
    pub const fn block_bytes(self) -> usize {
        self.row().block_bytes
    }

    /// Whether the SIMD kernels dot and sum this type (q8_0 and q4_0).
    #[inline(always)]
    pub(crate) fn has_simd(self) -> bool {
        self.row().simd
    }

    /// Bits a coordinate takes, scales included (8.5 for q8_0, 4.5 for q4_0).
    pub fn bits_per_coordinate(self) -> f64 {
        (self.block_bytes() * 8) as f64 / BLOCK as f64
    }

    /// Bytes of a row of `n` coordinates; `n` must be a multiple of [`BLOCK`].
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        if !n.is_multiple_of(BLOCK) {
            return Err(Error::InvalidDimension {
                dim: n,
                reason: "a row of ggml blocks is a multiple of 32 coordinates",
            });
        }
        Ok(n / BLOCK * self.block_bytes())
    }

    /// Quantizes `x` into `out` (exactly [`BlockType::row_bytes`] of it) as ggml's
    /// `quantize_row_*_ref` does.
    pub fn quantize_row(self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let bytes = self.row_bytes(x.len())?;
        check_len(out.len(), bytes)?;
        let quantize = self.row().quantize;
        for (xb, q) in x
            .chunks_exact(BLOCK)
            .zip(out.chunks_exact_mut(self.block_bytes()))
        {
            let xb: &[f32; BLOCK] = xb.try_into().expect("chunks of BLOCK");
            quantize(xb, q);
        }
        Ok(())
    }

    /// Dequantizes `q` into `out` as ggml's `dequantize_row_*` does.
    pub fn dequantize_row(self, q: &[u8], out: &mut [f32]) -> Result<()> {
        check_len(q.len(), self.row_bytes(out.len())?)?;
        let TypeRow { levels, affine, .. } = *self.row();
        for (q, y) in q
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let d = read_f16(q, 0);
            // The two types caches use most, written so the compiler vectorizes them: the
            // same float per coordinate (its level times the scale) as the general path.
            match self {
                BlockType::Q8_0 => {
                    for (y, &c) in y.iter_mut().zip(&q[2..2 + BLOCK]) {
                        *y = f32::from(c as i8) * d;
                    }
                    continue;
                }
                BlockType::Q4_0 => {
                    let (lo, hi) = y.split_at_mut(BLOCK / 2);
                    for ((l, h), &c) in lo.iter_mut().zip(hi.iter_mut()).zip(&q[2..2 + BLOCK / 2]) {
                        *l = (i32::from(c & 0x0F) - 8) as f32 * d;
                        *h = (i32::from(c >> 4) - 8) as f32 * d;
                    }
                    continue;
                }
                _ => {}
            }
            let levels = levels(q);
            if affine {
                let m = read_f16(q, 2);
                for (y, &l) in y.iter_mut().zip(&levels) {
                    *y = l as f32 * d + m;
                }
            } else {
                for (y, &l) in y.iter_mut().zip(&levels) {
                    *y = l as f32 * d;
                }
            }
        }
        Ok(())
    }
}
