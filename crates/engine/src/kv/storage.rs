//! The storage seam of the KV cache: one [`KvStorage`] per cache-owning layer holds that
//! layer's keys and values in some precision and computes attention over them itself, so a
//! compressed storage never has to hand out dense tensors on the hot path.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::format::{KvPrecision, CALIBRATION_ROWS};
use super::wire::{WireReader, WireWriter};
use crate::error::Result;

/// Which stored keys a block of queries may see, in absolute token positions.
///
/// Query row `i` sits at position `query_start + i`; stored key `j` at `key_start + j`.
/// Key at position `k` is visible to the query at `q` iff `k ≤ q` and, with a window `W`,
/// `q − k < W` (exactly `W` keys including the query's own). A query inside `both_ways`
/// also sees the later keys of that span (an image's soft tokens on Gemma 4's sliding
/// layers: the window still bounds how far back, nothing bounds the span ahead).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttendSpec {
    /// Absolute position of the first query row.
    pub query_start: usize,
    /// Absolute position of the first stored key.
    pub key_start: usize,
    /// Sliding window, or `None` for full causal attention.
    pub window: Option<usize>,
    /// Multiplier on q·k before the softmax.
    pub scale: f64,
    /// Positions `[a, b)` that attend to each other both ways, or `None`.
    pub both_ways: Option<(usize, usize)>,
}

impl AttendSpec {
    /// The key positions `[lo, hi)` the query at `qp` sees among `stored` keys from
    /// `key_start` (empty, `hi ≤ lo`, when it sees none): the one rule every path applies.
    pub fn visible(&self, qp: usize, stored: usize) -> (usize, usize) {
        let lo = match self.window {
            Some(w) => self.key_start.max((qp + 1).saturating_sub(w)),
            None => self.key_start,
        };
        let end = match self.both_ways {
            Some((a, b)) if (a..b).contains(&qp) => b,
            _ => qp + 1,
        };
        (lo, (self.key_start + stored).min(end))
    }
}

#[cfg(test)]
mod tests {
    use super::AttendSpec;

    #[test]
    fn a_both_ways_span_sees_ahead_within_itself_and_the_window_still_bounds_behind() {
        let spec = AttendSpec {
            query_start: 10,
            key_start: 2,
            window: Some(4),
            scale: 1.0,
            both_ways: Some((12, 16)),
        };
        // Before, inside and after the span, 20 keys stored from position 2.
        assert_eq!(spec.visible(11, 20), (8, 12));
        assert_eq!(spec.visible(12, 20), (9, 16));
        assert_eq!(spec.visible(15, 20), (12, 16));
        assert_eq!(spec.visible(16, 20), (13, 17));
        // Keys not yet stored are not seen, whatever the span says.
        assert_eq!(spec.visible(12, 12), (9, 14));
        let causal = AttendSpec {
            window: None,
            ..spec
        };
        assert_eq!(causal.visible(13, 20), (2, 16));
    }
}

