//! Lloyd–Max scalar codebooks for one coordinate of a uniformly random unit vector in R^d,
//! computed (never tabulated) and cached per (d, b).
//!
//! The codec uses the **exact** coordinate law f(t) ∝ (1 − t²)^((d−3)/2) on [−1, 1]. Its
//! N(0, 1/d) limit gives a codebook whose distortion under the exact law is higher by at most
//! 0.43% at d = 64, 0.11% at d = 128, 0.02% at d = 256 and 0.01% at d = 512 (worst over
//! b = 1..4; test `gaussian_limit_is_negligible`), so either would do; the exact law costs
//! nothing extra because the codebook is computed once per (d, b).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Density family used to fit a codebook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Law {
    /// Exact marginal of a coordinate of a uniform unit vector in R^d.
    Sphere,
    /// Its high-dimensional limit N(0, 1/d).
    Gaussian,
}

/// A symmetric scalar codebook with `2^bits` levels, in the unit-vector coordinate scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    dim: usize,
    bits: u8,
    /// All levels, ascending; `centroids[i] = −centroids[len − 1 − i]`.
    centroids: Vec<f32>,
    /// Decision thresholds (midpoints), ascending, `len − 1` of them.
    thresholds: Vec<f32>,
    /// D_mse = E‖u − û‖² for a uniform unit vector u under the fitting law.
    mse: f64,
}

impl Codebook {
    /// Vector dimension the codebook was fitted for.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Bits per coordinate (levels = 2^bits).
    pub fn bits(&self) -> u8 {
        self.bits
    }
    /// All levels, ascending.
    pub fn centroids(&self) -> &[f32] {
        &self.centroids
    }
    /// Decision thresholds, ascending (midpoints of adjacent centroids).
    pub fn thresholds(&self) -> &[f32] {
        &self.thresholds
    }
    /// Expected squared error E‖u − û‖² of a uniform unit vector (the D_mse of the paper).
    pub fn mse(&self) -> f64 {
        self.mse
    }

    /// Index of the level nearest to `t` (ties go up). Up to 4 bits, counting thresholds
    /// below `t` is branch-free and vectorizes over a slice; wider codebooks binary-search
    /// their up to 255 thresholds. NaN maps to level 0.
    #[inline]
    pub fn quantize(&self, t: f32) -> u8 {
        if self.thresholds.len() > 15 {
            return self.thresholds.partition_point(|&th| t >= th) as u8;
        }
        let mut idx = 0u8;
        for &th in &self.thresholds {
            idx += u8::from(t >= th);
        }
        idx
    }
}

/// Process-wide codebook cache keyed by (dim, bits).
type Cache = Mutex<HashMap<(usize, u8), Arc<Codebook>>>;

/// The cached exact-law codebook for `(dim, bits)`; `dim ≥ 3`, `1 ≤ bits ≤ 8` (callers
/// validate; out-of-range values are clamped into range rather than panicking).
pub fn codebook(dim: usize, bits: u8) -> Arc<Codebook> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (dim.max(3), bits.clamp(1, 8));
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked mid-insert of a pure value; the map
    // is still consistent, so keep using it.
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(key)
        .or_insert_with(|| Arc::new(lloyd_max(key.0, key.1, Law::Sphere)))
        .clone()
}

/// Cumulative integrals of the (half) density on a fine grid, so that any cell integral of
/// t^0, t^1, t^2 costs O(1).
struct Moments {
    law: Law,
    dim: f64,
    top: f64,
    h: f64,
    norm: f64,
    c: [Vec<f64>; 3],
}

const GRID: usize = 1 << 14;

impl Moments {
    fn new(dim: usize, law: Law) -> Self {
        let d = dim as f64;
        // Beyond 16 standard deviations the mass is < 1e-50: treat the support as ending there.
        let top = (16.0 / d.sqrt()).min(1.0);
        let h = top / GRID as f64;
        let mut m = Moments {
            law,
            dim: d,
            top,
            h,
            norm: 1.0,
            c: [
                vec![0.0; GRID + 1],
                vec![0.0; GRID + 1],
                vec![0.0; GRID + 1],
            ],
        };
        for i in 0..GRID {
            let a = i as f64 * h;
            let s = m.simpson(a, a + h);
            for (k, c) in m.c.iter_mut().enumerate() {
                c[i + 1] = c[i] + s[k];
            }
        }
        m.norm = m.c[0][GRID];
        m
    }

