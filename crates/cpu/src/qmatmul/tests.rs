//! Every backend against dequantize-then-multiply on random matrices, and the SIMD backends
//! against the portable one bit for bit. The matrices are random ggml blocks (any bytes, with
//! finite scales), so every stored integer and sub-block scale occurs; that the blocks decode
//! as ggml's own dequantization does is checked in the engine, against candle's.

use super::*;
use crate::test_rng::Rng;
use crate::Serial;

fn random(rng: &mut Rng, n: usize, spread: bool) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = rng.gaussian();
            // Rows of very different magnitudes and a few outliers, as real weights have.
            if spread {
                v * (0.2 + (i % 13) as f32) + if i % 97 == 0 { 8.0 } else { 0.0 }
            } else {
                v
            }
        })
        .collect()
}

/// `rows × cols` weights of random ggml blocks: random bytes, with each block's float scales
/// (`d`, and `dmin` for Q4K/Q5K) set to small finite values of either sign.
pub(crate) fn random_blocks(format: QFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let g = format.geometry();
    let mut rng = Rng::new(seed);
    let mut bytes: Vec<u8> = (0..rows * (cols / g.sb) * g.ggml_block)
        .map(|_| rng.next() as u8)
        .collect();
    for block in bytes.chunks_exact_mut(g.ggml_block) {
        let mut scale = || half::f16::from_f32(rng.symmetric() * 0.05).to_le_bytes();
        match format {
            QFormat::Q6K => {
                let d = scale();
                block[g.ggml_block - 2..].copy_from_slice(&d);
            }
            QFormat::Q4K | QFormat::Q5K => {
                let (d, dmin) = (scale(), scale());
                block[..2].copy_from_slice(&d);
                block[2..4].copy_from_slice(&dmin);
            }
            QFormat::Q4_0 | QFormat::Q5_0 | QFormat::Q8_0 => {
                let d = scale();
                block[..2].copy_from_slice(&d);
            }
        }
    }
    bytes
}

/// A random `[rows, cols]` matrix repacked, and its weights as the ggml blocks decode.
fn matrix(format: QFormat, rows: usize, cols: usize, seed: u64) -> (PackedMatrix, Vec<f32>) {
    let g = format.geometry();
    let bytes = random_blocks(format, rows, cols, seed);
    let deq: Vec<f32> = bytes
        .chunks_exact(g.ggml_block)
        .flat_map(|b| decode_block(format, b).values(&g))
        .collect();
    (
        PackedMatrix::from_ggml(format, &bytes, rows, cols).unwrap(),
        deq,
    )
}

/// The shapes each format is checked at: one superblock, several, an E2B-like width, and row
/// counts that leave a partial last tile.
fn shapes(format: QFormat) -> Vec<(usize, usize)> {
    let sb = format.geometry().sb;
    vec![(16, sb), (37, 2 * sb), (48, 1536), (5, 6 * sb)]
}

const BACKENDS: [Backend; 4] = [
    Backend::Avx512Vnni,
    Backend::Avx2,
    Backend::Neon,
    Backend::Portable,
];

