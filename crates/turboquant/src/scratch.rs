//! Caller-owned working memory for encode/decode and the kernels, so steady-state calls do
//! not allocate. Buffers only grow, to the largest (dim × queries) seen.

/// Reusable buffers; create with [`crate::Codec::scratch`], one per thread.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) idx: Vec<u8>,
    /// Rotated queries, g × d.
    pub(crate) q: Vec<f32>,
    /// S·q' per query (prod), g × d.
    pub(crate) sq: Vec<f32>,
    /// Σ_j (S·q')_j per query (prod).
    pub(crate) sqsum: Vec<f32>,
    /// Rotated-domain accumulators, g × d.
    pub(crate) acc: Vec<f32>,
    /// QJL-sign accumulators (prod), g × d.
    pub(crate) acc_s: Vec<f32>,
    /// The backend of the last kernel or encode call made with this scratch.
    pub(crate) last_backend: Option<crate::Backend>,
}

impl Scratch {
    /// Which backend ran the last `scores*`, `accumulate*` or `encode`/`encode_record` call
    /// made with this scratch (`None` before the first), so callers and tests can tell which
    /// instruction set produced a result.
    pub fn last_backend(&self) -> Option<crate::Backend> {
        self.last_backend
    }

    pub(crate) fn new(dim: usize) -> Self {
        let mut s = Scratch::default();
        s.ensure(dim, 1);
        s
    }

    pub(crate) fn ensure(&mut self, dim: usize, queries: usize) {
        fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
            if v.len() < n {
                v.resize(n, T::default());
            }
        }
        grow(&mut self.a, dim);
        grow(&mut self.b, dim);
        grow(&mut self.idx, dim);
        let gd = dim * queries;
        grow(&mut self.q, gd);
        grow(&mut self.sq, gd);
        grow(&mut self.acc, gd);
        grow(&mut self.acc_s, gd);
        grow(&mut self.sqsum, queries);
    }
}
