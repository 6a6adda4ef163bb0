//! Tests of the TurboQuant storage: attention on codes equals dense attention on the
//! dequantized K/V (causal, sliding windows, GQA, segment boundaries, dropped fronts, mixed
//! sides), bytes follow the codec formula, and failed appends change nothing.

use candle_core::{Device, Tensor};
use kvlab_turboquant::ggml::BlockType;
use kvlab_turboquant::{bytes_per_vector, Bits, RotationKind, Spec, Variant};

use super::*;
use crate::kv::attend::attend_dense;
use crate::kv::format::CALIBRATION_ROWS;
use crate::kv::spec::CacheSpec;

/// Deterministic roughly-normal values (sum of 4 uniforms), with a per-row offset so
/// vectors are not centred (the case a sign-less rotation would get wrong).
fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = kvlab_turboquant::Rng::new(seed, 0);
    let mut next = || rng.uniform() as f32;
    (0..n)
        .map(|i| (next() + next() + next() + next() - 2.0) * 1.7 + 0.3 * ((i / 7) % 3) as f32)
        .collect()
}

fn tensor(seed: u64, h: usize, t: usize, d: usize) -> Result<Tensor> {
    Ok(Tensor::from_vec(
        data(seed, h * t * d),
        (h, t, d),
        &Device::Cpu,
    )?)
}

/// A shape whose calibrating sides calibrate on their first append, whatever its size: these
/// tests are about codes, and most append fewer than [`CALIBRATION_ROWS`] tokens.
fn shape(n_kv: usize, d: usize) -> StorageShape {
    waiting(n_kv, d, 1)
}

/// A shape whose calibrating sides hold their first `rows` as f16.
fn waiting(n_kv: usize, d: usize, rows: usize) -> StorageShape {
    StorageShape {
        calibration_rows: rows,
        ..StorageShape::new(n_kv, d, Device::Cpu)
    }
}

fn tq(key: SideSpec, value: SideSpec) -> LayerPrecision {
    LayerPrecision::new(key, value)
}

fn codes(bits: Bits) -> SideSpec {
    SideSpec::Codes(Spec::mse(bits))
}

fn max_abs(t: &Tensor) -> Result<f32> {
    Ok(t.abs()?.max_all()?.to_scalar::<f32>()?)
}

/// Appends `chunks` token by chunk, attending after each append as a model step would, and
/// keeping a sliding window trimmed like `KvCache::commit`; every result must equal dense
/// attention over `to_dense()`.
fn check_against_dense(
    precision: LayerPrecision,
    n_heads: usize,
    n_kv: usize,
    d: usize,
    window: Option<usize>,
    chunks: &[usize],
) -> Result<()> {
    let as_given = |q: &Tensor, _: f32| Ok(q.clone());
    check_against_dense_scored(precision, n_heads, n_kv, d, window, chunks, &as_given)?;
    // Again with the first 200 rows waiting as f16 before the side calibrates on them.
    check_waiting(precision, n_heads, n_kv, d, window, chunks, 200, &as_given)
}

/// [`check_against_dense`] with the dense attention given the queries as `scored(q, scale)`
/// makes them (what the storage's keys are dotted with). Equal up to the order of f32 sums:
/// within 2·10⁻⁵ of the output's scale.
fn check_against_dense_scored(
    precision: LayerPrecision,
    n_heads: usize,
    n_kv: usize,
    d: usize,
    window: Option<usize>,
    chunks: &[usize],
    scored: &dyn Fn(&Tensor, f32) -> Result<Tensor>,
) -> Result<()> {
    check_waiting(precision, n_heads, n_kv, d, window, chunks, 1, scored)
}

/// [`check_against_dense_scored`] on a storage whose calibrating sides wait for
/// `calibration_rows`.
#[allow(clippy::too_many_arguments)]
fn check_waiting(
    precision: LayerPrecision,
    n_heads: usize,
    n_kv: usize,
    d: usize,
    window: Option<usize>,
    chunks: &[usize],
    calibration_rows: usize,
    scored: &dyn Fn(&Tensor, f32) -> Result<Tensor>,
) -> Result<()> {
    let mut s = SplitStorage::new(precision, waiting(n_kv, d, calibration_rows))?;
    let (mut seq, mut key_start) = (0usize, 0usize);
    for (step, &c) in chunks.iter().enumerate() {
        let seed = 1000 + step as u64;
        s.append(&tensor(seed, n_kv, c, d)?, &tensor(seed + 500, n_kv, c, d)?)?;
        let q = tensor(seed + 900, n_heads, c, d)?;
        let spec = AttendSpec {
            query_start: seq,
            key_start,
            window,
            scale: 0.125,
            both_ways: None,
        };
        let got = s.attend(&q, &spec)?;
        let (k, v) = s.to_dense()?;
        let want = attend_dense(&scored(&q, spec.scale as f32)?, &k, &v, &spec)?;
        let err = max_abs(&(&got - &want)?)?;
        let scale = max_abs(&want)?.max(1.0);
        assert!(
            err <= 2e-5 * scale,
            "{precision} step {step} (chunk {c}, window {window:?}): error {err} vs scale {scale}"
        );
        seq += c;
        if let Some(w) = window {
            let keep = w - 1;
            if s.len() > keep {
                s.drop_front(s.len() - keep)?;
                key_start = seq - keep;
            }
        }
    }
    Ok(())
}

#[test]
fn attend_on_codes_equals_dense_attend_on_dequantized_full_causal_gqa() -> Result<()> {
    let chunks = [300, 1, 400, 37, 1, 1, 2];
    for p in [
        tq(codes(Bits::B4), codes(Bits::B4)),
        tq(codes(Bits::B3_5), codes(Bits::B2_5)),
        tq(codes(Bits::B2), codes(Bits::B3)),
    ] {
        check_against_dense(p, 6, 2, 64, None, &chunks)?;
    }
    Ok(())
}