    fn density(&self, t: f64) -> f64 {
        match self.law {
            Law::Sphere => {
                let k = (self.dim - 3.0) / 2.0;
                let v = 1.0 - t * t;
                if k == 0.0 {
                    1.0
                } else if v <= 0.0 {
                    0.0
                } else {
                    (k * v.ln()).exp()
                }
            }
            Law::Gaussian => (-0.5 * self.dim * t * t).exp(),
        }
    }

    /// Simpson's rule for ∫ t^k f(t) dt, k = 0, 1, 2, over [a, b] (unnormalized).
    fn simpson(&self, a: f64, b: f64) -> [f64; 3] {
        let m = 0.5 * (a + b);
        let (fa, fm, fb) = (self.density(a), self.density(m), self.density(b));
        let w = (b - a) / 6.0;
        [
            w * (fa + 4.0 * fm + fb),
            w * (a * fa + 4.0 * m * fm + b * fb),
            w * (a * a * fa + 4.0 * m * m * fm + b * b * fb),
        ]
    }

    /// Normalized ∫_0^x t^k f(t) dt for k = 0, 1, 2 (the positive half has mass 1).
    fn upto(&self, x: f64) -> [f64; 3] {
        let x = x.clamp(0.0, self.top);
        let i = ((x / self.h) as usize).min(GRID - 1);
        let a = i as f64 * self.h;
        let s = self.simpson(a, x);
        [
            (self.c[0][i] + s[0]) / self.norm,
            (self.c[1][i] + s[1]) / self.norm,
            (self.c[2][i] + s[2]) / self.norm,
        ]
    }

    /// The cells of the positive-half levels `c`: `edges` set to 0, the midpoints and `top`,
    /// and each cell's (mass, first moment, second moment) in `cells`.
    fn cells(&self, c: &[f64], edges: &mut [f64], cells: &mut [[f64; 3]]) {
        let half = c.len();
        edges[0] = 0.0;
        for i in 1..half {
            edges[i] = 0.5 * (c[i - 1] + c[i]);
        }
        edges[half] = self.top;
        let mut lo = self.upto(0.0);
        for (i, cell) in cells.iter_mut().enumerate() {
            let hi = self.upto(edges[i + 1]);
            *cell = [hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]];
            lo = hi;
        }
    }
}

/// `half` positive levels at the midpoint quantiles of f^⅓ on [0, top] (the optimal point
/// density of many-level quantizers), from a midpoint sum on the moments' grid.
fn companded_start(mom: &Moments, half: usize) -> Vec<f64> {
    let h = mom.top / GRID as f64;
    let mut cum = Vec::with_capacity(GRID + 1);
    cum.push(0.0);
    for i in 0..GRID {
        let t = (i as f64 + 0.5) * h;
        cum.push(cum[i] + mom.density(t).cbrt());
    }
    let total = cum[GRID];
    (0..half)
        .map(|i| {
            let target = total * (i as f64 + 0.5) / half as f64;
            let k = cum.partition_point(|&v| v < target).clamp(1, GRID);
            // Linear inside the grid cell that crosses the target.
            let (lo, hi) = (cum[k - 1], cum[k]);
            let frac = if hi > lo {
                (target - lo) / (hi - lo)
            } else {
                0.5
            };
            (k as f64 - 1.0 + frac) * h
        })
        .collect()
}

