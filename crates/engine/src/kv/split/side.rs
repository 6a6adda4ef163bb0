//! One side (keys or values) of a split layer, stored by its format: segments of codes,
//! ggml blocks or dense rows per kv head; appending (with calibration), truncating, decoding
//! and its bytes. What attention reads of a side is in `attend.rs`, its saved form in
//! `persist.rs`.

use super::*;

/// One segment of one side of one kv head.
pub(super) enum Seg {
    Codes(CodeBlock),
    /// Row-major `tokens × dim` dense floats.
    Dense(DenseRows),
    /// Row-major ggml blocks, `tokens × row_bytes`.
    Blocks(Vec<u8>),
}

/// A dense side's segment in the side's dtype (f16, bf16 or f32).
pub(super) enum DenseRows {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
}

/// Reserves room for `add` more floats in a segment of rows of `d`, 128 rows at a time (never
/// past a whole segment) so the reserve stays small.
pub(super) fn grow<T>(v: &mut Vec<T>, add: usize, d: usize) {
    if v.capacity() < v.len() + add {
        let want = (v.len() + add).div_ceil(TQ_ROW_GRAIN * d) * TQ_ROW_GRAIN * d;
        v.reserve_exact(want.min(SEGMENT_TOKENS * d).max(v.len() + add) - v.len());
    }
}

impl DenseRows {
    pub(super) fn new(dtype: DType) -> Self {
        match dtype {
            DType::BF16 => DenseRows::Bf16(Vec::new()),
            DType::F32 => DenseRows::F32(Vec::new()),
            _ => DenseRows::F16(Vec::new()),
        }
    }

    /// Floats held.
    pub(super) fn len(&self) -> usize {
        match self {
            DenseRows::F16(v) => v.len(),
            DenseRows::Bf16(v) => v.len(),
            DenseRows::F32(v) => v.len(),
        }
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        match self {
            DenseRows::F16(v) => 2 * v.capacity(),
            DenseRows::Bf16(v) => 2 * v.capacity(),
            DenseRows::F32(v) => 4 * v.capacity(),
        }
    }

    /// Appends `xs` (rows of `d`), rounded to the dtype.
    pub(super) fn extend(&mut self, xs: &[f32], d: usize) {
        match self {
            DenseRows::F16(v) => {
                grow(v, xs.len(), d);
                v.extend(xs.iter().map(|&x| f16::from_f32(x)));
            }
            DenseRows::Bf16(v) => {
                grow(v, xs.len(), d);
                v.extend(xs.iter().map(|&x| bf16::from_f32(x)));
            }
            DenseRows::F32(v) => {
                grow(v, xs.len(), d);
                v.extend_from_slice(xs);
            }
        }
    }

    /// Keeps the first `n` floats.
    pub(super) fn truncate(&mut self, n: usize) {
        match self {
            DenseRows::F16(v) => v.truncate(n),
            DenseRows::Bf16(v) => v.truncate(n),
            DenseRows::F32(v) => v.truncate(n),
        }
    }

    /// Floats `range` as f32 (a bf16 side's widened, for the f32 kernels).
    pub(super) fn floats(&self, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let mut out = vec![0f32; range.len()];
        self.read(range.start, &mut out)
            .ok_or_else(|| EngineError::invalid("rows past a dense segment"))?;
        Ok(out)
    }

    /// Floats `at..at + out.len()` into `out`; `None` past the end.
    pub(super) fn read(&self, at: usize, out: &mut [f32]) -> Option<()> {
        let range = at..at + out.len();
        match self {
            DenseRows::F16(v) => {
                for (o, x) in out.iter_mut().zip(v.get(range)?) {
                    *o = x.to_f32();
                }
            }
            DenseRows::Bf16(v) => {
                for (o, x) in out.iter_mut().zip(v.get(range)?) {
                    *o = x.to_f32();
                }
            }
            DenseRows::F32(v) => out.copy_from_slice(v.get(range)?),
        }
        Some(())
    }

    /// The floats as saved: each one's little-endian bytes.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        match self {
            DenseRows::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            DenseRows::Bf16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            DenseRows::F32(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        }
    }

    /// What [`DenseRows::to_bytes`] wrote for a side of `dtype` (whole rows: the reader
    /// checks the length against the side's row bytes).
    pub(super) fn from_bytes(dtype: DType, bytes: &[u8]) -> Self {
        let u16s = || {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        match dtype {
            DType::BF16 => DenseRows::Bf16(u16s().map(bf16::from_bits).collect()),
            DType::F32 => DenseRows::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            _ => DenseRows::F16(u16s().map(f16::from_bits).collect()),
        }
    }
}

