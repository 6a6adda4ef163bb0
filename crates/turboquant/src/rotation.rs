//! Seeded orthogonal rotations of R^d with exact inverses: a randomized Walsh–Hadamard
//! transform (O(d log d)) and a dense Haar rotation (O(d²), the reference).

use std::sync::Arc;

use crate::prng::Rng;
use crate::shared;

/// Stream id of the rotation's random numbers (keeps them independent of other seeded parts).
const STREAM: u64 = 0x524F_5441_5445; // "ROTATE"

/// A fixed orthogonal matrix Π. `forward` computes Π·x, `inverse` computes Πᵀ·y.
#[derive(Clone, Debug)]
pub(crate) enum Rotation {
    Hadamard(Hadamard),
    Haar(Haar),
}

impl Rotation {
    #[inline(always)]
    pub(crate) fn forward(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Rotation::Hadamard(h) => h.forward(x, out),
            Rotation::Haar(h) => h.forward(x, out),
        }
    }

    pub(crate) fn inverse(&self, y: &[f32], out: &mut [f32]) {
        match self {
            Rotation::Hadamard(h) => h.inverse(y, out),
            Rotation::Haar(h) => h.inverse(y, out),
        }
    }
}

/// y = H·D·x: random ±1 signs D first (so structured inputs are spread), then the
/// normalized Walsh–Hadamard transform H. For d not a power of two, H is block-diagonal with
/// power-of-two blocks (largest first, following the binary expansion of d): no padding.
#[derive(Clone, Debug)]
pub(crate) struct Hadamard {
    signs: Vec<f32>,
    /// (offset, size) of each power-of-two block.
    blocks: Vec<(usize, usize)>,
}

impl Hadamard {
    pub(crate) fn new(dim: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed, STREAM);
        let signs = (0..dim).map(|_| rng.sign()).collect();
        Hadamard {
            signs,
            blocks: blocks(dim),
        }
    }

    /// The same transform without the sign flips: only for demonstrating why they matter.
    #[cfg(test)]
    pub(crate) fn without_signs(dim: usize) -> Self {
        Hadamard {
            signs: vec![1.0; dim],
            blocks: blocks(dim),
        }
    }

    #[inline(always)]
    fn forward(&self, x: &[f32], out: &mut [f32]) {
        for ((o, &v), &s) in out.iter_mut().zip(x).zip(&self.signs) {
            *o = v * s;
        }
        for &(off, n) in &self.blocks {
            fwht(&mut out[off..off + n]);
        }
    }

    fn inverse(&self, y: &[f32], out: &mut [f32]) {
        out.copy_from_slice(y);
        for &(off, n) in &self.blocks {
            fwht(&mut out[off..off + n]);
        }
        for (o, &s) in out.iter_mut().zip(&self.signs) {
            *o *= s;
        }
    }
}

/// Power-of-two blocks covering `dim`, largest first.
fn blocks(dim: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = 0;
    for bit in (0..usize::BITS).rev() {
        let n = 1usize << bit;
        if dim & n != 0 {
            out.push((off, n));
            off += n;
        }
    }
    out
}

/// In-place normalized Walsh–Hadamard transform of a power-of-two slice (its own inverse).
#[inline(always)]
fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for chunk in x.chunks_exact_mut(2 * h) {
            let (a, b) = chunk.split_at_mut(h);
            for (p, q) in a.iter_mut().zip(b.iter_mut()) {
                let (u, v) = (*p, *q);
                *p = u + v;
                *q = u - v;
            }
        }
        h *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    for v in x.iter_mut() {
        *v *= scale;
    }
}

/// A Haar-distributed rotation: Q from the QR factorization of a seeded Gaussian matrix with
/// R's diagonal made positive (Gram–Schmidt yields exactly that sign convention).
#[derive(Clone, Debug)]
pub(crate) struct Haar {
    dim: usize,
    /// Row-major Π (row i gives output coordinate i), shared by the codecs of one
    /// (dim, seed).
    q: Arc<[f32]>,
}

