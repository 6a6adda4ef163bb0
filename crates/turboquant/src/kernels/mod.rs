//! Compressed-domain kernels: attention scores ⟨q, x̂_t⟩ and weighted sums Σ_t w_t x̂_t over a
//! `CodeBlock`, computed from the codes without materializing any decoded vector.
//!
//! Each query is rotated once (q' = Π q); a key's score is n_t · Σ_j q'_j · c[idx_tj] (plus
//! the QJL term for `prod`); value sums are accumulated in the rotated domain and rotated back
//! once. Backends, one module per instruction set, chosen per call by run-time CPU detection:
//! AVX-512 (`x86.rs`), AVX2+FMA (`avx2.rs`), NEON on aarch64 (`neon.rs`), portable scalar
//! (`portable.rs`). Every call records in the caller's `Scratch` which [`Backend`] ran.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_avx512;
#[cfg(all(
    target_arch = "aarch64",
    target_feature = "neon",
    target_endian = "little"
))]
pub(crate) mod blocks_neon;
#[cfg(all(
    target_arch = "aarch64",
    target_feature = "neon",
    target_endian = "little"
))]
pub(crate) mod neon;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{pack_pext, quantize_avx512};

use crate::block::CodeBlock;
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::scratch::Scratch;

/// Per-segment data the kernels need.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub start: usize,
    pub len: usize,
    pub width: u8,
    pub bit_offset: usize,
    /// Codebook levels, zero-padded to 256 entries (8-bit codes). The x86 backends' narrow
    /// kernels read the first 16 (one AVX-512 register); the wide ones and NEON read them
    /// all (see `Ctx::wide`).
    pub table: [f32; 256],
    /// Decision thresholds, padded with +∞ to 16 entries.
    pub thresholds: [f32; 16],
    /// Leading 128-coordinate blocks (16·w bytes) the SIMD backend reads lane-wise (segment
    /// start byte-aligned): lane i takes the w bytes holding coordinates 8i..8i+7, so within
    /// a block the SIMD order is position 16·s + i ↔ coordinate 8i + s (see `Ctx::perm`).
    /// Only the x86 backends read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub lane_blocks: usize,
}

/// Everything about the record layout a kernel reads. Built once per codec.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub dim: usize,
    pub stride: usize,
    pub segs: Vec<Seg>,
    pub norm_offset: usize,
    /// (sign bit offset, γ offset, √(π/2)/d) for prod.
    pub qjl: Option<(usize, usize, f32)>,
    /// Whether a segment is wider than 4 bits: its codebook does not fit the x86 backends'
    /// 16-entry registers. Its scores and sums (without QJL) run their wide kernels
    /// (`scores_wide`, AVX2's `accumulate_wide`), in coordinate order. NEON
    /// scores and sums every width (four-register table lookups); encoders of wide codecs
    /// are portable everywhere.
    pub wide: bool,
    /// SIMD order → coordinate: position p of a rotated query / accumulator in the SIMD
    /// backend holds coordinate `perm[p]` (identity outside byte-lane blocks).
    pub perm: Vec<u32>,
    /// The AVX2 kernels' order (scores and sums), which differs from `perm` where codes become
    /// floats by `pshufb` lookups, one per byte of the centroid's f32, interleaved by
    /// unpacks:
    /// - in the lane blocks of a narrow codec's 4-bit segments, each 32 code bytes (64
    ///   coordinates) make 8 vectors, and position `32·hf + 8·g + 4·L + e` of the 64 holds
    ///   the coordinate of nibble `hf` of byte `16·L + 4·g + e` (`avx2::plane_centroids`);
    /// - in a wide codec's byte-aligned 5-bit segments, each whole 32 codes (20 bytes) make 4
    ///   vectors, and position `8·g + 4·L + e` of the 32 holds code `16·L + 4·g + e`
    ///   (`avx2::centroids32`).
    pub perm_planes: Vec<u32>,
}

