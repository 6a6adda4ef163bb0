//! Dense K/V storage in f32, f16 or bf16 that grows in fixed blocks as tokens arrive (never
//! preallocating the model's context), forgets old tokens by moving a start index, and
//! compacts only when the block runs out.

use candle_core::{DType, Device, Tensor};

use super::attend::attend_dense;
use super::format::KvPrecision;
use super::storage::{AttendSpec, KvStorage, StorageShape};
use super::wire::{WireReader, WireWriter};
use crate::error::{EngineError, Result};

/// Tokens per allocation block: every allocation is a whole number of them.
pub const BLOCK_TOKENS: usize = 16;

/// Keys and values as plain tensors `[n_kv_heads, capacity, head_dim]`.
#[derive(Debug)]
pub struct DenseStorage {
    precision: KvPrecision,
    shape: StorageShape,
    /// `(k, v)` buffers; `None` until the first append.
    bufs: Option<(Tensor, Tensor)>,
    /// Buffer index of the oldest live token.
    start: usize,
    len: usize,
    cap: usize,
}

fn dtype_of(p: KvPrecision) -> DType {
    match p {
        KvPrecision::F32 => DType::F32,
        KvPrecision::F16 => DType::F16,
        KvPrecision::BF16 => DType::BF16,
        // Not a dense precision; `new_storage` never builds a dense store for it.
        KvPrecision::Split(_) => DType::F16,
    }
}

fn round_up(n: usize) -> usize {
    n.div_ceil(BLOCK_TOKENS).max(1) * BLOCK_TOKENS
}

/// The room a layer allocates when it must grow to hold `held` tokens, and the most it has
/// while it holds `held`: what it holds and a spare of an eighth (at least a block), in whole
/// blocks. The spare makes a long cache copy O(log n) times as it grows and a sliding window
/// compact once per spare, not per step; being bounded, it is what a budget of allocated
/// bytes counts ([`crate::memory::estimate_kv_allocated`]).
pub fn allocated_tokens(held: usize) -> usize {
    round_up(held + (held / 8).max(BLOCK_TOKENS))
}

impl DenseStorage {
    /// An empty storage; no memory is reserved until tokens arrive.
    pub fn new(precision: KvPrecision, shape: StorageShape) -> Self {
        Self {
            precision,
            shape,
            bufs: None,
            start: 0,
            len: 0,
            cap: 0,
        }
    }

    /// The storage dtype.
    pub fn dtype(&self) -> DType {
        dtype_of(self.precision)
    }

    /// Moves the live tokens to the front of fresh buffers of `cap` tokens.
    fn reallocate(&mut self, cap: usize) -> Result<()> {
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        let k = Tensor::zeros((h, cap, d), self.dtype(), &self.shape.device)?;
        let v = Tensor::zeros((h, cap, d), self.dtype(), &self.shape.device)?;
        if let Some((ok, ov)) = &self.bufs {
            if self.len > 0 {
                k.slice_set(&ok.narrow(1, self.start, self.len)?.contiguous()?, 1, 0)?;
                v.slice_set(&ov.narrow(1, self.start, self.len)?.contiguous()?, 1, 0)?;
            }
        }
        self.bufs = Some((k, v));
        self.start = 0;
        self.cap = cap;
        Ok(())
    }

    fn live(&self) -> Result<Option<(Tensor, Tensor)>> {
        match &self.bufs {
            Some((k, v)) if self.len > 0 => Ok(Some((
                k.narrow(1, self.start, self.len)?,
                v.narrow(1, self.start, self.len)?,
            ))),
            _ => Ok(None),
        }
    }
}

impl DenseStorage {
    /// The precision's byte formula for `tokens` tokens of this layer's shape.
    fn held(&self, tokens: usize) -> usize {
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        self.precision.held_bytes(h, d, tokens).unwrap_or(u64::MAX) as usize
    }
}

impl KvStorage for DenseStorage {
    fn precision(&self) -> KvPrecision {
        self.precision
    }

    fn write_state(&self, w: &mut WireWriter) -> Result<()> {
        self.write_held(w)
    }

