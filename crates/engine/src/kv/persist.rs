//! A KV cache saved to a file and read back exactly, in the precision it holds: dense rows
//! as stored (f16/bf16/f32), TurboQuant codes, norms and centering offsets as held. The
//! file is versioned and self-describing:
//!
//! ```text
//! "KVLABKV\0"  u32 format version  u64 header length  header (JSON)  u32 CRC-32 of the header
//! one section per cache-owning layer, in layer order (lengths and CRC-32s in the header)
//! ```
//!
//! The header names the model ([`weights_identity`]), the cache policy as its canonical SPEC,
//! the token ids the cache covers (and any sampled after it but not yet run), the rewind
//! margin, and each section's layer, layout, first stored position, length and checksum.
//! Reading checks the format, the version, every checksum, the model, the policy and every
//! layer's layout before building anything, into a fresh cache: the live one is never
//! touched, so a refused file loses nothing. Writing is atomic (a temporary file beside the
//! target, synced, then renamed), so a save killed midway leaves the previous file whole.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::wire::{corrupt, WireReader, WireWriter};
use super::{KvCache, KvLayout};
use crate::error::{EngineError, Result};

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"KVLABKV\0";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// What a cache file says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheHeader {
    /// The model it belongs to ([`weights_identity`]).
    pub model: String,
    /// The cache policy, as its canonical SPEC.
    pub spec: String,
    /// Tokens the cache holds (the next token's position).
    pub seq_len: usize,
    /// The ids at positions `0..seq_len`.
    pub tokens: Vec<u32>,
    /// Ids that follow `tokens` but were not run yet (a generation's last sampled token):
    /// a continuation runs them first.
    pub pending: Vec<u32>,
    /// Tokens sliding layers keep beyond their window.
    pub rewind_margin: usize,
    /// The images whose soft tokens it holds, in order: a prompt reuses them only where it
    /// places the same image in the same places.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::images::PromptImage>,
    /// One per cache-owning layer, in order.
    pub layers: Vec<LayerSection>,
}

/// One layer's section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerSection {
    /// The layer index.
    pub layer: usize,
    /// Its layout (full or sliding with its window).
    pub layout: KvLayout,
    /// Absolute position of its first stored token (a sliding window's start).
    pub key_start: usize,
    /// The section's length in the file.
    pub bytes: u64,
    /// CRC-32 of the section.
    pub crc32: u32,
}

/// The largest rewind margin a cache file may carry (the engine writes
/// [`crate::REWIND_MARGIN`], 256).
pub const MAX_REWIND_MARGIN: usize = 1 << 16;

fn mismatch(what: impl std::fmt::Display) -> EngineError {
    EngineError::CacheMismatch(what.to_string())
}

fn io(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::CacheIo {
        path: path.to_path_buf(),
        source,
    }
}

/// Bytes of the model's weights read into its identity: the first and last MiB of each file
/// and one MiB at each of three evenly spaced offsets, with the file's length. Two different
/// checkpoints of one architecture differ there; hashing whole multi-GB files would cost
/// seconds per save.
const SAMPLE_BYTES: u64 = 1 << 20;

/// A digest that tells one model's weights from another's: a file (GGUF, safetensors), or
/// a folder's `*.safetensors` and `config.json` in name order (see [`SAMPLE_BYTES`]).
pub fn weights_identity(path: &Path) -> Result<String> {
    let mut files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| io(path, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default();
                name.ends_with(".safetensors") || name == "config.json"
            })
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    files.dedup();
    let mut hash = Sha256::new();
    for f in &files {
        let mut file = std::fs::File::open(f).map_err(|e| io(f, e))?;
        let len = file.metadata().map_err(|e| io(f, e))?.len();
        hash.update(len.to_le_bytes());
        let mut at = vec![
            0,
            len / 4,
            len / 2,
            3 * len / 4,
            len.saturating_sub(SAMPLE_BYTES),
        ];
        at.dedup();
        let mut buf = vec![0u8; SAMPLE_BYTES as usize];
        for offset in at {
            file.seek(SeekFrom::Start(offset)).map_err(|e| io(f, e))?;
            let n = (SAMPLE_BYTES).min(len - offset.min(len)) as usize;
            file.read_exact(&mut buf[..n]).map_err(|e| io(f, e))?;
            hash.update(&buf[..n]);
        }
    }
    Ok(format!("{:x}", hash.finalize()))
}