/// A side stored in one of llama.cpp's block types, rotated as upstream rotates it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockSide {
    pub(super) ty: BlockType,
    /// Bytes of one stored vector.
    pub(super) row_bytes: usize,
    /// Hadamard block width the vectors (and, for keys, the queries) are rotated in.
    pub(super) rot: Option<usize>,
}

impl BlockSide {
    /// Rotates (when rotating) and quantizes `rows` (`n × dim`), appending the blocks.
    pub(super) fn encode(&self, rows: &[f32], dim: usize, out: &mut Vec<u8>) -> Result<()> {
        let mut row = vec![0f32; dim];
        for r in rows.chunks_exact(dim) {
            row.copy_from_slice(r);
            self.rotate(&mut row)?;
            let at = out.len();
            out.resize(at + self.row_bytes, 0);
            self.ty.quantize_row(&row, &mut out[at..])?;
        }
        Ok(())
    }

    /// The floats of stored rows (in the rotated domain), row-major.
    pub(super) fn dequantize_rows(&self, bytes: &[u8], dim: usize) -> Result<Vec<f32>> {
        // Each row through a buffer that stays in L1, appended: zeroing the whole output
        // first cost as much as the dequantizing.
        let mut out = Vec::with_capacity(bytes.len() / self.row_bytes * dim);
        let mut row = vec![0f32; dim];
        for q in bytes.chunks_exact(self.row_bytes) {
            self.ty.dequantize_row(q, &mut row)?;
            out.extend_from_slice(&row);
        }
        Ok(out)
    }

    /// Applies the side's rotation to `x` (its own inverse).
    pub(super) fn rotate(&self, x: &mut [f32]) -> Result<()> {
        if let Some(w) = self.rot {
            ggml::hadamard_rotate(x, w)?;
        }
        Ok(())
    }
}

/// How a side stores its rows, by format: one variant per kind of storage, so a side is
/// exactly one of them.
pub(super) enum SideStore {
    /// Dense rows in this dtype (f16, bf16 or f32).
    Dense(DType),
    /// TurboQuant codes under `codec`. Until `calibrated` (a centered side, or `+qw` keys,
    /// waiting for its first rows: [`Side::append_heads`]) it holds f16 rows, a dense f16
    /// side in every respect.
    Codes { codec: Arc<Codec>, calibrated: bool },
    /// One of llama.cpp's block types, rotated as upstream rotates it.
    Blocks(BlockSide),
}

impl SideStore {
    /// The codec whose codes the segments hold: a coded side that has calibrated.
    pub(super) fn codec(&self) -> Option<&Arc<Codec>> {
        match self {
            SideStore::Codes {
                codec,
                calibrated: true,
            } => Some(codec),
            _ => None,
        }
    }

    /// A coded side's codec while it waits to calibrate (its rows f16 until then).
    pub(super) fn waiting(&self) -> Option<&Arc<Codec>> {
        match self {
            SideStore::Codes {
                codec,
                calibrated: false,
            } => Some(codec),
            _ => None,
        }
    }

    /// The block type and rotation of a block side.
    pub(super) fn block(&self) -> Option<&BlockSide> {
        match self {
            SideStore::Blocks(b) => Some(b),
            _ => None,
        }
    }

    /// The dtype of the dense rows a side holds: a dense side's own, f16 for a coded side
    /// still waiting to calibrate.
    pub(super) fn dense(&self) -> DType {
        match self {
            SideStore::Dense(d) => *d,
            _ => DType::F16,
        }
    }

    /// Marks a coded side calibrated (its segments now codes) or waiting again; nothing for
    /// the other formats.
    pub(super) fn set_calibrated(&mut self, on: bool) {
        if let SideStore::Codes { calibrated, .. } = self {
            *calibrated = on;
        }
    }
}