/// Fits a Lloyd–Max codebook with `2^bits` levels for `law` in dimension `dim` (uncached).
pub fn lloyd_max(dim: usize, bits: u8, law: Law) -> Codebook {
    let dim = dim.max(3);
    let bits = bits.clamp(1, 8);
    let mom = Moments::new(dim, law);
    let half = 1usize << (bits - 1);
    let sigma = 1.0 / (dim as f64).sqrt();
    // Positive-half centroids, started where high-resolution theory puts them (the quantiles
    // of the density's cube root, Panter–Dite), taken to the fixed point by Newton's method,
    // then checked (and, should Newton have stopped early, finished) by Lloyd's iteration,
    // which from there has nothing or little left to do.
    let mut c = companded_start(&mom, half);
    newton(&mom, &mut c, 1e-11 * sigma);
    let mut edges = vec![0.0; half + 1];
    let mut cells = vec![[0.0f64; 3]; half];
    for _ in 0..200_000 {
        mom.cells(&c, &mut edges, &mut cells);
        let mut moved = 0.0f64;
        for (ci, m) in c.iter_mut().zip(&cells) {
            if m[0] > 0.0 {
                let nc = m[1] / m[0];
                moved = moved.max((nc - *ci).abs());
                *ci = nc;
            }
        }
        // 1e-11 σ: the fixed point to well below f32's resolution of the levels (the
        // reference tables agree to 2e-6, the conditional means to 1e-6 relative).
        if moved < 1e-11 * sigma {
            break;
        }
    }
    // Per-coordinate E[(t − q(t))²] over the positive half (mass 1); the sphere has d of them.
    let per_coord: f64 = cells
        .iter()
        .zip(&c)
        .map(|(m, &ci)| m[2] - 2.0 * ci * m[1] + ci * ci * m[0])
        .sum();
    let mut centroids: Vec<f32> = c.iter().rev().map(|&v| -v as f32).collect();
    centroids.extend(c.iter().map(|&v| v as f32));
    let thresholds = centroids.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    Codebook {
        dim,
        bits,
        centroids,
        thresholds,
        mse: per_coord * dim as f64,
    }
}

