//! Checks a GGUF file's header against the file's length before any parser trusts it: every
//! declared count, string, array, dimension and offset must fit in the bytes that follow, so
//! nothing is ever allocated (or sought) because a header said so. The walk reads the header
//! through a small buffer, skipping strings and values without holding them; what it keeps
//! (tensor extents, tensor names for duplicates) is proportional to the bytes present. It
//! enforces ggml's own rules (at most 4 dimensions, known tensor types, rows that hold whole
//! blocks, aligned offsets, a power-of-two alignment) and caps no real model comes near, so
//! candle's reader and the vocabulary builder only ever see a header that is consistent.

use std::collections::HashSet;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::quantized::GgmlDType;

/// Longest string value (ggml: `GGUF_MAX_STRING_LENGTH` is 1 GiB; no real one is near).
const MAX_STRING: u64 = 1 << 30;
/// Longest key or tensor name (ggml caps tensor names at 64 bytes).
const MAX_NAME: u64 = 1 << 16;
/// Arrays nest at most this deep (real files never nest).
const MAX_DEPTH: usize = 4;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Largest `general.alignment` accepted.
const MAX_ALIGNMENT: u64 = 1 << 20;
/// Longest vocabulary piece: Gemma's longest is 93 bytes; building merges costs the square of
/// a piece's length, so one huge piece could stall the tokenizer for minutes.
pub const MAX_PIECE: u64 = 1024;
/// Most vocabulary entries (Gemma: 262,144).
pub const MAX_TOKENS: u64 = 1 << 22;

/// Keys whose arrays form the vocabulary: they must have one entry per token.
const TOKENS: &str = "tokenizer.ggml.tokens";
const PER_TOKEN: [&str; 2] = ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"];
const MERGES: &str = "tokenizer.ggml.merges";
const ALIGNMENT: &str = "general.alignment";

/// The tensor types candle reads, by their GGUF code.
fn tensor_type(code: u32) -> Option<GgmlDType> {
    use GgmlDType as G;
    Some(match code {
        0 => G::F32,
        1 => G::F16,
        2 => G::Q4_0,
        3 => G::Q4_1,
        6 => G::Q5_0,
        7 => G::Q5_1,
        8 => G::Q8_0,
        9 => G::Q8_1,
        10 => G::Q2K,
        11 => G::Q3K,
        12 => G::Q4K,
        13 => G::Q5K,
        14 => G::Q6K,
        15 => G::Q8K,
        30 => G::BF16,
        _ => return None,
    })
}

/// Bytes one value of GGUF value type `t` takes at least on disk (`None`: unknown type).
fn min_size(t: u32, len_bytes: u64) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => len_bytes,
        9 => 4 + len_bytes,
        _ => return None,
    })
}

/// What a checked header holds, for the caller's own checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufLayout {
    /// Tensors in the directory.
    pub tensors: u64,
    /// Metadata entries.
    pub metadata: u64,
    /// Where tensor data starts.
    pub data_start: u64,
    /// Entries of `tokenizer.ggml.tokens` (0 without a vocabulary).
    pub vocabulary: u64,
}

struct Walker<R> {
    r: BufReader<R>,
    pos: u64,
    len: u64,
    /// Bytes of a string's length prefix (4 in GGUF v1, 8 after).
    len_bytes: u64,
}

impl<R: Read + Seek> Walker<R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<(), String> {
        if n > self.left() {
            return Err(format!(
                "{} needs {n} bytes at offset {}, but the file ends {} bytes later",
                what(),
                self.pos,
                self.left()
            ));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        self.need(N as u64, &|| what.to_owned())?;
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("{what}: {e}"))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// A length prefix (u32 in v1, u64 after).
    fn length(&mut self, what: &str) -> Result<u64, String> {
        if self.len_bytes == 4 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<(), String> {
        self.need(n, what)?;
        let step = i64::try_from(n).map_err(|_| format!("{}: {n} bytes", what()))?;
        self.r
            .seek_relative(step)
            .map_err(|e| format!("{}: {e}", what()))?;
        self.pos += n;
        Ok(())
    }

    /// A string's length, checked against `max` and the file, and the string skipped.
    fn skip_string(&mut self, max: u64, what: &dyn Fn() -> String) -> Result<u64, String> {
        let n = self.length(&what())?;
        if n > max {
            return Err(format!("{} is {n} bytes long (at most {max})", what()));
        }
        self.skip(n, what)?;
        Ok(n)
    }

    /// A short string (a key or a name), read.
    fn name(&mut self, what: &dyn Fn() -> String) -> Result<Vec<u8>, String> {
        let n = self.length(&what())?;
        if n > MAX_NAME {
            return Err(format!("{} is {n} bytes long (at most {MAX_NAME})", what()));
        }
        self.need(n, what)?;
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("{}: {e}", what()))?;
        self.pos += n;
        Ok(b)
    }