/// Keys or values of every kv head.
pub(super) struct Side {
    /// How it stores its rows: dense, TurboQuant codes or ggml blocks.
    pub(super) store: SideStore,
    /// Rows it waits for ([`StorageShape::calibration_rows`]).
    pub(super) calibration_rows: usize,
    pub(super) dim: usize,
    pub(super) heads: Vec<Vec<Seg>>,
    /// Whether coded vectors are stored relative to a per-head offset.
    pub(super) center: bool,
    /// Per head: the offset subtracted before encoding, fixed when the side calibrates.
    pub(super) offsets: Vec<Option<Vec<f32>>>,
    /// Whether coded vectors are weighted per channel by the queries' energy (`+qw`).
    pub(super) weigh: bool,
    /// Per head: the channel weights w (the codes hold w ⊙ (x − μ)), fixed when the side
    /// calibrates.
    pub(super) weights: Vec<Option<Vec<f32>>>,
    /// Per head: Σ q_j² over the query rows of the head's group seen so far, for the weights.
    pub(super) query_energy: Vec<Vec<f64>>,
    /// Whether this is a `+sink` side, blocks or codes (docs/cache-options.md).
    pub(super) sink: bool,
    /// Per head: a `+sink` side's first token as f16: rotated as its blocks are, or as it
    /// came for codes (their offset and weights are fixed later, when the side calibrates).
    /// Attention and decoding read it in place of that token's blocks or record
    /// ([`Side::sink_row`], [`Side::coded_sink`]).
    pub(super) sinks: Vec<Option<Vec<f16>>>,
    /// Whether a sliding window dropped the first segment: the sinks then stand for no held
    /// token, and stay (their bytes are in the layer's fixed bytes) until the side empties.
    pub(super) sink_dropped: bool,
}

impl fmt::Debug for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the codes themselves.
        f.debug_struct("Side")
            .field("spec", &self.store.codec().map(|c| *c.spec()))
            .field("waiting", &self.store.waiting().is_some())
            .field("dim", &self.dim)
            .field("heads", &self.heads.len())
            .field("segments", &self.heads.first().map_or(0, Vec::len))
            .finish()
    }
}

impl Side {
    /// `rotate` and `is_key` choose a block side's rotation: keys in the widest Hadamard
    /// block upstream uses, values in 64-wide ones, neither unless `dim` is a multiple of 64.
    pub(super) fn new(
        side: SideSpec,
        p: &LayerPrecision,
        is_key: bool,
        shape: &StorageShape,
    ) -> Result<Self> {
        let (n_heads, dim) = (shape.n_kv_heads, shape.head_dim);
        let (center, weigh) = (p.center, p.weigh_keys && is_key);
        let store = match side {
            SideSpec::Dense(d) => SideStore::Dense(d.dtype()),
            SideSpec::Codes(spec) => SideStore::Codes {
                codec: Arc::new(Codec::new(dim, spec)?),
                calibrated: !p.calibrates(is_key),
            },
            SideSpec::Blocks(ty) => SideStore::Blocks(BlockSide {
                ty,
                row_bytes: ty.row_bytes(dim)?,
                rot: if !p.rotate {
                    None
                } else if is_key {
                    ggml::key_rotation_width(dim)
                } else {
                    ggml::value_rotation_width(dim)
                },
            }),
        };
        let coded = matches!(store, SideStore::Codes { .. });
        let (center, weigh) = (center && coded, weigh && coded);
        let sink = p.sink && !matches!(store, SideStore::Dense(_));
        Ok(Self {
            store,
            calibration_rows: shape.calibration_rows.min(SEGMENT_TOKENS),
            dim,
            heads: (0..n_heads).map(|_| Vec::new()).collect(),
            center,
            offsets: vec![None; n_heads],
            weigh,
            weights: vec![None; n_heads],
            query_energy: vec![vec![0.0; dim]; n_heads],
            sink,
            sinks: vec![None; n_heads],
            sink_dropped: false,
        })
    }

    /// Keeps head `h`'s first token (the first row of `rows`) as its sink when this is a
    /// `+sink` side that holds nothing yet.
    pub(super) fn keep_sink(&mut self, h: usize, rows: &[f32]) -> Result<()> {
        if !self.sink || self.sinks[h].is_some() || !self.heads[h].is_empty() {
            return Ok(());
        }
        if let Some(row) = self.sink_of(rows)? {
            self.sinks[h] = Some(row);
        }
        Ok(())
    }