/// Moves the positive-half levels `c` (increasing, inside (0, top)) to Lloyd–Max's fixed point
/// T(c) = c by Newton's method, stopping once no level would move by `tol`; leaves `c` at the
/// last good iterate if a step would break the order (Lloyd's iteration then finishes).
///
/// T_i, the mean of cell i, depends on c_{i−1}, c_i and c_{i+1} only (through the cell's edges,
/// the midpoints), so the Jacobian of T(c) − c is tridiagonal and a step costs O(levels).
/// Lloyd's own iteration converges linearly at a rate near 1 with many levels: about 75,000
/// iterations for 128 (8 bits), 0.6 s of a codec's construction, where Newton takes a handful.
fn newton(mom: &Moments, c: &mut [f64], tol: f64) {
    let half = c.len();
    let mut edges = vec![0.0; half + 1];
    let mut cells = vec![[0.0f64; 3]; half];
    let (mut lower, mut diag, mut upper, mut rhs) = (
        vec![0.0; half],
        vec![0.0; half],
        vec![0.0; half],
        vec![0.0; half],
    );
    for _ in 0..100 {
        mom.cells(c, &mut edges, &mut cells);
        let mut worst = 0.0f64;
        for i in 0..half {
            let mass = cells[i][0];
            if mass <= 0.0 || !mass.is_finite() {
                return;
            }
            let t = cells[i][1] / mass;
            // ∂T_i/∂e = ±p(e)(e − T_i)/mass at each edge; each interior edge moves by half
            // of each neighbouring level's step.
            lower[i] = if i > 0 {
                0.5 * mom.density(edges[i]) / mom.norm * (t - edges[i]) / mass
            } else {
                0.0
            };
            upper[i] = if i + 1 < half {
                0.5 * mom.density(edges[i + 1]) / mom.norm * (edges[i + 1] - t) / mass
            } else {
                0.0
            };
            diag[i] = lower[i] + upper[i] - 1.0;
            rhs[i] = c[i] - t; // −F_i
            worst = worst.max((t - c[i]).abs());
        }
        if worst < tol {
            return;
        }
        // Thomas' algorithm on (lower, diag, upper)·δ = rhs, in place.
        for i in 1..half {
            let m = lower[i] / diag[i - 1];
            diag[i] -= m * upper[i - 1];
            rhs[i] -= m * rhs[i - 1];
        }
        let mut step = vec![0.0; half];
        for i in (0..half).rev() {
            let above = if i + 1 < half {
                upper[i] * step[i + 1]
            } else {
                0.0
            };
            step[i] = (rhs[i] - above) / diag[i];
        }
        let next: Vec<f64> = c.iter().zip(&step).map(|(a, d)| a + d).collect();
        let ordered = next.iter().all(|v| v.is_finite())
            && next[0] > 0.0
            && next[half - 1] < mom.top
            && next.windows(2).all(|w| w[0] < w[1]);
        if !ordered {
            return;
        }
        c.copy_from_slice(&next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of turboquant.md §2: (d, b, positive centroids, positive thresholds).
    #[allow(clippy::type_complexity)]
    const TABLE: &[(usize, u8, &[f64], &[f64])] = &[
        (128, 2, &[0.039992, 0.133042], &[0.086517]),
        (
            128,
            3,
            &[0.021604, 0.066586, 0.118140, 0.188397],
            &[0.044095, 0.092363, 0.153268],
        ),
        (
            128,
            4,
            &[
                0.011302, 0.034152, 0.057772, 0.082828, 0.110288, 0.141805, 0.180836, 0.237664,
            ],
            &[
                0.022727, 0.045962, 0.070300, 0.096558, 0.126047, 0.161321, 0.209250,
            ],
        ),
        (256, 2, &[0.028289, 0.094238], &[0.061263]),
        (
            256,
            3,
            &[0.015297, 0.047167, 0.083765, 0.133854],
            &[0.031232, 0.065466, 0.108810],
        ),
        (
            256,
            4,
            &[
                0.008008, 0.024201, 0.040949, 0.058732, 0.078249, 0.100698, 0.128588, 0.169410,
            ],
            &[
                0.016105, 0.032575, 0.049841, 0.068491, 0.089474, 0.114643, 0.148999,
            ],
        ),
        (512, 2, &[0.020007, 0.066694], &[0.043350]),
        (
            512,
            3,
            &[0.010824, 0.033381, 0.059312, 0.094876],
            &[0.022103, 0.046347, 0.077094],
        ),
        (
            512,
            4,
            &[
                0.005669, 0.017131, 0.028990, 0.041588, 0.055424, 0.071356, 0.091181, 0.120276,
            ],
            &[
                0.011400, 0.023061, 0.035289, 0.048506, 0.063390, 0.081269, 0.105729,
            ],
        ),
    ];

    /// Exact D_mse anchors of turboquant.md §3, b = 1..4.
    const ANCHORS: &[(usize, [f64; 4])] = &[
        (128, [0.36089, 0.11600, 0.033966, 0.009315]),
        (256, [0.36214, 0.11674, 0.034256, 0.009408]),
        (512, [0.36276, 0.11711, 0.034402, 0.009454]),
    ];

    #[test]
    fn matches_the_reference_table() {
        for &(d, b, cents, ths) in TABLE {
            let cb = codebook(d, b);
            let half = cents.len();
            assert_eq!(cb.centroids().len(), 2 * half);
            for (i, &want) in cents.iter().enumerate() {
                let got = cb.centroids()[half + i] as f64;
                assert!(
                    (got - want).abs() < 2e-6,
                    "d={d} b={b} c{i}: {got} vs {want}"
                );
                assert_eq!(cb.centroids()[half - 1 - i], -cb.centroids()[half + i]);
            }
            for (i, &want) in ths.iter().enumerate() {
                let got = cb.thresholds()[half + i] as f64;
                assert!(
                    (got - want).abs() < 2e-6,
                    "d={d} b={b} t{i}: {got} vs {want}"
                );
            }
            assert_eq!(cb.thresholds()[half - 1], 0.0);
        }
    }

    #[test]
    fn distortion_matches_exact_anchors() {
        for &(d, mses) in ANCHORS {
            for b in 1..=4u8 {
                let got = codebook(d, b).mse();
                let want = mses[b as usize - 1];
                // The anchors are printed to 5 significant digits.
                assert!(
                    (got - want).abs() / want < 2e-4,
                    "d={d} b={b}: {got} vs {want}"
                );
            }
        }
        let gauss = [0.36338, 0.11748, 0.034548, 0.009501];
        for b in 1..=4u8 {
            let got = lloyd_max(1 << 20, b, Law::Gaussian).mse();
            let want = gauss[b as usize - 1];
            assert!(
                (got - want).abs() / want < 2e-4,
                "gaussian b={b}: {got} vs {want}"
            );
        }
    }

    /// Distortion of codebook `cb` when the data follow the exact sphere law of dimension `d`.
    fn mse_under_sphere(cb: &Codebook, d: usize) -> f64 {
        let mom = Moments::new(d, Law::Sphere);
        let half = cb.centroids().len() / 2;
        let c = &cb.centroids()[half..];
        let mut lo = mom.upto(0.0);
        let mut total = 0.0;
        for (i, &ci) in c.iter().enumerate() {
            let edge = if i + 1 < half {
                cb.thresholds()[half + i] as f64
            } else {
                1.0
            };
            let hi = mom.upto(edge);
            let ci = ci as f64;
            total += (hi[2] - lo[2]) - 2.0 * ci * (hi[1] - lo[1]) + ci * ci * (hi[0] - lo[0]);
            lo = hi;
        }
        total * d as f64
    }

    #[test]
    fn gaussian_limit_is_negligible() {
        for (d, tol) in [(64usize, 5e-3), (128, 1.5e-3), (256, 4e-4), (512, 2e-4)] {
            for b in 1..=4u8 {
                let exact = mse_under_sphere(&codebook(d, b), d);
                let gauss = mse_under_sphere(&lloyd_max(d, b, Law::Gaussian), d);
                println!(
                    "d={d} b={b}: exact-law codebook {exact:.6}, N(0,1/d) codebook {gauss:.6}"
                );
                assert!(
                    gauss >= exact * (1.0 - 1e-9),
                    "Lloyd–Max is optimal for its own law"
                );
                assert!(
                    (gauss - exact) / exact < tol,
                    "d={d} b={b}: {gauss} vs {exact}"
                );
            }
        }
    }

    #[test]
    // Platform-independent arithmetic (scalar codebook code): checked natively, not again
    // under qemu.
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "arithmetic checked on the native run"
    )]
    fn levels_are_fixed_points_of_quantize() {
        for d in [3usize, 17, 128, 4096] {
            // Wide codebooks (up to 256 levels) at two dimensions: each costs a fit.
            let top = if d == 3 || d == 128 { 8 } else { 4 };
            for b in 1..=top {
                let cb = codebook(d, b);
                for (i, &c) in cb.centroids().iter().enumerate() {
                    assert_eq!(cb.quantize(c) as usize, i, "d={d} b={b}");
                }
                assert_eq!(
                    cb.quantize(f32::INFINITY) as usize,
                    cb.centroids().len() - 1
                );
                assert_eq!(cb.quantize(f32::NEG_INFINITY), 0);
            }
        }
    }

    /// Moments of the exact coordinate law on [0, x], in closed form from `statrs`'s
    /// regularized incomplete beta (nothing shared with `Moments`' quadrature): with
    /// s = t², ∫₀ˣ tᵏ f(t) dt reduces to incomplete beta integrals, normalized so that the
    /// positive half has mass 1. Returns (mass, first moment, second moment).
    fn exact_moments(d: usize, x: f64) -> [f64; 3] {
        use statrs::function::beta::{beta_reg, ln_beta};
        let (a, s) = ((d as f64 - 1.0) / 2.0, (x * x).min(1.0));
        let half_mass = 0.5 * ln_beta(0.5, a).exp();
        [
            beta_reg(0.5, a, s),
            (1.0 - (1.0 - s).powf(a)) / (d as f64 - 1.0) / half_mass,
            beta_reg(1.5, a, s) / d as f64,
        ]
    }

    /// The 5–8-bit codebooks (no published table reaches them) checked against the exact
    /// law itself: every level is the conditional mean of its cell (Lloyd's condition),
    /// every threshold the midpoint of its levels (Max's), and the distortion equals the
    /// exact integral, all from independent special functions.
    #[test]
    // Platform-independent f64 arithmetic (no SIMD): checked natively, not again under qemu.
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "arithmetic checked on the native run"
    )]
    fn wide_codebooks_are_exact_lloyd_max_fixed_points() {
        for d in [128usize, 256, 512] {
            for b in 5..=8u8 {
                let cb = codebook(d, b);
                let half = cb.centroids().len() / 2;
                assert_eq!(cb.centroids().len(), 1 << b);
                let c = &cb.centroids()[half..];
                let mut lo = exact_moments(d, 0.0);
                let mut total = 0.0;
                for (i, &ci) in c.iter().enumerate() {
                    let edge = if i + 1 < half {
                        cb.thresholds()[half + i] as f64
                    } else {
                        1.0
                    };
                    if i + 1 < half {
                        let mid = 0.5 * (ci as f64 + c[i + 1] as f64);
                        assert!((edge - mid).abs() < 1e-7, "d={d} b={b} t{i}");
                    }
                    let hi = exact_moments(d, edge);
                    let m = [hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]];
                    let mean = m[1] / m[0];
                    // f32 levels: relative 1e-6 of the cell's scale.
                    assert!(
                        (ci as f64 - mean).abs() < 1e-6 * mean.abs().max(1e-3 / (d as f64).sqrt()),
                        "d={d} b={b} c{i}: {ci} vs conditional mean {mean}"
                    );
                    let ci = ci as f64;
                    total += m[2] - 2.0 * ci * m[1] + ci * ci * m[0];
                    lo = hi;
                }
                let exact = total * d as f64;
                assert!(
                    (cb.mse() - exact).abs() / exact < 1e-4,
                    "d={d} b={b}: mse {} vs exact {exact}",
                    cb.mse()
                );
            }
        }
    }

    /// High-resolution theory (Panter–Dite): 4ᵇ·D_mse of the Gaussian Lloyd–Max quantizer
    /// rises towards √3·π/2 ≈ 2.7207 as b grows; at 8 bits it is within 1.5% of it.
    #[test]
    // Platform-independent f64 arithmetic (no SIMD): checked natively, not again under qemu.
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "arithmetic checked on the native run"
    )]
    fn wide_codebooks_approach_the_panter_dite_limit() {
        let limit = 3f64.sqrt() * std::f64::consts::PI / 2.0;
        let mut last = 0.0;
        for b in 1..=8u8 {
            let scaled = lloyd_max(1 << 20, b, Law::Gaussian).mse() * 4f64.powi(b as i32);
            println!("b={b}: 4^b·D = {scaled:.5}");
            assert!(scaled > last && scaled < limit, "b={b}: {scaled}");
            last = scaled;
        }
        assert!((limit - last) / limit < 0.015, "{last}");
    }

    #[test]
    // Platform-independent arithmetic (scalar codebook code): checked natively, not again
    // under qemu.
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "arithmetic checked on the native run"
    )]
    fn wide_codebooks_quantize_to_the_nearest_level() {
        let cb = codebook(256, 8);
        let levels = cb.centroids();
        for k in 0..2000 {
            let t = (k as f32 - 1000.0) * 3e-4;
            let q = cb.quantize(t) as usize;
            let best = (0..levels.len())
                .min_by(|&a, &b| (levels[a] - t).abs().total_cmp(&(levels[b] - t).abs()))
                .unwrap();
            assert!(
                (levels[q] - t).abs() <= (levels[best] - t).abs() + 1e-7,
                "t={t}: level {q} vs nearest {best}"
            );
        }
        assert_eq!(cb.quantize(f32::INFINITY), 255);
        assert_eq!(cb.quantize(f32::NEG_INFINITY), 0);
        assert_eq!(cb.quantize(f32::NAN), 0);
    }

    #[test]
    // Platform-independent arithmetic (scalar codebook code): checked natively, not again
    // under qemu.
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "arithmetic checked on the native run"
    )]
    fn within_the_paper_bounds() {
        for b in 1..=8u8 {
            let m = codebook(256, b).mse();
            let lower = 4f64.powi(-(b as i32));
            assert!(m >= lower && m <= 3f64.sqrt() * std::f64::consts::PI / 2.0 * lower);
        }
    }
}
