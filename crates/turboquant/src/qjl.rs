//! The seeded Gaussian sketch S (d×d) of the `prod` variant: residual signs sign(S·r) and the
//! query-side projection S·q used by the unbiased inner-product estimator.

use std::sync::Arc;

use crate::prng::Rng;
use crate::shared;

const STREAM: u64 = 0x0051_4A4C; // "QJL"

#[derive(Clone, Debug)]
pub(crate) struct Qjl {
    dim: usize,
    /// Row-major S with i.i.d. N(0, 1) entries.
    s: Arc<[f32]>,
}

impl Qjl {
    pub(crate) fn new(dim: usize, seed: u64) -> Self {
        let s = shared::matrix(shared::Kind::Qjl, dim, seed, || {
            let mut rng = Rng::new(seed, STREAM);
            (0..dim * dim).map(|_| rng.gaussian() as f32).collect()
        });
        Qjl { dim, s }
    }

    /// √(π/2)/d: scale of ⟨S·y, sign(S·r)⟩ in the estimator.
    pub(crate) fn scale(&self) -> f32 {
        (std::f64::consts::FRAC_PI_2.sqrt() / self.dim as f64) as f32
    }

    /// out = S·v
    pub(crate) fn project(&self, v: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.s.chunks_exact(self.dim)) {
            *o = row.iter().zip(v).map(|(a, b)| a * b).sum();
        }
    }

    /// out += Sᵀ·v
    pub(crate) fn project_t_add(&self, v: &[f32], out: &mut [f32]) {
        for (&vi, row) in v.iter().zip(self.s.chunks_exact(self.dim)) {
            if vi != 0.0 {
                for (o, &r) in out.iter_mut().zip(row) {
                    *o += vi * r;
                }
            }
        }
    }
}