    /// The first row of `rows` as this side keeps it for its sink (f16; rotated for blocks),
    /// `None` when `rows` is empty; refused as a calibrating side refuses what f16 cannot
    /// hold (all or nothing: the append leaves the storage as it was).
    fn sink_of(&self, rows: &[f32]) -> Result<Option<Vec<f16>>> {
        let Some(first) = rows.get(..self.dim) else {
            return Ok(None);
        };
        let mut row = first.to_vec();
        if let Some(b) = self.store.block() {
            b.rotate(&mut row)?;
        }
        let row: Vec<f16> = row.into_iter().map(f16::from_f32).collect();
        if row.iter().any(|x| !x.is_finite()) {
            let norm = first.iter().map(|x| x * x).sum::<f32>().sqrt();
            return Err(kvlab_turboquant::Error::NotEncodable { norm }.into());
        }
        Ok(Some(row))
    }

    /// A codes side's sink where segment `s` holds its token (as the first record), as the
    /// codes hold their rows (less the offset, times the weights), in the model's coordinates,
    /// or rotated as the codec rotates (`rotated`, for the matrix products of prefill).
    pub(super) fn coded_sink(&self, h: usize, s: usize, rotated: bool) -> Result<Option<Vec<f32>>> {
        let (Some(c), Some(row)) = (self.store.codec(), self.sink_row(h, s)) else {
            return Ok(None);
        };
        let coded = self.coded(h, &row).into_owned();
        if !rotated {
            return Ok(Some(coded));
        }
        let mut out = vec![0f32; self.dim];
        if !c.rotated_queries(&coded, &mut out)? {
            return Err(EngineError::invalid("rotated rows of a codec with QJL"));
        }
        Ok(Some(out))
    }

    /// Head `h`'s sink where segment `s` holds its token (as the first row), as kept: in the
    /// rotated domain the blocks are read in, as it came for codes.
    pub(super) fn sink_row(&self, h: usize, s: usize) -> Option<Vec<f32>> {
        if s != 0 || self.sink_dropped {
            return None;
        }
        let row = self.sinks.get(h)?.as_ref()?;
        Some(row.iter().map(|x| x.to_f32()).collect())
    }

    /// Whether a head still waits for its weights (so the queries' energy is wanted).
    pub(super) fn wants_query_energy(&self) -> bool {
        self.weigh && self.weights.iter().any(Option::is_none)
    }

    /// Takes the per-head query energies (`n_heads × dim`) the cache measured so far.
    pub(super) fn set_query_energy(&mut self, energy: &[f64]) {
        for (h, e) in energy.chunks_exact(self.dim).enumerate() {
            if let Some(mine) = self.query_energy.get_mut(h) {
                mine.copy_from_slice(e);
            }
        }
    }

    /// The weights of head `h`, if its codes are weighted.
    pub(super) fn weights(&self, h: usize) -> Option<&[f32]> {
        self.weights.get(h).and_then(|w| w.as_deref())
    }

    pub(super) fn bytes_per_vector(&self) -> usize {
        match (self.store.codec(), self.store.block()) {
            (Some(c), _) => c.bytes_per_vector(),
            (None, Some(b)) => b.row_bytes,
            (None, None) => self.store.dense().size_in_bytes() * self.dim,
        }
    }

    pub(super) fn seg_len(&self, seg: &Seg) -> usize {
        match seg {
            Seg::Codes(b) => b.len(),
            Seg::Dense(v) => v.len() / self.dim,
            Seg::Blocks(v) => v.len() / self.bytes_per_vector(),
        }
    }

    pub(super) fn new_seg(&self) -> Seg {
        match (self.store.codec(), self.store.block()) {
            (Some(c), _) => Seg::Codes(c.new_block()),
            (None, Some(_)) => Seg::Blocks(Vec::new()),
            (None, None) => Seg::Dense(DenseRows::new(self.store.dense())),
        }
    }

    pub(super) fn scratch(&self) -> Scratch {
        self.store.codec().map(|c| c.scratch()).unwrap_or_default()
    }