    fn read_state(&mut self, r: &mut WireReader) -> Result<()> {
        self.read_held(r)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (h, t, d) = k.dims3()?;
        if (h, d) != (self.shape.n_kv_heads, self.shape.head_dim) || v.dims3()? != (h, t, d) {
            return Err(EngineError::invalid(format!(
                "append: k {:?} / v {:?} do not match a cache of {} kv heads × {}",
                k.dims(),
                v.dims(),
                self.shape.n_kv_heads,
                self.shape.head_dim
            )));
        }
        if t == 0 {
            return Ok(());
        }
        if self.start + self.len + t > self.cap {
            // Room with a bounded spare (see `allocated_tokens`); a sliding window that has
            // room compacts in place.
            let need = allocated_tokens(self.len + t);
            self.reallocate(if self.len + t > self.cap {
                need
            } else {
                self.cap
            })?;
        }
        let (kb, vb) = self
            .bufs
            .as_ref()
            .ok_or_else(|| EngineError::invalid("cache buffer missing after allocation"))?;
        let at = self.start + self.len;
        kb.slice_set(&k.to_dtype(self.dtype())?.contiguous()?, 1, at)?;
        vb.slice_set(&v.to_dtype(self.dtype())?.contiguous()?, 1, at)?;
        self.len += t;
        Ok(())
    }

    fn attend(&self, q: &Tensor, spec: &AttendSpec) -> Result<Tensor> {
        let (k, v) = self
            .live()?
            .ok_or_else(|| EngineError::invalid("attend on an empty cache"))?;
        attend_dense(q, &k, &v, spec)
    }

    fn drop_front(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::invalid(format!(
                "drop_front({n}) on a cache of {} tokens",
                self.len
            )));
        }
        self.start += n;
        self.len -= n;
        if self.len == 0 {
            self.start = 0;
        }
        // After a prefill chunk a sliding layer keeps a window: give the rest back, so what
        // it allocates between steps is the room of what it holds (a copy of the window once
        // per chunk; between chunks the spare absorbs the window's steps).
        let fit = allocated_tokens(self.len);
        if self.cap > fit {
            self.reallocate(fit)?;
        }
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(EngineError::invalid(format!(
                "truncate({len}) on a cache of {} tokens",
                self.len
            )));
        }
        self.len = len;
        if len == 0 {
            self.start = 0;
        }
        Ok(())
    }

    fn bytes_used(&self) -> usize {
        self.held(self.len)
    }

    fn bytes_allocated(&self) -> usize {
        self.held(self.cap)
    }

    fn to_dense_range(&self, from: usize, len: usize) -> Result<(Tensor, Tensor)> {
        if from + len > self.len {
            return Err(EngineError::invalid(format!(
                "to_dense_range({from}, {len}) on a cache of {} tokens",
                self.len
            )));
        }
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        match &self.bufs {
            Some((k, v)) if len > 0 => Ok((
                k.narrow(1, self.start + from, len)?
                    .to_dtype(DType::F32)?
                    .contiguous()?,
                v.narrow(1, self.start + from, len)?
                    .to_dtype(DType::F32)?
                    .contiguous()?,
            )),
            _ => {
                let z = Tensor::zeros((h, 0, d), DType::F32, &self.shape.device)?;
                Ok((z.clone(), z))
            }
        }
    }

    fn to_dense(&self) -> Result<(Tensor, Tensor)> {
        match self.live()? {
            Some((k, v)) => Ok((
                k.to_dtype(DType::F32)?.contiguous()?,
                v.to_dtype(DType::F32)?.contiguous()?,
            )),
            None => {
                let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
                let z = Tensor::zeros((h, 0, d), DType::F32, &self.shape.device)?;
                Ok((z.clone(), z))
            }
        }
    }
}

