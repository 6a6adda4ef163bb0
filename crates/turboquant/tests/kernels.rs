//! Compressed-domain kernels against their dequantize-then-compute oracles, round trips,
//! storage accounting and error handling.

mod common;

use common::{dot, TestRng};
use kvlab_turboquant::{
    bytes_per_vector, Backend, Bits, CodeBlock, Codec, Error, RotationKind, Spec, Variant,
};
use proptest::prelude::*;

const ALL_BITS: [Bits; 12] = Bits::ALL;

/// Whether `spec` codes any coordinate with more than 4 bits (prod's mse part has one bit
/// less): such codebooks do not fit the x86 backends' registers, so x86 runs them through its
/// wide kernels without QJL ([`scores_backend`], [`sums_backend`]) and the portable code with
/// it; NEON reads every width.
/// Held for writing while a test flips the process-global backend switch, for reading by
/// tests that compare two calls bit for bit ([`backends_agree_and_match_oracles`]).
static BACKEND: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn wide(spec: &Spec) -> bool {
    let top = match spec.variant {
        Variant::Mse => spec.bits.value().ceil(),
        Variant::Prod => spec.bits.value() - 1.0,
    };
    top > 4.0
}

/// The backend `spec`'s scores run on where `simd` is the CPU's: NEON scores every width, the
/// x86 backends score wide codebooks too (`scores_wide`) unless the spec carries QJL (prod).
fn scores_backend(spec: &Spec, simd: Backend) -> Backend {
    let gathers = matches!(simd, Backend::Avx512 | Backend::Avx2) && spec.variant == Variant::Mse;
    if !wide(spec) || gathers || simd == Backend::Neon {
        simd
    } else {
        Backend::Portable
    }
}

/// The backend `spec`'s weighted sums run on: NEON for every width, the x86 backends for
/// narrow codebooks, and AVX2's wide kernel for wide ones without QJL on either x86 backend.
fn sums_backend(spec: &Spec, simd: Backend) -> Backend {
    let x86 = matches!(simd, Backend::Avx512 | Backend::Avx2);
    if !wide(spec) || simd == Backend::Neon {
        simd
    } else if x86 && spec.variant == Variant::Mse {
        Backend::Avx2
    } else {
        Backend::Portable
    }
}

/// Dimensions the wide (above 4-bit) widths are tested at: each new (dimension, width) fits a
/// codebook of up to 256 levels (about half a second, far more under qemu), so they get two
/// dimensions, one with a scalar tail and one of whole blocks, not all of them.
const WIDE_DIMS: [usize; 2] = [100, 256];

/// Whether this build leaves the portable-only cases to the native run: on aarch64 (run
/// under qemu here, where each wide codebook fit costs tens of seconds) the portable Rust is
/// the same as on x86-64, so only the cases that reach NEON are run again, and of the wide
/// widths (NEON's table lookups, each width checked bit for bit on synthetic codebooks in
/// `kernels::neon`) only [`QEMU_WIDE`] at 256 dimensions.
const NATIVE_RUN_CHECKS_PORTABLE: bool = cfg!(target_arch = "aarch64");

/// The wide widths run through the codec under qemu: 4/5-bit segments (an odd-offset 5-bit
/// one, a single 64-level lookup) and 8 bits (four chained lookups).
const QEMU_WIDE: [Bits; 2] = [Bits::B4_5, Bits::B8];

/// Whether `spec` at `d` is one of the few wide cases run under qemu.
fn qemu_wide(spec: &Spec, d: usize) -> bool {
    d == 256
        && QEMU_WIDE.contains(&spec.bits)
        && spec.variant == Variant::Mse
        && spec.rotation == RotationKind::Hadamard
        && !spec.norm_correction
        && !spec.unbiased
}

/// The rotations the specs are built with. Where [`NATIVE_RUN_CHECKS_PORTABLE`], Hadamard
/// alone: the kernels read codes and an already rotated query, so a Haar spec reaches the
/// same NEON code as its Hadamard twin, and its dense O(d²) oracle decodes cost most of the
/// run under qemu.
const ROTATIONS: &[RotationKind] = if NATIVE_RUN_CHECKS_PORTABLE {
    &[RotationKind::Hadamard]
} else {
    &[RotationKind::Hadamard, RotationKind::Haar]
};

/// Every valid spec (seed fixed) for dimension `d` (wide widths only at [`WIDE_DIMS`], and
/// only [`qemu_wide`] ones where [`NATIVE_RUN_CHECKS_PORTABLE`]), with each of [`ROTATIONS`].
fn all_specs(d: usize) -> Vec<Spec> {
    let mut out = Vec::new();
    for bits in ALL_BITS {
        if bits.value() > 4.0 && !WIDE_DIMS.contains(&d) {
            continue;
        }
        for &rotation in ROTATIONS {
            for variant in [Variant::Mse, Variant::Prod] {
                for (norm_correction, unbiased) in [(false, false), (true, false), (false, true)] {
                    let spec = Spec {
                        bits,
                        variant,
                        rotation,
                        norm_correction,
                        unbiased,
                        seed: 5,
                    };
                    let skip = NATIVE_RUN_CHECKS_PORTABLE && wide(&spec) && !qemu_wide(&spec, d);
                    if spec.validate().is_ok() && !skip {
                        out.push(spec);
                    }
                }
            }
        }
    }
    out
}

