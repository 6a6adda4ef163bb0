//! `Codec`: one (dim, spec) pair with its rotation, codebooks and QJL sketch; encodes vectors
//! into a `CodeBlock`, decodes them back, and hosts the compressed-domain kernels.

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use crate::block::{CodeBlock, DEFAULT_CHUNK_VECTORS};
use crate::codebook::{codebook, Codebook};
use crate::error::{Error, Result};
use crate::kernels::Backend;
use crate::layout::Layout;
use crate::qjl::Qjl;
use crate::rotation::{Haar, Hadamard, Rotation};
use crate::spec::{RotationKind, Spec, Variant};
use crate::{bits, scratch::Scratch};

/// Below this many vectors `encode_batch` stays on the calling thread (threads cost more).
const PARALLEL_MIN_VECTORS: usize = 512;

/// A codec for vectors of one dimension under one [`Spec`]. Immutable after construction,
/// `Send + Sync`; share it with `Arc` across threads. Kernels take `&self` plus a
/// caller-owned [`Scratch`], so many blocks can be processed in parallel.
#[derive(Clone, Debug)]
pub struct Codec {
    pub(crate) dim: usize,
    pub(crate) spec: Spec,
    pub(crate) layout: Layout,
    pub(crate) rotation: Rotation,
    /// One codebook per layout segment.
    pub(crate) books: Vec<Arc<Codebook>>,
    pub(crate) qjl: Option<Qjl>,
    /// Layout facts for the kernels, precomputed.
    pub(crate) ctx: crate::kernels::Ctx,
}

impl Codec {
    /// Builds the codec, validating `spec` and `dim` (3 ≤ dim ≤ 65536; dense parts ≤ 4096).
    pub fn new(dim: usize, spec: Spec) -> Result<Self> {
        let layout = Layout::new(dim, &spec)?;
        let rotation = match spec.rotation {
            RotationKind::Hadamard => Rotation::Hadamard(Hadamard::new(dim, spec.seed)),
            RotationKind::Haar => Rotation::Haar(Haar::new(dim, spec.seed)),
        };
        let books: Vec<Arc<Codebook>> = layout
            .segments
            .iter()
            .map(|s| codebook(dim, s.width))
            .collect();
        let qjl = (spec.variant == Variant::Prod).then(|| Qjl::new(dim, spec.seed));
        let ctx = crate::kernels::Ctx::new(&layout, &books, qjl.as_ref().map(Qjl::scale));
        Ok(Codec {
            dim,
            spec,
            layout,
            rotation,
            books,
            qjl,
            ctx,
        })
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The spec this codec implements.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }
    /// Bytes per stored vector.
    pub fn bytes_per_vector(&self) -> usize {
        self.layout.stride
    }
    /// Stored bits per coordinate, norm (and γ) included.
    pub fn bits_per_coordinate(&self) -> f64 {
        self.layout.bits_per_coordinate()
    }
    /// The codebooks in use: one, or two for fractional widths (high width first).
    pub fn codebooks(&self) -> Vec<Arc<Codebook>> {
        self.books.clone()
    }

    /// An empty block for this codec, growing [`DEFAULT_CHUNK_VECTORS`] vectors at a time.
    pub fn new_block(&self) -> CodeBlock {
        CodeBlock::new(&self.layout, self.spec, DEFAULT_CHUNK_VECTORS)
    }
    /// An empty block growing `chunk_vectors` vectors at a time.
    pub fn new_block_with_chunk(&self, chunk_vectors: usize) -> CodeBlock {
        CodeBlock::new(&self.layout, self.spec, chunk_vectors)
    }
    /// Reusable working memory for this codec's kernels (grows to the largest call).
    pub fn scratch(&self) -> Scratch {
        Scratch::new(self.dim)
    }

    pub(crate) fn check_block(&self, block: &CodeBlock) -> Result<()> {
        if block.dim != self.dim || block.spec != self.spec {
            return Err(Error::LayoutMismatch {
                block_dim: block.dim,
                codec_dim: self.dim,
            });
        }
        Ok(())
    }

    pub(crate) fn check_len(&self, expected: usize, got: usize) -> Result<()> {
        if expected != got {
            return Err(Error::DimensionMismatch { expected, got });
        }
        Ok(())
    }

