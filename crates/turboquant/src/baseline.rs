//! Dense f16 reference for speed comparisons: scores of one query against f16 keys,
//! converting f16→f32 on the fly, as an uncompressed f16 cache does.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// `out[t] = Σ_j q_j · keys[t·d + j]` for `keys` stored row-major as f16 (`d = q.len()`).
/// Rows are converted 8 at a time with F16C where available and dotted with 8 independent
/// accumulators (compiled for AVX2+FMA when the CPU has them).
pub fn f16_scores(q: &[f32], keys: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::features::avx2() {
        // SAFETY: the required CPU features were detected just above.
        unsafe { f16_scores_avx2(q, keys, out) };
        return;
    }
    f16_scores_generic(q, keys, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn f16_scores_avx2(q: &[f32], keys: &[f16], out: &mut [f32]) {
    f16_scores_generic(q, keys, out)
}

#[inline(always)]
fn f16_scores_generic(q: &[f32], keys: &[f16], out: &mut [f32]) {
    let d = q.len();
    if d == 0 {
        return;
    }
    // One key row of f32 at a time: stays in L1.
    let mut row = vec![0.0f32; d];
    for (o, k) in out.iter_mut().zip(keys.chunks_exact(d)) {
        k.convert_to_f32_slice(&mut row);
        let mut acc = [0.0f32; 8];
        let mut qc = q.chunks_exact(8);
        let mut rc = row.chunks_exact(8);
        for (a, b) in (&mut qc).zip(&mut rc) {
            for i in 0..8 {
                acc[i] += a[i] * b[i];
            }
        }
        let tail: f32 = qc
            .remainder()
            .iter()
            .zip(rc.remainder())
            .map(|(a, b)| a * b)
            .sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f32_dot() {
        let d = 19;
        let q: Vec<f32> = (0..d).map(|i| i as f32 * 0.25 - 1.0).collect();
        let keys: Vec<f16> = (0..3 * d)
            .map(|i| f16::from_f32((i % 7) as f32 - 3.0))
            .collect();
        let mut out = vec![0.0; 3];
        f16_scores(&q, &keys, &mut out);
        for t in 0..3 {
            let want: f32 = (0..d).map(|j| q[j] * keys[t * d + j].to_f32()).sum();
            assert!((out[t] - want).abs() < 1e-4, "{} vs {want}", out[t]);
        }
    }
}