/// 3-bit prod (2-bit mse and QJL): the codec whose kernels nothing else can stand in for.
fn prod3() -> Spec {
    Spec {
        variant: Variant::Prod,
        ..Spec::mse(Bits::B3)
    }
}

fn filled_block(codec: &Codec, n: usize, seed: u64) -> (CodeBlock, Vec<f32>) {
    let mut rng = TestRng::new(seed);
    let d = codec.dim();
    // Non-unit vectors with varied norms.
    let xs: Vec<f32> = (0..n)
        .flat_map(|t| {
            let scale = 0.5 + (t % 7) as f32;
            rng.gaussian_vec(d).into_iter().map(move |v| v * scale)
        })
        .collect();
    let mut block = codec.new_block_with_chunk(37);
    codec.encode_batch(&xs, &mut block).unwrap();
    (block, xs)
}

fn decoded_norms(codec: &Codec, block: &CodeBlock) -> Vec<f64> {
    let mut s = codec.scratch();
    let mut x = vec![0.0; codec.dim()];
    (0..block.len())
        .map(|t| {
            codec.decode(block, t, &mut x, &mut s).unwrap();
            dot(&x, &x).sqrt()
        })
        .collect()
}

/// How far a kernel's score may be from the oracle's, relative to ‖q‖·‖x̂‖. The float
/// kernels land within ~10⁻⁷; AVX2 scores 4- and 5-bit codes in 16-bit fixed point (query and
/// centroids each to 1/16383 of their largest), up to 2.4·10⁻⁵ over these
/// blocks: a twentieth of what rounding the record's norm to f16 may move it (4.9·10⁻⁴), and four
/// orders below what 4-bit codes change a score by.
const SCORE_TOLERANCE: f64 = 5e-5;

fn check_scores(codec: &Codec, block: &CodeBlock, queries: &[f32]) {
    let d = codec.dim();
    let g = queries.len() / d;
    let n = block.len();
    let norms = decoded_norms(codec, block);
    let mut multi = vec![0.0; g * n];
    codec
        .scores_multi(queries, block, &mut codec.scratch(), &mut multi)
        .unwrap();
    for (qi, q) in queries.chunks_exact(d).enumerate() {
        let fast = codec.scores_vec(q, block).unwrap();
        let reference = codec.scores_reference(q, block).unwrap();
        let qn = dot(q, q).sqrt();
        for t in 0..n {
            // Relative to the Cauchy–Schwarz scale ‖q‖·‖x̂‖ (a score can cancel to ~0).
            let scale = qn * norms[t] + 1e-30;
            let e = (fast[t] as f64 - reference[t] as f64).abs() / scale;
            assert!(
                e < SCORE_TOLERANCE,
                "{:?} d={d} t={t}: {} vs {}",
                codec.spec(),
                fast[t],
                reference[t]
            );
            let em = (multi[qi * n + t] as f64 - reference[t] as f64).abs() / scale;
            assert!(em < SCORE_TOLERANCE, "multi {:?} d={d} t={t}", codec.spec());
        }
    }
}

fn check_accumulate(codec: &Codec, block: &CodeBlock, weights: &[f32]) {
    let d = codec.dim();
    let n = block.len();
    let g = weights.len() / n;
    let norms = decoded_norms(codec, block);
    let mut multi = vec![0.0; g * d];
    codec
        .accumulate_multi(weights, block, &mut codec.scratch(), &mut multi)
        .unwrap();
    for (qi, w) in weights.chunks_exact(n).enumerate() {
        let fast = codec.accumulate_vec(w, block).unwrap();
        let reference = codec.accumulate_reference(w, block).unwrap();
        let scale: f64 = w
            .iter()
            .zip(&norms)
            .map(|(a, b)| a.abs() as f64 * b)
            .sum::<f64>()
            + 1e-30;
        let err: f64 = fast
            .iter()
            .zip(&reference)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            err / scale < 1e-5,
            "{:?} d={d}: {err} / {scale}",
            codec.spec()
        );
        let errm: f64 = multi[qi * d..(qi + 1) * d]
            .iter()
            .zip(&reference)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(errm / scale < 1e-5, "multi {:?} d={d}", codec.spec());
    }
}

#[test]
fn kernels_equal_dequantize_then_compute() {
    for d in [3usize, 24, 100, 128, 256] {
        for spec in all_specs(d) {
            let codec = Codec::new(d, spec).unwrap();
            let (block, _) = filled_block(&codec, 90, d as u64);
            let mut rng = TestRng::new(77);
            let queries: Vec<f32> = rng.gaussian_vec(d * 7);
            let weights: Vec<f32> = (0..90 * 3).map(|_| rng.uniform() as f32 - 0.3).collect();
            check_scores(&codec, &block, &queries);
            check_accumulate(&codec, &block, &weights);
        }
    }
}