impl DenseStorage {
    /// The held tokens' keys then values, exactly as stored: `[len][k bytes][v bytes]`, each
    /// tensor `[n_kv_heads, len, head_dim]` row-major in the storage dtype.
    pub(super) fn write_held(&self, w: &mut WireWriter) -> Result<()> {
        w.len(self.len);
        if let Some((k, v)) = self.live()? {
            for t in [k, v] {
                let t = t.contiguous()?.flatten_all()?.to_device(&Device::Cpu)?;
                match t.dtype() {
                    DType::F32 => w.f32s(&t.to_vec1::<f32>()?),
                    DType::F16 => {
                        w.u16s(t.to_vec1::<half::f16>()?.into_iter().map(|x| x.to_bits()))
                    }
                    DType::BF16 => {
                        w.u16s(t.to_vec1::<half::bf16>()?.into_iter().map(|x| x.to_bits()))
                    }
                    other => {
                        return Err(EngineError::invalid(format!("no saved form for {other:?}")))
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads what [`DenseStorage::write_state`] wrote into this empty storage.
    pub(super) fn read_held(&mut self, r: &mut WireReader) -> Result<()> {
        if self.len != 0 {
            return Err(EngineError::invalid(
                "restore into a cache that holds tokens",
            ));
        }
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        let elem = self.dtype().size_in_bytes();
        let per_token = 2 * h * d * elem;
        let len = r.len(r.remaining() / per_token.max(1), "a layer's token count")?;
        if len == 0 {
            return Ok(());
        }
        let n = h * len * d;
        let mut side = || -> Result<Tensor> {
            let shape = (h, len, d);
            let device = &self.shape.device;
            Ok(match self.dtype() {
                DType::F32 => Tensor::from_vec(r.f32s(n)?, shape, device)?,
                DType::F16 => {
                    let v: Vec<half::f16> =
                        r.u16s(n)?.into_iter().map(half::f16::from_bits).collect();
                    Tensor::from_vec(v, shape, device)?
                }
                DType::BF16 => {
                    let v: Vec<half::bf16> =
                        r.u16s(n)?.into_iter().map(half::bf16::from_bits).collect();
                    Tensor::from_vec(v, shape, device)?
                }
                other => return Err(EngineError::invalid(format!("no saved form for {other:?}"))),
            })
        };
        let k = side()?;
        let v = side()?;
        self.append(&k, &v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn shape() -> StorageShape {
        StorageShape::new(2, 4, Device::Cpu)
    }

    fn chunk(start: usize, t: usize) -> Tensor {
        let data: Vec<f32> = (0..2 * t * 4).map(|i| (start * 100 + i) as f32).collect();
        Tensor::from_vec(data, (2, t, 4), &Device::Cpu).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn grows_in_blocks_and_reports_exact_bytes() -> Result<()> {
        let mut s = DenseStorage::new(KvPrecision::F16, shape());
        assert_eq!(s.bytes_allocated(), 0);
        s.append(&chunk(0, 3), &chunk(0, 3))?;
        assert_eq!(s.len(), 3);
        assert_eq!(s.bytes_used(), 2 * 3 * 2 * 4 * 2);
        assert_eq!(s.bytes_allocated(), 2 * 2 * BLOCK_TOKENS * 2 * 4 * 2);
        Ok(())
    }

    #[test]
    fn drop_front_and_truncate_keep_the_right_tokens() -> Result<()> {
        let mut s = DenseStorage::new(KvPrecision::F32, shape());
        s.append(&chunk(0, 5), &chunk(0, 5))?;
        s.drop_front(2)?;
        s.truncate(2)?;
        let (k, _) = s.to_dense()?;
        let expect = chunk(0, 5).narrow(1, 2, 2)?;
        let diff = (k - expect)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        assert!(s.truncate(3).is_err());
        assert!(s.drop_front(3).is_err());
        Ok(())
    }

    #[test]
    fn compaction_preserves_order_across_many_appends() -> Result<()> {
        let mut s = DenseStorage::new(KvPrecision::F32, shape());
        let mut all = Vec::new();
        for step in 0..700 {
            let c = chunk(step, 1);
            s.append(&c, &c)?;
            all.push(c);
            if s.len() > 7 {
                s.drop_front(s.len() - 7)?;
            }
        }
        let (k, _) = s.to_dense()?;
        let expect = Tensor::cat(&all[all.len() - 7..], 1)?;
        let diff = (k - expect)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        assert!(s.bytes_allocated() <= 2 * 2 * 2 * BLOCK_TOKENS * 4 * 4);
        Ok(())
    }
}