impl KvCache {
    /// Writes this cache to `path` for `model` (an identity) under `spec` (its policy), with
    /// the ids it covers and those `pending` after them; returns the file's bytes.
    pub fn save_to(
        &self,
        path: &Path,
        model: &str,
        spec: &str,
        (tokens, images): (&[u32], &[crate::images::PromptImage]),
        pending: &[u32],
    ) -> Result<u64> {
        if tokens.len() != self.seq_len {
            return Err(EngineError::invalid(format!(
                "{} token ids for a cache of {} tokens",
                tokens.len(),
                self.seq_len
            )));
        }
        let mut sections = Vec::new();
        let mut layers = Vec::new();
        for (layer, slot) in self.slots.iter().enumerate() {
            let Some(owned) = &slot.owned else { continue };
            let mut w = WireWriter::new();
            owned.storage.write_state(&mut w)?;
            let bytes = w.into_bytes();
            layers.push(LayerSection {
                layer,
                layout: slot.layout,
                key_start: owned.key_start,
                bytes: bytes.len() as u64,
                crc32: crc32fast::hash(&bytes),
            });
            sections.push(bytes);
        }
        let header = CacheHeader {
            model: model.to_string(),
            spec: spec.to_string(),
            seq_len: self.seq_len,
            tokens: tokens.to_vec(),
            pending: pending.to_vec(),
            rewind_margin: self.rewind_margin,
            images: images.to_vec(),
            layers,
        };
        let json = serde_json::to_vec(&header)
            .map_err(|e| EngineError::invalid(format!("cache header: {e}")))?;
        let mut head = WireWriter::new();
        head.bytes(&MAGIC);
        head.u32(FORMAT_VERSION);
        head.len(json.len());
        head.bytes(&json);
        head.u32(crc32fast::hash(&json));
        let head = head.into_bytes();
        remove_stale_temporaries(path);
        let tmp = temporary_beside(path);
        let written = (|| -> std::io::Result<u64> {
            let mut f = private_file(&tmp)?;
            f.write_all(&head)?;
            for s in &sections {
                f.write_all(s)?;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            Ok(head.len() as u64 + sections.iter().map(|s| s.len() as u64).sum::<u64>())
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(path, e)
        })
    }
}

/// A new file only its owner may read or write (0600 on Unix): a cache holds the
/// conversation's token ids.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// `path` with `.tmp-<pid>` added: beside it, so the rename stays on one file system.
fn temporary_beside(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Removes what saves of `path` killed midway left beside it (`<name>.tmp-<pid>`): one
/// engine thread saves a given file, so any such file is a dead save's.
fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.tmp-", name.to_string_lossy());
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Parses the start of a cache file (magic, version, header, header checksum) from `bytes`,
/// which hold at least the header; returns the header and where the sections start.
fn parse_head(path: &Path, bytes: &[u8], file_len: u64) -> Result<(CacheHeader, usize)> {
    let mut r = WireReader::new(bytes);
    if r.remaining() < MAGIC.len() || r.take(MAGIC.len())? != MAGIC {
        return Err(corrupt(format!(
            "{} is not a KV Lab cache file",
            path.display()
        )));
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(mismatch(format!(
            "{} is in cache format {version}; this KV Lab reads format {FORMAT_VERSION}",
            path.display()
        )));
    }
    // Bounded by the file, not the buffer: a header that claims more than the file holds
    // is refused before anything is allocated for it.
    let len = r.len(file_len as usize, "the header")?;
    let json = r.take(len)?;
    if crc32fast::hash(json) != r.u32()? {
        return Err(corrupt("the header's checksum does not match"));
    }
    let header: CacheHeader =
        serde_json::from_slice(json).map_err(|e| corrupt(format!("header: {e}")))?;
    Ok((header, bytes.len() - r.remaining()))
}

/// Reads the whole cache file at `path`: its header, its bytes, and where the sections start.
fn read_file(path: &Path) -> Result<(CacheHeader, Vec<u8>, usize)> {
    let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
    let (header, at) = parse_head(path, &bytes, bytes.len() as u64)?;
    Ok((header, bytes, at))
}

/// The bytes before a header's JSON: magic, version, header length.
const PREAMBLE: usize = MAGIC.len() + 4 + 8;

/// The header of the cache file at `path` (format, version and header checksum checked),
/// reading only the header: a session list can show a multi-GB cache's size and policy
/// without reading its sections.
pub fn peek(path: &Path) -> Result<CacheHeader> {
    let mut file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let file_len = file.metadata().map_err(|e| io(path, e))?.len();
    let mut preamble = [0u8; PREAMBLE];
    let got = read_up_to(&mut file, &mut preamble).map_err(|e| io(path, e))?;
    let claimed = if got == PREAMBLE {
        u64::from_le_bytes(preamble[12..20].try_into().unwrap_or_default())
    } else {
        0
    };
    // The header and its checksum, never past the file's end.
    let want = (PREAMBLE as u64)
        .saturating_add(claimed)
        .saturating_add(4)
        .min(file_len) as usize;
    let mut head = preamble[..got].to_vec();
    head.resize(want.max(got), 0);
    file.read_exact(&mut head[got..]).map_err(|e| io(path, e))?;
    Ok(parse_head(path, &head, file_len)?.0)
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Reads the cache file at `path` into `fresh` (an empty cache of the model and policy the
/// caller expects: `model` its identity, `spec` its policy) and returns it with the header.
/// Every check comes first: format, version, checksums, model, policy, layouts; then each
/// section fills its layer, and the positions must agree.
pub fn read_into(
    path: &Path,
    model: &str,
    spec: &str,
    mut fresh: KvCache,
) -> Result<(KvCache, CacheHeader)> {
    let (header, bytes, start) = read_file(path)?;
    if header.model != model {
        return Err(mismatch("the cache was saved from another model"));
    }
    if header.spec != spec {
        return Err(mismatch(format!(
            "the cache holds a {} cache; this conversation's is {spec}",
            header.spec
        )));
    }
    if header.tokens.len() != header.seq_len {
        return Err(corrupt(format!(
            "{} token ids for {} tokens",
            header.tokens.len(),
            header.seq_len
        )));
    }
    // Images in order, apart, within the tokens: a file that lies about them would have a
    // prompt reuse places no image filled.
    let mut end = 0;
    for image in &header.images {
        if image.at < end || image.len == 0 || image.at + image.len > header.seq_len {
            return Err(corrupt(format!(
                "an image at {} of {} tokens in a cache of {}",
                image.at, image.len, header.seq_len
            )));
        }
        end = image.at + image.len;
    }
    // Sliding layers keep this many tokens past their window: a value no engine writes would
    // make them keep (and later allocate for) far more than the file holds.
    if header.rewind_margin > MAX_REWIND_MARGIN {
        return Err(corrupt(format!(
            "a rewind margin of {} tokens (at most {MAX_REWIND_MARGIN})",
            header.rewind_margin
        )));
    }
    let owned: Vec<usize> = (0..fresh.slots.len())
        .filter(|&i| fresh.slots[i].owned.is_some())
        .collect();
    let layers: Vec<usize> = header.layers.iter().map(|l| l.layer).collect();
    if layers != owned {
        return Err(mismatch(format!(
            "the cache has layers {layers:?}; the model's cache-owning layers are {owned:?}"
        )));
    }
    let mut r = WireReader::new(&bytes[start..]);
    let total: u64 = header.layers.iter().map(|l| l.bytes).sum();
    if total != r.remaining() as u64 {
        return Err(corrupt(format!(
            "the sections take {total} bytes, the file holds {}",
            r.remaining()
        )));
    }
    let mut sections = Vec::with_capacity(header.layers.len());
    for l in &header.layers {
        if fresh.slots[l.layer].layout != l.layout {
            return Err(mismatch(format!(
                "layer {} was {:?}; the model's is {:?}",
                l.layer, l.layout, fresh.slots[l.layer].layout
            )));
        }
        let section = r.take(l.bytes as usize)?;
        if crc32fast::hash(section) != l.crc32 {
            return Err(corrupt(format!(
                "layer {}'s section fails its checksum",
                l.layer
            )));
        }
        sections.push(section);
    }
    for (l, section) in header.layers.iter().zip(sections) {
        let Some(owned) = fresh.slots[l.layer].owned.as_mut() else {
            return Err(mismatch(format!("layer {} owns no cache", l.layer)));
        };
        let mut sr = WireReader::new(section);
        owned.storage.read_state(&mut sr)?;
        sr.finish()?;
        owned.key_start = l.key_start;
        if l.key_start + owned.storage.len() != header.seq_len {
            return Err(corrupt(format!(
                "layer {} holds positions {}..{}, the cache {}",
                l.layer,
                l.key_start,
                l.key_start + owned.storage.len(),
                header.seq_len
            )));
        }
    }
    fresh.seq_len = header.seq_len;
    fresh.rewind_margin = header.rewind_margin;
    Ok((fresh, header))
}