/// Queries a fixed-point kernel (AVX2's 4- and 5-bit scores) could mishandle, against the
/// oracle:
/// one coordinate 10⁷ times the others (the rest of its chunk rounds to zero), a chunk of
/// zeros, extremes near f32's range, and NaN or ∞, which must reach the scores as the float
/// kernels carry them.
#[test]
fn scores_follow_the_oracle_on_extreme_queries() {
    let d = 256;
    for bits in [Bits::B4, Bits::B3_5, Bits::B5, Bits::B4_5] {
        let spec = Spec::mse(bits);
        let codec = Codec::new(d, spec).unwrap();
        let (block, _) = filled_block(&codec, 40, 3);
        let norms = decoded_norms(&codec, &block);
        let base = TestRng::new(5).gaussian_vec(d);
        let mut spike = base.iter().map(|v| v * 1e-3).collect::<Vec<f32>>();
        spike[77] = 1e4;
        let mut zeros = base.clone();
        zeros[64..128].fill(0.0);
        let huge: Vec<f32> = base.iter().map(|v| v * 1e30).collect();
        let tiny: Vec<f32> = base.iter().map(|v| v * 1e-30).collect();
        let tinier: Vec<f32> = base.iter().map(|v| v * 1e-37).collect();
        for q in [&spike, &zeros, &huge, &tiny, &tinier] {
            let fast = codec.scores_vec(q, &block).unwrap();
            let want = codec.scores_reference(q, &block).unwrap();
            let qn = dot(q, q).sqrt();
            for t in 0..block.len() {
                if !want[t].is_finite() {
                    assert!(!fast[t].is_finite(), "{spec:?} record {t}: {}", fast[t]);
                    continue;
                }
                let e = (fast[t] as f64 - want[t] as f64).abs() / (qn * norms[t] + 1e-300);
                assert!(
                    e < SCORE_TOLERANCE,
                    "{spec:?} record {t}: {} vs {}",
                    fast[t],
                    want[t]
                );
            }
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let mut q = base.clone();
            q[200] = bad;
            let fast = codec.scores_vec(&q, &block).unwrap();
            assert!(
                fast.iter().all(|v| !v.is_finite()),
                "{spec:?} {bad}: {fast:?}"
            );
        }
    }
}

/// Rotated queries against rotated rows (prefill's matrix product) give the kernels' scores,
/// for narrow, fractional and wide codebooks, whole and with a scalar tail (WIDE_DIMS);
/// a codec with QJL declines.
#[test]
fn rotated_rows_score_as_the_kernels_do() {
    for spec in [
        Spec::mse(Bits::B4),
        Spec::mse(Bits::B3_5),
        Spec::mse(Bits::B8),
        Spec {
            rotation: RotationKind::Haar,
            ..Spec::mse(Bits::B5)
        },
    ] {
        for d in WIDE_DIMS {
            let codec = Codec::new(d, spec).unwrap();
            let n = 60;
            let (block, _) = filled_block(&codec, n, 6);
            let g = 5;
            let q = TestRng::new(9).gaussian_vec(d * g);
            let mut want = vec![0.0; g * n];
            codec
                .scores_multi(&q, &block, &mut codec.scratch(), &mut want)
                .unwrap();
            let mut rq = vec![0.0; g * d];
            assert!(codec.rotated_queries(&q, &mut rq).unwrap());
            let (lo, hi) = (7, 51);
            let mut rows = vec![0.0; (hi - lo) * d];
            codec.rotated_rows(&block, lo..hi, &mut rows).unwrap();
            let norms = decoded_norms(&codec, &block);
            for qi in 0..g {
                let qn = dot(&q[qi * d..(qi + 1) * d], &q[qi * d..(qi + 1) * d]).sqrt();
                for t in lo..hi {
                    let got = dot(
                        &rq[qi * d..(qi + 1) * d],
                        &rows[(t - lo) * d..(t - lo + 1) * d],
                    );
                    let e = (got - want[qi * n + t] as f64).abs() / (qn * norms[t] + 1e-30);
                    assert!(
                        e < SCORE_TOLERANCE,
                        "{spec:?} query {qi} record {t}: {got} vs {}",
                        want[qi * n + t]
                    );
                }
            }
            assert!(matches!(
                codec.rotated_rows(&block, 50..61, &mut vec![0.0; 11 * d]),
                Err(Error::IndexOutOfRange { .. })
            ));
        }
    }
    let prod = Codec::new(64, prod3()).unwrap();
    let mut out = vec![1.0; 64];
    assert!(!prod.rotated_queries(&vec![0.5; 64], &mut out).unwrap());
    assert_eq!(out, vec![1.0; 64]);
}