#[test]
fn kernels_match_dequantize_then_multiply() {
    let mut tried = Vec::new();
    for format in ALL_FORMATS {
        for (si, (rows, cols)) in shapes(format).into_iter().enumerate() {
            let (w, deq) = matrix(format, rows, cols, 10 + si as u64);
            for m in [1usize, 3, 4, 9, 70] {
                let mut rng = Rng::new(99 + m as u64);
                let x = random(&mut rng, m * cols, false);
                // The activations as the kernels see them (quantized), for a tight reference.
                let mut acts = QuantizedActs::default();
                acts.quantize_into(&x, m, cols);
                let xq: Vec<f32> = (0..m * cols)
                    .map(|i| acts.q[i] as f32 * acts.d[i / activation::BLOCK])
                    .collect();
                let reference = |xs: &[f32]| -> (Vec<f64>, Vec<f64>) {
                    let mut y = vec![0f64; m * rows];
                    let mut mag = vec![0f64; m * rows];
                    for i in 0..m {
                        for r in 0..rows {
                            for k in 0..cols {
                                let p = xs[i * cols + k] as f64 * deq[r * cols + k] as f64;
                                y[i * rows + r] += p;
                                mag[i * rows + r] += p.abs();
                            }
                        }
                    }
                    (y, mag)
                };
                let (tight, mag) = reference(&xq);
                let (exact, _) = reference(&x);
                let mut portable = vec![0f32; m * rows];
                w.matmul_with(Backend::Portable, &Serial, &x, m, &mut portable)
                    .unwrap();
                for backend in BACKENDS.into_iter().filter(|b| b.available()) {
                    let mut got = vec![0f32; m * rows];
                    w.matmul_with(backend, &Serial, &x, m, &mut got).unwrap();
                    for i in 0..m * rows {
                        let err = (got[i] as f64 - tight[i]).abs();
                        assert!(
                            err <= 1e-5 * mag[i] + 1e-6,
                            "{format:?} {backend:?} [{rows}x{cols}] m={m} out {i}: {} vs {} (mag {})",
                            got[i],
                            tight[i],
                            mag[i]
                        );
                    }
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{format:?} {backend:?} differs from the portable kernel"
                    );
                    if !tried.contains(&backend) {
                        tried.push(backend);
                    }
                }
                // Against the unquantized activations, only the activation rounding remains.
                let num: f64 = (0..m * rows)
                    .map(|i| (portable[i] as f64 - exact[i]).powi(2))
                    .sum();
                let den: f64 = exact.iter().map(|v| v * v).sum();
                assert!(
                    (num / den).sqrt() < 0.02,
                    "{format:?} [{rows}x{cols}] m={m}: relative error {}",
                    (num / den).sqrt()
                );
            }
        }
    }
    // This machine's best backend was among those checked.
    assert!(tried.contains(&Backend::best()), "{tried:?}");
}

/// A batched step lays several sequences' rows end to end: each row's outputs must be the
/// bits it gets alone, whatever the row count (2 to 16 decode rows, a prefill chunk beside
/// them) and wherever the row falls among the four-row groups and chunks of the kernels.
#[test]
fn each_row_comes_out_as_it_does_alone() {
    for format in ALL_FORMATS {
        let (rows, cols) = (37, 2 * format.geometry().sb);
        let (w, _) = matrix(format, rows, cols, 3);
        for backend in BACKENDS.into_iter().filter(|b| b.available()) {
            for m in (1..=16).chain([67, 70]) {
                let mut rng = Rng::new(500 + m as u64);
                let x = random(&mut rng, m * cols, true);
                let mut together = vec![0f32; m * rows];
                w.matmul_with(backend, &Serial, &x, m, &mut together)
                    .unwrap();
                for i in 0..m {
                    let mut alone = vec![0f32; rows];
                    w.matmul_with(
                        backend,
                        &Serial,
                        &x[i * cols..(i + 1) * cols],
                        1,
                        &mut alone,
                    )
                    .unwrap();
                    assert_eq!(
                        together[i * rows..(i + 1) * rows]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>(),
                        alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{format:?} {backend:?}: row {i} of {m} differs from the row alone"
                    );
                }
            }
        }
    }
}

#[test]
fn repacked_rows_dequantize_as_their_blocks_and_keep_their_size() {
    for format in ALL_FORMATS {
        let (rows, cols) = (37, 2 * format.geometry().sb);
        let (w, deq) = matrix(format, rows, cols, 5);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut row);
            assert_eq!(row, deq[r * cols..(r + 1) * cols], "{format:?} row {r}");
        }
        let ids = [0u32, 36, 5];
        let e = w.embedding(&ids).unwrap();
        assert_eq!(e[cols..2 * cols], deq[36 * cols..37 * cols]);
        assert!(w.embedding(&[37]).is_err());
        // Held bytes against ggml's, for a full-size row count (no padding tile).
        let (big, _) = matrix(format, 256, 1536, 6);
        let ggml = 256 * 1536 / format.geometry().sb * format.geometry().ggml_block;
        let ratio = big.held_bytes() as f64 / ggml as f64;
        assert!((1.0..1.03).contains(&ratio), "{format:?}: {ratio}");
    }
}

