//! The codec's own checks of the block types: the inline f16 conversion, the sizes and
//! rotation widths upstream uses, and every SIMD kernel equal to the portable reference bit
//! for bit (ggml's own bytes are held in tests/ggml_blocks.rs).

use super::codes::f16_to_f32;
use super::dots::{axpy_portable, DotKernel, ValueKernel};
use super::*;
use half::f16;

#[test]
fn the_inline_f16_conversion_is_halfs_for_every_value() {
    for h in 0..=u16::MAX {
        let want = f16::from_bits(h).to_f32();
        let got = f16_to_f32(h);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}: {got} vs {want}"
        );
    }
}

#[test]
fn bits_per_coordinate_are_llama_cpps() {
    let bits: Vec<f64> = BlockType::ALL
        .iter()
        .map(|t| t.bits_per_coordinate())
        .collect();
    assert_eq!(bits, [8.5, 4.5, 5.0, 5.5, 6.0, 4.5]);
    for t in BlockType::ALL {
        assert_eq!(BlockType::from_name(t.name()), Some(t));
    }
    assert_eq!(BlockType::from_name("q4_k"), None);
}

#[test]
fn rotation_widths_follow_upstream() {
    assert_eq!(key_rotation_width(256), Some(256));
    assert_eq!(key_rotation_width(512), Some(512));
    assert_eq!(key_rotation_width(192), Some(64));
    assert_eq!(key_rotation_width(80), None);
    assert_eq!(value_rotation_width(512), Some(64));
    assert_eq!(value_rotation_width(100), None);
}

/// The SIMD dot products are the portable ones, float for float, on rows at every scale
/// and on codes at their extremes.
#[test]
fn simd_dots_equal_the_portable_reference_bit_for_bit() {
    let mut rng = crate::Rng::new(35, 0);
    let n = 256;
    for row in 0..300 {
        let scale = [1e-3f32, 1.0, 40.0, 6e4][row % 4];
        let mut x: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32 * scale).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32 * 2.0).collect();
        if row % 7 == 0 {
            // Codes at ±127 and the lowest q4_0 level in every block.
            for (j, v) in x.iter_mut().enumerate() {
                *v = if j % 2 == 0 { scale } else { -scale };
            }
        }
        for t in BlockType::ALL {
            let mut k = vec![0u8; t.row_bytes(n).unwrap()];
            let mut q = vec![0u8; t.query_bytes(n).unwrap()];
            t.quantize_row(&x, &mut k).unwrap();
            t.quantize_query(&y, &mut q).unwrap();
            let simd = t.dot(&k, &q).unwrap();
            let portable = t.dot_portable(&k, &q);
            assert_eq!(simd.to_bits(), portable.to_bits(), "{} row {row}", t.name());
        }
    }
}

/// Every value-sum kernel is the portable fused adds, bit for bit: with zero weights
/// (masked rows) and without (whole tiles, the AVX-512 kernel's fast case), a last tile
/// cut short, and more output rows than a tile has.
#[test]
fn tiled_value_sums_equal_row_by_row_fused_adds() {
    let mut rng = crate::Rng::new(37, 0);
    let (n, d, g) = (21, 96, 13);
    for (t, masked) in BlockType::ALL
        .into_iter()
        .flat_map(|t| [(t, true), (t, false)])
    {
        let mut rows = vec![0u8; n * t.row_bytes(d).unwrap()];
        for r in rows.chunks_exact_mut(t.row_bytes(d).unwrap()) {
            let x: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * 7.0).collect();
            t.quantize_row(&x, r).unwrap();
        }
        let weights: Vec<f32> = (0..g * n)
            .map(|i| {
                if masked && i % 4 == 1 {
                    0.0
                } else {
                    rng.uniform() as f32 + 1e-3
                }
            })
            .collect();
        let mut want = vec![0.5f32; g * d];
        let mut x = vec![0f32; d];
        for (k, r) in rows.chunks_exact(t.row_bytes(d).unwrap()).enumerate() {
            t.dequantize_row(r, &mut x).unwrap();
            for (qi, o) in want.chunks_exact_mut(d).enumerate() {
                let w = weights[qi * n + k];
                if w != 0.0 {
                    axpy_portable(w, &x, o);
                }
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for kernel in runnable_value_kernels(t) {
            let mut got = vec![0.5f32; g * d];
            t.accumulate_rows_with(kernel, &rows, d, &weights, &mut got)
                .unwrap();
            assert_eq!(bits(&got), bits(&want), "{} {kernel:?} {masked}", t.name());
        }
        let mut got = vec![0.5f32; g * d];
        t.accumulate_rows(&rows, d, &weights, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "{}", t.name());
    }
}

/// The dot kernels this CPU runs for `t`.
fn runnable_dot_kernels(t: BlockType) -> Vec<DotKernel> {
    let mut v = vec![DotKernel::Portable];
    #[cfg(target_arch = "x86_64")]
    if t.has_simd() {
        if crate::features::avx2() {
            v.push(DotKernel::Avx2);
        }
        if crate::features::avx512_vnni() {
            v.push(DotKernel::Vnni);
        }
    }
    #[cfg(all(
        target_arch = "aarch64",
        target_feature = "neon",
        target_endian = "little"
    ))]
    if t.has_simd() {
        v.push(DotKernel::Neon);
    }
    let _ = t;
    v
}