/// Weighted rotated rows, summed as one matrix product and rotated back, give the kernels'
/// weighted sums; a codec with QJL declines.
#[test]
fn unrotated_sums_of_rotated_rows_equal_the_kernels_sums() {
    for spec in [
        Spec::mse(Bits::B3),
        Spec::mse(Bits::B3_5),
        Spec {
            rotation: RotationKind::Haar,
            ..Spec::mse(Bits::B4)
        },
    ] {
        for d in WIDE_DIMS {
            let codec = Codec::new(d, spec).unwrap();
            assert!(codec.works_by_products());
            let n = 50;
            let (block, _) = filled_block(&codec, n, 7);
            let g = 3;
            let mut rng = TestRng::new(10);
            let w: Vec<f32> = (0..g * n).map(|_| rng.uniform() as f32).collect();
            let mut want = vec![0.0; g * d];
            codec
                .accumulate_multi(&w, &block, &mut codec.scratch(), &mut want)
                .unwrap();
            let mut rows = vec![0.0; n * d];
            codec.rotated_rows(&block, 0..n, &mut rows).unwrap();
            let sums: Vec<f32> = (0..g * d)
                .map(|i| {
                    let (qi, j) = (i / d, i % d);
                    (0..n).map(|t| w[qi * n + t] * rows[t * d + j]).sum()
                })
                .collect();
            let mut got = vec![0.0; g * d];
            assert!(codec.unrotated_sums(&sums, &mut got).unwrap());
            let scale = want.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * scale,
                    "{spec:?} d={d} {i}: {a} vs {b}"
                );
            }
        }
    }
    let prod = Codec::new(64, prod3()).unwrap();
    assert!(!prod.works_by_products());
    let mut out = vec![1.0; 64];
    assert!(!prod.unrotated_sums(&vec![0.5; 64], &mut out).unwrap());
    assert_eq!(out, vec![1.0; 64]);
}

/// Queries prepared once score every block as `scores_multi_range` does, and sums left raw
/// over two blocks (each in two record ranges), scaled and added, with a row added raw
/// (`add_raw`), come back (`finish_sums`) as the same combination of that row and
/// each block's `accumulate_multi`: narrow, fractional, 5-bit (AVX2's byte planes) and
/// 8-bit codebooks, whole and with a tail. A codec with QJL declines raw sums.
#[test]
fn prepared_queries_and_raw_sums_equal_the_per_block_calls() {
    let _same_backend = BACKEND.read().unwrap_or_else(|e| e.into_inner());
    for spec in [
        Spec::mse(Bits::B4),
        Spec::mse(Bits::B3_5),
        Spec::mse(Bits::B5),
        Spec::mse(Bits::B4_5),
        Spec::mse(Bits::B8),
        prod3(),
    ] {
        for d in WIDE_DIMS {
            let codec = Codec::new(d, spec).unwrap();
            let n = 40;
            let blocks = [filled_block(&codec, n, 3).0, filled_block(&codec, n, 4).0];
            let g = 4;
            let mut rng = TestRng::new(21);
            let q = rng.gaussian_vec(d * g);
            let prepared = codec.prepare_scores(&q).unwrap();
            assert_eq!(prepared.len(), g);
            let mut scratch = codec.scratch();
            for block in &blocks {
                let (mut want, mut got) = (vec![-7.0; g * n], vec![-7.0; g * n]);
                codec
                    .scores_multi_range(&q, block, 5..33, &mut scratch, &mut want)
                    .unwrap();
                codec
                    .scores_prepared_range(&prepared, block, 5..33, &mut scratch, &mut got)
                    .unwrap();
                assert_eq!(got, want, "{spec:?} d={d}");
            }
            let w: Vec<Vec<f32>> = (0..2)
                .map(|_| (0..g * n).map(|_| rng.uniform() as f32).collect())
                .collect();
            let scale = [0.75f32, 1.5];
            if codec.works_by_products() {
                let mut raw = vec![0.0; g * d];
                let mut want = vec![0.0f64; g * d];
                for (b, block) in blocks.iter().enumerate() {
                    let mut part = vec![0.0; g * d];
                    // In two record ranges, as a segment cut into key ranges is summed.
                    for range in [0..17, 17..n] {
                        codec
                            .accumulate_raw(&w[b], block, range, &mut scratch, &mut part)
                            .unwrap();
                    }
                    raw.iter_mut()
                        .zip(&part)
                        .for_each(|(r, p)| *r += scale[b] * p);
                    let mut one = vec![0.0; g * d];
                    codec
                        .accumulate_multi(&w[b], block, &mut scratch, &mut one)
                        .unwrap();
                    want.iter_mut()
                        .zip(&one)
                        .for_each(|(x, &y)| *x += scale[b] as f64 * y as f64);
                }
                assert!(matches!(
                    codec.accumulate_raw(&w[0], &blocks[0], 30..n + 1, &mut scratch, &mut raw),
                    Err(Error::IndexOutOfRange { .. })
                ));
                // A row held beside the codes, added raw, comes back as itself.
                let x = rng.gaussian_vec(d);
                let xw: Vec<f32> = (0..g).map(|qi| 0.25 * qi as f32).collect();
                codec.add_raw(&x, &xw, &mut raw).unwrap();
                for (qi, row) in want.chunks_exact_mut(d).enumerate() {
                    row.iter_mut()
                        .zip(&x)
                        .for_each(|(a, &b)| *a += xw[qi] as f64 * b as f64);
                }
                let mut got = vec![0.0; g * d];
                codec.finish_sums(&raw, &mut got).unwrap();
                let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(&a, b)| (a as f64 - b).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(err < 1e-5 * norm, "{spec:?} d={d}: {err} of {norm}");
            } else {
                let mut sums = vec![0.0; g * d];
                assert!(matches!(
                    codec.accumulate_raw(&w[0], &blocks[0], 0..n, &mut scratch, &mut sums),
                    Err(Error::UnsupportedSpec(_))
                ));
                assert!(matches!(
                    codec.add_raw(&vec![1.0; d], &vec![1.0; g], &mut sums),
                    Err(Error::UnsupportedSpec(_))
                ));
            }
        }
    }
}