    /// Skips one value of type `t`; returns the array length for arrays.
    fn skip_value(
        &mut self,
        t: u32,
        depth: usize,
        piece_cap: Option<u64>,
        what: &dyn Fn() -> String,
    ) -> Result<Option<u64>, String> {
        match t {
            8 => {
                self.skip_string(piece_cap.unwrap_or(MAX_STRING), what)?;
                Ok(None)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(format!("{} nests arrays deeper than {MAX_DEPTH}", what()));
                }
                let et = self.u32(&what())?;
                let min = min_size(et, self.len_bytes)
                    .ok_or_else(|| format!("{} holds values of unknown type {et}", what()))?;
                let n = self.length(&what())?;
                // Every element takes at least `min` bytes: a longer array cannot be here.
                let need = n.saturating_mul(min);
                self.need(need, &|| format!("{} of {n} entries", what()))?;
                for i in 0..n {
                    self.skip_value(et, depth + 1, piece_cap, &|| format!("{}[{i}]", what()))?;
                }
                Ok(Some(n))
            }
            _ => {
                let n = min_size(t, self.len_bytes)
                    .ok_or_else(|| format!("{} has unknown value type {t}", what()))?;
                self.skip(n, what)?;
                Ok(None)
            }
        }
    }

    /// An unsigned integer value of type `t`.
    fn uint(&mut self, t: u32, what: &str) -> Result<u64, String> {
        Ok(match t {
            0 => u64::from(self.bytes::<1>(what)?[0]),
            2 => u64::from(u16::from_le_bytes(self.bytes::<2>(what)?)),
            4 => u64::from(self.u32(what)?),
            10 => self.u64(what)?,
            1 | 3 | 5 | 11 => {
                let v = match t {
                    1 => i64::from(self.bytes::<1>(what)?[0] as i8),
                    3 => i64::from(i16::from_le_bytes(self.bytes::<2>(what)?)),
                    5 => i64::from(self.u32(what)? as i32),
                    _ => self.u64(what)? as i64,
                };
                u64::try_from(v).map_err(|_| format!("{what} is negative"))?
            }
            _ => return Err(format!("{what} is not an integer (type {t})")),
        })
    }
}

/// Checks the GGUF file at `path`; the error says what lies and where.
pub fn check_file(path: &Path) -> Result<GgufLayout, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    check(file, len)
}

