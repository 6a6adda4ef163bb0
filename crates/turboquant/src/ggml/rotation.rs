//! Upstream's Hadamard rotation of keys, queries and values (llama.cpp's `attn_rot_k` and
//! `attn_rot_v`): the block widths it picks for a head size, and the rotation itself.

use crate::error::{Error, Result};

/// Width of the Hadamard blocks llama.cpp rotates keys (and queries) in, for heads of
/// `head_dim` (one width per cache: every layer it holds has that head size): the largest
/// power of two dividing it, when it is a multiple of 64; none otherwise.
pub fn key_rotation_width(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then(|| 1 << head_dim.trailing_zeros())
}

/// Width of the Hadamard blocks llama.cpp rotates values in (and the attention output back):
/// 64, when `head_dim` is a multiple of 64; none otherwise.
pub fn value_rotation_width(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then_some(64)
}

/// Rotates each `width`-wide slice of `x` by the orthonormal Walsh–Hadamard matrix of that
/// width (Sylvester's order, scaled by 1/√width: symmetric, its own inverse), as a fast
/// transform. `width` is a power of two dividing `x.len()`.
pub fn hadamard_rotate(x: &mut [f32], width: usize) -> Result<()> {
    if !width.is_power_of_two() || !x.len().is_multiple_of(width) {
        return Err(Error::InvalidDimension {
            dim: width,
            reason: "a Hadamard block is a power of two that divides the row",
        });
    }
    let scale = 1.0 / (width as f32).sqrt();
    for block in x.chunks_exact_mut(width) {
        let mut h = 1;
        while h < width {
            // Each butterfly pair as two slices of h, so the wide stages vectorize (the
            // same sum and difference per element, in any lane order).
            for pair in block.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (x, y) = (*a, *b);
                    *a = x + y;
                    *b = x - y;
                }
            }
            h *= 2;
        }
        for v in block.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}