    /// Appends `t` rows of every head (`rows`: `heads × t × dim`). A calibrating side holds
    /// them as f16 until it has seen [`Side::calibration_rows`], then measures each head's
    /// offset and weights on all of them and codes them in place ([`Side::calibrate`]).
    pub(super) fn append_heads(&mut self, rows: &[f32], t: usize) -> Result<()> {
        let per_head = t * self.dim;
        if self.store.waiting().is_some() {
            let held = self.heads.first().map_or(0, |segs| {
                segs.iter().map(|s| self.seg_len(s)).sum::<usize>()
            });
            if held + t >= self.calibration_rows {
                return self.calibrate(rows, t);
            }
            // Refused now as the codec would refuse them when it calibrates (and as a
            // calibrated side's append does), not later, at the append that calibrates.
            for r in rows.chunks_exact(self.dim) {
                let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt();
                if !norm.is_finite() || norm > f16::MAX.to_f32() {
                    return Err(kvlab_turboquant::Error::NotEncodable { norm }.into());
                }
            }
        }
        for (h, r) in rows.chunks_exact(per_head).enumerate() {
            self.keep_sink(h, r)?;
            let coded = self.coded(h, r);
            self.append_rows(h, &coded)?;
        }
        Ok(())
    }

    /// `rows` of head `h` as its codes hold them: less the head's offset, times its weights.
    pub(super) fn coded<'a>(&self, h: usize, rows: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let (offset, weights) = (self.offset(h), self.weights(h));
        if offset.is_none() && weights.is_none() {
            return std::borrow::Cow::Borrowed(rows);
        }
        let mut coded = rows.to_vec();
        for r in coded.chunks_exact_mut(self.dim) {
            if let Some(m) = offset {
                r.iter_mut().zip(m).for_each(|(x, m)| *x -= m);
            }
            if let Some(w) = weights {
                r.iter_mut().zip(w).for_each(|(x, w)| *x *= w);
            }
        }
        std::borrow::Cow::Owned(coded)
    }

    /// Calibrates a waiting side on the rows it holds and `rows` (`heads × t × dim`): each
    /// head's offset (their mean, [`MIN_CALIBRATION_ROWS`] at least) and weights, then every row
    /// coded in the same places. All or nothing: on an error the side is as it was.
    pub(super) fn calibrate(&mut self, rows: &[f32], t: usize) -> Result<()> {
        if self.store.waiting().is_none() {
            return Ok(());
        }
        let d = self.dim;
        let n_heads = self.heads.len();
        self.store.set_calibrated(true);
        let built = (|| {
            let mut heads = Vec::with_capacity(n_heads);
            let mut offsets = Vec::with_capacity(n_heads);
            let mut weights = Vec::with_capacity(n_heads);
            let mut sinks = self.sinks.clone();
            for (h, sink) in sinks.iter_mut().enumerate().take(n_heads) {
                let new = rows.get(h * t * d..(h + 1) * t * d).unwrap_or_default();
                let held: usize = self.heads[h].iter().map(|s| self.seg_len(s)).sum();
                if self.sink && held == 0 && sink.is_none() {
                    *sink = self.sink_of(new)?;
                }
                let mut all = vec![0f32; held * d];
                self.decode(h, 0, &mut all)?;
                all.extend_from_slice(new);
                let offset = (self.center && all.len() / d >= MIN_CALIBRATION_ROWS)
                    .then(|| mean_row(&all, d))
                    .or_else(|| self.center.then(|| vec![0.0; d]));
                if let Some(m) = &offset {
                    for r in all.chunks_exact_mut(d) {
                        r.iter_mut().zip(m).for_each(|(x, m)| *x -= m);
                    }
                }
                let w = self
                    .weigh
                    .then(|| channel_weights(&self.query_energy[h], &all, d));
                if let Some(w) = &w {
                    for r in all.chunks_exact_mut(d) {
                        r.iter_mut().zip(w).for_each(|(x, w)| *x *= w);
                    }
                }
                let mut segs = Vec::new();
                self.append_to(&mut segs, &all)?;
                heads.push(segs);
                offsets.push(offset);
                weights.push(w);
            }
            Ok::<_, EngineError>((heads, offsets, weights, sinks))
        })();
        match built {
            Ok((heads, offsets, weights, sinks)) => {
                self.heads = heads;
                self.offsets = offsets;
                self.weights = weights;
                self.sinks = sinks;
                Ok(())
            }
            Err(e) => {
                self.store.set_calibrated(false);
                Err(e)
            }
        }
    }

    /// Holds a calibrating side's rows as f16 again, waiting, once it holds none.
    pub(super) fn restage(&mut self) {
        if self.store.waiting().is_none() && (self.center || self.weigh) {
            self.store.set_calibrated(false);
        }
    }

    /// The offset of head `h`, if its vectors are stored relative to one.
    pub(super) fn offset(&self, h: usize) -> Option<&[f32]> {
        self.offsets.get(h).and_then(|o| o.as_deref())
    }

    /// Appends `rows` (`n × dim`, as coded) to head `h`, filling the last segment first.
    pub(super) fn append_rows(&mut self, h: usize, rows: &[f32]) -> Result<()> {
        let mut segs = std::mem::take(&mut self.heads[h]);
        let res = self.append_to(&mut segs, rows);
        self.heads[h] = segs;
        res
    }

    /// [`Side::append_rows`] into the segments `segs`.
    pub(super) fn append_to(&self, segs: &mut Vec<Seg>, mut rows: &[f32]) -> Result<()> {
        let d = self.dim;
        let row_bytes = self.bytes_per_vector();
        while !rows.is_empty() {
            let need_new = match segs.last() {
                None => true,
                Some(s) => self.seg_len(s) == SEGMENT_TOKENS,
            };
            if need_new {
                segs.push(self.new_seg());
            }
            let Some(seg) = segs.last_mut() else {
                return Err(EngineError::invalid("segment missing after push"));
            };
            let have = match seg {
                Seg::Codes(b) => b.len(),
                Seg::Dense(v) => v.len() / d,
                Seg::Blocks(v) => v.len() / row_bytes,
            };
            let take = (SEGMENT_TOKENS - have).min(rows.len() / d);
            let (now, rest) = rows.split_at(take * d);
            match (seg, self.store.codec()) {
                (Seg::Codes(b), Some(codec)) => codec.encode_batch(now, b)?,
                (Seg::Dense(v), _) => v.extend(now, d),
                (Seg::Blocks(v), _) => {
                    let Some(b) = self.store.block() else {
                        return Err(EngineError::invalid("block segment without a block type"));
                    };
                    let row = b.row_bytes;
                    if v.capacity() < v.len() + take * row {
                        let want = (v.len() + take * row).div_ceil(TQ_ROW_GRAIN * row)
                            * TQ_ROW_GRAIN
                            * row;
                        v.reserve_exact(want.min(SEGMENT_TOKENS * row) - v.len());
                    }
                    b.encode(now, d, v)?;
                }
                (Seg::Codes(_), None) => {
                    return Err(EngineError::invalid("code segment without a codec"));
                }
            }
            rows = rest;
        }
        Ok(())
    }

    /// Keeps the first `total` stored tokens of every head.
    pub(super) fn truncate(&mut self, total: usize) {
        let d = self.dim;
        if total == 0 {
            self.offsets.iter_mut().for_each(|o| *o = None);
            self.weights.iter_mut().for_each(|w| *w = None);
            self.sinks.iter_mut().for_each(|s| *s = None);
            self.sink_dropped = false;
            self.restage();
        }
        let keep = total.div_ceil(SEGMENT_TOKENS);
        let in_last = total - keep.saturating_sub(1) * SEGMENT_TOKENS;
        let row = self.bytes_per_vector();
        for segs in &mut self.heads {
            segs.truncate(keep);
            match segs.last_mut() {
                Some(Seg::Codes(b)) => b.truncate(in_last),
                Some(Seg::Dense(v)) => v.truncate(in_last * d),
                Some(Seg::Blocks(v)) => v.truncate(in_last * row),
                None => {}
            }
        }
    }

    /// Forgets the first `n` segments of every head.
    pub(super) fn drop_segments(&mut self, n: usize) {
        self.sink_dropped |= n > 0;
        for segs in &mut self.heads {
            let n = n.min(segs.len());
            segs.drain(..n);
        }
    }

    /// Bytes of the per-head offsets and weights (f32, `dim` each per head that has one)
    /// and sinks (f16).
    pub(super) fn offset_bytes(&self) -> usize {
        let vectors = self.offsets.iter().flatten().count() + self.weights.iter().flatten().count();
        let sinks = self.sinks.iter().flatten().count();
        (vectors * std::mem::size_of::<f32>() + sinks * 2) * self.dim
    }

    pub(super) fn bytes_allocated(&self) -> usize {
        self.offset_bytes()
            + self
                .heads
                .iter()
                .flatten()
                .map(|s| match s {
                    Seg::Codes(b) => b.bytes_allocated(),
                    Seg::Dense(v) => v.capacity_bytes(),
                    Seg::Blocks(v) => v.capacity(),
                })
                .sum::<usize>()
    }

    /// The block type of a block side.
    pub(super) fn block_side(&self) -> Result<&BlockSide> {
        self.store
            .block()
            .ok_or_else(|| EngineError::invalid("block segment without a block type"))
    }

    /// Decodes stored tokens `from..from + out.len() / dim` of head `h` into `out`.
    pub(super) fn decode(&self, h: usize, from: usize, out: &mut [f32]) -> Result<()> {
        let d = self.dim;
        let mut scratch = self.scratch();
        for (r, row) in out.chunks_exact_mut(d).enumerate() {
            let j = from + r;
            let seg = self.heads[h]
                .get(j / SEGMENT_TOKENS)
                .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
            let i = j % SEGMENT_TOKENS;
            match (seg, self.store.codec()) {
                (Seg::Codes(b), Some(c)) => {
                    // A `+sink` side's first token: its f16 row, as it came.
                    if let Some(sink) = self.sink_row(h, j / SEGMENT_TOKENS).filter(|_| i == 0) {
                        row.copy_from_slice(&sink);
                        continue;
                    }
                    c.decode(b, i, row, &mut scratch)?;
                    if let Some(w) = self.weights(h) {
                        row.iter_mut().zip(w).for_each(|(x, w)| *x /= w);
                    }
                    if let Some(m) = self.offset(h) {
                        row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
                    }
                }
                (Seg::Dense(v), _) => {
                    v.read(i * d, row)
                        .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
                }
                (Seg::Blocks(v), _) => {
                    let b = self.block_side()?;
                    let src = v
                        .get(i * b.row_bytes..(i + 1) * b.row_bytes)
                        .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
                    let sink = if i == 0 {
                        self.sink_row(h, j / SEGMENT_TOKENS)
                    } else {
                        None
                    };
                    match sink {
                        Some(sink) => row.copy_from_slice(&sink),
                        None => b.ty.dequantize_row(src, row)?,
                    }
                    b.rotate(row)?;
                }
                (Seg::Codes(_), None) => {
                    return Err(EngineError::invalid("code segment without a codec"));
                }
            }
        }
        Ok(())
    }
}

