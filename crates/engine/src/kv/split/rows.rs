//! Prefill over a quantized cache as the f16 cache's: each held segment is decoded once per
//! call into the floats the products read (TurboQuant codes as norm × centroids in their
//! rotated domain, ggml blocks dequantized in theirs, dense f16 rows in place), and the query
//! rows go over it in passes of at most [`PASS_ROWS`] through `kvlab_cpu::attention`'s tiles,
//! spread over the cores, each pass folding segment after segment into its own running
//! softmax ([`Partial::absorb`]). The same products as the decode kernels' (summed in another
//! order); no score matrix outlives a pass and a segment. Codecs with QJL and keys that dot
//! with a q8_1 query (q4_1, q5_1) keep the general path.

use std::borrow::Cow;
use std::sync::Mutex;

use half::f16;
use kvlab_cpu::attention::{self, Elem};
use kvlab_cpu::vmath::exp_shifted_sum;

use super::attend::seen_rows;
use super::side::{DenseRows, Seg, Side};
use super::{SplitStorage, BLOCK_GEMM_MIN_ROWS, SEGMENT_TOKENS};
use crate::error::{EngineError, Result};
use crate::kv::pool;
use crate::kv::split_softmax::Partial;

/// Query rows per pass (a group's heads at consecutive positions), as the f16 path's.
const PASS_ROWS: usize = 32;

/// Passes per segment from which each pass reads the segment whole; below, a pass's keys
/// are cut in [`KEY_SPLITS`] so that a turn's few rows still occupy every core.
const WHOLE_SEGMENT_PASSES: usize = 8;
const KEY_SPLITS: usize = 4;

/// A segment's rows as the products read them.
enum Rows<'a> {
    /// A dense f16 side's own rows.
    F16(&'a [f16]),
    /// A dense f32 side's own rows, or rows decoded (`n × dim`; a bf16 side's converted).
    F32(Cow<'a, [f32]>),
}

impl Side {
    /// Whether a prefill may read this side as rows ([`Side::rows`]): TurboQuant codes
    /// without QJL, any dense side, block values, and block keys whose query is q8_0 (the
    /// products of its floats are ggml's; a q8_1 query's dot also uses its f16-rounded sum).
    fn reads_as_rows(&self, is_key: bool) -> bool {
        match (self.store.codec(), self.store.block()) {
            (Some(c), _) => c.works_by_products(),
            (None, Some(b)) => !is_key || !b.ty.query_is_q8_1(),
            (None, None) => true,
        }
    }

    /// The queries (`g × dim`, scaled) as this side's rows are scored against: rotated as a
    /// codec's are; rotated as the keys are and quantized to q8_0 and back, as ggml's flash
    /// attention has them, for block keys; as they are for dense keys.
    fn scoring_queries(&self, qm: &[f32]) -> Result<Vec<f32>> {
        let d = self.dim;
        if let Some(c) = self.store.codec() {
            let mut rq = vec![0f32; qm.len()];
            if !c.rotated_queries(qm, &mut rq)? {
                return Err(EngineError::invalid("rows of a codec with QJL"));
            }
            return Ok(rq);
        }
        if let Some(b) = self.store.block() {
            let mut qq = vec![0u8; b.ty.query_bytes(d)?];
            let mut out = vec![0f32; qm.len()];
            let mut row = vec![0f32; d];
            for (q, o) in qm.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                row.copy_from_slice(q);
                b.rotate(&mut row)?;
                b.ty.quantize_query(&row, &mut qq)?;
                b.ty.dequantize_query(&qq, o)?;
            }
            return Ok(out);
        }
        Ok(qm.to_vec())
    }

    /// Stored tokens `range` of segment `s` of head `h`.
    fn rows(&self, h: usize, s: usize, range: std::ops::Range<usize>) -> Result<Rows<'_>> {
        let d = self.dim;
        match (&self.heads[h][s], self.store.codec()) {
            (Seg::Codes(b), Some(c)) => {
                let mut out = vec![0f32; range.len() * d];
                let sink = match range.start == 0 && !range.is_empty() {
                    true => self.coded_sink(h, s, true)?,
                    false => None,
                };
                c.rotated_rows(b, range, &mut out)?;
                if let Some(sink) = sink {
                    out[..d].copy_from_slice(&sink);
                }
                Ok(Rows::F32(Cow::Owned(out)))
            }
            (Seg::Blocks(v), _) => {
                let b = self.block_side()?;
                let held = v
                    .get(range.start * b.row_bytes..range.end * b.row_bytes)
                    .ok_or_else(|| EngineError::invalid("rows past a block segment"))?;
                let mut rows = b.dequantize_rows(held, d)?;
                if let Some(sink) = self.sink_row(h, s).filter(|_| range.start == 0) {
                    if let Some(first) = rows.get_mut(..d) {
                        first.copy_from_slice(&sink);
                    }
                }
                Ok(Rows::F32(Cow::Owned(rows)))
            }
            (Seg::Dense(DenseRows::F16(v)), _) => Ok(Rows::F16(
                v.get(range.start * d..range.end * d)
                    .ok_or_else(|| EngineError::invalid("rows past a dense segment"))?,
            )),
            (Seg::Dense(DenseRows::F32(v)), _) => Ok(Rows::F32(Cow::Borrowed(
                v.get(range.start * d..range.end * d)
                    .ok_or_else(|| EngineError::invalid("rows past a dense segment"))?,
            ))),
            (Seg::Dense(v), _) => {
                let mut out = vec![0f32; range.len() * d];
                v.read(range.start * d, &mut out)
                    .ok_or_else(|| EngineError::invalid("rows past a dense segment"))?;
                Ok(Rows::F32(Cow::Owned(out)))
            }
            (Seg::Codes(_), None) => Err(EngineError::invalid("code segment without a codec")),
        }
    }
}