/// Checks a GGUF header read from `r` (positioned at its start) in a file of `len` bytes.
pub fn check<R: Read + Seek>(r: R, len: u64) -> Result<GgufLayout, String> {
    let mut w = Walker {
        r: BufReader::with_capacity(64 << 10, r),
        pos: 0,
        len,
        len_bytes: 8,
    };
    let magic = w.bytes::<4>("the magic")?;
    if &magic != b"GGUF" {
        return Err(format!("not a GGUF file (magic {magic:02x?})"));
    }
    let version = w.u32("the version")?;
    w.len_bytes = match version {
        1 => 4,
        2 | 3 => 8,
        v => return Err(format!("unsupported GGUF version {v}")),
    };
    let tensors = w.length("the tensor count")?;
    let metadata = w.length("the metadata count")?;
    // The smallest entries: a key and a type and one byte; a name, dims, type and offset.
    let kv_min = w.len_bytes + 4 + 1;
    let tensor_min = w.len_bytes + 4 + 4 + 8;
    let need = metadata
        .checked_mul(kv_min)
        .and_then(|a| {
            tensors
                .checked_mul(tensor_min)
                .and_then(|b| a.checked_add(b))
        })
        .unwrap_or(u64::MAX);
    w.need(need, &|| {
        format!("a header of {tensors} tensors and {metadata} metadata entries")
    })?;

    let mut alignment = 32u64;
    let mut vocabulary = None;
    let mut per_token = Vec::new();
    for k in 0..metadata {
        let key = w.name(&|| format!("metadata key {k}"))?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let t = w.u32(&format!("the type of `{key}`"))?;
        let what = || format!("`{key}`");
        if key == ALIGNMENT {
            alignment = w.uint(t, "`general.alignment`")?;
            if alignment == 0 || !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
                return Err(format!(
                    "`general.alignment` is {alignment}: it must be a power of two up to {MAX_ALIGNMENT}"
                ));
            }
            continue;
        }
        let cap = match key.as_str() {
            TOKENS => Some(MAX_PIECE),
            MERGES => Some(2 * MAX_PIECE + 1),
            _ => None,
        };
        let n = w.skip_value(t, 0, cap, &what)?;
        if key == TOKENS {
            let n = n.ok_or_else(|| format!("`{TOKENS}` is not an array"))?;
            if n == 0 || n > MAX_TOKENS {
                return Err(format!("`{TOKENS}` has {n} entries (1 to {MAX_TOKENS})"));
            }
            vocabulary = Some(n);
        } else if PER_TOKEN.contains(&key.as_str()) {
            let n = n.ok_or_else(|| format!("`{key}` is not an array"))?;
            per_token.push((key, n));
        }
    }
    if let Some(tokens) = vocabulary {
        if let Some((key, n)) = per_token.iter().find(|(_, n)| *n != tokens) {
            return Err(format!("`{key}` has {n} entries for {tokens} tokens"));
        }
    }

    let mut names = HashSet::new();
    let mut extents = Vec::new();
    for i in 0..tensors {
        let name = w.name(&|| format!("the name of tensor {i}"))?;
        let shown = String::from_utf8_lossy(&name).into_owned();
        let dims = w.u32(&format!("the dimension count of `{shown}`"))?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(format!(
                "tensor `{shown}` has {dims} dimensions (1 to {MAX_DIMS})"
            ));
        }
        let mut elements = 1u64;
        let mut row = 0u64;
        for d in 0..dims {
            let n = w.length(&format!("dimension {d} of `{shown}`"))?;
            if n == 0 {
                return Err(format!("tensor `{shown}` has an empty dimension"));
            }
            if d == 0 {
                row = n;
            }
            elements = elements
                .checked_mul(n)
                .ok_or_else(|| format!("tensor `{shown}`: its dimensions overflow"))?;
        }
        let code = w.u32(&format!("the type of `{shown}`"))?;
        let ty =
            tensor_type(code).ok_or_else(|| format!("tensor `{shown}` has unknown type {code}"))?;
        let block = ty.block_size() as u64;
        if !row.is_multiple_of(block) {
            return Err(format!(
                "tensor `{shown}`: rows of {row} are not whole {ty:?} blocks of {block}"
            ));
        }
        let bytes = (elements / block)
            .checked_mul(ty.type_size() as u64)
            .ok_or_else(|| format!("tensor `{shown}`: its size overflows"))?;
        let offset = w.u64(&format!("the offset of `{shown}`"))?;
        if !names.insert(name) {
            return Err(format!("tensor `{shown}` is listed twice"));
        }
        extents.push((offset, bytes, shown));
    }
    let data_start = w.pos.div_ceil(alignment).saturating_mul(alignment);
    let data = len.saturating_sub(data_start);
    extents.sort_by_key(|(offset, ..)| *offset);
    let mut end_of_last = 0u64;
    for (offset, bytes, name) in &extents {
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor `{name}` starts at {offset}, not a multiple of the alignment {alignment}"
            ));
        }
        let end = offset.checked_add(*bytes).unwrap_or(u64::MAX);
        if end > data {
            return Err(format!(
                "tensor `{name}` needs {bytes} bytes at data offset {offset}, but the file holds \
                 {data} bytes of tensor data"
            ));
        }
        if *offset < end_of_last {
            return Err(format!("tensor `{name}` overlaps the tensor before it"));
        }
        end_of_last = end;
    }
    Ok(GgufLayout {
        tensors,
        metadata,
        data_start,
        vocabulary: vocabulary.unwrap_or(0),
    })
}