/// Fewest rows for a head's channel weights: below, the head's codes stay unweighted.
pub(super) const MIN_WEIGHT_ROWS: usize = MIN_CALIBRATION_ROWS;

/// Bounds on a channel's weight relative to the others: a channel no query has read yet, or
/// on which no key varies, must not take a weight that overflows the stored norm.
pub(super) const WEIGHT_RATIO_BOUND: f64 = 1e4;

/// The weights of `+qw` (module doc of docs/cache-options.md): w_j = (E q_j² / E x_j²)^¼ over the rows
/// `x` about to be coded (already centered), scaled so their geometric mean is one. Ones when
/// no query has been seen or there are too few rows to measure the keys' spread.
pub(super) fn channel_weights(query_energy: &[f64], rows: &[f32], d: usize) -> Vec<f32> {
    let n = rows.len() / d;
    let q_total: f64 = query_energy.iter().sum();
    if n < MIN_WEIGHT_ROWS || !q_total.is_finite() || q_total <= 0.0 {
        return vec![1.0; d];
    }
    let mut spread = vec![0f64; d];
    for r in rows.chunks_exact(d) {
        spread
            .iter_mut()
            .zip(r)
            .for_each(|(a, &x)| *a += (x as f64) * (x as f64));
    }
    let k_total: f64 = spread.iter().sum();
    if !k_total.is_finite() || k_total <= 0.0 {
        return vec![1.0; d];
    }
    let floor = 1.0 / (d as f64 * WEIGHT_RATIO_BOUND);
    let logs: Vec<f64> = query_energy
        .iter()
        .zip(&spread)
        .map(|(&q, &k)| {
            let (q, k) = ((q / q_total).max(floor), (k / k_total).max(floor));
            0.25 * (q / k).ln()
        })
        .collect();
    let mean = logs.iter().sum::<f64>() / d as f64;
    logs.iter().map(|l| (l - mean).exp() as f32).collect()
}

/// The mean of `n × d` row-major rows.
pub(super) fn mean_row(rows: &[f32], d: usize) -> Vec<f32> {
    let n = rows.len() / d;
    let mut m = vec![0f64; d];
    for r in rows.chunks_exact(d) {
        m.iter_mut().zip(r).for_each(|(a, &x)| *a += x as f64);
    }
    m.iter().map(|a| (*a / n.max(1) as f64) as f32).collect()
}
