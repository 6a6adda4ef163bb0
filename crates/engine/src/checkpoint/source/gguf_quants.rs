//! The quantizations a Hub GGUF repository offers, from its file listing alone: each
//! `*.gguf` file (or set of `-0000N-of-0000M` shards) named by its quant (`Q4_K_M`, `Q8_0`,
//! `UD-Q4_K_XL`, `BF16`, …) with its size, vision/audio projectors (`mmproj-*`) left out.
//! Pure functions over (path, size) pairs, so the picker and the tests need no network.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// One downloadable quantization of a GGUF repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct GgufQuant {
    /// The quant as named in the file (`Q4_K_M`, `Q8_0`, `UD-Q4_K_XL`, `BF16`), or the file
    /// stem when the name carries none.
    pub name: String,
    /// Repository paths of its file(s), shards in order.
    pub files: Vec<String>,
    /// Bytes of all its files, from the Hub listing.
    pub bytes: u64,
}

/// The quant a preferred choice falls back to when none is asked for: what LM Studio and
/// Ollama default to.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// Whether `path` is a GGUF file with model weights (not a multimodal projector).
pub fn is_weights_gguf(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    name.ends_with(".gguf") && !name.contains("mmproj")
}

/// `stem` without a `-00001-of-00003` shard suffix, and whether it had one.
fn strip_shard(stem: &str) -> &str {
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    match parts.as_slice() {
        [total, "of", index, rest] if digits(total) && digits(index) => rest,
        _ => stem,
    }
}

/// Whether `token` looks like a ggml type name: `Q4_K_M`, `IQ3_XXS`, `F16`, `BF16`, `MXFP4`.
fn is_quant_token(token: &str) -> bool {
    let t = token.to_ascii_uppercase();
    let digit_after = |prefix: &str| {
        t.strip_prefix(prefix)
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    };
    digit_after("Q") || digit_after("IQ") || digit_after("F") || digit_after("BF") || t == "MXFP4"
}

/// The quant name of a weights GGUF path (`None` for other files and projectors).
pub fn quant_name(path: &str) -> Option<String> {
    if !is_weights_gguf(path) {
        return None;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    let stem = strip_shard(&name[..name.len() - ".gguf".len()]);
    let tokens: Vec<&str> = stem.split(['-', '.']).collect();
    let last = tokens.last().copied().unwrap_or(stem);
    if !is_quant_token(last) {
        return Some(stem.to_owned());
    }
    // Unsloth's dynamic quants: `…-UD-Q4_K_XL`.
    let ud = tokens.len() >= 2 && tokens[tokens.len() - 2].eq_ignore_ascii_case("UD");
    Some(if ud {
        format!("UD-{}", last.to_ascii_uppercase())
    } else {
        last.to_ascii_uppercase()
    })
}

/// The quants in a listing of (path, bytes), smallest first; projectors and other files
/// are left out.
pub fn group_quants<'a>(files: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<GgufQuant> {
    let mut out: Vec<GgufQuant> = Vec::new();
    for (path, bytes) in files {
        let Some(name) = quant_name(path) else {
            continue;
        };
        match out.iter_mut().find(|q| q.name == name) {
            Some(q) => {
                q.files.push(path.to_owned());
                q.bytes += bytes;
            }
            None => out.push(GgufQuant {
                name,
                files: vec![path.to_owned()],
                bytes,
            }),
        }
    }
    for q in &mut out {
        q.files.sort();
    }
    out.sort_by(|a, b| a.bytes.cmp(&b.bytes).then(a.name.cmp(&b.name)));
    out
}

/// The quant `wanted` names (case-insensitive), or with none asked, [`DEFAULT_QUANT`] where
/// offered, else the smallest.
pub fn pick<'a>(quants: &'a [GgufQuant], wanted: Option<&str>) -> Option<&'a GgufQuant> {
    match wanted {
        Some(w) => quants.iter().find(|q| q.name.eq_ignore_ascii_case(w)),
        None => quants
            .iter()
            .find(|q| q.name == DEFAULT_QUANT)
            .or_else(|| quants.first()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_names_come_from_the_file_names_that_repos_use() {
        for (path, want) in [
            ("gemma-4-E4B-it-Q4_K_M.gguf", Some("Q4_K_M")),
            ("gemma-4-E4B-it-Q8_0.gguf", Some("Q8_0")),
            ("gemma-4-E4B-it-UD-Q4_K_XL.gguf", Some("UD-Q4_K_XL")),
            ("gemma-4-E4B-it-bf16.gguf", Some("BF16")),
            ("gemma-4-E4B-it-f16.gguf", Some("F16")),
            ("google_gemma-4-E4B-it-IQ3_XXS.gguf", Some("IQ3_XXS")),
            ("BF16/gemma-4-31B-it-BF16-00001-of-00002.gguf", Some("BF16")),
            ("gemma-4-E4B-it.Q5_K_S.gguf", Some("Q5_K_S")),
            ("model.gguf", Some("model")),
            ("mmproj-gemma-4-E4B-it-f16.gguf", None),
            ("mmproj-BF16.gguf", None),
            ("config.json", None),
            ("README.md", None),
        ] {
            assert_eq!(quant_name(path).as_deref(), want, "{path}");
        }
    }

    #[test]
    fn shards_group_projectors_drop_and_sizes_add_up() {
        let q = group_quants([
            ("mmproj-gemma-4-E4B-it-f16.gguf", 900),
            ("gemma-4-E4B-it-Q8_0.gguf", 8_000),
            ("BF16/gemma-4-E4B-it-BF16-00002-of-00002.gguf", 6_000),
            ("BF16/gemma-4-E4B-it-BF16-00001-of-00002.gguf", 9_000),
            ("gemma-4-E4B-it-Q4_K_M.gguf", 5_000),
            ("README.md", 10),
        ]);
        let names: Vec<_> = q.iter().map(|q| (q.name.as_str(), q.bytes)).collect();
        assert_eq!(
            names,
            vec![("Q4_K_M", 5_000), ("Q8_0", 8_000), ("BF16", 15_000)]
        );
        assert_eq!(
            q[2].files,
            vec![
                "BF16/gemma-4-E4B-it-BF16-00001-of-00002.gguf",
                "BF16/gemma-4-E4B-it-BF16-00002-of-00002.gguf"
            ]
        );
        assert_eq!(pick(&q, None).map(|q| q.name.as_str()), Some("Q4_K_M"));
        assert_eq!(
            pick(&q, Some("q8_0")).map(|q| q.name.as_str()),
            Some("Q8_0")
        );
        assert_eq!(pick(&q, Some("Q2_K")), None);
        assert_eq!(pick(&q[1..], None).map(|q| q.name.as_str()), Some("Q8_0"));
    }
}
