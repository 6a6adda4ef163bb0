//! The split softmax of flash decoding, shared by every attention over a cache: each part of
//! the keys (a key block, a stored segment) reports per query row its largest score, the sum
//! of its numerators e^(score − that max) and the values weighted by them; [`merge`] rescales
//! the parts to each row's overall maximum and divides by the total, exactly.

/// One part's share of every query row (`out` is rows × dim, unnormalized).
pub(crate) struct Partial {
    pub(crate) max: Vec<f32>,
    pub(crate) sum: Vec<f32>,
    pub(crate) out: Vec<f32>,
}

impl Partial {
    /// A part that weighs nothing yet: `rows` rows of width `d`.
    pub(crate) fn empty(rows: usize, d: usize) -> Self {
        Self {
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            out: vec![0.0; rows * d],
        }
    }

    /// Folds `other` (a part of the same rows over other keys) into this one: per row both
    /// rescaled to the larger maximum and added, as [`merge`] adds many at once.
    pub(crate) fn absorb(&mut self, other: &Partial, d: usize) {
        for r in 0..self.max.len() {
            if other.sum[r] == 0.0 {
                continue;
            }
            let m = self.max[r].max(other.max[r]);
            let (ws, wo) = (weight(self.max[r] - m), weight(other.max[r] - m));
            self.sum[r] = self.sum[r] * ws + other.sum[r] * wo;
            let mine = &mut self.out[r * d..(r + 1) * d];
            for (x, y) in mine.iter_mut().zip(&other.out[r * d..(r + 1) * d]) {
                *x = *x * ws + y * wo;
            }
            self.max[r] = m;
        }
    }

    /// Each row's output divided by its total (zero where nothing weighed it).
    pub(crate) fn normalized(mut self, d: usize) -> Vec<f32> {
        for (o, &total) in self.out.chunks_exact_mut(d).zip(&self.sum) {
            let inv = if total > 0.0 { 1.0 / total } else { 0.0 };
            o.iter_mut().for_each(|x| *x *= inv);
        }
        self.out
    }
}

/// e^shift for a shift ≤ 0, zero below e^-87 (as `vmath::exp_shifted_sum` drops), never a
/// subnormal factor (whose products take microcode assists).
fn weight(shift: f32) -> f32 {
    if shift < -87.0 {
        0.0
    } else {
        shift.exp()
    }
}

/// Adds the parts into `out` (rows × `d`, zeroed by the caller). A part that weighs nothing
/// for a row (no visible key, or a maximum under e^-87 of the row's, as
/// `vmath::exp_shifted_sum` drops) is skipped; a row no part weighs stays zero.
pub(crate) fn merge(parts: &[Partial], d: usize, out: &mut [f32]) {
    for (r, o) in out.chunks_exact_mut(d).enumerate() {
        let m = parts
            .iter()
            .map(|p| p.max[r])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0f32;
        for p in parts {
            let shift = p.max[r] - m;
            if p.sum[r] == 0.0 || shift < -87.0 {
                continue;
            }
            let w = shift.exp();
            total += w * p.sum[r];
            for (x, y) in o.iter_mut().zip(&p.out[r * d..(r + 1) * d]) {
                *x += w * y;
            }
        }
        if total > 0.0 {
            let inv = 1.0 / total;
            o.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two parts merged equal one softmax over all their scores.
    #[test]
    fn merged_parts_equal_one_softmax() {
        let (scores, values) = (
            [1.0f32, 3.0, -2.0, 0.5],
            [[1.0f32, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 4.0]],
        );
        let part = |ks: std::ops::Range<usize>| {
            let max = ks
                .clone()
                .map(|k| scores[k])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut out = vec![0f32; 2];
            let mut sum = 0f32;
            for k in ks {
                let e = (scores[k] - max).exp();
                sum += e;
                out.iter_mut().zip(values[k]).for_each(|(o, v)| *o += e * v);
            }
            Partial {
                max: vec![max],
                sum: vec![sum],
                out,
            }
        };
        let mut got = vec![0f32; 2];
        merge(&[part(0..2), part(2..4)], 2, &mut got);
        let total: f32 = scores.iter().map(|s| s.exp()).sum();
        for j in 0..2 {
            let want: f32 = (0..4).map(|k| scores[k].exp() * values[k][j]).sum::<f32>() / total;
            assert!((got[j] - want).abs() < 1e-6, "{j}: {} vs {want}", got[j]);
        }
        // A part with nothing visible changes nothing; a row nothing weighs stays zero.
        let empty = Partial {
            max: vec![f32::NEG_INFINITY],
            sum: vec![0.0],
            out: vec![0.0; 2],
        };
        let mut again = vec![0f32; 2];
        merge(&[part(0..2), empty, part(2..4)], 2, &mut again);
        assert_eq!(again, got);
        let empty = Partial {
            max: vec![f32::NEG_INFINITY],
            sum: vec![0.0],
            out: vec![0.0; 2],
        };
        let mut none = vec![0f32; 2];
        merge(&[empty], 2, &mut none);
        assert_eq!(none, [0.0, 0.0]);
        // Absorbed one by one into an empty part, the same as merged at once.
        let mut folded = Partial::empty(1, 2);
        folded.absorb(&part(2..4), 2);
        folded.absorb(&Partial::empty(1, 2), 2);
        folded.absorb(&part(0..2), 2);
        for (a, b) in folded.normalized(2).iter().zip(&got) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert_eq!(Partial::empty(1, 2).normalized(2), [0.0, 0.0]);
    }
}