#[test]
fn attend_on_codes_equals_dense_attend_with_sliding_windows() -> Result<()> {
    // Window 100: the dropped front is masked inside a segment; 1400 tokens also drop
    // whole segments.
    let chunks = [150, 1, 1, 260, 513, 1, 90, 1, 384, 1];
    check_against_dense(
        tq(codes(Bits::B4), codes(Bits::B3)),
        4,
        1,
        32,
        Some(100),
        &chunks,
    )?;
    // A window wider than a segment.
    check_against_dense(
        tq(codes(Bits::B3), codes(Bits::B4)),
        2,
        2,
        16,
        Some(700),
        &chunks,
    )?;
    Ok(())
}

#[test]
fn sunk_codes_attend_like_dense_attention_over_what_they_hold() -> Result<()> {
    // The first token read from its f16 row by every path: decode's kernels (sums raw, or
    // rotated back per segment with QJL), prefill by rows and by matrix products, a window
    // that drops the first segment, and a side that waits as f16 before it calibrates.
    let chunks = [300, 1, 40, 1, 600, 1, 2];
    for text in [
        "tq3+sink",
        "k4v3+qw+sink@all",
        "tq4+prod+sink",
        "f16/tq3+sink",
        "tq3/f16+sink",
    ] {
        let CacheSpec::Split { precision, .. } = CacheSpec::parse(text)? else {
            panic!("{text} is dense");
        };
        check_against_dense(precision, 4, 2, 64, None, &chunks)?;
        check_against_dense(precision, 4, 2, 64, Some(100), &chunks)?;
    }
    Ok(())
}

#[test]
fn mixed_sides_prod_and_haar_match_dense_attend() -> Result<()> {
    let chunks = [40, 1, 600, 1];
    let prod = Spec {
        variant: Variant::Prod,
        ..Spec::mse(Bits::B3)
    };
    let haar = Spec {
        rotation: RotationKind::Haar,
        norm_correction: true,
        unbiased: false,
        seed: 5,
        ..Spec::mse(Bits::B4)
    };
    for p in [
        tq(codes(Bits::B4), SideSpec::F16),
        tq(SideSpec::F16, codes(Bits::B2_5)),
        tq(codes(Bits::B3), SideSpec::F32),
        tq(SideSpec::BF16, codes(Bits::B4)),
        tq(SideSpec::BF16, SideSpec::F32),
        tq(SideSpec::Codes(prod), SideSpec::Codes(prod)),
        tq(SideSpec::Codes(haar), SideSpec::Codes(haar)),
    ] {
        check_against_dense(p, 4, 2, 48, None, &chunks)?;
        check_against_dense(p, 4, 2, 48, Some(30), &chunks)?;
    }
    Ok(())
}

#[test]
fn bytes_follow_the_codec_formula_for_every_spec() -> Result<()> {
    let (n_kv, d) = (2, 64);
    for text in [
        "tq1",
        "tq2",
        "tq2.5",
        "tq3",
        "tq3.5",
        "tq4",
        "k4v3",
        "k3.5v2.5",
        "k4vf16",
        "kf16v2",
        "tq4+prod",
        "tq3+nc",
        "tq3+haar",
        "q8_0",
        "q8_0/q4_0",
        "f16/iq4_nl",
        "q5_1/tq3",
        "q4_1+norot",
        "f32/q4_0",
        "q8_0/bf16",
        "tq4/f32",
        "bf16/tq3",
        "f32/bf16",
        "q4_0+sink",
        "f16/q4_0+sink",
        "q8_0/tq3+sink",
        "tq3+sink",
        "k4v3+qw+sink@all",
        "f16/tq3+sink",
        "tq4+prod+sink",
    ] {
        let CacheSpec::Split { precision, .. } = CacheSpec::parse(text)? else {
            panic!("{text} is not turboquant");
        };
        let bpv = |s: &SideSpec| match *s {
            SideSpec::F16 | SideSpec::BF16 => 2 * d,
            SideSpec::F32 => 4 * d,
            SideSpec::Codes(spec) => bytes_per_vector(d, &spec).unwrap_or(0),
            SideSpec::Blocks(t) => t.row_bytes(d).unwrap_or(0),
        };
        let per_token = n_kv * (bpv(&precision.key) + bpv(&precision.value));
        // Each coded side keeps one f32 offset vector per head (centering, the default).
        let coded = [precision.key, precision.value]
            .iter()
            .filter(|s| s.spec().is_some())
            .count();
        // Each `+sink` side but a dense one its first token as f16.
        let sinks = if precision.sink {
            [precision.key, precision.value]
                .iter()
                .filter(|s| !s.is_dense())
                .count()
        } else {
            0
        };
        // `+qw` keys their channel weights (f32 per head) too.
        let weighed = usize::from(precision.weigh_keys);
        let fixed = (coded + weighed) * n_kv * d * 4 + sinks * n_kv * d * 2;
        assert_eq!(
            KvPrecision::Split(precision).bytes_after(n_kv, d, 704, 704, 1)?,
            (704 * per_token + fixed) as u64,
            "{text}"
        );
        let mut s = SplitStorage::new(precision, shape(n_kv, d))?;
        assert_eq!(s.bytes_used(), 0);
        for (i, c) in [1usize, 700, 3].into_iter().enumerate() {
            s.append(&tensor(i as u64, n_kv, c, d)?, &tensor(9, n_kv, c, d)?)?;
        }
        assert_eq!(s.bytes_used(), 704 * per_token + fixed, "{text}");
        assert!(s.bytes_allocated() >= s.bytes_used(), "{text}");
        s.drop_front(600)?;
        assert_eq!(s.bytes_used(), 104 * per_token + fixed, "{text}");
        s.truncate(4)?;
        assert_eq!(s.bytes_used(), 4 * per_token + fixed, "{text}");
        s.truncate(0)?;
        assert_eq!((s.bytes_used(), s.bytes_allocated()), (0, 0), "{text}");
    }
    Ok(())
}