/// Where a tensor's floats sit in the bytes of one block of type `ty`: the block's size, and
/// each field's offset and width (2: f16, 4: f32; `BF16`'s halves are checked by the same
/// exponent test as f16's after widening). A block of quantized codes is only as finite as
/// its scales.
fn float_fields(ty: GgmlDType) -> (usize, &'static [(usize, usize)]) {
    use GgmlDType as G;
    match ty {
        G::F32 => (4, &[(0, 4)]),
        G::F16 => (2, &[(0, 2)]),
        G::BF16 => (2, &[(0, 3)]),
        G::Q4_0 => (18, &[(0, 2)]),
        G::Q4_1 => (20, &[(0, 2), (2, 2)]),
        G::Q5_0 => (22, &[(0, 2)]),
        G::Q5_1 => (24, &[(0, 2), (2, 2)]),
        G::Q8_0 => (34, &[(0, 2)]),
        G::Q8_1 => (36, &[(0, 2), (2, 2)]),
        G::Q2K => (84, &[(80, 2), (82, 2)]),
        G::Q3K => (110, &[(108, 2)]),
        G::Q4K => (144, &[(0, 2), (2, 2)]),
        G::Q5K => (176, &[(0, 2), (2, 2)]),
        G::Q6K => (210, &[(208, 2)]),
        G::Q8K => (292, &[(0, 4)]),
    }
}

/// The first non-finite float (NaN or infinity) among a tensor's `data` of type `ty`: its
/// block's index. A weight like that reaches the logits as noise through some kernels (an
/// int8 product turns a NaN into a number), so it is refused at load instead.
pub fn first_non_finite(ty: GgmlDType, data: &[u8]) -> Option<usize> {
    let (size, fields) = float_fields(ty);
    let bad = |b: &[u8], at: usize, width: usize| -> bool {
        match width {
            4 => {
                let bits = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                bits & 0x7f80_0000 == 0x7f80_0000
            }
            // bf16: the top half of an f32.
            3 => u16::from_le_bytes([b[at], b[at + 1]]) & 0x7f80 == 0x7f80,
            _ => u16::from_le_bytes([b[at], b[at + 1]]) & 0x7c00 == 0x7c00,
        }
    };
    data.chunks_exact(size)
        .position(|block| fields.iter().any(|&(at, width)| bad(block, at, width)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn header(tensors: u64, kvs: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        b
    }

    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    fn run(b: &[u8]) -> Result<GgufLayout, String> {
        check(Cursor::new(b), b.len() as u64)
    }

    #[test]
    fn non_finite_scales_are_found_in_every_type() {
        use half::f16;
        let nan = f16::NAN.to_le_bytes();
        let inf = f16::INFINITY.to_le_bytes();
        for ty in [
            GgmlDType::Q4_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let (size, fields) = float_fields(ty);
            let mut data = vec![0u8; size * 4];
            assert_eq!(first_non_finite(ty, &data), None, "{ty:?}");
            let at = size * 2 + fields[0].0;
            data[at..at + 2].copy_from_slice(&nan);
            assert_eq!(first_non_finite(ty, &data), Some(2), "{ty:?}");
            data[at..at + 2].copy_from_slice(&inf);
            assert_eq!(first_non_finite(ty, &data), Some(2), "{ty:?}");
        }
        let floats: Vec<u8> = [1.0f32, f32::NEG_INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(GgmlDType::F32, &floats), Some(1));
        let halves: Vec<u8> = [f16::ONE, f16::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(GgmlDType::F16, &halves), None);
    }

    #[test]
    fn an_empty_header_is_fine_and_lies_are_named() {
        let ok = run(&header(0, 0)).unwrap();
        assert_eq!((ok.tensors, ok.metadata, ok.data_start), (0, 0, 32));
        let e = run(&header(1 << 40, 0)).unwrap_err();
        assert!(e.contains("1099511627776 tensors"), "{e}");
        let mut b = header(0, 1);
        string(&mut b, "general.alignment");
        b.extend(4u32.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        assert!(run(&b).unwrap_err().contains("power of two"));
    }

    #[test]
    fn a_tensor_past_the_end_is_refused() {
        let mut b = header(1, 0);
        string(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // f32: 64 bytes
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32 + 63, 0);
        let e = run(&b).unwrap_err();
        assert!(
            e.contains("needs 64 bytes") && e.contains("holds 63"),
            "{e}"
        );
        b.push(0);
        assert_eq!(run(&b).unwrap().tensors, 1);
    }
}