    /// Encodes one vector into `record` (`bytes_per_vector()` bytes).
    pub fn encode_record(&self, x: &[f32], record: &mut [u8], scratch: &mut Scratch) -> Result<()> {
        self.check_len(self.dim, x.len())?;
        self.check_len(self.layout.stride, record.len())?;
        scratch.ensure(self.dim, 1);
        if self.ctx.wide {
            // 5–8-bit codebooks: the SIMD quantizers hold 16 levels at most.
            scratch.last_backend = Some(Backend::Portable);
            return self.encode_record_with(x, record, scratch, portable_quantize, bits::pack);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if crate::features::avx512_bmi2() {
                scratch.last_backend = Some(Backend::Avx512);
                // SAFETY: AVX-512F and BMI2 were detected at run time.
                return unsafe { self.encode_record_avx512(x, record, scratch) };
            }
            // Through the kernels' switch, so forcing the portable backend reaches here too.
            if crate::features::avx2() {
                scratch.last_backend = Some(Backend::Avx2);
                // SAFETY: AVX2 and FMA were detected at run time.
                return unsafe { self.encode_record_avx2(x, record, scratch) };
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        {
            if crate::features::neon() {
                scratch.last_backend = Some(Backend::Neon);
                let segs = &self.ctx.segs;
                return self.encode_record_with(
                    x,
                    record,
                    scratch,
                    |k, _book, ys, idx, cents| {
                        crate::kernels::neon::quantize(&segs[k], ys, idx, cents)
                    },
                    crate::kernels::neon::pack,
                );
            }
        }
        scratch.last_backend = Some(Backend::Portable);
        self.encode_record_with(x, record, scratch, portable_quantize, bits::pack)
    }

    /// The encoder with AVX-512 quantization and BMI2 packing (loops vectorize 16 wide).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,bmi2")]
    fn encode_record_avx512(
        &self,
        x: &[f32],
        record: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<()> {
        let segs = &self.ctx.segs;
        self.encode_record_with(
            x,
            record,
            scratch,
            |k, _book, ys, idx, cents| {
                // SAFETY: AVX-512F was detected by the caller; buffers are segment-sized.
                unsafe { crate::kernels::quantize_avx512(&segs[k], ys, idx, cents) }
            },
            |codes, width, dst, bit| {
                // SAFETY: BMI2 was detected by the caller.
                unsafe { crate::kernels::pack_pext(codes, width, dst, bit) }
            },
        )
    }

    /// Same code compiled with AVX2+FMA enabled so the loops vectorize 8 wide.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn encode_record_avx2(
        &self,
        x: &[f32],
        record: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<()> {
        self.encode_record_with(x, record, scratch, portable_quantize, bits::pack)
    }

    /// The encoder, parameterized by the segment quantizer (`(segment index, codebook, ys,
    /// idx out, centroids out)`) and the bit packer.
    #[inline(always)]
    fn encode_record_with<Q, P>(
        &self,
        x: &[f32],
        record: &mut [u8],
        scratch: &mut Scratch,
        quant: Q,
        pack: P,
    ) -> Result<()>
    where
        Q: Fn(usize, &Codebook, &[f32], &mut [u8], &mut [f32]),
        P: Fn(&[u8], u8, &mut [u8], usize) -> bool,
    {
        let d = self.dim;
        let norm = norm2(x).sqrt();
        if !norm.is_finite() || norm > f16::MAX.to_f32() {
            return Err(Error::NotEncodable { norm });
        }
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        let Scratch { a, b, idx, .. } = scratch;
        let (unit, rot) = (&mut a[..d], &mut b[..d]);
        for (u, &v) in unit.iter_mut().zip(x) {
            *u = v * inv;
        }
        self.rotation.forward(unit, rot);
        let idx = &mut idx[..d];
        let mut cnorm2 = 0.0f32;
        // `unit` is reused to hold the chosen centroids (rotated domain).
        for (k, (seg, book)) in self.layout.segments.iter().zip(&self.books).enumerate() {
            let r = seg.start..seg.start + seg.len;
            quant(
                k,
                book,
                &rot[r.clone()],
                &mut idx[r.clone()],
                &mut unit[r.clone()],
            );
            cnorm2 += norm2(&unit[r.clone()]);
            pack(&idx[r], seg.width, record, seg.bit_offset);
        }
        if self.layout.segments.is_empty() {
            unit.fill(0.0);
        }
        // ⟨u, û⟩ = ⟨y, c⟩: the rotation is orthogonal.
        let proj: f32 = unit.iter().zip(rot.iter()).map(|(c, y)| c * y).sum();
        if let (Some(qjl), Some(sign_bit), Some(goff)) = (
            &self.qjl,
            self.layout.sign_bit_offset,
            self.layout.gamma_offset,
        ) {
            // Residual r = y − c in the rotated domain; S applied there is still Gaussian.
            for (r, &y) in unit.iter_mut().zip(rot.iter()) {
                *r = y - *r;
            }
            let gamma = norm2(unit).sqrt();
            qjl.project(unit, rot);
            for (i, &z) in idx.iter_mut().zip(rot.iter()) {
                *i = u8::from(z >= 0.0);
            }
            pack(idx, 1, record, sign_bit);
            write_f16(record, goff, gamma);
        }
        let stored = if self.spec.unbiased && proj > 0.0 {
            norm / proj
        } else if self.spec.norm_correction && cnorm2 > 0.0 {
            norm / cnorm2.sqrt()
        } else {
            norm
        };
        write_f16(record, self.layout.norm_offset, stored);
        Ok(())
    }

    /// Encodes `x` and appends it to `block`.
    pub fn encode(&self, x: &[f32], block: &mut CodeBlock, scratch: &mut Scratch) -> Result<()> {
        self.check_block(block)?;
        self.check_len(self.dim, x.len())?;
        let before = block.len();
        let res = {
            let mut regions = block.grow(1);
            match regions.first_mut() {
                Some(rec) => self.encode_record(x, rec, scratch),
                None => Ok(()),
            }
        };
        if res.is_err() {
            block.truncate(before);
        }
        res
    }

    /// Encodes the rows of `xs` (row-major, `n × dim`) and appends them; uses all cores for
    /// large batches. On error nothing is appended.
    pub fn encode_batch(&self, xs: &[f32], block: &mut CodeBlock) -> Result<()> {
        self.check_block(block)?;
        if !xs.len().is_multiple_of(self.dim) {
            return Err(Error::DimensionMismatch {
                expected: xs.len().div_ceil(self.dim) * self.dim,
                got: xs.len(),
            });
        }
        let n = xs.len() / self.dim;
        let before = block.len();
        let stride = self.layout.stride;
        let res = {
            let regions = block.grow(n);
            let mut jobs: Vec<(&mut [u8], &[f32])> = Vec::with_capacity(n);
            let mut rows = xs.chunks_exact(self.dim);
            for region in regions {
                for rec in region.chunks_exact_mut(stride) {
                    if let Some(row) = rows.next() {
                        jobs.push((rec, row));
                    }
                }
            }
            if n >= PARALLEL_MIN_VECTORS {
                jobs.into_par_iter().try_for_each_init(
                    || self.scratch(),
                    |s, (rec, row)| self.encode_record(row, rec, s),
                )
            } else {
                let mut s = self.scratch();
                jobs.into_iter()
                    .try_for_each(|(rec, row)| self.encode_record(row, rec, &mut s))
            }
        };
        if res.is_err() {
            block.truncate(before);
        }
        res
    }

    /// Decodes a record into the codec's estimate of the original vector:
    /// n · Πᵀ ŷ with ŷ = c[idx] (mse) or c[idx] + γ·√(π/2)/d · Sᵀ sign(S r) (prod).
    pub fn decode_record(
        &self,
        record: &[u8],
        out: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        self.check_len(self.layout.stride, record.len())?;
        self.check_len(self.dim, out.len())?;
        let d = self.dim;
        scratch.ensure(d, 1);
        let Scratch { a, b, .. } = scratch;
        let y = &mut a[..d];
        y.fill(0.0);
        for (seg, book) in self.layout.segments.iter().zip(&self.books) {
            let cents = book.centroids();
            for k in 0..seg.len {
                let i = bits::read(record, seg.bit_offset + k * seg.width as usize, seg.width);
                y[seg.start + k] = cents[i as usize];
            }
        }
        if let (Some(qjl), Some(sign_bit), Some(goff)) = (
            &self.qjl,
            self.layout.sign_bit_offset,
            self.layout.gamma_offset,
        ) {
            let g = read_f16(record, goff) * qjl.scale();
            let s = &mut b[..d];
            for (k, v) in s.iter_mut().enumerate() {
                *v = if bits::read(record, sign_bit + k, 1) == 1 {
                    g
                } else {
                    -g
                };
            }
            qjl.project_t_add(s, y);
        }
        let norm = read_f16(record, self.layout.norm_offset);
        self.rotation.inverse(y, out);
        for v in out.iter_mut() {
            *v *= norm;
        }
        Ok(())
    }

    /// Decodes vector `i` of `block` (for conversion back to dense form and as a test oracle).
    pub fn decode(
        &self,
        block: &CodeBlock,
        i: usize,
        out: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        self.check_block(block)?;
        self.decode_record(block.record(i)?, out, scratch)
    }
}

/// Σ v², accumulated in 8 independent lanes so it vectorizes.
#[inline(always)]
pub(crate) fn norm2(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut it = v.chunks_exact(8);
    for c in &mut it {
        for k in 0..8 {
            acc[k] += c[k] * c[k];
        }
    }
    let tail: f32 = it.remainder().iter().map(|x| x * x).sum();
    acc.iter().sum::<f32>() + tail
}

/// Nearest-level indices and centroid values: count the thresholds at or below each value
/// (branch-free, one pass per threshold so the inner loop vectorizes); wide codebooks (up to
/// 255 thresholds) binary-search instead.
#[inline(always)]
fn portable_quantize(_seg: usize, book: &Codebook, ys: &[f32], idx: &mut [u8], cents: &mut [f32]) {
    if book.thresholds().len() > 15 {
        for (i, &y) in idx.iter_mut().zip(ys) {
            *i = book.quantize(y);
        }
    } else {
        idx.fill(0);
        for &th in book.thresholds() {
            for (i, &y) in idx.iter_mut().zip(ys) {
                *i += u8::from(y >= th);
            }
        }
    }
    let levels = book.centroids();
    for (c, &i) in cents.iter_mut().zip(idx.iter()) {
        *c = levels[i as usize];
    }
}

pub(crate) fn write_f16(record: &mut [u8], off: usize, v: f32) {
    record[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

#[inline(always)]
pub(crate) fn read_f16(record: &[u8], off: usize) -> f32 {
    let lo = record.get(off).copied().unwrap_or(0);
    let hi = record.get(off + 1).copied().unwrap_or(0);
    f16::from_le_bytes([lo, hi]).to_f32()
}
