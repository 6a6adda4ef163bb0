//! Attention over a split layer: the queries prepared once per call for each side's format,
//! scores and value sums per segment, masked and soft-maxed across segments (decode), or
//! by the row tiles of `rows.rs` and matrix products (prefill).

use super::*;

/// `a` (`m × k`) times `b` (`k × n`), row-major, on the CPU's GEMM.
pub(super) fn matmul(a: Vec<f32>, m: usize, b: Vec<f32>, k: usize, n: usize) -> Result<Vec<f32>> {
    let a = Tensor::from_vec(a, (m, k), &Device::Cpu)?;
    let b = Tensor::from_vec(b, (k, n), &Device::Cpu)?;
    Ok(a.matmul(&b)?.flatten_all()?.to_vec1::<f32>()?)
}

/// `a` (`m × k`) times the transpose of `b` (`n × k`), row-major.
pub(super) fn matmul_t(a: Vec<f32>, m: usize, b: Vec<f32>, n: usize, k: usize) -> Result<Vec<f32>> {
    product_t(&Tensor::from_vec(a, (m, k), &Device::Cpu)?, b, n)
}

/// [`matmul_t`] with `a` already a tensor (`m × k`, shared by several products).
pub(super) fn product_t(a: &Tensor, b: Vec<f32>, n: usize) -> Result<Vec<f32>> {
    let (m, k) = a.dims2()?;
    if n == 0 {
        return Ok(vec![0.0; m]);
    }
    let b = Tensor::from_vec(b, (n, k), &Device::Cpu)?;
    Ok(a.matmul(&b.t()?)?.flatten_all()?.to_vec1::<f32>()?)
}

/// A call's queries as a key side scores them, made once for every segment.
pub(super) enum Prepared {
    /// Each row quantized to a block side's dot type, as ggml's flash attention does.
    Block(Vec<u8>),
    /// Rotated as a TurboQuant side's codes are, for prefill's matrix products (`g × d`).
    Rotated(Tensor),
    /// Made ready for a TurboQuant side's kernels (rotated, in their order) once per call,
    /// not once per segment.
    Codes(kvlab_turboquant::PreparedQueries),
}

/// The stored rows from the first to the last of `rows` (clipped to the `n` a segment holds)
/// that some of the `g` weight rows (`weights`: `g × n`) weighs, and those weight rows' columns
/// over that span (`g × span`); `None` when none is weighed. Value sums read only that span:
/// a sliding window's dropped front, a causal block's future and other units' keys never.
pub(super) fn weighed_span(
    weights: &[f32],
    n: usize,
    g: usize,
    rows: std::ops::Range<usize>,
) -> Option<(std::ops::Range<usize>, Vec<f32>)> {
    let weighed = |t: usize| (0..g).any(|qi| weights[qi * n + t] != 0.0);
    let (lo, hi) = (rows.start.min(n), rows.end.min(n));
    let first = (lo..hi).find(|&t| weighed(t))?;
    let last = (first..hi).rev().find(|&t| weighed(t)).unwrap_or(first);
    let w = weights
        .chunks_exact(n)
        .take(g)
        .flat_map(|r| r[first..=last].iter().copied())
        .collect();
    Some((first..last + 1, w))
}

impl Side {
    /// The queries as this side scores them ([`Prepared`]), once per attention call for
    /// every segment: quantized for a block side; rotated for a TurboQuant side, for matrix
    /// products in prefill (at least [`BLOCK_GEMM_MIN_ROWS`] rows, a codec without QJL) and
    /// for its kernels otherwise; `None` for a dense side.
    pub(super) fn prepare_queries(&self, queries: &[f32]) -> Result<Option<Prepared>> {
        let d = self.dim;
        let g = queries.len() / d;
        if let Some(b) = self.store.block() {
            let qb = b.ty.query_bytes(d)?;
            let mut qq = vec![0u8; qb * g];
            for (q, out) in queries.chunks_exact(d).zip(qq.chunks_exact_mut(qb)) {
                b.ty.quantize_query(q, out)?;
            }
            return Ok(Some(Prepared::Block(qq)));
        }
        match self.store.codec() {
            Some(c) if g >= BLOCK_GEMM_MIN_ROWS && c.works_by_products() => {
                let mut rq = vec![0f32; g * d];
                c.rotated_queries(queries, &mut rq)?;
                Ok(Some(Prepared::Rotated(Tensor::from_vec(
                    rq,
                    (g, d),
                    &Device::Cpu,
                )?)))
            }
            Some(c) => Ok(Some(Prepared::Codes(c.prepare_scores(queries)?))),
            None => Ok(None),
        }
    }

