//! Checks a safetensors file's header against the file before it is mapped: the header's
//! declared length against its limit and the file, then every tensor's dtype, shape and byte
//! span against the data that follows (known dtypes, no overflowing shapes, spans that match
//! their shapes, inside the data, not overlapping). Only the header is read, and only once
//! its length is known to be within the limit and the file.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

/// The safetensors format's header limit (the `safetensors` crate's `MAX_HEADER_SIZE`).
pub const MAX_HEADER: u64 = 100_000_000;

/// Bytes per element of a safetensors dtype (`None`: unknown).
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// Checks the safetensors file at `path`; returns its tensor count, or what lies and where.
pub fn check_file(path: &Path) -> Result<usize, String> {
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < 8 {
        return Err(format!("{len} bytes: too short for a safetensors header"));
    }
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| e.to_string())?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER {
        return Err(format!(
            "the header declares {n} bytes, over the format's limit of {MAX_HEADER}"
        ));
    }
    if n > len - 8 {
        return Err(format!(
            "the header declares {n} bytes, but the file holds {} after its length",
            len - 8
        ));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    check_header(&header, len - 8 - n)
}

/// Checks a header's JSON against `data` bytes of tensor data.
pub fn check_header(header: &[u8], data: u64) -> Result<usize, String> {
    let json: Value =
        serde_json::from_slice(header).map_err(|e| format!("the header is not JSON: {e}"))?;
    let entries = json.as_object().ok_or("the header is not a JSON object")?;
    let mut spans = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| format!("tensor `{name}`: {what}");
        let dtype = entry
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no dtype"))?;
        let size = dtype_size(dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype}")))?;
        let shape = entry
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no shape"))?;
        let mut elements = 1u64;
        for d in shape {
            let d = d
                .as_u64()
                .ok_or_else(|| bad("a dimension is not a count"))?;
            elements = elements
                .checked_mul(d)
                .ok_or_else(|| bad("its shape overflows"))?;
        }
        let bytes = elements
            .checked_mul(size)
            .ok_or_else(|| bad("its size overflows"))?;
        let offsets = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("no [begin, end] data_offsets"))?;
        let (begin, end) = match (offsets[0].as_u64(), offsets[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => return Err(bad("data_offsets are not an ordered pair of counts")),
        };
        if end - begin != bytes {
            return Err(bad(&format!(
                "its shape {shape:?} of {dtype} needs {bytes} bytes, its span holds {}",
                end - begin
            )));
        }
        if end > data {
            return Err(bad(&format!(
                "its bytes end at {end}, past the {data} bytes of tensor data"
            )));
        }
        spans.push((begin, end, name));
    }
    spans.sort();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(format!(
                "tensors `{}` and `{}` overlap",
                pair[0].2, pair[1].2
            ));
        }
    }
    Ok(spans.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_must_match_shapes_and_fit_the_data() {
        let ok = br#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        assert_eq!(check_header(ok, 16), Ok(1));
        assert!(check_header(ok, 15)
            .unwrap_err()
            .contains("past the 15 bytes"));
        let lie = br#"{"a":{"dtype":"F32","shape":[4,4],"data_offsets":[0,16]}}"#;
        assert!(check_header(lie, 16)
            .unwrap_err()
            .contains("needs 64 bytes"));
        let huge = br#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
        assert!(check_header(huge, 16).unwrap_err().contains("overflows"));
        let overlap = br#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
        assert!(check_header(overlap, 16).unwrap_err().contains("overlap"));
    }
}