/// A record range scores exactly what the whole block scores there, across chunk boundaries
/// (chunks of 37 records), and leaves every other column as it was.
#[test]
fn scores_of_a_record_range_equal_the_whole_blocks() {
    let _same_backend = BACKEND.read().unwrap_or_else(|e| e.into_inner());
    for spec in [Spec::mse(Bits::B4), Spec::mse(Bits::B3_5), prod3()] {
        let d = 128;
        let codec = Codec::new(d, spec).unwrap();
        let n = 100;
        let (block, _) = filled_block(&codec, n, 5);
        let q = TestRng::new(8).gaussian_vec(d * 3);
        let mut s = codec.scratch();
        let mut whole = vec![0.0; 3 * n];
        codec.scores_multi(&q, &block, &mut s, &mut whole).unwrap();
        for range in [0..0, 0..n, 30..80, 36..38, 74..75, 99..100] {
            let sentinel = -12345.0;
            let mut out = vec![sentinel; 3 * n];
            codec
                .scores_multi_range(&q, &block, range.clone(), &mut s, &mut out)
                .unwrap();
            for (i, (&got, &want)) in out.iter().zip(&whole).enumerate() {
                let want = if range.contains(&(i % n)) {
                    want
                } else {
                    sentinel
                };
                assert_eq!(got, want, "{spec:?} {range:?} column {i}");
            }
        }
        let mut out = vec![0.0; 3 * n];
        for bad in [10..101, 101..101] {
            assert!(matches!(
                codec.scores_multi_range(&q, &block, bad, &mut s, &mut out),
                Err(Error::IndexOutOfRange { .. })
            ));
        }
    }
}

#[test]
fn codec_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Codec>();
    assert_send_sync::<CodeBlock>();
}

/// The SIMD backend this build and CPU must use: NEON on aarch64 (part of its baseline),
/// AVX-512 or AVX2 on x86-64 as the CPU has them, else portable.
fn expected_simd() -> Backend {
    #[cfg(target_arch = "aarch64")]
    return Backend::Neon;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Backend::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Backend::Avx2;
        }
    }
    #[allow(unreachable_code)]
    Backend::Portable
}

/// Scores and weighted sums of `codec` over `block` against their oracles, through whichever
/// backend runs now, which must be `want` (read back from the scratch that ran each call).
fn check_backend(
    codec: &Codec,
    block: &CodeBlock,
    (want_scores, want): (Backend, Backend),
    rng: &mut TestRng,
) {
    let d = codec.dim();
    let n = block.len();
    let mut s = codec.scratch();
    // 15 queries (tiles of 8, 4, 2, 1 in the SIMD backends) and 7 weight rows (4, 2, 1).
    let q = rng.gaussian_vec(d * 15);
    let mut out = vec![0.0; 15 * n];
    codec.scores_multi(&q, block, &mut s, &mut out).unwrap();
    assert_eq!(
        s.last_backend(),
        Some(want_scores),
        "scores_multi ran elsewhere"
    );
    check_scores(codec, block, &q);
    // Zero weights as masking leaves them: whole records no row weighs, and single zeros.
    let w: Vec<f32> = (0..n * 7)
        .map(|i| {
            let (row, t) = (i / n, i % n);
            if t % 7 == 3 || (t + row) % 5 == 0 {
                0.0
            } else {
                rng.uniform() as f32
            }
        })
        .collect();
    let mut acc = vec![0.0; 7 * d];
    codec.accumulate_multi(&w, block, &mut s, &mut acc).unwrap();
    assert_eq!(
        s.last_backend(),
        Some(want),
        "accumulate_multi ran elsewhere"
    );
    check_accumulate(codec, block, &w);
}

