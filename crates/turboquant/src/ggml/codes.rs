//! One block's bytes: f16 scales read and written, nibbles packed and unpacked, each type's
//! reference quantizer (ggml's `quantize_row_*_ref` for one block) and its level reader
//! (what `dequantize_row_*` multiplies by the scale), as [`super::TYPES`] names them.

use half::f16;

use super::BLOCK;
use crate::error::{Error, Result};

/// iq4_nl's 16 non-linear levels (ggml-common.h's `kvalues_iq4nl`).
const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// An error unless a buffer is `expected` long.
pub(super) fn check_len(got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::DimensionMismatch { expected, got })
    }
}

#[inline(always)]
pub(crate) fn read_f16(q: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([q[at], q[at + 1]]))
}

/// An f16's value as an f32, exactly (every f16 is an f32), in a few integer operations the
/// compiler inlines: `half`'s conversion is a call per scale, a fifth of a block dot's time.
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let em = u32::from(h & 0x7FFF);
    let magnitude = if em >= 0x7C00 {
        // Infinity or NaN: all-ones exponent, the mantissa moved up.
        0x7F80_0000 | ((em & 0x03FF) << 13)
    } else if em >= 0x0400 {
        // Normal: rebias the exponent from 15 to 127.
        (em << 13) + ((127 - 15) << 23)
    } else {
        // Zero or subnormal: em × 2⁻²⁴, exact in f32.
        (em as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(sign | magnitude)
}

pub(super) fn write_f16(q: &mut [u8], at: usize, v: f32) {
    q[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The 32 codes of a block: low nibbles hold coordinates 0..16, high nibbles 16..32, and
/// bit `j` of the little-endian `high` word is code `j`'s fifth bit.
pub(super) fn nibbles(packed: &[u8], high: [u8; 4]) -> [u8; BLOCK] {
    let high = u32::from_le_bytes(high);
    let mut codes = [0u8; BLOCK];
    for (j, &b) in packed.iter().enumerate() {
        codes[j] = (b & 0x0F) | (((high >> j) & 1) as u8) << 4;
        codes[j + BLOCK / 2] = (b >> 4) | (((high >> (j + BLOCK / 2)) & 1) as u8) << 4;
    }
    codes
}

/// Packs 32 codes as [`nibbles`] reads them; returns the fifth bits' word.
pub(super) fn pack_nibbles(codes: &[u8; BLOCK], packed: &mut [u8]) -> [u8; 4] {
    let mut high = 0u32;
    for j in 0..BLOCK / 2 {
        let (a, b) = (codes[j], codes[j + BLOCK / 2]);
        packed[j] = (a & 0x0F) | ((b & 0x0F) << 4);
        high |= u32::from((a >> 4) & 1) << j;
        high |= u32::from((b >> 4) & 1) << (j + BLOCK / 2);
    }
    high.to_le_bytes()
}

/// The coordinate of largest magnitude, with its sign (the first of equals, as the
/// reference's strict `>` keeps it).
pub(super) fn signed_max(xb: &[f32; BLOCK]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `roundf`: halves away from zero (Rust's `round` is the same).
pub(super) fn round_away(v: f32) -> i32 {
    v.round() as i32
}

pub(super) fn quantize_q8_0(xb: &[f32; BLOCK], q: &mut [u8]) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    write_f16(q, 0, d);
    for (c, &v) in q[2..].iter_mut().zip(xb) {
        *c = round_away(v * id) as i8 as u8;
    }
}

/// q4_0 and q5_0: a scale from the signed maximum (so it maps to the lowest code), codes
/// offset by half their range.
pub(super) fn quantize_symmetric(xb: &[f32; BLOCK], q: &mut [u8], bits: u32) {
    let half = (1u32 << (bits - 1)) as f32;
    let top = (1u8 << bits) - 1;
    let (_, max) = signed_max(xb);
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(xb) {
        // (int8_t)(x*id + half + 0.5): truncation toward zero, then capped at the top code.
        *c = ((v * id + (half + 0.5)) as i8 as u8).min(top);
    }
    write_f16(q, 0, d);
    if bits == 4 {
        pack_nibbles(&codes, &mut q[2..]);
    } else {
        let high = pack_nibbles(&codes, &mut q[6..]);
        q[2..6].copy_from_slice(&high);
    }
}

/// q4_1 and q5_1: a scale and a minimum, codes from the minimum up.
pub(super) fn quantize_affine(xb: &[f32; BLOCK], q: &mut [u8], bits: u32) {
    let top = (1u8 << bits) - 1;
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(xb) {
        *c = (((v - min) * id + 0.5) as i8 as u8).min(top);
    }
    write_f16(q, 0, d);
    write_f16(q, 2, min);
    if bits == 4 {
        pack_nibbles(&codes, &mut q[4..]);
    } else {
        let high = pack_nibbles(&codes, &mut q[8..]);
        q[4..8].copy_from_slice(&high);
    }
}

/// The level nearest `x` (the lower one of a tie goes up, as the reference's `<` says).
pub(super) fn nearest_level(x: f32) -> u8 {
    let levels = IQ4_NL_LEVELS.map(f32::from);
    if x <= levels[0] {
        return 0;
    }
    if x >= levels[15] {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < levels[mid] {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - levels[hi - 1] < levels[hi] - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// iq4_nl as the reference quantizer runs it (no importance weights, no scale search): each
/// coordinate to its nearest level at the scale that maps the signed maximum to -127, then
/// the least-squares scale for those levels (weighted by the squared coordinates). A block
/// of (near) zeros gets scale 0; its codes are then meaningless (the reference leaves them
/// unwritten), and zero here.
pub(super) fn quantize_iq4_nl(xb: &[f32; BLOCK], q: &mut [u8]) {
    let (amax, max) = signed_max(xb);
    let mut codes = [0u8; BLOCK];
    let mut d = 0.0f32;
    if amax >= 1e-15 {
        let id = 1.0 / (max / f32::from(IQ4_NL_LEVELS[0]));
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (c, &v) in codes.iter_mut().zip(xb) {
            *c = nearest_level(id * v);
            let level = f32::from(IQ4_NL_LEVELS[*c as usize]);
            let w = v * v;
            sumqx += w * level * v;
            sumq2 += w * level * level;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    }
    write_f16(q, 0, d);
    pack_nibbles(&codes, &mut q[2..]);
}

pub(super) fn quantize_q4_0(xb: &[f32; BLOCK], q: &mut [u8]) {
    quantize_symmetric(xb, q, 4)
}

pub(super) fn quantize_q5_0(xb: &[f32; BLOCK], q: &mut [u8]) {
    quantize_symmetric(xb, q, 5)
}

pub(super) fn quantize_q4_1(xb: &[f32; BLOCK], q: &mut [u8]) {
    quantize_affine(xb, q, 4)
}

pub(super) fn quantize_q5_1(xb: &[f32; BLOCK], q: &mut [u8]) {
    quantize_affine(xb, q, 5)
}

/// A block's 32 four-bit codes from byte `at` on (fifth bits in `high`), less `offset`.
#[inline(always)]
fn nibble_levels(k: &[u8], at: usize, high: [u8; 4], offset: i32) -> [i32; BLOCK] {
    nibbles(&k[at..at + BLOCK / 2], high).map(|c| i32::from(c) - offset)
}

pub(super) fn levels_q8_0(k: &[u8]) -> [i32; BLOCK] {
    std::array::from_fn(|j| i32::from(k[2 + j] as i8))
}

pub(super) fn levels_q4_0(k: &[u8]) -> [i32; BLOCK] {
    nibble_levels(k, 2, [0; 4], 8)
}

pub(super) fn levels_q4_1(k: &[u8]) -> [i32; BLOCK] {
    nibble_levels(k, 4, [0; 4], 0)
}

pub(super) fn levels_q5_0(k: &[u8]) -> [i32; BLOCK] {
    nibble_levels(k, 6, [k[2], k[3], k[4], k[5]], 16)
}

pub(super) fn levels_q5_1(k: &[u8]) -> [i32; BLOCK] {
    nibble_levels(k, 8, [k[4], k[5], k[6], k[7]], 0)
}

pub(super) fn levels_iq4_nl(k: &[u8]) -> [i32; BLOCK] {
    nibble_levels(k, 2, [0; 4], 0).map(|c| i32::from(IQ4_NL_LEVELS[c as usize]))
}
