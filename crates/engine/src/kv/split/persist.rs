//! A split layer's saved state: per side and kv head its calibration (offset, weights), its
//! sink and its segments, each by its format, read back exactly or refused.

use super::*;

/// Segment kinds in a saved side.
pub(super) const SEG_CODES: u8 = 0;
pub(super) const SEG_DENSE: u8 = 1;
pub(super) const SEG_BLOCKS: u8 = 2;

impl Side {
    /// Per head: the offset (flag, then `dim` f32), for a `+qw` side the weights (the same),
    /// then its segments (kind, byte length, bytes: a `CodeBlock`'s records, or f16 rows).
    pub(super) fn write_state(&self, w: &mut WireWriter) {
        w.len(self.heads.len());
        for (h, segs) in self.heads.iter().enumerate() {
            // Weights only for `+qw` sides, so other files read as before `+qw` existed.
            let weighted = if self.weigh {
                Some(&self.weights[h])
            } else {
                None
            };
            for v in std::iter::once(&self.offsets[h]).chain(weighted) {
                match v {
                    Some(o) => {
                        w.u8(1);
                        w.f32s(o);
                    }
                    None => w.u8(0),
                }
            }
            // Sinks only for `+sink` sides: 0 none, 1 held, 2 kept past a dropped segment.
            if self.sink {
                match &self.sinks[h] {
                    Some(row) => {
                        w.u8(if self.sink_dropped { 2 } else { 1 });
                        w.u16s(row.iter().map(|x| x.to_bits()));
                    }
                    None => w.u8(0),
                }
            }
            w.len(segs.len());
            for seg in segs {
                match seg {
                    Seg::Codes(b) => {
                        let bytes = b.to_bytes();
                        w.u8(SEG_CODES);
                        w.len(bytes.len());
                        w.bytes(&bytes);
                    }
                    Seg::Dense(v) => {
                        let bytes = v.to_bytes();
                        w.u8(SEG_DENSE);
                        w.len(bytes.len());
                        w.bytes(&bytes);
                    }
                    Seg::Blocks(v) => {
                        w.u8(SEG_BLOCKS);
                        w.len(v.len());
                        w.bytes(v);
                    }
                }
            }
        }
    }

    /// Reads what [`Side::write_state`] wrote into this empty side; every head must then
    /// hold `total` tokens in full segments but the last.
    pub(super) fn read_state(&mut self, r: &mut WireReader, total: usize) -> Result<()> {
        let heads = r.len(self.heads.len(), "the kv head count")?;
        if heads != self.heads.len() {
            return Err(corrupt(format!(
                "{heads} kv heads saved, the layer has {}",
                self.heads.len()
            )));
        }
        let d = self.dim;
        for h in 0..heads {
            self.offsets[h] = match r.u8()? {
                0 => None,
                1 if self.center => Some(r.f32s(d)?),
                flag => return Err(corrupt(format!("offset flag {flag}"))),
            };
            let flag = if self.weigh { r.u8()? } else { 0 };
            self.weights[h] = match flag {
                0 => None,
                1 => {
                    let w = r.f32s(d)?;
                    if w.iter().any(|x| !x.is_finite() || *x <= 0.0) {
                        return Err(corrupt("a channel weight is not a positive number"));
                    }
                    Some(w)
                }
                flag => return Err(corrupt(format!("weights flag {flag}"))),
            };
            let flag = if self.sink { r.u8()? } else { 0 };
            self.sinks[h] = match flag {
                0 => None,
                1 | 2 if total > 0 => {
                    if h > 0 && self.sink_dropped != (flag == 2) {
                        return Err(corrupt("kv heads saved with their sinks both held and not"));
                    }
                    self.sink_dropped = flag == 2;
                    let row: Vec<f16> = r.u16s(d)?.into_iter().map(f16::from_bits).collect();
                    if row.iter().any(|x| !x.is_finite()) {
                        return Err(corrupt("a first token that is not a finite f16 row"));
                    }
                    Some(row)
                }
                flag => return Err(corrupt(format!("sink flag {flag} with {total} tokens"))),
            };
            if self.sink && total > 0 && self.sinks[h].is_none() {
                return Err(corrupt("a `+sink` layer saved without its first token"));
            }
            // A calibrating side saved before it calibrated has neither, and f16 rows.
            if self.center || self.weigh {
                let calibrated = self.offsets[h].is_some() || self.weights[h].is_some();
                if h == 0 && calibrated {
                    self.store.set_calibrated(true);
                } else if calibrated != self.store.waiting().is_none() {
                    return Err(corrupt("kv heads saved both calibrated and not"));
                }
            }
            let n = r.len(total.div_ceil(SEGMENT_TOKENS), "a head's segment count")?;
            let mut segs = Vec::with_capacity(n);
            for _ in 0..n {
                let kind = r.u8()?;
                let len = r.len(r.remaining(), "a segment's size")?;
                let bytes = r.take(len)?;
                let row = self.bytes_per_vector();
                let seg = match (kind, self.store.codec()) {
                    (SEG_CODES, Some(codec)) => Seg::Codes(CodeBlock::from_bytes(codec, bytes)?),
                    (SEG_BLOCKS, None) if self.store.block().is_some() && len % row == 0 => {
                        Seg::Blocks(bytes.to_vec())
                    }
                    (SEG_DENSE, None) if self.store.block().is_none() && len % row == 0 => {
                        Seg::Dense(DenseRows::from_bytes(self.store.dense(), bytes))
                    }
                    _ => {
                        return Err(corrupt(format!(
                            "segment kind {kind} of {len} bytes does not fit this side"
                        )))
                    }
                };
                segs.push(seg);
            }
            let lens: Vec<usize> = segs.iter().map(|s| self.seg_len(s)).collect();
            let held: usize = lens.iter().sum();
            let full_but_last = lens.iter().rev().skip(1).all(|&l| l == SEGMENT_TOKENS);
            if held != total || !full_but_last || lens.last().is_some_and(|&l| l == 0) {
                return Err(corrupt(format!(
                    "head {h} holds {held} tokens in segments {lens:?}, the layer {total}"
                )));
            }
            self.heads[h] = segs;
        }
        Ok(())
    }
}

impl SplitStorage {
    /// `[total][front]`, then keys, then values.
    pub(super) fn write_held(&self, w: &mut WireWriter) -> Result<()> {
        w.len(self.total);
        w.len(self.front);
        self.key.write_state(w);
        self.value.write_state(w);
        Ok(())
    }

    /// Reads what [`SplitStorage::write_state`] wrote into this empty storage.
    pub(super) fn read_held(&mut self, r: &mut WireReader) -> Result<()> {
        if self.total != 0 {
            return Err(EngineError::invalid(
                "restore into a cache that holds tokens",
            ));
        }
        // Every stored token takes at least one byte per head and side.
        let total = r.len(r.remaining(), "a layer's stored tokens")?;
        let front = r.len(total.min(SEGMENT_TOKENS - 1), "a layer's dropped front")?;
        self.key.read_state(r, total)?;
        self.value.read_state(r, total)?;
        self.total = total;
        self.front = front;
        Ok(())
    }
}