/// Every kernel through one backend (`force` selects it), on dimensions that exercise whole
/// 128-coordinate blocks, 16-code groups and scalar tails.
fn backend_equals_the_oracles(want: Backend, dims: &[usize], force: impl Fn(bool)) {
    force(true);
    assert_eq!(kvlab_turboquant::kernel_backend(), want);
    for &d in dims {
        for spec in all_specs(d) {
            if spec.rotation == RotationKind::Haar && d > 256 {
                continue;
            }
            let codec = Codec::new(d, spec).unwrap();
            let (block, _) = filled_block(&codec, 40, 9);
            let wants = (scores_backend(&spec, want), sums_backend(&spec, want));
            check_backend(&codec, &block, wants, &mut TestRng::new(4));
        }
    }
    force(false);
}

/// The backend switch is process-global: this single test owns it, holding [`BACKEND`] for
/// writing; other tests give correct results through either backend, and those that hold
/// two calls to bit-for-bit equality hold it for reading (one call through NEON and the other
/// through the portable backend differ in the last bits: seen once under qemu). It names the
/// backend that ran each side, so on aarch64 the SIMD side is asserted to be NEON.
#[test]
fn backends_agree_and_match_oracles() {
    let _owner = BACKEND.write().unwrap_or_else(|e| e.into_inner());
    let simd = expected_simd();
    eprintln!("SIMD backend on this machine: {simd}");
    assert_eq!(kvlab_turboquant::kernel_backend(), simd);
    if !NATIVE_RUN_CHECKS_PORTABLE {
        backend_equals_the_oracles(
            Backend::Portable,
            &[24, 100, 256],
            kvlab_turboquant::force_portable_kernels,
        );
    }
    backend_equals_the_oracles(simd, &[24, 100, 256, 384], |_| {});
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // The AVX2 backend, used on x86 CPUs without AVX-512.
        backend_equals_the_oracles(
            Backend::Avx2,
            &[24, 100, 256, 384],
            kvlab_turboquant::force_avx2_kernels,
        );
    }
    portable_and_simd_backends_agree(simd);
}

fn portable_and_simd_backends_agree(simd: Backend) {
    let codec = Codec::new(256, Spec::mse(Bits::B3_5)).unwrap();
    let (block, xs) = filled_block(&codec, 50, 1);
    let q = &xs[..256];
    let mut s = codec.scratch();
    let run = |s: &mut kvlab_turboquant::Scratch| {
        let mut sc = vec![0.0; 50];
        codec.scores(q, &block, s, &mut sc).unwrap();
        let after_scores = s.last_backend();
        let mut acc = vec![0.0; 256];
        codec.accumulate(&[0.5; 50], &block, s, &mut acc).unwrap();
        assert_eq!(s.last_backend(), after_scores);
        (sc, acc, after_scores)
    };
    let (simd_scores, acc_simd, ran) = run(&mut s);
    assert_eq!(ran, Some(simd));
    kvlab_turboquant::force_portable_kernels(true);
    let (portable, acc_portable, ran) = run(&mut s);
    kvlab_turboquant::force_portable_kernels(false);
    assert_eq!(ran, Some(Backend::Portable));
    // Encoders: the SIMD encoder (AVX-512/BMI2, AVX2 or NEON) and the portable one produce
    // identical bytes, one vector at a time and in batches.
    for bits in ALL_BITS {
        for d in [24usize, 100, 256, 384] {
            if bits.value() > 4.0 && !WIDE_DIMS.contains(&d) {
                continue;
            }
            for variant in [Variant::Mse, Variant::Prod] {
                let spec = Spec {
                    variant,
                    ..Spec::mse(bits)
                };
                if spec.validate().is_err() || (NATIVE_RUN_CHECKS_PORTABLE && wide(&spec)) {
                    continue;
                }
                let codec = Codec::new(d, spec).unwrap();
                let mut rng = TestRng::new(d as u64);
                let xs = rng.gaussian_vec(d * 20);
                let encode = |want: Backend| {
                    let mut block = codec.new_block();
                    let mut s = codec.scratch();
                    for x in xs.chunks_exact(d) {
                        codec.encode(x, &mut block, &mut s).unwrap();
                    }
                    assert_eq!(s.last_backend(), Some(want), "{spec:?} d={d}");
                    let mut batch = codec.new_block();
                    codec.encode_batch(&xs, &mut batch).unwrap();
                    assert_eq!(block.to_bytes(), batch.to_bytes());
                    block.to_bytes()
                };
                let simd_bytes = encode(if wide(&spec) { Backend::Portable } else { simd });
                kvlab_turboquant::force_portable_kernels(true);
                let portable_bytes = encode(Backend::Portable);
                kvlab_turboquant::force_portable_kernels(false);
                assert_eq!(simd_bytes, portable_bytes, "{spec:?} d={d}");
            }
        }
    }
    // Scores relative to ‖q‖·‖x̂‖, as against the oracles (a score can cancel to ~0).
    let qn = dot(q, q).sqrt();
    let norms = decoded_norms(&codec, &block);
    for ((a, b), xn) in simd_scores.iter().zip(&portable).zip(&norms) {
        let e = (a - b).abs() as f64 / (qn * xn + 1e-30);
        assert!(e <= SCORE_TOLERANCE, "{a} vs {b}");
    }
    for (a, b) in acc_simd.iter().zip(&acc_portable) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
// Byte accounting is the same on every CPU: checked natively, not again under qemu.
#[cfg_attr(
    target_arch = "aarch64",
    ignore = "accounting checked on the native run"
)]
fn stored_bytes_equal_bytes_per_vector() {
    assert_eq!(bytes_per_vector(256, &Spec::mse(Bits::B4)), Ok(130));
    for d in [3usize, 17, 64, 100, 256, 512] {
        for spec in all_specs(d) {
            if spec.rotation == RotationKind::Haar && d > 256 {
                continue; // same layout as Hadamard; skip the O(d³) setup
            }
            let codec = Codec::new(d, spec).unwrap();
            let bpv = bytes_per_vector(d, &spec).unwrap();
            assert_eq!(codec.bytes_per_vector(), bpv);
            let (block, _) = filled_block(&codec, 41, 3);
            assert_eq!(block.bytes_used(), 41 * bpv);
            assert_eq!(block.to_bytes().len(), 41 * bpv);
            // Bits are not wasted: the code area is the exact bit count rounded up once.
            // Fractional widths: half the coordinates half a bit up, half half a bit down.
            let v = spec.bits.value();
            let (lo, hi) = (v.floor(), v.ceil());
            let code_bits = match spec.variant {
                Variant::Mse => {
                    let h = if d >= 16 { (d / 2) & !7 } else { d / 2 };
                    h as f64 * hi + (d - h) as f64 * lo
                }
                Variant::Prod => d as f64 * spec.bits.value(),
            };
            let fields = if spec.variant == Variant::Prod { 4 } else { 2 };
            assert_eq!(
                bpv,
                (code_bits as usize).div_ceil(8) + fields,
                "{spec:?} d={d}"
            );
        }
    }
}