#[test]
fn bad_shapes_and_lengths_are_errors() {
    assert!(PackedMatrix::from_ggml(QFormat::Q4K, &[0; 144], 1, 128).is_err());
    assert!(PackedMatrix::from_ggml(QFormat::Q8_0, &[0; 33], 1, 32).is_err());
    let (w, _) = matrix(QFormat::Q8_0, 16, 64, 1);
    let mut out = vec![0f32; 16];
    assert!(w.matmul(&Serial, &[0.0; 63], 1, &mut out).is_err());
}

#[test]
fn non_finite_activations_reach_the_outputs() {
    for format in ALL_FORMATS {
        let (w, _) = matrix(format, 16, format.geometry().sb, 3);
        let mut x = vec![0.5f32; w.cols()];
        x[3] = f32::NAN;
        let mut out = vec![0f32; 16];
        w.matmul(&Serial, &x, 1, &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_nan()), "{format:?}: {out:?}");
    }
}

/// ggml blocks whose every stored integer is its format's largest (Q8_0's: −128, the largest
/// magnitude), with small float scales: the widest integer sums any kernel can meet.
fn saturated_blocks(format: QFormat, rows: usize, cols: usize) -> Vec<u8> {
    let g = format.geometry();
    let mut bytes = vec![0xFFu8; rows * (cols / g.sb) * g.ggml_block];
    let small = half::f16::from_f32(1.0 / 1024.0).to_le_bytes();
    for block in bytes.chunks_exact_mut(g.ggml_block) {
        match format {
            QFormat::Q6K => block[g.ggml_block - 2..].copy_from_slice(&small),
            QFormat::Q4K | QFormat::Q5K => {
                block[..2].copy_from_slice(&small);
                block[2..4].copy_from_slice(&small);
            }
            QFormat::Q8_0 => {
                block[..2].copy_from_slice(&small);
                block[2..].fill(0x80);
            }
            QFormat::Q4_0 | QFormat::Q5_0 => block[..2].copy_from_slice(&small),
        }
    }
    bytes
}

#[test]
fn kernels_hold_the_widest_integer_sums() {
    // Activations of one sign quantize to ±127 everywhere, so with every weight at its
    // largest, each 16-bit partial sum a kernel keeps is at its bound: an overflow would
    // show as a wrong sign or magnitude against the dequantized reference.
    for format in ALL_FORMATS {
        let (rows, cols) = (24, 2 * format.geometry().sb);
        let w = PackedMatrix::from_ggml(format, &saturated_blocks(format, rows, cols), rows, cols)
            .unwrap();
        let mut deq = vec![0f32; rows * cols];
        for (r, row) in deq.chunks_exact_mut(cols).enumerate() {
            w.dequantize_row(r, row);
        }
        for sign in [1.0f32, -1.0] {
            for m in [1usize, 4] {
                let x = vec![sign; m * cols];
                let mut portable = vec![0f32; m * rows];
                w.matmul_with(Backend::Portable, &Serial, &x, m, &mut portable)
                    .unwrap();
                for (i, &got) in portable.iter().enumerate() {
                    let r = i % rows;
                    let want: f64 = deq[r * cols..(r + 1) * cols]
                        .iter()
                        .map(|&v| v as f64 * sign as f64)
                        .sum();
                    let mag: f64 = deq[r * cols..(r + 1) * cols]
                        .iter()
                        .map(|v| v.abs() as f64)
                        .sum();
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * mag,
                        "{format:?} m={m} sign {sign} out {i}: {got} vs {want}"
                    );
                }
                for backend in BACKENDS.into_iter().filter(|b| b.available()) {
                    let mut got = vec![0f32; m * rows];
                    w.matmul_with(backend, &Serial, &x, m, &mut got).unwrap();
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{format:?} {backend:?} m={m} sign {sign}"
                    );
                }
            }
        }
    }
}