#[test]
fn dense_sides_hold_their_dtype_exactly() -> Result<()> {
    use candle_core::DType;
    let (n_kv, d) = (2, 32);
    let (k, v) = (tensor(1, n_kv, 40, d)?, tensor(2, n_kv, 40, d)?);
    for (key, value) in [
        (SideSpec::F32, block(BlockType::Q4_0)),
        (SideSpec::BF16, SideSpec::F32),
        (codes(Bits::B3), SideSpec::BF16),
    ] {
        let mut s = SplitStorage::new(tq(key, value), shape(n_kv, d))?;
        s.append(&k, &v)?;
        let (k0, v0) = s.to_dense()?;
        for (side, given, held) in [(key, &k, &k0), (value, &v, &v0)] {
            if let Some(dt) = side.dense_dtype() {
                // The given floats rounded to the side's dtype, nothing else.
                let rounded = given.to_dtype(dt)?.to_dtype(DType::F32)?;
                assert_eq!(max_abs(&(held - &rounded)?)?, 0.0, "{side:?}");
                if dt == DType::BF16 {
                    assert!(max_abs(&(held - given)?)? > 0.0, "bf16 rounds");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn drop_front_and_truncate_keep_the_right_tokens() -> Result<()> {
    let p = tq(codes(Bits::B3), SideSpec::F16);
    let mut s = SplitStorage::new(p, shape(2, 16))?;
    let k = tensor(1, 2, 1300, 16)?;
    let v = tensor(2, 2, 1300, 16)?;
    s.append(&k, &v)?;
    let (k0, v0) = s.to_dense()?;
    // Values are dense f16: exact up to f16 rounding.
    let f16_err = max_abs(&(&v0 - &v)?)?;
    assert!(f16_err < 4e-3, "f16 side error {f16_err}");
    s.drop_front(1030)?;
    s.truncate(200)?;
    let (k1, v1) = s.to_dense()?;
    assert_eq!(max_abs(&(&k1 - k0.narrow(1, 1030, 200)?)?)?, 0.0);
    assert_eq!(max_abs(&(&v1 - v0.narrow(1, 1030, 200)?)?)?, 0.0);
    let (kr, _) = s.to_dense_range(50, 10)?;
    assert_eq!(max_abs(&(&kr - k0.narrow(1, 1080, 10)?)?)?, 0.0);
    assert!(s.truncate(201).is_err());
    assert!(s.drop_front(201).is_err());
    assert!(s.to_dense_range(195, 6).is_err());
    // Appending after drops continues in order.
    s.append(&k.narrow(1, 0, 3)?, &v.narrow(1, 0, 3)?)?;
    assert_eq!(s.len(), 203);
    let (k2, _) = s.to_dense()?;
    assert_eq!(max_abs(&(k2.narrow(1, 0, 200)? - &k1)?)?, 0.0);
    Ok(())
}

#[test]
fn a_vector_that_cannot_be_encoded_changes_nothing() -> Result<()> {
    let p = tq(codes(Bits::B4), codes(Bits::B4));
    let mut s = SplitStorage::new(p, shape(2, 16))?;
    s.append(&tensor(1, 2, 520, 16)?, &tensor(2, 2, 520, 16)?)?;
    let before = (s.len(), s.bytes_used(), s.to_dense()?);
    // Head 1's last value overflows the f16 norm field; head 0 and the keys are fine.
    let mut bad = data(3, 2 * 4 * 16);
    bad[2 * 4 * 16 - 1] = 1e6;
    let bad = Tensor::from_vec(bad, (2, 4, 16), &Device::Cpu)?;
    assert!(matches!(
        s.append(&tensor(4, 2, 4, 16)?, &bad),
        Err(EngineError::Codec(_))
    ));
    assert_eq!((s.len(), s.bytes_used()), (before.0, before.1));
    let (k, v) = s.to_dense()?;
    assert_eq!(max_abs(&(&k - &before.2 .0)?)?, 0.0);
    assert_eq!(max_abs(&(&v - &before.2 .1)?)?, 0.0);
    Ok(())
}

#[test]
fn rejects_mismatched_shapes_and_empty_attends() -> Result<()> {
    let p = tq(codes(Bits::B4), codes(Bits::B4));
    let mut s = SplitStorage::new(p, shape(2, 16))?;
    let spec = AttendSpec {
        query_start: 0,
        key_start: 0,
        window: None,
        scale: 1.0,
        both_ways: None,
    };
    assert!(s.attend(&tensor(1, 4, 1, 16)?, &spec).is_err());
    assert!(s
        .append(&tensor(1, 3, 1, 16)?, &tensor(1, 3, 1, 16)?)
        .is_err());
    assert!(s
        .append(&tensor(1, 2, 1, 16)?, &tensor(1, 2, 2, 16)?)
        .is_err());
    s.append(&tensor(1, 2, 1, 16)?, &tensor(1, 2, 1, 16)?)?;
    // 3 query heads cannot share 2 kv heads.
    assert!(s.attend(&tensor(1, 3, 1, 16)?, &spec).is_err());
    Ok(())
}

/// Keys like Gemma's: a large mean shared by every token plus per-token detail.
fn offset_rows(seed: u64, h: usize, t: usize, d: usize) -> Result<Tensor> {
    let detail = data(seed, h * t * d);
    let mean = data(seed ^ 0xABCD, d);
    let rows: Vec<f32> = detail
        .chunks_exact(d)
        .flat_map(|r| {
            r.iter()
                .zip(&mean)
                .map(|(x, m)| x + 3.0 * m)
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(Tensor::from_vec(rows, (h, t, d), &Device::Cpu)?)
}

/// Squared error of the stored vectors relative to the inputs' energy.
fn relative_error(p: LayerPrecision, k: &Tensor) -> Result<f32> {
    let mut s = SplitStorage::new(p, shape(k.dim(0)?, k.dim(2)?))?;
    s.append(k, k)?;
    let (kd, _) = s.to_dense()?;
    let err = (&kd - k)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok(err / k.sqr()?.sum_all()?.to_scalar::<f32>()?)
}

#[test]
fn centering_cuts_the_error_of_offset_vectors_and_stays_exact_in_attention() -> Result<()> {
    let k = offset_rows(3, 2, 300, 64)?;
    let centered = tq(codes(Bits::B3), codes(Bits::B3));
    let raw = LayerPrecision {
        center: false,
        ..centered
    };
    let (c, r) = (relative_error(centered, &k)?, relative_error(raw, &k)?);
    // The mean holds ~90% of the energy: coding k − μ leaves about a tenth of the error.
    assert!(c < 0.25 * r, "centered {c} vs raw {r}");
    assert!(
        (r - 0.0343).abs() < 0.006,
        "raw error {r} is the codec's D_mse(3)"
    );
    // Scores and weighted sums on the centered codes still equal dense attention on the
    // decoded (offset added back) K/V, across segments and GQA.
    check_against_dense(centered, 4, 2, 64, None, &[300, 1, 250, 1])?;
    Ok(())
}

#[test]
fn a_short_first_append_leaves_the_head_uncentered() -> Result<()> {
    // Calibrating on the first append whatever its size (`shape`): 4 rows give no offset.
    let k = offset_rows(5, 1, 40, 64)?;
    let p = tq(codes(Bits::B3), codes(Bits::B3));
    let mut short = SplitStorage::new(p, shape(1, 64))?;
    short.append(&k.narrow(1, 0, 4)?, &k.narrow(1, 0, 4)?)?;
    short.append(&k.narrow(1, 4, 36)?, &k.narrow(1, 4, 36)?)?;
    let mut long = SplitStorage::new(p, shape(1, 64))?;
    long.append(&k, &k)?;
    let (e_short, e_long) = (sq_error(&short, &k)?, sq_error(&long, &k)?);
    assert!(e_long < 0.5 * e_short, "long {e_long} vs short {e_short}");
    // A reset forgets the offset: the next first append decides again.
    short.truncate(0)?;
    short.append(&k, &k)?;
    assert!((sq_error(&short, &k)? - e_long).abs() <= 1e-3 * e_long);
    Ok(())
}

/// Σ (decoded key − key)² over a storage's keys.
fn sq_error(s: &SplitStorage, k: &Tensor) -> Result<f32> {
    let (kd, _) = s.to_dense()?;
    Ok((&kd - k)?.sqr()?.sum_all()?.to_scalar::<f32>()?)
}

#[test]
fn first_rows_wait_as_f16_and_calibrate_together() -> Result<()> {
    // Rows f16 holds exactly, so waiting loses nothing the codes would not.
    let (n_kv, t, d) = (2usize, 90usize, 64usize);
    let k = offset_rows(5, n_kv, t, d)?
        .to_dtype(DType::F16)?
        .to_dtype(DType::F32)?;
    let v = (k.clone() * 0.5)?;
    let p = LayerPrecision {
        weigh_keys: true,
        ..tq(codes(Bits::B3), codes(Bits::B4))
    };
    let energy: Vec<f64> = (0..n_kv * d).map(|j| 1.0 + (j % 7) as f64).collect();
    let rows = 64;
    let mut chat = SplitStorage::new(p, waiting(n_kv, d, rows))?;
    chat.set_query_energy(&energy);
    let held = |s: &SplitStorage, n| {
        KvPrecision::Split(p)
            .bytes_after(n_kv, d, n, n, rows)
            .map(|b| assert_eq!(s.bytes_used() as u64, b, "{n} rows"))
    };
    // A short first message: held as f16 (exactly, here), at f16's bytes, and attended
    // over as the dense rows they are.
    chat.append(&k.narrow(1, 0, 5)?, &v.narrow(1, 0, 5)?)?;
    chat.append(&k.narrow(1, 5, 40)?, &v.narrow(1, 5, 40)?)?;
    assert_eq!(
        max_abs(&(&chat.to_dense()?.0 - &k.narrow(1, 0, 45)?)?)?,
        0.0
    );
    held(&chat, 45)?;
    assert_eq!(chat.bytes_used(), n_kv * 45 * 2 * 2 * d);
    assert!(chat.wants_query_energy() && chat.calibrating());
    // The row that reaches 64 calibrates on all 64 waiting and new rows: the same codes,
    // offsets and weights as one long first append of them.
    chat.append(&k.narrow(1, 45, 30)?, &v.narrow(1, 45, 30)?)?;
    chat.append(&k.narrow(1, 75, 15)?, &v.narrow(1, 75, 15)?)?;
    let mut long = SplitStorage::new(p, waiting(n_kv, d, rows))?;
    long.set_query_energy(&energy);
    long.append(&k.narrow(1, 0, 75)?, &v.narrow(1, 0, 75)?)?;
    long.append(&k.narrow(1, 75, 15)?, &v.narrow(1, 75, 15)?)?;
    let (a, b) = (chat.to_dense()?, long.to_dense()?);
    assert_eq!(max_abs(&(&a.0 - &b.0)?)?, 0.0);
    assert_eq!(max_abs(&(&a.1 - &b.1)?)?, 0.0);
    assert!(sq_error(&chat, &k)? > 0.0, "the keys are coded now");
    assert!(!chat.wants_query_energy() && !chat.calibrating());
    held(&chat, t)?;
    // Codes, offsets of both sides and the keys' weights: far below f16's bytes.
    let coded = KvPrecision::Split(p).token_bytes(n_kv, d)? * t + 3 * n_kv * d * 4;
    assert_eq!(chat.bytes_used(), coded);
    // Saved and restored while waiting, a cache calibrates as it would have.
    let mut waits = SplitStorage::new(p, waiting(n_kv, d, rows))?;
    waits.set_query_energy(&energy);
    waits.append(&k.narrow(1, 0, 45)?, &v.narrow(1, 0, 45)?)?;
    let mut w = crate::kv::wire::WireWriter::new();
    waits.write_state(&mut w)?;
    let bytes = w.into_bytes();
    let mut back = SplitStorage::new(p, waiting(n_kv, d, rows))?;
    back.set_query_energy(&energy);
    back.read_state(&mut crate::kv::wire::WireReader::new(&bytes))?;
    assert_eq!(back.bytes_used(), waits.bytes_used());
    back.append(&k.narrow(1, 45, 30)?, &v.narrow(1, 45, 30)?)?;
    back.append(&k.narrow(1, 75, 15)?, &v.narrow(1, 75, 15)?)?;
    assert_eq!(max_abs(&(&back.to_dense()?.0 - &a.0)?)?, 0.0);
    // A reset waits again; a row the codes could not hold is refused while waiting too,
    // and the rows before it stay.
    chat.truncate(0)?;
    chat.append(&k.narrow(1, 0, 5)?, &v.narrow(1, 0, 5)?)?;
    held(&chat, 5)?;
    let huge = (v.narrow(1, 0, 1)? * 1e6)?;
    let e = chat.append(&k.narrow(1, 0, 1)?, &huge);
    assert!(matches!(e, Err(EngineError::Codec(_))), "{e:?}");
    assert_eq!(chat.len(), 5);
    Ok(())
}

#[test]
fn a_switch_calibrates_on_the_rows_it_was_given() -> Result<()> {
    let (n_kv, d) = (2usize, 64usize);
    let k = offset_rows(5, n_kv, 40, d)?
        .to_dtype(DType::F16)?
        .to_dtype(DType::F32)?;
    let p = tq(codes(Bits::B3), codes(Bits::B4));
    let mut s = SplitStorage::new(p, waiting(n_kv, d, CALIBRATION_ROWS))?;
    // Fewer rows than calibrating takes: they keep waiting.
    s.append(&k.narrow(1, 0, 10)?, &k.narrow(1, 0, 10)?)?;
    s.calibrate_now()?;
    assert!(s.calibrating());
    s.append(&k.narrow(1, 10, 30)?, &k.narrow(1, 10, 30)?)?;
    s.calibrate_now()?;
    assert!(!s.calibrating());
    // The codes of a storage that calibrated on those 40 rows appended at once, at the bytes
    // a switch's plan gives.
    let mut once = SplitStorage::new(p, shape(n_kv, d))?;
    once.append(&k, &k)?;
    let (a, b) = (s.to_dense()?, once.to_dense()?);
    assert_eq!(max_abs(&(&a.0 - &b.0)?)?, 0.0);
    assert_eq!(max_abs(&(&a.1 - &b.1)?)?, 0.0);
    let planned = KvPrecision::Split(p).bytes_after(n_kv, d, 40, 40, MIN_CALIBRATION_ROWS)?;
    assert_eq!(s.bytes_used() as u64, planned);
    Ok(())
}

/// `n × d` rows of `data(seed)` with channel `j` scaled by `gain(j)`.
fn shaped_rows(seed: u64, n: usize, d: usize, gain: impl Fn(usize) -> f32) -> Vec<f32> {
    let mut rows = data(seed, n * d);
    for r in rows.chunks_exact_mut(d) {
        r.iter_mut().enumerate().for_each(|(j, x)| *x *= gain(j));
    }
    rows
}

#[test]
fn query_weighted_keys_cut_the_score_error_where_queries_look() -> Result<()> {
    let (t, d) = (400usize, 64usize);
    // Queries read channels 0..16; keys vary most on the other 48 (Gemma's pattern, sharper).
    let keys = shaped_rows(11, t, d, |j| if j < 16 { 0.3 } else { 2.0 });
    let queries = shaped_rows(12, 32, d, |j| if j < 16 { 1.0 } else { 0.05 });
    let mut energy = vec![0f64; d];
    for r in queries.chunks_exact(d) {
        energy
            .iter_mut()
            .zip(r)
            .for_each(|(e, &x)| *e += (x as f64) * (x as f64));
    }
    let k = Tensor::from_vec(keys.clone(), (1, t, d), &Device::Cpu)?;
    let q = Tensor::from_vec(queries.clone(), (1, 32, d), &Device::Cpu)?;
    let plain = tq(codes(Bits::B3), codes(Bits::B3));
    let weighted = LayerPrecision {
        weigh_keys: true,
        ..plain
    };
    // Σ over queries and tokens of (q·k̂ − q·k)², and the storage for the exactness check.
    let score_error = |p: LayerPrecision| -> Result<(f64, SplitStorage)> {
        let mut s = SplitStorage::new(p, shape(1, d))?;
        assert_eq!(s.wants_query_energy(), p.weigh_keys);
        s.set_query_energy(&energy);
        s.append(&k, &k)?;
        assert!(!s.wants_query_energy());
        let (kd, _) = s.to_dense()?;
        let kd: Vec<f32> = kd.flatten_all()?.to_vec1()?;
        let mut err = 0f64;
        for qr in queries.chunks_exact(d) {
            for (a, b) in kd.chunks_exact(d).zip(keys.chunks_exact(d)) {
                let e: f32 = qr
                    .iter()
                    .zip(a.iter().zip(b))
                    .map(|(q, (x, y))| q * (x - y))
                    .sum();
                err += (e as f64) * (e as f64);
            }
        }
        Ok((err, s))
    };
    let (e_plain, _) = score_error(plain)?;
    let (e_weighted, s) = score_error(weighted)?;
    // Cauchy–Schwarz predicts ~30× on these shapes; ask for 5×.
    assert!(
        e_weighted < 0.2 * e_plain,
        "weighted {e_weighted} vs plain {e_plain}"
    );
    // The weighted scores are still exactly dense attention over the decoded keys, and the
    // weights cost one f32 row per head beside the offset.
    let spec = AttendSpec {
        query_start: t - 32,
        key_start: 0,
        window: None,
        scale: 0.125,
        both_ways: None,
    };
    let q_heads = Tensor::cat(&[&q, &q], 0)?;
    let got = s.attend(&q_heads, &spec)?;
    let (kd, vd) = s.to_dense()?;
    let want = attend_dense(&q_heads, &kd, &vd, &spec)?;
    let err = max_abs(&(&got - &want)?)?;
    assert!(
        err <= 2e-5 * max_abs(&want)?.max(1.0),
        "attention error {err}"
    );
    let plain_bytes = SplitStorage::new(plain, shape(1, d))
        .and_then(|mut p| p.append(&k, &k).map(|_| p.bytes_used()))?;
    assert_eq!(s.bytes_used(), plain_bytes + d * 4);
    // A reset forgets the weights: the next first append measures again.
    let mut s = s;
    s.truncate(0)?;
    assert!(s.wants_query_energy());
    Ok(())
}

#[test]
fn without_queries_weighted_keys_code_as_plain_ones() -> Result<()> {
    let k = offset_rows(7, 2, 100, 64)?;
    let plain = tq(codes(Bits::B3), codes(Bits::B3));
    let weighted = LayerPrecision {
        weigh_keys: true,
        ..plain
    };
    // No query energy (a switch before any query was seen): weights of one, the same codes.
    assert!((relative_error(weighted, &k)? - relative_error(plain, &k)?).abs() < 1e-7);
    Ok(())
}

/// Sylvester's Hadamard matrix of order `n`, normalized, written out entry by entry
/// (`(-1)^popcount(i & j) / √n`): the reference the storage's fast rotation is held to.
fn explicit_hadamard(n: usize) -> Vec<f32> {
    let s = 1.0 / (n as f32).sqrt();
    (0..n * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            if (i & j).count_ones() % 2 == 0 {
                s
            } else {
                -s
            }
        })
        .collect()
}

/// `x` (a row of `d`) times the block-diagonal Hadamard of blocks `w`.
fn rotate_explicitly(x: &[f32], w: usize) -> Vec<f32> {
    let h = explicit_hadamard(w);
    x.chunks_exact(w)
        .flat_map(|b| {
            (0..w)
                .map(|i| (0..w).map(|j| h[i * w + j] * b[j]).sum::<f32>())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn block(t: BlockType) -> SideSpec {
    SideSpec::Blocks(t)
}

#[test]
fn block_sides_hold_ggml_bytes_of_upstreams_rotation() -> Result<()> {
    // Head size 128: keys rotate in one 128-wide block, values in 64-wide ones.
    let (n_kv, t, d) = (2, 5, 128);
    let (k, v) = (tensor(1, n_kv, t, d)?, tensor(2, n_kv, t, d)?);
    for (kt, vt, rotate) in [
        (BlockType::Q8_0, BlockType::Q4_0, true),
        (BlockType::Q5_1, BlockType::Iq4Nl, true),
        (BlockType::Q4_1, BlockType::Q5_0, false),
    ] {
        let p = LayerPrecision {
            rotate,
            sink: false,
            ..tq(block(kt), block(vt))
        };
        let mut s = SplitStorage::new(p, shape(n_kv, d))?;
        s.append(&k, &v)?;
        let (dk, dv) = s.to_dense()?;
        for (side, ty, width, src, held) in
            [("keys", kt, 128, &k, &dk), ("values", vt, 64, &v, &dv)]
        {
            let src = src.flatten_all()?.to_vec1::<f32>()?;
            let held = held.flatten_all()?.to_vec1::<f32>()?;
            for (r, (x, got)) in src.chunks_exact(d).zip(held.chunks_exact(d)).enumerate() {
                // H⁻¹ · dequantize(quantize(H · x)), H explicit (symmetric, orthonormal).
                let rotated = if rotate {
                    rotate_explicitly(x, width)
                } else {
                    x.to_vec()
                };
                let mut bytes = vec![0u8; ty.row_bytes(d)?];
                ty.quantize_row(&rotated, &mut bytes)?;
                let mut back = vec![0f32; d];
                ty.dequantize_row(&bytes, &mut back)?;
                let want = if rotate {
                    rotate_explicitly(&back, width)
                } else {
                    back
                };
                let err = want
                    .iter()
                    .zip(got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                // The fast transform and the matrix product round differently; a code that
                // flips shows as a whole quantization step, far above this.
                assert!(err < 1e-4, "{p} {side} row {r}: {err}");
            }
        }
    }
    Ok(())
}

#[test]
fn block_keys_score_as_ggml_with_the_query_in_the_dot_type() -> Result<()> {
    let (n_kv, t, d) = (1, 40, 256);
    for (i, kt) in BlockType::ALL.into_iter().enumerate() {
        // Values in each dense format in turn: they play no part in the scores.
        let values = [SideSpec::F16, SideSpec::BF16, SideSpec::F32][i % 3];
        let p = tq(block(kt), values);
        let mut s = SplitStorage::new(p, shape(n_kv, d))?;
        let k = tensor(3, n_kv, t, d)?;
        s.append(&k, &tensor(4, n_kv, t, d)?)?;
        // Two query rows take ggml's integer dots, twenty (prefill) a matrix product of
        // the same floats: both must give ggml's products.
        for g in [2, BLOCK_GEMM_MIN_ROWS + 4] {
            let q = data(5, g * d);
            let mut out = vec![0f32; g * t];
            let mut scratch = s.key.scratch();
            // `scores` takes the queries rotated, as `attend_codes` hands them over.
            let rotated: Vec<f32> = q
                .chunks_exact(d)
                .flat_map(|r| rotate_explicitly(r, 256))
                .collect();
            let prepared = s.key.prepare_queries(&rotated)?;
            s.key.scores(
                0,
                0,
                &rotated,
                prepared.as_ref(),
                0..t,
                &mut scratch,
                &mut out,
            )?;
            let keys = k.flatten_all()?.to_vec1::<f32>()?;
            for (qi, qrow) in q.chunks_exact(d).enumerate() {
                // The query rotated by the keys' 256-wide Hadamard, quantized to q8_0 (q8_1
                // for q4_1/q5_1), dotted block by block by ggml's reference dot.
                let mut qq = vec![0u8; kt.query_bytes(d)?];
                kt.quantize_query(&rotate_explicitly(qrow, 256), &mut qq)?;
                for (j, key) in keys.chunks_exact(d).enumerate() {
                    let mut kb = vec![0u8; kt.row_bytes(d)?];
                    kt.quantize_row(&rotate_explicitly(key, 256), &mut kb)?;
                    let want = kt.dot(&kb, &qq)?;
                    let got = out[qi * t + j];
                    assert!(
                        (want - got).abs() <= 1e-3 * want.abs().max(1.0),
                        "{} query {qi} key {j}: {got} vs {want}",
                        kt.name()
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn block_sides_attend_like_dense_attention_over_what_they_hold() -> Result<()> {
    let chunks = [40, 1, 600, 1];
    // Values are exact to what they hold (converted and summed in floats, rotated back).
    for p in [
        tq(SideSpec::F16, block(BlockType::Q4_0)),
        tq(SideSpec::F16, block(BlockType::Q8_0)),
        tq(SideSpec::F32, block(BlockType::Q4_0)),
        tq(SideSpec::BF16, block(BlockType::Q8_0)),
        LayerPrecision {
            rotate: false,
            sink: false,
            ..tq(SideSpec::F16, block(BlockType::Q5_1))
        },
    ] {
        check_against_dense(p, 4, 2, 64, None, &chunks)?;
        check_against_dense(p, 4, 2, 64, Some(30), &chunks)?;
    }
    Ok(())
}

#[test]
fn block_sides_save_and_restore_byte_for_byte() -> Result<()> {
    use crate::kv::wire::{WireReader, WireWriter};
    let (n_kv, d) = (2, 64);
    for text in [
        "q8_0",
        "q8_0/q4_0",
        "f16/iq4_nl+norot",
        "q5_1/tq3",
        "f32/q4_0",
        "q8_0/bf16",
        "bf16/f32",
        "q4_0+sink",
        "q8_0/q4_0+sink",
        "tq3+sink",
        "k4v3+qw+sink@all",
        "tq4+prod+sink",
    ] {
        let CacheSpec::Split { precision, .. } = CacheSpec::parse(text)? else {
            panic!("{text} is dense");
        };
        let mut s = SplitStorage::new(precision, shape(n_kv, d))?;
        s.append(&tensor(1, n_kv, 600, d)?, &tensor(2, n_kv, 600, d)?)?;
        s.drop_front(30)?;
        let mut w = WireWriter::new();
        s.write_state(&mut w)?;
        let bytes = w.into_bytes();
        let mut back = SplitStorage::new(precision, shape(n_kv, d))?;
        let mut r = WireReader::new(&bytes);
        back.read_state(&mut r)?;
        r.finish()?;
        assert_eq!(back.len(), s.len(), "{text}");
        assert_eq!(back.bytes_used(), s.bytes_used(), "{text}");
        let (a, b) = (s.to_dense()?, back.to_dense()?);
        assert_eq!(max_abs(&(&a.0 - &b.0)?)?, 0.0, "{text}");
        assert_eq!(max_abs(&(&a.1 - &b.1)?)?, 0.0, "{text}");
        // A file of another format is refused, not misread.
        let CacheSpec::Split {
            precision: other, ..
        } = CacheSpec::parse("q4_1")?
        else {
            panic!("q4_1 is dense");
        };
        let mut wrong = SplitStorage::new(other, shape(n_kv, d))?;
        if text != "q4_1" && precision.key != other.key {
            assert!(
                wrong.read_state(&mut WireReader::new(&bytes)).is_err(),
                "{text}"
            );
        }
    }
    Ok(())
}

#[test]
fn block_types_refuse_heads_that_are_not_whole_blocks() {
    let CacheSpec::Split { precision, .. } = CacheSpec::parse("q8_0").expect("spec") else {
        panic!("q8_0 is dense");
    };
    let e = SplitStorage::new(precision, shape(1, 16))
        .expect_err("16 is not a multiple of 32")
        .to_string();
    assert!(e.contains("multiple of 32"), "{e}");
}

/// Queries in the model's domain as ggml's flash attention dots them with block keys: scaled,
/// rotated as the keys are, quantized to the keys' dot type and back, rotated back (the
/// Hadamard matrix is its own inverse) and unscaled (a power of two: exact).
fn as_ggml_scores(q: &Tensor, ty: BlockType, width: Option<usize>, scale: f32) -> Result<Tensor> {
    let (h, t, d) = q.dims3()?;
    let mut rows = q.flatten_all()?.to_vec1::<f32>()?;
    let mut bytes = vec![0u8; ty.query_bytes(d)?];
    for r in rows.chunks_exact_mut(d) {
        r.iter_mut().for_each(|x| *x *= scale);
        if let Some(w) = width {
            kvlab_turboquant::ggml::hadamard_rotate(r, w)?;
        }
        ty.quantize_query(r, &mut bytes)?;
        ty.dequantize_query(&bytes, r)?;
        if let Some(w) = width {
            kvlab_turboquant::ggml::hadamard_rotate(r, w)?;
        }
        r.iter_mut().for_each(|x| *x /= scale);
    }
    Ok(Tensor::from_vec(rows, (h, t, d), &Device::Cpu)?)
}

#[test]
fn block_caches_attend_exactly_as_ggml_scores_and_sums_what_they_hold() -> Result<()> {
    // Dense attention over the held keys and values, with the query as ggml's flash
    // attention has it (rotated, in q8_0): equal up to the order of f32 sums, in prefill
    // (300, 40 and 400 rows, the last across a segment's end) and decode (1 row), whole and in a sliding window, each side alone
    // and both together (f16 keys are dotted with the query as it is). (q4_1 and q5_1 keys
    // dot with a q8_1 query whose sum is rounded to f16: not a query of floats.)
    for text in [
        "q8_0",
        "q4_0",
        "q4_0+norot",
        "q8_0/q4_0",
        "q4_0/q8_0",
        "q4_0/f16",
        "f16/q4_0",
        "iq4_nl",
        "q5_0/q4_0",
        "q4_0+sink",
        "q8_0/q4_0+sink",
        "q4_0/f16+sink",
        "f16/q4_0+sink",
    ] {
        let CacheSpec::Split { precision, .. } = CacheSpec::parse(text)? else {
            panic!("{text} is dense");
        };
        let d = 256;
        let width = precision
            .rotate
            .then(|| kvlab_turboquant::ggml::key_rotation_width(d))
            .flatten();
        let key = precision.key;
        let scored = |q: &Tensor, scale: f32| match key {
            SideSpec::Blocks(ty) => as_ggml_scores(q, ty, width, scale),
            _ => Ok(q.clone()),
        };
        for window in [None, Some(100)] {
            check_against_dense_scored(
                precision,
                4,
                1,
                d,
                window,
                // Past a segment (512 tokens) too: prefill then reads several.
                &[300, 1, 40, 1, 400, 1],
                &scored,
            )?;
        }
    }
    Ok(())
}

#[test]
fn a_sink_keeps_the_first_token_in_f16_until_the_layer_empties() -> Result<()> {
    for (plain, sunk) in [
        ("q4_0", "q4_0+sink"),
        ("tq3", "tq3+sink"),
        ("k4v3+qw@all", "k4v3+qw+sink@all"),
        ("tq4+prod", "tq4+prod+sink"),
    ] {
        a_sink_keeps_its_first_token(plain, sunk)?;
    }
    Ok(())
}

/// `sunk` is `plain` with `+sink`: its first token as exact as an f16 rounding, every other
/// token the plain cache's byte for byte, read by attention, saved and restored, kept past a
/// dropped segment and replaced once the layer empties.
fn a_sink_keeps_its_first_token(plain: &str, sunk: &str) -> Result<()> {
    use crate::kv::wire::{WireReader, WireWriter};
    use candle_core::DType;
    let (n_kv, d) = (2, 64);
    let parse = |text: &str| -> Result<LayerPrecision> {
        match CacheSpec::parse(text)? {
            CacheSpec::Split { precision, .. } => Ok(precision),
            _ => panic!("{text} is dense"),
        }
    };
    let (plain, sunk) = (parse(plain)?, parse(sunk)?);
    // The first token an outlier (an attention sink's row is), the rest as usual.
    let outlier = |seed: u64, t: usize| -> Result<Tensor> {
        let x = tensor(seed, n_kv, t, d)?;
        let gain = Tensor::from_vec(
            (0..t).map(|i| if i == 0 { 40f32 } else { 1.0 }).collect(),
            (1, t, 1),
            &Device::Cpu,
        )?;
        Ok(x.broadcast_mul(&gain)?)
    };
    let (k, v) = (outlier(3, 700)?, outlier(4, 700)?);
    let mut a = SplitStorage::new(plain, shape(n_kv, d))?;
    let mut b = SplitStorage::new(sunk, shape(n_kv, d))?;
    for s in [&mut a, &mut b] {
        s.append(&k.narrow(1, 0, 5)?, &v.narrow(1, 0, 5)?)?;
        s.append(&k.narrow(1, 5, 695)?, &v.narrow(1, 5, 695)?)?;
    }
    assert_eq!(b.bytes_used(), a.bytes_used() + 2 * n_kv * d * 2);
    let ((ka, va), (kb, vb)) = (a.to_dense()?, b.to_dense()?);
    for (held, alone, given) in [(&kb, &ka, &k), (&vb, &va, &v)] {
        // Token 0 is as exact as an f16 rounding (for blocks made in the rotated domain,
        // so not the same one); every other token is the plain cache's, byte for byte.
        let first = given.narrow(1, 0, 1)?;
        let f16_err = max_abs(&(&first.to_dtype(DType::F16)?.to_dtype(DType::F32)? - &first)?)?;
        let err = max_abs(&(&held.narrow(1, 0, 1)? - &first)?)?;
        let blocks_err = max_abs(&(&alone.narrow(1, 0, 1)? - &first)?)?;
        assert!(err <= f16_err * 2.0, "{sunk}: sink {err} vs f16 {f16_err}");
        assert!(
            blocks_err > 20.0 * err,
            "{plain} {blocks_err} vs sink {err}"
        );
        let rest = |x: &Tensor| x.narrow(1, 1, 699);
        assert_eq!(max_abs(&(&rest(held)? - &rest(alone)?)?)?, 0.0, "{sunk}");
    }
    // Attention reads it: a query aimed at token 0 gets its value nearly exactly, and more
    // exactly than from its blocks.
    let q = k.narrow(1, 0, 1)?.repeat((2, 1, 1))?;
    let spec = AttendSpec {
        query_start: 700,
        key_start: 0,
        window: None,
        scale: 1.0,
        both_ways: None,
    };
    let want = attend_dense(&q, &k, &v, &spec)?;
    let err = |s: &SplitStorage| -> Result<f32> { max_abs(&(&s.attend(&q, &spec)? - &want)?) };
    assert!(
        err(&b)? * 4.0 < err(&a)?,
        "{sunk}: sink {} vs {plain} {}",
        err(&b)?,
        err(&a)?
    );
    // Saved and restored with it; a sliding window that drops the first segment stops
    // reading it but keeps its bytes; an emptied layer takes the next first token.
    let mut w = WireWriter::new();
    b.write_state(&mut w)?;
    let bytes = w.into_bytes();
    let mut back = SplitStorage::new(sunk, shape(n_kv, d))?;
    back.read_state(&mut WireReader::new(&bytes))?;
    assert_eq!(max_abs(&(&back.to_dense()?.0 - &kb)?)?, 0.0);
    let before = b.bytes_used();
    b.drop_front(600)?;
    a.drop_front(600)?;
    assert_eq!(b.bytes_used(), a.bytes_used() + 2 * n_kv * d * 2);
    assert_eq!(max_abs(&(&b.to_dense()?.0 - &a.to_dense()?.0)?)?, 0.0);
    assert!(b.bytes_used() < before);
    let mut w = WireWriter::new();
    b.write_state(&mut w)?;
    let bytes = w.into_bytes();
    let mut back = SplitStorage::new(sunk, shape(n_kv, d))?;
    back.read_state(&mut WireReader::new(&bytes))?;
    assert_eq!(max_abs(&(&back.to_dense()?.0 - &a.to_dense()?.0)?)?, 0.0);
    b.truncate(0)?;
    let (k2, v2) = (outlier(7, 3)?, outlier(8, 3)?);
    b.append(&k2, &v2)?;
    let first = k2.narrow(1, 0, 1)?;
    let err = max_abs(&(&b.to_dense()?.0.narrow(1, 0, 1)? - &first)?)?;
    assert!(err < 0.05, "{sunk}: the new first token: {err}");
    Ok(())
}