impl Ctx {
    pub(crate) fn new(
        codec_layout: &crate::layout::Layout,
        books: &[std::sync::Arc<crate::codebook::Codebook>],
        qjl_scale: Option<f32>,
    ) -> Ctx {
        let dim = codec_layout.dim;
        let wide = codec_layout.segments.iter().any(|s| s.width > 4);
        let mut perm: Vec<u32> = (0..dim as u32).collect();
        // Starts of the 128-coordinate lane blocks of 4-bit segments.
        let mut planes = Vec::new();
        let segs: Vec<Seg> = codec_layout
            .segments
            .iter()
            .zip(books)
            .map(|(s, b)| {
                let mut table = [0.0f32; 256];
                for (t, &c) in table.iter_mut().zip(b.centroids()) {
                    *t = c;
                }
                let mut thresholds = [f32::INFINITY; 16];
                for (t, &c) in thresholds.iter_mut().zip(b.thresholds()) {
                    *t = c;
                }
                // Wide codecs have no lane blocks: read in coordinate order but for AVX2's
                // 5-bit blocks (`perm_planes`).
                let lane_blocks = if s.bit_offset % 8 == 0 && !wide {
                    let blocks = s.len / 128;
                    for blk in 0..blocks {
                        let base = s.start + blk * 128;
                        for sub in 0..8 {
                            for lane in 0..16 {
                                perm[base + sub * 16 + lane] = (base + lane * 8 + sub) as u32;
                            }
                        }
                        if s.width == 4 {
                            planes.push(base);
                        }
                    }
                    blocks
                } else {
                    0
                };
                Seg {
                    start: s.start,
                    len: s.len,
                    width: s.width,
                    bit_offset: s.bit_offset,
                    table,
                    thresholds,
                    lane_blocks,
                }
            })
            .collect();
        let qjl = match (
            qjl_scale,
            codec_layout.sign_bit_offset,
            codec_layout.gamma_offset,
        ) {
            (Some(q), Some(sb), Some(go)) => Some((sb, go, q)),
            _ => None,
        };
        let mut perm_planes = perm.clone();
        for s in &codec_layout.segments {
            if !(wide && s.width == 5 && s.bit_offset % 8 == 0) {
                continue;
            }
            for blk in 0..s.len / 32 {
                let base = s.start + 32 * blk;
                for k in 0..32 {
                    let (g, l, e) = (k / 8, (k / 4) % 2, k % 4);
                    perm_planes[base + k] = (base + 16 * l + 4 * g + e) as u32;
                }
            }
        }
        for base in planes {
            for chunk in 0..2 {
                for k in 0..64 {
                    let (hf, g, l, e) = (k / 32, (k / 8) % 4, (k / 4) % 2, k % 4);
                    let byte = 32 * chunk + 16 * l + 4 * g + e;
                    perm_planes[base + 64 * chunk + k] = (base + 2 * byte + hf) as u32;
                }
            }
        }
        Ctx {
            dim,
            stride: codec_layout.stride,
            wide,
            segs,
            norm_offset: codec_layout.norm_offset,
            qjl,
            perm,
            perm_planes,
        }
    }
}

/// Tiles `(first, size)` of consecutive queries covering `0..g`, each the largest power of two
/// up to `widest` that fits: a SIMD backend unpacks each record's codes once per tile.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn query_tiles(g: usize, widest: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut qi = 0;
    std::iter::from_fn(move || {
        let left = g - qi;
        if left == 0 {
            return None;
        }
        let tile = (1..=widest)
            .rev()
            .find(|t| t.is_power_of_two() && *t <= left)?;
        qi += tile;
        Some((qi - tile, tile))
    })
}

/// A kernel implementation: which instruction set computed a result. All variants exist on
/// every platform so callers can match on them; only those of the running CPU ever occur.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Scalar Rust: any CPU, and the cross-check for the others.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX-512F (and BMI2 for encoding).
    Avx512,
    /// aarch64 NEON (Apple Silicon, ARM servers).
    Neon,
}

impl Backend {
    /// The backend the scoring and accumulation kernels use now: the best one this CPU has,
    /// capped by the test hooks (`force_portable_kernels`, `force_avx2_kernels`).
    pub fn detect() -> Backend {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::features::avx512() {
                return Backend::Avx512;
            }
            if crate::features::avx2() {
                return Backend::Avx2;
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        {
            if crate::features::neon() {
                return Backend::Neon;
            }
        }
        Backend::Portable
    }

    /// Lowercase name: `portable`, `avx2`, `avx512`, `neon`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Portable => "portable",
            Backend::Avx2 => "avx2",
            Backend::Avx512 => "avx512",
            Backend::Neon => "neon",
        }
    }
}

