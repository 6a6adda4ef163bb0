//! `CodeBlock`: the stored vectors of one stream (e.g. one head's tokens), as fixed-size
//! records in fixed-capacity chunks, so memory grows a chunk at a time and is never
//! preallocated for a maximum length.

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::spec::Spec;

/// Default vectors per chunk: small enough that the unused tail stays a few KiB.
pub const DEFAULT_CHUNK_VECTORS: usize = 128;

/// Many encoded vectors of one (dim, spec). Built by [`crate::Codec::new_block`] and filled
/// by [`crate::Codec::encode`] / [`crate::Codec::encode_batch`].
#[derive(Clone, Debug)]
pub struct CodeBlock {
    pub(crate) dim: usize,
    pub(crate) spec: Spec,
    pub(crate) stride: usize,
    chunk_vectors: usize,
    /// Each chunk has capacity `chunk_vectors * stride`; all but the last are full.
    chunks: Vec<Vec<u8>>,
    len: usize,
}

impl CodeBlock {
    pub(crate) fn new(layout: &Layout, spec: Spec, chunk_vectors: usize) -> Self {
        CodeBlock {
            dim: layout.dim,
            spec,
            stride: layout.stride,
            chunk_vectors: chunk_vectors.max(1),
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Number of stored vectors.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when no vector is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Dimension of the stored vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The spec the vectors were encoded with.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }
    /// Bytes per stored vector (equals [`crate::bytes_per_vector`]).
    pub fn bytes_per_vector(&self) -> usize {
        self.stride
    }
    /// Bytes holding stored vectors: `len() * bytes_per_vector()`.
    pub fn bytes_used(&self) -> usize {
        self.len * self.stride
    }
    /// Bytes reserved from the allocator (used bytes plus the unfilled part of the last chunk).
    pub fn bytes_allocated(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    /// Keeps the first `len` vectors (no-op if already shorter) and frees emptied chunks.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let keep_chunks = len.div_ceil(self.chunk_vectors);
        self.chunks.truncate(keep_chunks);
        if let Some(last) = self.chunks.last_mut() {
            let in_last = len - (keep_chunks - 1) * self.chunk_vectors;
            last.truncate(in_last * self.stride);
        }
        self.len = len;
    }

    /// Removes every vector and frees all chunks.
    pub fn clear(&mut self) {
        self.chunks = Vec::new();
        self.len = 0;
    }

    /// The stored bytes of vector `i`.
    pub fn record(&self, i: usize) -> Result<&[u8]> {
        if i >= self.len {
            return Err(Error::IndexOutOfRange {
                index: i,
                len: self.len,
            });
        }
        let c = &self.chunks[i / self.chunk_vectors];
        let off = (i % self.chunk_vectors) * self.stride;
        Ok(&c[off..off + self.stride])
    }

    /// All records, concatenated in order (the serialization read by [`Self::from_bytes`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes_used());
        for c in &self.chunks {
            out.extend_from_slice(c);
        }
        out
    }

    /// Rebuilds a block from [`Self::to_bytes`] output for the given codec. Any bytes of the
    /// right length are accepted (every bit pattern decodes); a length that is not a whole
    /// number of records is [`Error::TruncatedBlock`].
    pub fn from_bytes(codec: &crate::Codec, bytes: &[u8]) -> Result<Self> {
        let mut block = codec.new_block();
        let stride = block.stride;
        if !bytes.len().is_multiple_of(stride) {
            return Err(Error::TruncatedBlock {
                len: bytes.len(),
                stride,
            });
        }
        for rec in bytes.chunks_exact(stride) {
            block.push_zeroed(1).copy_from_slice(rec);
        }
        Ok(block)
    }

    /// Contiguous runs of whole records, in order.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().map(|c| c.as_slice())
    }

    /// The records `records` as contiguous runs, each with the index of its first record:
    /// the chunks clipped to the range, in order. `IndexOutOfRange` for a range past the
    /// block (or reversed).
    pub(crate) fn chunks_in(
        &self,
        records: std::ops::Range<usize>,
    ) -> Result<impl Iterator<Item = (usize, &[u8])>> {
        if records.start > records.end || records.end > self.len {
            return Err(Error::IndexOutOfRange {
                index: records.end.max(records.start),
                len: self.len,
            });
        }
        let stride = self.stride;
        let mut first = 0;
        Ok(self.chunks().filter_map(move |whole| {
            let start = first;
            first += whole.len() / stride;
            let (base, end) = (records.start.max(start), records.end.min(first));
            (base < end).then(|| {
                (
                    base,
                    &whole[(base - start) * stride..(end - start) * stride],
                )
            })
        }))
    }

    /// Appends up to the end of the current chunk (or a new chunk) `n` zeroed records
    /// and returns them; callers loop until all requested records are added.
    fn push_zeroed(&mut self, n: usize) -> &mut [u8] {
        let need_new = match self.chunks.last() {
            None => true,
            Some(c) => c.len() == self.chunk_vectors * self.stride,
        };
        if need_new {
            self.chunks
                .push(Vec::with_capacity(self.chunk_vectors * self.stride));
        }
        let stride = self.stride;
        let cap_vectors = self.chunk_vectors;
        let last = self.chunks.len() - 1;
        let c = &mut self.chunks[last];
        let have = c.len() / stride;
        let take = n.min(cap_vectors - have);
        let start = c.len();
        c.resize(start + take * stride, 0);
        self.len += take;
        &mut c[start..]
    }

    /// Appends `n` zeroed records and returns the mutable record runs that hold them.
    pub(crate) fn grow(&mut self, n: usize) -> Vec<&mut [u8]> {
        let first_chunk = self.chunks.len();
        let old_last_len = self.chunks.last().map(|c| c.len());
        let mut left = n;
        while left > 0 {
            let got = self.push_zeroed(left).len() / self.stride;
            left -= got;
        }
        // Collect the new regions: the tail of the previously-last chunk, then new chunks.
        let mut out = Vec::new();
        let start_chunk = if old_last_len.is_some() {
            first_chunk - 1
        } else {
            first_chunk
        };
        for (k, c) in self.chunks[start_chunk..].iter_mut().enumerate() {
            let from = if k == 0 { old_last_len.unwrap_or(0) } else { 0 };
            if from < c.len() {
                out.push(&mut c[from..]);
            }
        }
        out
    }
}