/// The value kernels this CPU runs for `t`.
fn runnable_value_kernels(t: BlockType) -> Vec<ValueKernel> {
    let mut v = vec![ValueKernel::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if crate::features::avx2() {
            v.push(ValueKernel::Avx2);
        }
        if t.has_simd() && crate::features::avx512() {
            v.push(ValueKernel::Avx512);
        }
    }
    #[cfg(all(
        target_arch = "aarch64",
        target_feature = "neon",
        target_endian = "little"
    ))]
    if t.has_simd() {
        v.push(ValueKernel::Neon);
    }
    let _ = t;
    v
}

/// Many keys against many queries, eight at a time in SIMD, are each the one-pair dot.
#[test]
fn query_batched_dots_equal_the_portable_reference_bit_for_bit() {
    let mut rng = crate::Rng::new(36, 0);
    let (n, d) = (37, 128);
    for t in BlockType::ALL {
        for g in [1usize, 3, 8, 11, 17] {
            let mut keys = vec![0u8; n * t.row_bytes(d).unwrap()];
            let mut queries = vec![0u8; g * t.query_bytes(d).unwrap()];
            for (i, k) in keys.chunks_exact_mut(t.row_bytes(d).unwrap()).enumerate() {
                let scale = [1e-3f32, 1.0, 40.0][i % 3];
                let mut x: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * scale).collect();
                if i % 5 == 0 {
                    // Codes at ±127 and q4_0's lowest level in every block.
                    for (j, v) in x.iter_mut().enumerate() {
                        *v = if j % 2 == 0 { scale } else { -scale };
                    }
                }
                t.quantize_row(&x, k).unwrap();
            }
            for q in queries.chunks_exact_mut(t.query_bytes(d).unwrap()) {
                let y: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * 3.0).collect();
                t.quantize_query(&y, q).unwrap();
            }
            let stride = n + 5;
            for kernel in runnable_dot_kernels(t).into_iter().map(Some).chain([None]) {
                let mut out = vec![f32::NAN; (g - 1) * stride + n];
                match kernel {
                    Some(k) => t.dots_with(k, &keys, &queries, d, &mut out, stride),
                    None => t.dots(&keys, &queries, d, &mut out, stride),
                }
                .unwrap();
                for (qi, q) in queries.chunks_exact(t.query_bytes(d).unwrap()).enumerate() {
                    for (j, k) in keys.chunks_exact(t.row_bytes(d).unwrap()).enumerate() {
                        let want = t.dot_portable(k, q);
                        let got = out[qi * stride + j];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {kernel:?} g {g} q {qi} k {j}",
                            t.name()
                        );
                    }
                }
            }
            let mut out = vec![f32::NAN; (g - 1) * stride + n];
            assert!(t
                .dots(
                    &keys,
                    &queries,
                    d,
                    &mut out[..n - 1 + (g - 1) * stride],
                    stride
                )
                .is_err());
        }
    }
}

#[test]
fn rows_of_the_wrong_length_are_refused() {
    let mut out = [0u8; 34];
    assert!(BlockType::Q8_0.quantize_row(&[0.0; 31], &mut out).is_err());
    assert!(BlockType::Q8_0
        .quantize_row(&[0.0; 32], &mut out[..33])
        .is_err());
    let mut y = [0.0f32; 32];
    assert!(BlockType::Q4_0.dequantize_row(&out, &mut y).is_err());
    assert!(hadamard_rotate(&mut [0.0; 96], 64).is_err());
    assert!(hadamard_rotate(&mut [0.0; 96], 48).is_err());
}