#[test]
fn block_grows_in_chunks_and_truncates() {
    let codec = Codec::new(256, Spec::mse(Bits::B4)).unwrap();
    let mut block = codec.new_block_with_chunk(64);
    assert_eq!(block.bytes_allocated(), 0);
    let mut s = codec.scratch();
    let mut rng = TestRng::new(1);
    codec
        .encode(&rng.gaussian_vec(256), &mut block, &mut s)
        .unwrap();
    assert_eq!(block.bytes_used(), 130);
    assert_eq!(block.bytes_allocated(), 64 * 130);
    let batch = rng.gaussian_vec(256 * 100);
    codec.encode_batch(&batch, &mut block).unwrap();
    assert_eq!(block.len(), 101);
    assert_eq!(block.bytes_allocated(), 2 * 64 * 130);
    let before = block.to_bytes();
    block.truncate(60);
    assert_eq!(block.len(), 60);
    assert_eq!(block.bytes_allocated(), 64 * 130);
    assert_eq!(block.to_bytes(), before[..60 * 130]);
    block.truncate(0);
    assert_eq!(block.bytes_allocated(), 0);
}

#[test]
fn batch_and_single_encoding_agree_and_are_deterministic() {
    let _same_backend = BACKEND.read().unwrap_or_else(|e| e.into_inner());
    let spec = Spec {
        seed: 9,
        ..Spec::mse(Bits::B3)
    };
    let a = Codec::new(128, spec).unwrap();
    let b = Codec::new(128, spec).unwrap();
    let mut rng = TestRng::new(5);
    let xs = rng.gaussian_vec(128 * 700); // above the parallel threshold
    let mut ba = a.new_block();
    a.encode_batch(&xs, &mut ba).unwrap();
    let mut bb = b.new_block();
    let mut s = b.scratch();
    for x in xs.chunks_exact(128) {
        b.encode(x, &mut bb, &mut s).unwrap();
    }
    assert_eq!(ba.to_bytes(), bb.to_bytes());
    let c = Codec::new(128, Spec { seed: 10, ..spec }).unwrap();
    let mut bc = c.new_block();
    c.encode_batch(&xs, &mut bc).unwrap();
    assert_ne!(ba.to_bytes(), bc.to_bytes());
}