/// One unit of work: a pass over some of a segment's decoded rows (`keys`).
struct Unit {
    pass: usize,
    keys: std::ops::Range<usize>,
}

/// A worker's buffers, kept across its units (fresh ones were a twentieth of the time, in
/// page faults).
#[derive(Default)]
struct Buffers {
    scores: Vec<f32>,
    part: Option<Partial>,
    back: Vec<f32>,
}

impl SplitStorage {
    /// Whether `g` query rows attend by [`Self::attend_rows`].
    pub(super) fn reads_as_rows(&self, g: usize) -> bool {
        g >= BLOCK_GEMM_MIN_ROWS && self.key.reads_as_rows(true) && self.value.reads_as_rows(false)
    }

    /// [`Self::attend_block`]'s contract, finished ([`Self::finish_values`]): `ranges[r]` the
    /// stored tokens position r sees, `qm` the `positions × group` scaled queries (not
    /// rotated) → `positions × group × d` outputs.
    pub(super) fn attend_rows(
        &self,
        hk: usize,
        qm: &[f32],
        group: usize,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let d = self.shape.head_dim;
        let per_pass = (PASS_ROWS / group).max(1);
        let passes: Vec<std::ops::Range<usize>> = (0..ranges.len())
            .step_by(per_pass)
            .map(|a| a..(a + per_pass).min(ranges.len()))
            .collect();
        let rows_of = |p: &std::ops::Range<usize>| p.start * group * d..p.end * group * d;
        // Every step below that is per pass runs on all cores: a serial tenth of the work
        // would cost a fifth of the time on two.
        let queries = pool::map_on_compute_pool(
            &passes,
            || (),
            |_, p| self.key.scoring_queries(&qm[rows_of(p)]),
        )
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
        let acc: Vec<Mutex<Partial>> = passes
            .iter()
            .map(|p| Mutex::new(Partial::empty(p.len() * group, d)))
            .collect();
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        let value_codec = self.value.store.codec().map(|c| &**c);
        for (s, a, b) in self.segment_spans(hk, lo, hi) {
            if a == b {
                continue;
            }
            // The decoded rows (relative to `a`) position `i` sees.
            let seen = |i: usize| {
                let (from, to) = seen_rows(ranges[i], s * SEGMENT_TOKENS, a, b);
                (from - a, to - a)
            };
            // Latest passes first: under causal masks they see the most.
            let live: Vec<(usize, usize, usize)> = (0..passes.len())
                .rev()
                .filter_map(|p| {
                    let (f, t) = passes[p]
                        .clone()
                        .map(seen)
                        .filter(|(f, t)| f < t)
                        .fold((usize::MAX, 0), |(l, h), (f, t)| (l.min(f), h.max(t)));
                    (f < t).then_some((p, f, t))
                })
                .collect();
            let splits = if live.len() >= WHOLE_SEGMENT_PASSES {
                1
            } else {
                KEY_SPLITS
            };
            let mut units = Vec::new();
            for &(pass, f, t) in &live {
                let step = (t - f).div_ceil(splits).max(1);
                for k0 in (f..t).step_by(step) {
                    units.push(Unit {
                        pass,
                        keys: k0..(k0 + step).min(t),
                    });
                }
            }
            // Both sides decoded once, on two cores.
            let sides = [&self.key, &self.value];
            let mut decoded =
                pool::map_on_compute_pool(&sides, || (), |_, side| side.rows(hk, s, a..b))
                    .into_iter();
            let (Some(keys), Some(vals)) = (decoded.next(), decoded.next()) else {
                return Err(EngineError::invalid("a side was not decoded"));
            };
            let (keys, vals) = (keys?, vals?);
            // A pass read whole folds its part in on the worker; parts of a split pass are
            // folded in unit order after, so that the sums never depend on which core
            // finished first (a cache's logits are the same in every run).
            let run = |buf: &mut Buffers, u: &Unit| -> Result<Option<Partial>> {
                let pos = passes[u.pass].clone();
                let q = &queries[u.pass];
                let rows = pos.len() * group;
                // Row r is position pos.start + r / group.
                let seen = |r: usize| seen(pos.start + r / group);
                let part = buf.part.get_or_insert_with(|| Partial::empty(rows, d));
                let sc = &mut buf.scores;
                match (&keys, &vals) {
                    (Rows::F32(k), Rows::F32(v)) => {
                        unit(q, &k[..], &v[..], d, &u.keys, &seen, sc, part)
                    }
                    (Rows::F32(k), Rows::F16(v)) => unit(q, &k[..], v, d, &u.keys, &seen, sc, part),
                    (Rows::F16(k), Rows::F32(v)) => unit(q, k, &v[..], d, &u.keys, &seen, sc, part),
                    (Rows::F16(k), Rows::F16(v)) => unit(q, k, v, d, &u.keys, &seen, sc, part),
                }
                // TurboQuant values were summed in their rotated domain: back to the
                // values' own before parts of different maxima are added.
                if let Some(c) = value_codec {
                    buf.back.resize(part.out.len(), 0.0);
                    c.unrotated_sums(&part.out, &mut buf.back)?;
                    std::mem::swap(&mut part.out, &mut buf.back);
                }
                if splits > 1 {
                    return Ok(buf.part.take());
                }
                lock(&acc[u.pass])?.absorb(part, d);
                Ok(None)
            };
            let parts = pool::map_on_compute_pool(&units, Buffers::default, run);
            for (u, part) in units.iter().zip(parts) {
                if let Some(part) = part? {
                    lock(&acc[u.pass])?.absorb(&part, d);
                }
            }
        }
        let finished = pool::map_on_compute_pool(
            &acc,
            || (),
            |_, part| -> Result<Vec<f32>> {
                let part = std::mem::replace(&mut *lock(part)?, Partial::empty(0, d));
                let mut out = part.normalized(d);
                self.finish_values(hk, &mut out)?;
                Ok(out)
            },
        );
        let mut out = Vec::with_capacity(ranges.len() * group * d);
        for rows in finished {
            out.extend(rows?);
        }
        Ok(out)
    }
}