/// Queries made ready once for scoring against many blocks ([`Codec::prepare_scores`]):
/// rotated, projected for `prod`, in the order the scoring kernels of this CPU read them.
#[derive(Clone, Debug)]
pub struct PreparedQueries {
    dim: usize,
    g: usize,
    backend: Backend,
    /// `g × dim`, rotated, in `backend`'s order.
    q: Vec<f32>,
    /// S·q' per query (prod; zeros otherwise), `g × dim` in coordinate order.
    sq: Vec<f32>,
    /// Σ_j (S·q')_j per query (prod).
    sqsum: Vec<f32>,
    /// AVX2's 4-bit lane blocks in fixed point (`avx2::FixedQueries`), where the codec has
    /// them.
    #[cfg(target_arch = "x86_64")]
    fixed: Option<avx2::FixedQueries>,
}

impl PreparedQueries {
    /// How many queries.
    pub fn len(&self) -> usize {
        self.g
    }

    /// Whether there are none (never: `prepare_scores` refuses an empty set).
    pub fn is_empty(&self) -> bool {
        self.g == 0
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Codec {
    /// The backend this codec's kernels run on: the CPU's best, or on x86 the portable code
    /// for wide (5–8-bit) codebooks (NEON reads every width by table lookups).
    pub(crate) fn backend(&self) -> Backend {
        match Backend::detect() {
            Backend::Avx512 | Backend::Avx2 if self.ctx.wide => Backend::Portable,
            b => b,
        }
    }

    /// The backend this codec's weighted sums run on: as [`Codec::backend`], except that a
    /// wide codebook without QJL is summed by the AVX2 wide kernel on any x86 CPU that has
    /// AVX2 (AVX-512 ones included: their codebooks outgrow its registers too).
    pub(crate) fn sums_backend(&self) -> Backend {
        #[cfg(target_arch = "x86_64")]
        if self.ctx.wide
            && self.ctx.qjl.is_none()
            && matches!(Backend::detect(), Backend::Avx512 | Backend::Avx2)
            && crate::features::avx2()
        {
            return Backend::Avx2;
        }
        self.backend()
    }

    /// The backend this codec's scores run on: as [`Codec::backend`], except that a wide
    /// codebook without QJL is scored by the x86 backends' wide kernels.
    pub(crate) fn scores_backend(&self) -> Backend {
        match Backend::detect() {
            b @ (Backend::Avx512 | Backend::Avx2) if self.ctx.wide && self.ctx.qjl.is_none() => b,
            _ => self.backend(),
        }
    }

    fn query_count(&self, len: usize) -> Result<usize> {
        if len == 0 || !len.is_multiple_of(self.dim) {
            return Err(Error::DimensionMismatch {
                expected: len.div_ceil(self.dim).max(1) * self.dim,
                got: len,
            });
        }
        Ok(len / self.dim)
    }

    /// Scores of one query against every vector of `block`: `out[t] = ⟨q, x̂_t⟩`.
    /// `out.len()` must equal `block.len()`.
    pub fn scores(
        &self,
        q: &[f32],
        block: &CodeBlock,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_len(self.dim, q.len())?;
        self.scores_multi(q, block, scratch, out)
    }

    /// Scores of `g` queries (row-major `g × dim`, e.g. the query heads sharing one KV head)
    /// against every vector of `block`, reading the codes once: `out[i·n + t] = ⟨q_i, x̂_t⟩`
    /// with `n = block.len()`.
    pub fn scores_multi(
        &self,
        queries: &[f32],
        block: &CodeBlock,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.scores_multi_range(queries, block, 0..block.len(), scratch, out)
    }

    /// [`Self::scores_multi`] for the vectors `records` of `block` only (e.g. those a sliding
    /// window still sees): `out` is still `g × n`, and its other columns are left as they
    /// were. The codes outside `records` are not read.
    pub fn scores_multi_range(
        &self,
        queries: &[f32],
        block: &CodeBlock,
        records: std::ops::Range<usize>,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let prepared = self.prepare_scores(queries)?;
        self.scores_prepared_range(&prepared, block, records, scratch, out)
    }

    /// The `g` queries (row-major `g × dim`) made ready for [`Self::scores_prepared_range`]:
    /// rotated (and projected for `prod`) and put in the scoring kernels' order, once for
    /// every block they are scored against, where [`Self::scores_multi_range`] does it per
    /// block.
    pub fn prepare_scores(&self, queries: &[f32]) -> Result<PreparedQueries> {
        let g = self.query_count(queries.len())?;
        let d = self.dim;
        let backend = self.scores_backend();
        let mut p = PreparedQueries {
            dim: d,
            g,
            backend,
            q: vec![0f32; g * d],
            sq: vec![0f32; g * d],
            sqsum: vec![0f32; g],
            #[cfg(target_arch = "x86_64")]
            fixed: None,
        };
        let order = self.order(backend);
        let mut rotated = vec![0f32; g * d];
        for (qi, x) in queries.chunks_exact(d).enumerate() {
            let rq = &mut rotated[qi * d..(qi + 1) * d];
            self.rotation.forward(x, rq);
            let rq = &*rq;
            if let Some(qjl) = &self.qjl {
                // The sign term reads S·q' in coordinate order.
                let sq = &mut p.sq[qi * d..(qi + 1) * d];
                qjl.project(rq, sq);
                p.sqsum[qi] = sq.iter().sum();
            }
            let dst = &mut p.q[qi * d..(qi + 1) * d];
            match order {
                Some(perm) => dst
                    .iter_mut()
                    .zip(perm)
                    .for_each(|(o, &j)| *o = rq[j as usize]),
                None => dst.copy_from_slice(rq),
            }
        }
        #[cfg(target_arch = "x86_64")]
        if backend == Backend::Avx2 {
            p.fixed = avx2::FixedQueries::new(&self.ctx, &rotated);
        }
        Ok(p)
    }

    /// [`Self::scores_multi_range`] for queries [`Self::prepare_scores`] made ready (by this
    /// codec): `out` is `g × n`, only the columns of `records` are written.
    pub fn scores_prepared_range(
        &self,
        prepared: &PreparedQueries,
        block: &CodeBlock,
        records: std::ops::Range<usize>,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_block(block)?;
        self.check_len(self.dim, prepared.dim)?;
        let g = prepared.g;
        let n = block.len();
        self.check_len(g * n, out.len())?;
        let chunks = block.chunks_in(records)?;
        let ctx = &self.ctx;
        let backend = prepared.backend;
        scratch.last_backend = Some(backend);
        let (q, sq, sqsum) = (&prepared.q[..], &prepared.sq[..], &prepared.sqsum[..]);
        for (base, chunk) in chunks {
            match backend {
                // SAFETY: the CPU features were detected at run time (the backend is the one
                // `prepare_scores` detected); q, sq hold g·d values and the chunk holds whole
                // records of this layout; scores_backend chose a SIMD backend for a wide
                // codec only without QJL.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx512 if ctx.wide => unsafe {
                    x86::scores_wide(ctx, q, g, chunk, out, n, base)
                },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx2 if ctx.wide => unsafe {
                    avx2::scores_wide(ctx, q, prepared.fixed.as_ref(), g, chunk, out, n, base)
                },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx512 => unsafe {
                    x86::scores(ctx, q, sq, sqsum, g, chunk, out, n, base)
                },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx2 => unsafe {
                    avx2::scores(
                        ctx,
                        q,
                        prepared.fixed.as_ref(),
                        sq,
                        sqsum,
                        g,
                        chunk,
                        out,
                        n,
                        base,
                    )
                },
                #[cfg(all(
                    target_arch = "aarch64",
                    target_feature = "neon",
                    target_endian = "little"
                ))]
                Backend::Neon => neon::scores(ctx, q, sq, sqsum, g, chunk, out, n, base),
                _ => portable::scores(ctx, q, sq, sqsum, g, chunk, out, n, base),
            }
        }
        Ok(())
    }

    /// The order `backend`'s kernels read queries and sums in (position p holds coordinate
    /// `perm[p]`), `None` for coordinate order.
    fn order(&self, backend: Backend) -> Option<&[u32]> {
        match backend {
            // AVX2's own order, see `Ctx::perm_planes`.
            Backend::Avx2 => Some(&self.ctx.perm_planes),
            Backend::Avx512 => Some(&self.ctx.perm),
            _ => None,
        }
    }

    /// For scoring many queries as one matrix product (prefill): `g` queries (row-major
    /// `g × dim`) rotated as the kernels rotate them, into `out`. `false` (and `out` left as
    /// it was) for a codec with QJL, whose scores need the kernels.
    pub fn rotated_queries(&self, queries: &[f32], out: &mut [f32]) -> Result<bool> {
        self.rotate_rows(queries, out, false)
    }

    /// Sums formed in the rotated domain (`rows`: `g × dim`, each `Σ_t w_t · row t` of
    /// [`Self::rotated_rows`]: values summed as one matrix product) rotated back into `out`,
    /// as [`Self::accumulate_multi`] gives them (summed in another order). `false` (and
    /// `out` left as it was) for a codec with QJL, whose sums need the kernels.
    pub fn unrotated_sums(&self, rows: &[f32], out: &mut [f32]) -> Result<bool> {
        self.rotate_rows(rows, out, true)
    }

    /// Each `dim`-row of `rows` rotated (or rotated back, `inverse`) into `out`; `false` and
    /// `out` untouched for a codec with QJL.
    fn rotate_rows(&self, rows: &[f32], out: &mut [f32], inverse: bool) -> Result<bool> {
        let g = self.query_count(rows.len())?;
        self.check_len(g * self.dim, out.len())?;
        if !self.works_by_products() {
            return Ok(false);
        }
        for (x, o) in rows
            .chunks_exact(self.dim)
            .zip(out.chunks_exact_mut(self.dim))
        {
            if inverse {
                self.rotation.inverse(x, o);
            } else {
                self.rotation.forward(x, o);
            }
        }
        Ok(true)
    }

    /// Whether [`Self::rotated_queries`] and [`Self::unrotated_sums`] serve this codec (it
    /// carries no QJL).
    pub fn works_by_products(&self) -> bool {
        self.qjl.is_none()
    }

    /// Records `records` of `block` in the rotated domain, row by row into `out`
    /// (`records.len() × dim`): row t is the record's norm times its centroids, so that
    /// ⟨q', row t⟩, with q' from [`Self::rotated_queries`], is what [`Self::scores`] gives
    /// (for a codec without QJL; summed in another order).
    pub fn rotated_rows(
        &self,
        block: &CodeBlock,
        records: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_block(block)?;
        let d = self.dim;
        self.check_len(records.len() * d, out.len())?;
        for (i, row) in records.zip(out.chunks_exact_mut(d)) {
            let rec = block.record(i)?;
            portable::centroids(&self.ctx, rec, row);
            let norm = crate::codec::read_f16(rec, self.ctx.norm_offset);
            row.iter_mut().for_each(|x| *x *= norm);
        }
        Ok(())
    }

    /// Convenience wrapper returning a new vector (allocates; prefer [`Self::scores`]).
    pub fn scores_vec(&self, q: &[f32], block: &CodeBlock) -> Result<Vec<f32>> {
        let mut out = vec![0.0; block.len()];
        self.scores(q, block, &mut self.scratch(), &mut out)?;
        Ok(out)
    }

    /// Weighted sum of the stored vectors, `out = Σ_t w_t x̂_t` (`weights.len() == block.len()`,
    /// `out.len() == dim`), accumulated in the rotated domain and rotated back once.
    pub fn accumulate(
        &self,
        weights: &[f32],
        block: &CodeBlock,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_len(block.len(), weights.len())?;
        self.accumulate_multi(weights, block, scratch, out)
    }

    /// `g` weighted sums at once (weights row-major `g × n`, out `g × dim`), reading the codes
    /// once.
    pub fn accumulate_multi(
        &self,
        weights: &[f32],
        block: &CodeBlock,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let g = self.sum_rows(out.len())?;
        let d = self.dim;
        scratch.ensure(d, g);
        scratch.acc[..g * d].fill(0.0);
        scratch.acc_s[..g * d].fill(0.0);
        let backend = self.sums_backend();
        let (acc, acc_s) = (&mut scratch.acc[..g * d], &mut scratch.acc_s[..g * d]);
        self.sum_block(backend, weights, block, 0..block.len(), g, acc, acc_s)?;
        scratch.last_backend = Some(backend);
        for (qi, o) in out.chunks_exact_mut(d).enumerate() {
            let acc_s = &scratch.acc_s[qi * d..(qi + 1) * d];
            self.finish_row(
                backend,
                &scratch.acc[qi * d..(qi + 1) * d],
                Some(acc_s),
                &mut scratch.a[..d],
                o,
            );
        }
        Ok(())
    }

    /// [`Self::accumulate_multi`]'s sums added into `sums` (`g × dim`) as the kernels form
    /// them, for a codec without QJL: in the rotated domain and the kernels' order. That
    /// domain is linear, so sums over many blocks (and their rescalings, as a split softmax
    /// makes) can be added there and taken back once by [`Self::finish_sums`], where
    /// `accumulate_multi` rotates every block's back. Only the records `records` are read
    /// (their weights still at their columns of the `g × n` rows), so one block's records can
    /// be summed in ranges apart.
    pub fn accumulate_raw(
        &self,
        weights: &[f32],
        block: &CodeBlock,
        records: std::ops::Range<usize>,
        scratch: &mut Scratch,
        sums: &mut [f32],
    ) -> Result<()> {
        self.raw_sums_served()?;
        let g = self.sum_rows(sums.len())?;
        let d = self.dim;
        scratch.ensure(d, g);
        let backend = self.sums_backend();
        self.sum_block(
            backend,
            weights,
            block,
            records,
            g,
            sums,
            &mut scratch.acc_s[..g * d],
        )?;
        scratch.last_backend = Some(backend);
        Ok(())
    }

    /// Sums [`Self::accumulate_raw`] formed (`g × dim`, added up over any blocks) as
    /// [`Self::accumulate_multi`] gives them, into `out`. The order is this CPU's kernels',
    /// so the kernel test hooks (`force_*_kernels`) must not change between the two calls.
    pub fn finish_sums(&self, sums: &[f32], out: &mut [f32]) -> Result<()> {
        self.raw_sums_served()?;
        self.sum_rows(sums.len())?;
        self.check_len(sums.len(), out.len())?;
        let d = self.dim;
        let backend = self.sums_backend();
        let mut y = vec![0f32; d];
        for (acc, o) in sums.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            self.finish_row(backend, acc, None, &mut y, o);
        }
        Ok(())
    }

    /// Adds `weights[qi] · x` to row `qi` of `sums` (`g × dim`, as [`Self::accumulate_raw`]
    /// forms them), `x` given in the coordinates the codec encodes: rotated and put in the
    /// kernels' order here, so [`Self::finish_sums`] gives `x` back in its own. For a row
    /// held beside the codes (a `+sink` first token) that a raw sum must count.
    pub fn add_raw(&self, x: &[f32], weights: &[f32], sums: &mut [f32]) -> Result<()> {
        self.raw_sums_served()?;
        self.check_len(self.dim, x.len())?;
        let g = self.sum_rows(sums.len())?;
        self.check_len(g, weights.len())?;
        let mut rotated = vec![0f32; self.dim];
        self.rotation.forward(x, &mut rotated);
        let raw: Vec<f32> = match self.order(self.sums_backend()) {
            Some(perm) => perm.iter().map(|&p| rotated[p as usize]).collect(),
            None => rotated,
        };
        for (row, &w) in sums.chunks_exact_mut(self.dim).zip(weights) {
            if w != 0.0 {
                row.iter_mut().zip(&raw).for_each(|(s, r)| *s += w * r);
            }
        }
        Ok(())
    }

    fn raw_sums_served(&self) -> Result<()> {
        if self.qjl.is_some() {
            return Err(Error::UnsupportedSpec(
                "raw sums of a codec with QJL (its sign sums need their own rows)".into(),
            ));
        }
        Ok(())
    }

    /// The rows of a `g × dim` sum buffer of `len` values (at least one row).
    fn sum_rows(&self, len: usize) -> Result<usize> {
        let d = self.dim;
        if len == 0 || !len.is_multiple_of(d) {
            return Err(Error::DimensionMismatch {
                expected: d,
                got: len,
            });
        }
        Ok(len / d)
    }

    /// `acc` (and `acc_s` for QJL), each `g × dim`, gain the weighted sums over the records
    /// `records` of `block` in `backend`'s order, in the rotated domain.
    #[allow(clippy::too_many_arguments)]
    fn sum_block(
        &self,
        backend: Backend,
        weights: &[f32],
        block: &CodeBlock,
        records: std::ops::Range<usize>,
        g: usize,
        acc: &mut [f32],
        acc_s: &mut [f32],
    ) -> Result<()> {
        self.check_block(block)?;
        let n = block.len();
        let d = self.dim;
        self.check_len(g * n, weights.len())?;
        self.check_len(g * d, acc.len())?;
        self.check_len(g * d, acc_s.len())?;
        let ctx = &self.ctx;
        for (base, chunk) in block.chunks_in(records)? {
            match backend {
                // SAFETY: the CPU features were detected at run time; acc, acc_s hold g·d
                // values, weights g·n, and the chunk holds whole records of this layout.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx512 => unsafe {
                    x86::accumulate(ctx, weights, g, n, base, chunk, acc, acc_s)
                },
                // SAFETY: as above; sums_backend chose AVX2 for a wide codec only without
                // QJL.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx2 if ctx.wide => unsafe {
                    avx2::accumulate_wide(ctx, weights, g, n, base, chunk, acc)
                },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Backend::Avx2 => unsafe {
                    avx2::accumulate(ctx, weights, g, n, base, chunk, acc, acc_s)
                },
                #[cfg(all(
                    target_arch = "aarch64",
                    target_feature = "neon",
                    target_endian = "little"
                ))]
                Backend::Neon => neon::accumulate(ctx, weights, g, n, base, chunk, acc, acc_s),
                _ => portable::accumulate(ctx, weights, g, n, base, chunk, acc, acc_s),
            }
        }
        Ok(())
    }

    /// One row of sums from `backend`'s order and the rotated domain into `out` (`y`: a
    /// `dim` scratch row): reordered, the QJL sign sums added, rotated back.
    fn finish_row(
        &self,
        backend: Backend,
        acc: &[f32],
        acc_s: Option<&[f32]>,
        y: &mut [f32],
        out: &mut [f32],
    ) {
        match self.order(backend) {
            Some(perm) => acc.iter().zip(perm).for_each(|(&v, &p)| y[p as usize] = v),
            None => y.copy_from_slice(acc),
        }
        if let (Some(qjl), Some(s)) = (&self.qjl, acc_s) {
            qjl.project_t_add(s, y);
        }
        self.rotation.inverse(y, out);
    }

    /// Convenience wrapper returning a new vector (allocates; prefer [`Self::accumulate`]).
    pub fn accumulate_vec(&self, weights: &[f32], block: &CodeBlock) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.dim];
        self.accumulate(weights, block, &mut self.scratch(), &mut out)?;
        Ok(out)
    }

    /// Test oracle: decode every vector, then dot (slow; never used by the fast paths).
    pub fn scores_reference(&self, q: &[f32], block: &CodeBlock) -> Result<Vec<f32>> {
        self.check_len(self.dim, q.len())?;
        let mut s = self.scratch();
        let mut x = vec![0.0; self.dim];
        (0..block.len())
            .map(|t| {
                self.decode(block, t, &mut x, &mut s)?;
                Ok(x.iter()
                    .zip(q)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum::<f64>() as f32)
            })
            .collect()
    }

    /// Test oracle: decode every vector, then sum with weights in f64.
    pub fn accumulate_reference(&self, weights: &[f32], block: &CodeBlock) -> Result<Vec<f32>> {
        self.check_len(block.len(), weights.len())?;
        let mut s = self.scratch();
        let mut x = vec![0.0; self.dim];
        let mut acc = vec![0.0f64; self.dim];
        for (t, &w) in weights.iter().enumerate() {
            self.decode(block, t, &mut x, &mut s)?;
            for (a, &v) in acc.iter_mut().zip(&x) {
                *a += w as f64 * v as f64;
            }
        }
        Ok(acc.into_iter().map(|v| v as f32).collect())
    }
}

#[cfg(test)]
mod tile_tests {
    #[test]
    fn query_tiles_cover_every_query_once_largest_first() {
        let tiles = |g, w| super::query_tiles(g, w).collect::<Vec<_>>();
        assert_eq!(tiles(15, 8), [(0, 8), (8, 4), (12, 2), (14, 1)]);
        assert_eq!(tiles(16, 8), [(0, 8), (8, 8)]);
        assert_eq!(tiles(7, 4), [(0, 4), (4, 2), (6, 1)]);
        assert_eq!(tiles(0, 8), []);
    }
}