#[test]
fn errors_are_typed() {
    let codec = Codec::new(64, Spec::mse(Bits::B2)).unwrap();
    let mut block = codec.new_block();
    let mut s = codec.scratch();
    assert!(matches!(
        codec.encode(&[1.0; 63], &mut block, &mut s),
        Err(Error::DimensionMismatch {
            expected: 64,
            got: 63
        })
    ));
    let mut bad = vec![1.0; 64];
    bad[3] = f32::NAN;
    assert!(matches!(
        codec.encode(&bad, &mut block, &mut s),
        Err(Error::NotEncodable { .. })
    ));
    assert!(matches!(
        codec.encode(&[1e6; 64], &mut block, &mut s),
        Err(Error::NotEncodable { .. })
    ));
    assert!(matches!(
        codec.encode_batch(&[1.0; 65], &mut block),
        Err(Error::DimensionMismatch { .. })
    ));
    let mut batch = vec![1.0; 64 * 3];
    batch[64 * 2] = f32::INFINITY;
    assert!(codec.encode_batch(&batch, &mut block).is_err());
    assert_eq!(block.len(), 0, "a failed batch appends nothing");
    let other = Codec::new(64, Spec::mse(Bits::B3)).unwrap();
    assert!(matches!(
        other.encode(&[1.0; 64], &mut block, &mut s),
        Err(Error::LayoutMismatch { .. })
    ));
    assert!(matches!(
        CodeBlock::from_bytes(&codec, &[0u8; 17 + 10]),
        Err(Error::TruncatedBlock {
            len: 27,
            stride: 18
        })
    ));
    let mut out = vec![0.0; 64];
    assert!(matches!(
        codec.decode(&block, 0, &mut out, &mut s),
        Err(Error::IndexOutOfRange { .. })
    ));
    assert!(codec
        .scores(&[0.0; 64], &block, &mut s, &mut [0.0; 1])
        .is_err());
    assert!(codec
        .accumulate(&[], &block, &mut s, &mut [0.0; 63])
        .is_err());
    assert!(matches!(
        Codec::new(2, Spec::mse(Bits::B2)),
        Err(Error::InvalidDimension { .. })
    ));
    let prod_frac = Spec {
        variant: Variant::Prod,
        ..Spec::mse(Bits::B2_5)
    };
    assert!(matches!(
        Codec::new(64, prod_frac),
        Err(Error::UnsupportedSpec(_))
    ));
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (
        // Up to 4 bits: each case draws a new dimension, and a wide width would fit a new
        // codebook of up to 256 levels per case (the wide widths have their fixed dimensions).
        0usize..6,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(b, prod, haar, nc, seed)| {
            let bits = ALL_BITS[b];
            let variant = if prod && bits.value().fract() == 0.0 {
                Variant::Prod
            } else {
                Variant::Mse
            };
            Spec {
                bits,
                variant,
                rotation: if haar {
                    RotationKind::Haar
                } else {
                    RotationKind::Hadamard
                },
                norm_correction: nc && variant == Variant::Mse,
                unbiased: false,
                seed,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Encoding is deterministic, to_bytes/from_bytes reproduce a block exactly, and decoding
    /// the reloaded block gives the same vector, closer to the input than 0 is (mse, d ≥ 16).
    #[test]
    fn encode_decode_roundtrip(spec in spec_strategy(), d in 3usize..80, seed in any::<u64>()) {
        let codec = Codec::new(d, spec).unwrap();
        let mut rng = TestRng::new(seed);
        let x = rng.gaussian_vec(d);
        let mut block = codec.new_block();
        let mut s = codec.scratch();
        codec.encode(&x, &mut block, &mut s).unwrap();
        codec.encode(&x, &mut block, &mut s).unwrap();
        let bytes = block.to_bytes();
        let stride = codec.bytes_per_vector();
        prop_assert_eq!(&bytes[..stride], &bytes[stride..]);
        let back = CodeBlock::from_bytes(&codec, &bytes).unwrap();
        prop_assert_eq!(back.to_bytes(), bytes.clone());
        let (mut y0, mut y1) = (vec![0.0; d], vec![0.0; d]);
        codec.decode(&block, 0, &mut y0, &mut s).unwrap();
        codec.decode(&back, 1, &mut y1, &mut s).unwrap();
        prop_assert_eq!(&y0, &y1);
        if spec.variant == Variant::Mse && d >= 16 {
            let rel = common::dist2(&x, &y0) / dot(&x, &x);
            prop_assert!(rel < 1.0, "relative error {}", rel);
        }
    }

    /// Arbitrary bytes never panic: they are either rejected as truncated or decode to
    /// some (possibly non-finite) vectors that the kernels process.
    #[test]
    fn arbitrary_bytes_never_panic(spec in spec_strategy(), d in 3usize..40,
                                   bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let codec = Codec::new(d, spec).unwrap();
        match CodeBlock::from_bytes(&codec, &bytes) {
            Err(e) => {
                let truncated = matches!(e, Error::TruncatedBlock { .. });
                prop_assert!(truncated, "unexpected error {:?}", e);
            }
            Ok(block) => {
                let mut s = codec.scratch();
                let mut y = vec![0.0; d];
                for t in 0..block.len() {
                    codec.decode(&block, t, &mut y, &mut s).unwrap();
                }
                let q = vec![1.0; d];
                let mut out = vec![0.0; block.len()];
                codec.scores(&q, &block, &mut s, &mut out).unwrap();
                let w = vec![1.0; block.len()];
                let mut acc = vec![0.0; d];
                if !block.is_empty() {
                    codec.accumulate(&w, &block, &mut s, &mut acc).unwrap();
                }
            }
        }
    }
}