/// One layer's K/V store. Object-safe so precisions can be swapped at run time.
///
/// Shapes: keys and values enter as `[n_kv_heads, t, head_dim]`; queries as
/// `[n_heads, t, head_dim]` with `n_heads` a multiple of `n_kv_heads` (query head `h` reads
/// kv head `h / (n_heads / n_kv_heads)`); [`KvStorage::attend`] returns `[n_heads, t, head_dim]`
/// in the query's dtype.
pub trait KvStorage: Send + std::fmt::Debug {
    /// The precision this storage keeps.
    fn precision(&self) -> KvPrecision;
    /// Number of tokens held.
    fn len(&self) -> usize;
    /// True when no token is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends a chunk of `t` tokens at the end.
    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()>;
    /// Whether this storage still wants the queries' per-channel energy
    /// ([`KvStorage::set_query_energy`]): a `+qw` TurboQuant storage whose weights are not
    /// all fixed yet.
    fn wants_query_energy(&self) -> bool {
        false
    }
    /// Σ q_j² per kv head and channel (`n_kv_heads × head_dim`, each kv head summing its
    /// query group) over the query rows the cache has seen, given before the appends that
    /// follow them.
    fn set_query_energy(&mut self, _energy: &[f64]) {}
    /// Whether some side still holds its first rows as f16, waiting to calibrate on
    /// [`StorageShape::calibration_rows`] of them (a TurboQuant side that centers or weighs).
    fn calibrating(&self) -> bool {
        false
    }
    /// Calibrates now on the rows held, without waiting for more, if they are at least
    /// [`MIN_CALIBRATION_ROWS`] (a switch's new storage, filled with every row it will get).
    fn calibrate_now(&mut self) -> Result<()> {
        Ok(())
    }
    /// softmax(scale·q·kᵀ + mask)·v over the held tokens, computed by the storage.
    fn attend(&self, q: &Tensor, spec: &AttendSpec) -> Result<Tensor>;
    /// Forgets the `n` oldest tokens (sliding windows).
    fn drop_front(&mut self, n: usize) -> Result<()>;
    /// Keeps only the first `len` tokens (rewinds).
    fn truncate(&mut self, len: usize) -> Result<()>;
    /// Bytes that hold live tokens.
    fn bytes_used(&self) -> usize;
    /// Bytes reserved, live or not.
    fn bytes_allocated(&self) -> usize;
    /// Decodes everything held to f32 `[n_kv_heads, len, head_dim]` (K, V). For conversion
    /// between precisions and for tests only, never on the decode path.
    fn to_dense(&self) -> Result<(Tensor, Tensor)>;
    /// Decodes held tokens `from..from + len` to f32 `[n_kv_heads, len, head_dim]` (K, V), so
    /// a precision switch can convert a layer in pieces instead of decoding all of it at once.
    fn to_dense_range(&self, from: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let (k, v) = self.to_dense()?;
        Ok((k.narrow(1, from, len)?, v.narrow(1, from, len)?))
    }
    /// Writes everything held, exactly as held (a cache file's layer section,
    /// [`super::persist`]).
    fn write_state(&self, w: &mut WireWriter) -> Result<()>;
    /// Reads a state [`KvStorage::write_state`] wrote into this empty storage of the same
    /// precision and shape; a state that does not fit them is `cache_corrupt`.
    fn read_state(&mut self, r: &mut WireReader) -> Result<()>;
    /// What this storage has converted and moved between devices so far (zeros for a
    /// storage that never converts nor crosses devices).
    fn traffic(&self) -> StorageTraffic {
        StorageTraffic::default()
    }
}

/// Counters of a storage's work beyond attention itself: dense conversions (which must
/// never happen on the decode path) and device crossings (what attention costs in
/// transfers when the storage's home is apart from the model's device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageTraffic {
    /// Calls that decoded held tokens into dense tensors (`to_dense`, `to_dense_range`).
    pub dense_conversions: u64,
    /// Tokens × kv heads decoded by those calls.
    pub dense_rows: u64,
    /// Attention calls whose query crossed to the home device and whose output crossed back.
    pub crossings: u64,
    /// Floats moved by those crossings: the query rows in plus the output rows back.
    pub crossed_floats: u64,
    /// Floats of new keys and values brought to the home device by appends.
    pub appended_floats: u64,
}

impl std::ops::Add for StorageTraffic {
    type Output = StorageTraffic;
    fn add(self, o: StorageTraffic) -> StorageTraffic {
        StorageTraffic {
            dense_conversions: self.dense_conversions + o.dense_conversions,
            dense_rows: self.dense_rows + o.dense_rows,
            crossings: self.crossings + o.crossings,
            crossed_floats: self.crossed_floats + o.crossed_floats,
            appended_floats: self.appended_floats + o.appended_floats,
        }
    }
}

/// Shape of one layer's cache, enough for a storage factory.
#[derive(Debug, Clone)]
pub struct StorageShape {
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// The model's device: where keys and values arrive from, queries come from, attention
    /// outputs must go, and dense conversions are placed.
    pub device: Device,
    /// Where a storage that keeps its data apart from the model keeps it and attends
    /// (TurboQuant on a GPU model: the CPU, whose memory is the GPU's on Apple Silicon).
    /// `None`: wherever the storage's kind decides (dense storages on `device`, TurboQuant on
    /// the CPU, crossing only when `device` is not the CPU). `Some` sets the home apart
    /// explicitly, so every attention call crosses, even between two CPU placements (how
    /// tests exercise the crossing on a machine without a GPU). Dense storages keep their
    /// tensors on `device` and ignore it.
    pub home: Option<Device>,
    /// Rows a calibrating TurboQuant side holds as f16 before it calibrates on them: the
    /// model's [`calibration_rows`] in a cache, [`CALIBRATION_ROWS`] from
    /// [`StorageShape::new`]; at most a segment.
    pub calibration_rows: usize,
}

impl StorageShape {
    /// A shape on `device` with the default home (see [`StorageShape::home`]).
    pub fn new(n_kv_heads: usize, head_dim: usize, device: Device) -> Self {
        Self {
            n_kv_heads,
            head_dim,
            device,
            home: None,
            calibration_rows: CALIBRATION_ROWS,
        }
    }
}