impl Haar {
    pub(crate) fn new(dim: usize, seed: u64) -> Self {
        let q = shared::matrix(shared::Kind::Haar, dim, seed, || Self::build(dim, seed));
        Haar { dim, q }
    }

    /// Row-major Π for (`dim`, `seed`): O(d³).
    fn build(dim: usize, seed: u64) -> Vec<f32> {
        // Distinct from the Hadamard signs' stream.
        let mut rng = Rng::new(seed, STREAM ^ 0x4841_4152);
        // Rows of a Gaussian matrix, orthonormalized in f64 with modified Gram–Schmidt
        // applied twice ("twice is enough" for orthogonality to machine precision).
        let mut rows: Vec<Vec<f64>> = (0..dim)
            .map(|_| (0..dim).map(|_| rng.gaussian()).collect())
            .collect();
        for i in 0..dim {
            let (done, rest) = rows.split_at_mut(i);
            let r = &mut rest[0];
            for _ in 0..2 {
                for p in done.iter() {
                    let dot: f64 = p.iter().zip(r.iter()).map(|(a, b)| a * b).sum();
                    for (x, y) in r.iter_mut().zip(p) {
                        *x -= dot * y;
                    }
                }
            }
            let norm = r.iter().map(|v| v * v).sum::<f64>().sqrt();
            for v in r.iter_mut() {
                *v /= norm;
            }
        }
        rows.iter()
            .flat_map(|r| r.iter().map(|&v| v as f32))
            .collect()
    }

    fn forward(&self, x: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.q.chunks_exact(self.dim)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    fn inverse(&self, y: &[f32], out: &mut [f32]) {
        out.fill(0.0);
        for (&yi, row) in y.iter().zip(self.q.chunks_exact(self.dim)) {
            for (o, &r) in out.iter_mut().zip(row) {
                *o += yi * r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(rot: &Rotation, dim: usize) {
        let mut rng = Rng::new(3, 3);
        let x: Vec<f32> = (0..dim).map(|_| rng.gaussian() as f32).collect();
        let mut y = vec![0.0; dim];
        let mut back = vec![0.0; dim];
        rot.forward(&x, &mut y);
        rot.inverse(&y, &mut back);
        let nx: f32 = x.iter().map(|v| v * v).sum();
        let ny: f32 = y.iter().map(|v| v * v).sum();
        assert!((nx - ny).abs() < 1e-4 * nx, "norm preserved");
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn rotations_are_orthogonal_with_exact_inverse() {
        for dim in [1usize, 3, 96, 100, 128, 256] {
            roundtrip(&Rotation::Hadamard(Hadamard::new(dim, 9)), dim);
            roundtrip(&Rotation::Haar(Haar::new(dim, 9)), dim);
        }
    }

    #[test]
    fn blocks_follow_binary_expansion() {
        assert_eq!(blocks(256), vec![(0, 256)]);
        assert_eq!(blocks(100), vec![(0, 64), (64, 32), (96, 4)]);
    }

    #[test]
    fn hadamard_matches_definition() {
        // H2 ⊗ H2 / 2 applied to e0 after signs s: column 0 of H scaled by s0.
        let h = Hadamard::new(4, 5);
        let mut out = vec![0.0; 4];
        h.forward(&[1.0, 0.0, 0.0, 0.0], &mut out);
        for v in out {
            assert!((v - 0.5 * h.signs[0]).abs() < 1e-7);
        }
    }

    #[test]
    fn seeded_and_deterministic() {
        let a = Haar::new(16, 42);
        let b = Haar::new(16, 42);
        let c = Haar::new(16, 43);
        assert_eq!(a.q, b.q);
        assert_ne!(a.q, c.q);
        assert_eq!(Hadamard::new(64, 1).signs, Hadamard::new(64, 1).signs);
        assert_ne!(Hadamard::new(64, 1).signs, Hadamard::new(64, 2).signs);
    }
}