    /// `out[qi·n + t] = ⟨q_qi, x̂_t⟩` for the tokens `cols` of the `n` of segment `s` of head
    /// `h`; the other columns are left as they were (the caller masks them). `prepared` is
    /// what [`Side::prepare_queries`] made of `queries`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores(
        &self,
        h: usize,
        s: usize,
        queries: &[f32],
        prepared: Option<&Prepared>,
        cols: std::ops::Range<usize>,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim;
        match (&self.heads[h][s], self.store.codec()) {
            (Seg::Codes(b), Some(c)) => {
                let n = b.len();
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if let (Some(Prepared::Rotated(rq)), true) = (prepared, hi > lo) {
                    // Prefill: each record decoded once (rotated domain) and scored against
                    // every query row by one matrix product, where the kernels decode a
                    // record once per 8 query rows.
                    let mut keys = vec![0f32; (hi - lo) * d];
                    c.rotated_rows(b, lo..hi, &mut keys)?;
                    let prod = product_t(rq, keys, hi - lo)?;
                    for (qi, p) in prod.chunks_exact(hi - lo).enumerate() {
                        out[qi * n + lo..qi * n + hi].copy_from_slice(p);
                    }
                } else if let Some(Prepared::Codes(p)) = prepared {
                    c.scores_prepared_range(p, b, cols, scratch, out)?;
                } else {
                    c.scores_multi_range(queries, b, cols, scratch, out)?;
                }
                // A `+sink` side's first token: its f16 row as the codes would hold it,
                // scored by the same (scaled, unweighted) query.
                let sink = match lo == 0 && hi > 0 {
                    true => self.coded_sink(h, s, false)?,
                    false => None,
                };
                if let Some(sink) = sink {
                    for (qi, q) in queries.chunks_exact(d).enumerate() {
                        out[qi * n] = q.iter().zip(&sink).map(|(a, b)| a * b).sum();
                    }
                }
            }
            (Seg::Blocks(v), _) => {
                // As ggml's flash attention: the (rotated) query quantized to the keys' dot
                // type, integer dots per block.
                let b = self.block_side()?;
                let n = v.len() / b.row_bytes;
                let g = queries.len() / d;
                let qb = b.ty.query_bytes(d)?;
                // The queries arrive rotated (`attend_codes` rotates them once per call) and
                // quantized (`prepare_queries`, once per call).
                let Some(Prepared::Block(qq)) = prepared else {
                    return Err(EngineError::invalid("block keys without queries"));
                };
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if g >= BLOCK_GEMM_MIN_ROWS && !b.ty.query_is_q8_1() {
                    // Prefill: the same products as one matrix product of the quantized
                    // queries' floats with the keys' (summed in another order). Not for
                    // q4_1/q5_1, whose dots use the query's sum rounded to f16.
                    let mut qf = vec![0f32; g * d];
                    for (q, out) in qq.chunks_exact(qb).zip(qf.chunks_exact_mut(d)) {
                        b.ty.dequantize_query(q, out)?;
                    }
                    let keys = b.dequantize_rows(&v[lo * b.row_bytes..hi * b.row_bytes], d)?;
                    let prod = matmul_t(qf, g, keys, hi - lo, d)?;
                    for (qi, p) in prod.chunks_exact((hi - lo).max(1)).enumerate().take(g) {
                        out[qi * n + lo..qi * n + hi].copy_from_slice(&p[..hi - lo]);
                    }
                } else {
                    let keys = &v[lo * b.row_bytes..hi * b.row_bytes];
                    b.ty.dots(keys, qq, d, &mut out[lo..], n)?;
                }
                // A `+sink` side's first token: its f16 row, scored by the same query.
                if let Some(sink) = self.sink_row(h, s).filter(|_| lo == 0 && hi > 0) {
                    let mut qf = vec![0f32; d];
                    for (qi, q) in qq.chunks_exact(qb).take(g).enumerate() {
                        b.ty.dequantize_query(q, &mut qf)?;
                        out[qi * n] = qf.iter().zip(&sink).map(|(a, b)| a * b).sum();
                    }
                }
            }
            (Seg::Dense(v), _) => {
                // The f16 cache's kernels (a calibrating side's first rows, a dense side).
                let n = v.len() / d;
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if hi <= lo {
                    return Ok(());
                }
                let g = queries.len() / d;
                let sc = match v {
                    DenseRows::F16(x) => dense_scores(queries, &x[lo * d..hi * d], d, g),
                    DenseRows::F32(x) => dense_scores(queries, &x[lo * d..hi * d], d, g),
                    DenseRows::Bf16(_) => dense_scores(queries, &v.floats(lo * d..hi * d)?, d, g),
                };
                for (qi, row) in sc.chunks_exact(hi - lo).enumerate() {
                    out[qi * n + lo..qi * n + hi].copy_from_slice(row);
                }
            }
            (Seg::Codes(_), None) => {
                return Err(EngineError::invalid("code segment without a codec"));
            }
        }
        Ok(())
    }

    /// A codes side's sink where segment `s` (`block`) holds its token, less the record the
    /// codes hold for it, both as the codes hold rows (model coordinates): what a sum over the
    /// records must add, per unit of the token's weight, to weigh the sink instead.
    fn sink_correction(
        &self,
        h: usize,
        s: usize,
        block: &CodeBlock,
        scratch: &mut Scratch,
    ) -> Result<Option<Vec<f32>>> {
        let Some(mut sink) = self.coded_sink(h, s, false)? else {
            return Ok(None);
        };
        let Some(c) = self.store.codec() else {
            return Ok(None);
        };
        let mut record = vec![0f32; self.dim];
        c.decode(block, 0, &mut record, scratch)?;
        sink.iter_mut().zip(&record).for_each(|(x, r)| *x -= r);
        Ok(Some(sink))
    }

    /// Whether [`Side::accumulate`] leaves `g` rows of sums in the codec's raw domain
    /// (`Codec::accumulate_raw`: rotated, in its kernels' order), to be added over the
    /// segments and taken back once by [`Side::finish_raw`]: TurboQuant codes without QJL
    /// summed by the kernels (fewer than [`BLOCK_GEMM_MIN_ROWS`] rows).
    pub(super) fn sums_raw(&self, g: usize) -> bool {
        g < BLOCK_GEMM_MIN_ROWS && self.store.codec().is_some_and(|c| c.works_by_products())
    }

    /// Sums of [`Side::accumulate`] left in the raw domain ([`Side::sums_raw`]), added up
    /// over the segments, as the values' rotated-back sums.
    pub(super) fn finish_raw(&self, out: &mut [f32]) -> Result<()> {
        if let Some(c) = self.store.codec() {
            let raw = out.to_vec();
            c.finish_sums(&raw, out)?;
        }
        Ok(())
    }

    /// Whether [`Side::accumulate`] reads only the rows of the range it is given, in decode: a
    /// segment of dense rows, ggml blocks or TurboQuant codes without QJL (whose sums stay
    /// raw, [`Side::sums_raw`]) can be cut into key ranges summed apart; codes with QJL are
    /// summed whole.
    pub(super) fn sums_by_range(&self) -> bool {
        self.store.codec().is_none_or(|c| c.works_by_products())
    }

    /// `out[qi] = Σ_t w[qi·n + t] · x̂_t` over segment `s` of head `h` (`out` is `g × dim`),
    /// `t` in `rows` (a side that [`Side::sums_by_range`]; other sides sum the whole segment,
    /// their weights zero outside `rows`); in the codec's raw domain where
    /// [`Side::sums_raw`].
    pub(super) fn accumulate(
        &self,
        h: usize,
        s: usize,
        rows: std::ops::Range<usize>,
        weights: &[f32],
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim;
        match (&self.heads[h][s], self.store.codec()) {
            (Seg::Codes(b), Some(c)) => {
                let n = b.len();
                let g = out.len() / d;
                // A `+sink` side's first token weighs its f16 row, not its record: the
                // difference, added to the sums of the records.
                let w0 = |g: usize| -> Vec<f32> { (0..g).map(|qi| weights[qi * n]).collect() };
                if self.sums_raw(g) {
                    // Left rotated: the caller adds the segments' sums and rotates them
                    // back once (`finish_raw`). Only the rows of `rows` are read.
                    out.fill(0.0);
                    let lo = rows.start.min(n);
                    let records = lo..rows.end.clamp(lo, n);
                    let diff = match records.start == 0 && !records.is_empty() {
                        true => self.sink_correction(h, s, b, scratch)?,
                        false => None,
                    };
                    c.accumulate_raw(weights, b, records, scratch, out)?;
                    if let Some(diff) = diff {
                        c.add_raw(&diff, &w0(g), out)?;
                    }
                    return Ok(());
                }
                if g < BLOCK_GEMM_MIN_ROWS || !c.works_by_products() {
                    // The whole segment, its weights zero outside `rows`.
                    let diff = match n > 0 {
                        true => self.sink_correction(h, s, b, scratch)?,
                        false => None,
                    };
                    c.accumulate_multi(weights, b, scratch, out)?;
                    if let Some(diff) = diff {
                        for (o, w) in out.chunks_exact_mut(d).zip(w0(g)) {
                            o.iter_mut().zip(&diff).for_each(|(o, x)| *o += w * x);
                        }
                    }
                    return Ok(());
                }
                // Prefill: the weighed records decoded once (rotated domain), summed for
                // every row by one matrix product, then rotated back, where the kernels
                // decode a record once per 8 rows.
                let Some((span, w)) = weighed_span(weights, n, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let m = span.len();
                let mut held = vec![0f32; m * d];
                let sink = match span.start == 0 {
                    true => self.coded_sink(h, s, true)?,
                    false => None,
                };
                c.rotated_rows(b, span, &mut held)?;
                if let Some(sink) = sink {
                    held[..d].copy_from_slice(&sink);
                }
                let sums = matmul(w, g, held, m, d)?;
                c.unrotated_sums(&sums, out)?;
            }
            (Seg::Blocks(v), _) => {
                // Value rows converted to floats and summed, as ggml does; the sums stay in
                // the rotated domain (`attend_block` rotates the total back once). Only the
                // rows of `rows` some query weighs are read: a sliding window's dropped
                // front, a causal block's future and other units' keys never are.
                let b = self.block_side()?;
                let n = v.len() / b.row_bytes;
                let g = out.len() / d;
                let Some((span, w)) = weighed_span(weights, n, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let held = &v[span.start * b.row_bytes..span.end * b.row_bytes];
                let m = span.len();
                // A `+sink` side's first token: its f16 row in place of its blocks', added
                // as the difference once the blocks are summed.
                let sink = self.sink_row(h, s).filter(|_| span.start == 0);
                let w0: Vec<f32> = match sink {
                    Some(_) => w.chunks_exact(m).map(|r| r[0]).collect(),
                    None => Vec::new(),
                };
                if g < BLOCK_GEMM_MIN_ROWS {
                    // Decode: each row dequantized once and fused-added into the few
                    // outputs (the codec's SIMD kernels), never a whole dequantized copy.
                    out.fill(0.0);
                    b.ty.accumulate_rows(held, d, &w, out)?;
                } else {
                    // Prefill: one matrix product.
                    let values = b.dequantize_rows(held, d)?;
                    out.copy_from_slice(&matmul(w, g, values, m, d)?);
                }
                if let Some(sink) = sink {
                    let mut first = vec![0f32; d];
                    b.ty.dequantize_row(&held[..b.row_bytes], &mut first)?;
                    for (o, &w0) in out.chunks_exact_mut(d).zip(&w0) {
                        if w0 != 0.0 {
                            for ((o, s), f) in o.iter_mut().zip(&sink).zip(&first) {
                                *o += w0 * (s - f);
                            }
                        }
                    }
                }
            }
            (Seg::Dense(v), _) => {
                let g = out.len() / d;
                let Some((span, w)) = weighed_span(weights, v.len() / d, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let at = span.start * d..span.end * d;
                match v {
                    DenseRows::F16(x) => dense_weighted(&x[at], d, &w, g, out),
                    DenseRows::F32(x) => dense_weighted(&x[at], d, &w, g, out),
                    DenseRows::Bf16(_) => dense_weighted(&v.floats(at)?, d, &w, g, out),
                }
            }
            (Seg::Codes(_), None) => {
                return Err(EngineError::invalid("code segment without a codec"));
            }
        }
        Ok(())
    }
}

/// `g × rows` scores of the `g` queries against dense rows `x` (rows of `d`), by the f16
/// cache's kernels.
pub(super) fn dense_scores<T: attention::Elem>(
    queries: &[f32],
    x: &[T],
    d: usize,
    g: usize,
) -> Vec<f32> {
    let keys: Vec<&[T]> = x.chunks_exact(d).collect();
    let mut sc = vec![0f32; g * keys.len()];
    let none: &[&[f32]] = &[];
    attention::scores(queries, &keys, none, g, 1.0, &mut sc);
    sc
}

/// `out[qi] = Σ_t w[qi·rows + t] · x_t` over dense rows `x` (rows of `d`), by the f16 cache's
/// kernels.
pub(super) fn dense_weighted<T: attention::Elem>(
    x: &[T],
    d: usize,
    w: &[f32],
    g: usize,
    out: &mut [f32],
) {
    let vals: Vec<&[T]> = x.chunks_exact(d).collect();
    attention::weighted(w, &vals, g, out);
}

impl SplitStorage {
    /// The compressed-domain attention (see the module doc): `q` from any device, output on
    /// `q`'s device in `q`'s dtype. Computed at home (the CPU); crosses when `q` is elsewhere
    /// or the home is set apart.
    pub(super) fn attend_codes(&self, q: &Tensor, spec: &AttendSpec) -> Result<Tensor> {
        let (nh, t, d) = q.dims3()?;
        let nkv = self.shape.n_kv_heads;
        if d != self.shape.head_dim || nkv == 0 || nh % nkv != 0 {
            return Err(EngineError::invalid(format!(
                "attend: q {:?} does not fit a cache of {nkv} kv heads × {}",
                q.dims(),
                self.shape.head_dim
            )));
        }
        if t == 0 {
            return Ok(q.clone());
        }
        if self.total == self.front {
            return Err(EngineError::invalid("attend on an empty cache"));
        }
        let group = nh / nkv;
        let qv = self.host_rows(q)?;
        let scale = spec.scale as f32;
        let live = self.total - self.front;
        // Prefill by rows holds no score matrix across segments: all positions at once.
        let by_rows = self.reads_as_rows(group * t);
        let rows_per_block = if by_rows {
            t
        } else {
            (SCORE_BUDGET / (group * live)).clamp(1, t)
        };
        let mut out = vec![0f32; nh * t * d];
        for hk in 0..nkv {
            // Weighted keys: score q ⊘ w against the codes of w ⊙ (k − μ).
            let q_scale: Vec<f32> = match self.key.weights(hk) {
                Some(w) => w.iter().map(|w| scale / w).collect(),
                None => vec![scale; d],
            };
            let mut a = 0;
            while a < t {
                let b = (a + rows_per_block).min(t);
                let ranges = (a..b)
                    .map(|i| self.visible(spec.query_start + i, spec))
                    .collect::<Result<Vec<_>>>()?;
                // The group's query heads, row-major (row, head), scale folded in.
                let g = (b - a) * group;
                let mut qm = vec![0f32; g * d];
                for (ri, i) in (a..b).enumerate() {
                    for gg in 0..group {
                        let src = &qv[((hk * group + gg) * t + i) * d..][..d];
                        let dst = &mut qm[(ri * group + gg) * d..][..d];
                        for ((o, &x), &s) in dst.iter_mut().zip(src).zip(&q_scale) {
                            *o = x * s;
                        }
                    }
                }
                let res = if by_rows {
                    // Rotates the queries for block keys itself, pass by pass on all cores.
                    self.attend_rows(hk, &qm, group, &ranges)?
                } else {
                    // Block keys are stored rotated: rotate the queries once, here.
                    if let Some(b) = self.key.store.block() {
                        for row in qm.chunks_exact_mut(d) {
                            b.rotate(row)?;
                        }
                    }
                    self.attend_block(hk, &qm, group, &ranges)?
                };
                for (ri, i) in (a..b).enumerate() {
                    for gg in 0..group {
                        let dst = &mut out[((hk * group + gg) * t + i) * d..][..d];
                        dst.copy_from_slice(&res[(ri * group + gg) * d..][..d]);
                    }
                }
                a = b;
            }
        }
        let floats = out.len();
        let o = Tensor::from_vec(out, (nh, t, d), &Device::Cpu)?;
        if self.apart || !q.device().is_cpu() {
            // The query rows came in (host_rows above) and the output goes back.
            Counters::add(&self.counters.crossings, 1);
            Counters::add(&self.counters.crossed_floats, qv.len() + floats);
            // Cast on the host first: the copy back then moves the query's dtype, not f32.
            return Ok(o.to_dtype(q.dtype())?.to_device(q.device())?);
        }
        Ok(o.to_dtype(q.dtype())?)
    }

    /// One kv head, one block of query rows (`ranges[r]` = visible stored tokens of row r,
    /// `qm` = `rows × group` scaled queries) → `rows × group × d` outputs.
    pub(super) fn attend_block(
        &self,
        hk: usize,
        qm: &[f32],
        group: usize,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let d = self.shape.head_dim;
        let g = ranges.len() * group;
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        // Units of work: each segment's keys that some row sees, cut into key ranges of
        // RANGE_KEYS in decode where both sides read ranges alone (dense rows, ggml blocks,
        // TurboQuant codes without QJL), so a sliding window or a short context still runs
        // on every core as the f16 path does. TurboQuant codes are cut only where the call
        // has fewer than RANGED_CODE_SEGMENTS segments: their kernels' per-call set-up
        // (lookup tables, query tiles) is paid per unit. Prefill's matrix products go by
        // whole segments.
        let spans: Vec<_> = self.segment_spans(hk, lo, hi).collect();
        let codes = self.key.store.codec().is_some() || self.value.store.codec().is_some();
        let by_range = g < BLOCK_GEMM_MIN_ROWS
            && self.key.sums_by_range()
            && self.value.sums_by_range()
            && (!codes || spans.len() < RANGED_CODE_SEGMENTS);
        let mut units: Vec<(usize, usize, usize)> = Vec::new();
        for (s, a, b) in spans {
            if by_range {
                let mut at = a;
                while at < b {
                    let to = (at + RANGE_KEYS).min(b);
                    units.push((s, at, to));
                    at = to;
                }
            } else {
                units.push((s, a, b));
            }
        }
        let parallel = g * (hi - lo) >= PARALLEL_MIN_PAIRS && units.len() > 1;

        // One pass per unit, all units in parallel: masked scores, their softmax numerators
        // against the unit's own maximum, and the values weighted by them. The partial sums
        // are then rescaled to the overall maximum and added, as flash attention does: one
        // dispatch to the compute pool per call.
        let prepared = self.key.prepare_queries(qm)?;
        let seg_pass = |scratch: &mut (Scratch, Scratch),
                        &(s, ua, ub): &(usize, usize, usize)|
         -> Result<Partial> {
            let n = self.key.seg_len(&self.key.heads[hk][s]);
            // Row r sees the unit's tokens `cols(r)`; only their union is scored (a sliding
            // window's dropped front and a causal block's future are never read).
            let cols = |r: (usize, usize)| seen_rows(r, s * SEGMENT_TOKENS, ua, ub);
            let lo = ranges.iter().map(|&r| cols(r).0).min().unwrap_or(ua);
            let hi = ranges.iter().map(|&r| cols(r).1).max().unwrap_or(ua);
            let mut w = vec![0f32; g * n];
            self.key.scores(
                hk,
                s,
                qm,
                prepared.as_ref(),
                lo..hi.max(lo),
                &mut scratch.0,
                &mut w,
            )?;
            let mut max = vec![f32::NEG_INFINITY; g];
            let mut sum = vec![0f32; g];
            for (qi, row) in w.chunks_exact_mut(n.max(1)).enumerate().take(g) {
                let (from, to) = cols(ranges[qi / group]);
                if from == to {
                    // No token of this segment is visible to the row: it weighs none.
                    row.fill(0.0);
                    continue;
                }
                // Masked records weigh exactly 0 (the value sums skip records no row weighs);
                // the exponentials are taken over the visible ones only.
                row[..from].fill(0.0);
                row[to..].fill(0.0);
                let seen = &mut row[from..to];
                let m = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // Unscaled numerators e^(x − m); each output row is divided by its total once.
                sum[qi] = exp_shifted_sum(seen, m);
                max[qi] = m;
            }
            let mut out = vec![0f32; g * d];
            self.value
                .accumulate(hk, s, ua..ub, &w, &mut scratch.1, &mut out)?;
            Ok(Partial { max, sum, out })
        };
        let scratch = || (self.key.scratch(), self.value.scratch());
        let partials: Vec<Partial> = if parallel {
            crate::kv::pool::map_on_compute_pool(&units, scratch, seg_pass)
                .into_iter()
                .collect::<Result<_>>()?
        } else {
            let mut sc = scratch();
            units
                .iter()
                .map(|u| seg_pass(&mut sc, u))
                .collect::<Result<_>>()?
        };
        let mut out = vec![0f32; g * d];
        merge(&partials, d, &mut out);
        // TurboQuant values were summed in their raw domain: the total rotated back once.
        if self.value.sums_raw(g) {
            self.value.finish_raw(&mut out)?;
        }
        self.finish_values(hk, &mut out)?;
        Ok(out)
    }

    /// Attention outputs of head `hk` (rows of `d`) from the values' stored domain to the
    /// model's.
    pub(super) fn finish_values(&self, hk: usize, out: &mut [f32]) -> Result<()> {
        let d = self.shape.head_dim;
        // Block values were summed in their rotated domain: rotate the total back.
        if let Some(b) = self.value.store.block() {
            for row in out.chunks_exact_mut(d) {
                b.rotate(row)?;
            }
        }
        // Values were coded relative to an offset: every row's weights sum to one, so the
        // offset comes back whole. (A key offset needs nothing: it shifts all of a query's
        // scores by the same q·μ, which the softmax ignores.)
        if let Some(m) = self.value.offset(hk) {
            for row in out.chunks_exact_mut(d) {
                row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
            }
        }
        Ok(())
    }

    /// The segments of head `hk` that stored tokens `lo..hi` reach, each as `(segment, a,
    /// b)`: its rows `a..b` among them (`a == b` where it holds none).
    pub(super) fn segment_spans(
        &self,
        hk: usize,
        lo: usize,
        hi: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (lo / SEGMENT_TOKENS..hi.div_ceil(SEGMENT_TOKENS)).map(move |s| {
            let n = self.key.seg_len(&self.key.heads[hk][s]);
            let base = s * SEGMENT_TOKENS;
            let a = lo.saturating_sub(base).min(n);
            (s, a, hi.saturating_sub(base).min(n).max(a))
        })
    }

    /// Decodes held tokens `from..from + len` of every head into `[n_kv, len, d]` f32.
    pub(super) fn decode_range(&self, side: &Side, from: usize, len: usize) -> Result<Vec<f32>> {
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        let mut out = vec![0f32; h * len * d];
        if len == 0 {
            return Ok(out);
        }
        // Rows are independent: decode them on all cores in runs of 256.
        out.par_chunks_mut(256 * d)
            .enumerate()
            .try_for_each(|(c, rows)| {
                let first = c * 256;
                let mut r = 0;
                while r < rows.len() / d {
                    let flat = first + r;
                    let (head, tok) = (flat / len, flat % len);
                    let n = (len - tok).min(rows.len() / d - r);
                    side.decode(head, self.front + from + tok, &mut rows[r * d..(r + n) * d])?;
                    r += n;
                }
                Ok::<(), EngineError>(())
            })?;
        Ok(out)
    }
}

/// The rows of `a..b`, in a segment whose first token is stored token `base`, that a query
/// seeing stored tokens `rlo..rhi` sees (an empty range where it sees none of them).
pub(super) fn seen_rows(
    (rlo, rhi): (usize, usize),
    base: usize,
    a: usize,
    b: usize,
) -> (usize, usize) {
    let from = rlo.saturating_sub(base).clamp(a, b);
    (from, rhi.saturating_sub(base).clamp(a, b).max(from))
}