/// A pass's running sums (poisoned only by a panic in another unit, reported as an error).
fn lock(part: &Mutex<Partial>) -> Result<std::sync::MutexGuard<'_, Partial>> {
    part.lock()
        .map_err(|_| EngineError::invalid("a pass's sums were poisoned"))
}

/// One pass over the decoded rows `span`: scores (`q`: a pass's rows × `d`, scale folded
/// in), masked per row by `seen(r)`, their exponentials against the span's own maxima, and
/// the values weighted by them, into `part` (resized to the pass's rows); `sc` is scratch.
#[allow(clippy::too_many_arguments)]
fn unit<K: Elem, V: Elem>(
    q: &[f32],
    keys: &[K],
    vals: &[V],
    d: usize,
    span: &std::ops::Range<usize>,
    seen: &dyn Fn(usize) -> (usize, usize),
    sc: &mut Vec<f32>,
    part: &mut Partial,
) {
    let rows = q.len() / d;
    let ks: Vec<&[K]> = keys[span.start * d..span.end * d].chunks_exact(d).collect();
    let vs: Vec<&[V]> = vals[span.start * d..span.end * d].chunks_exact(d).collect();
    let n = span.len();
    sc.resize(rows * n, 0.0);
    attention::scores(q, &ks, &vs, rows, 1.0, sc);
    part.max.clear();
    part.max.resize(rows, f32::NEG_INFINITY);
    part.sum.clear();
    part.sum.resize(rows, 0.0);
    for (r, row) in sc.chunks_exact_mut(n).enumerate().take(rows) {
        let (f, t) = seen(r);
        let (f, t) = (
            f.clamp(span.start, span.end) - span.start,
            t.clamp(span.start, span.end) - span.start,
        );
        if f >= t {
            // Nothing of this span is visible to the row: it weighs none.
            row.fill(0.0);
            continue;
        }
        row[..f].fill(0.0);
        row[t..].fill(0.0);
        let m = row[f..t].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        part.sum[r] = exp_shifted_sum(&mut row[f..t], m);
        part.max[r] = m;
    }
    part.out.resize(rows * d, 0.0);
    attention::weighted(sc, &vs, rows, &mut part.out);
}
