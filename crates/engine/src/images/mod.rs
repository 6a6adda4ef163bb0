//! Images in a conversation: a file becomes a [`PreparedImage`] once (decoded within limits
//! and cut into the tower's patches, off the engine thread), kept in a bounded
//! [`ImageStore`] under the digest of its bytes, which messages name. A rendered prompt's
//! image markers are then widened to each image's places ([`place`]): `<|image>`, one
//! `<|image|>` per soft token, `<image|>`, as Gemma 4's processor writes them, and the
//! [`PromptImage`]s say which image fills which places, so a cache that held another image
//! in the same places is never taken for this one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use ts_rs::TS;

use crate::models::vision::config::ImageTokens;
use crate::models::vision::preprocess::Processor as ImageProcessor;
use crate::models::vision::Patches;

/// Images a store keeps (the least recently added go first).
pub const MAX_IMAGES: usize = 64;
/// Bytes of patches a store keeps.
pub const MAX_STORE_BYTES: usize = 512 << 20;
/// Images one prompt may hold.
pub const MAX_IMAGES_PER_PROMPT: usize = 16;

/// Why an image cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    /// The loaded model reads no images (no vision tower, or no image tokens).
    #[error("the loaded model reads no images{0}")]
    Unsupported(String),
    /// A message names an image the engine does not hold (never added, or evicted).
    #[error("no image {0} is held: add it again")]
    Unknown(String),
    /// The prompt's image markers and its images disagree.
    #[error("{0}")]
    Mismatch(String),
}

/// What the loaded model needs to read images: its marker ids and its processor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageFacts {
    pub tokens: ImageTokens,
    pub processor: ImageProcessor,
}

/// An image ready for the tower.
#[derive(Debug)]
pub struct PreparedImage {
    /// The digest of its file's bytes (32 hex digits).
    pub id: String,
    pub patches: Patches,
}

/// What the app and the server learn of an added image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct ImageInfo {
    /// The id messages name it by.
    pub id: String,
    /// Its width and height as decoded (after its EXIF turn).
    pub width: u32,
    pub height: u32,
    /// Its width and height as the tower reads it.
    pub resized: (u32, u32),
    /// Its soft tokens.
    pub soft_tokens: usize,
    /// Prompt tokens it takes: its soft tokens and its two markers.
    pub tokens: usize,
}

impl PreparedImage {
    /// What the app and the server show of it.
    pub fn info(&self) -> ImageInfo {
        let p = &self.patches;
        ImageInfo {
            id: self.id.clone(),
            width: p.original.0,
            height: p.original.1,
            resized: p.size,
            soft_tokens: p.soft_tokens,
            tokens: p.soft_tokens + 2,
        }
    }

    fn bytes(&self) -> usize {
        self.patches.values.len() * 4 + self.patches.positions.len() * 8
    }
}

/// The id of an image file: the first 16 bytes of its SHA-256, in hex.
pub fn image_id(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Prepared images by id, bounded by count and bytes (see [`MAX_IMAGES`]).
#[derive(Debug, Default)]
pub struct ImageStore {
    images: HashMap<String, Arc<PreparedImage>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl ImageStore {
    /// Keeps `image` (the oldest go while the store is over its bounds) and returns it.
    pub fn insert(&mut self, image: PreparedImage) -> Arc<PreparedImage> {
        if let Some(held) = self.images.get(&image.id) {
            return Arc::clone(held);
        }
        let image = Arc::new(image);
        self.bytes += image.bytes();
        self.order.push_back(image.id.clone());
        self.images.insert(image.id.clone(), Arc::clone(&image));
        while self.order.len() > 1
            && (self.order.len() > MAX_IMAGES || self.bytes > MAX_STORE_BYTES)
        {
            if let Some(old) = self.order.pop_front() {
                if let Some(gone) = self.images.remove(&old) {
                    self.bytes -= gone.bytes();
                }
            }
        }
        image
    }

    /// The image `id`, if held.
    pub fn get(&self, id: &str) -> Option<Arc<PreparedImage>> {
        self.images.get(id).cloned()
    }

    /// Forgets every image (another model's processor cuts them otherwise).
    pub fn clear(&mut self) {
        self.images.clear();
        self.order.clear();
        self.bytes = 0;
    }
}

/// One image's places in a prompt: `len` soft tokens from position `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptImage {
    pub at: usize,
    pub len: usize,
    /// The image's id.
    pub id: String,
}

/// Widens each image marker of `ids` (one `<|image|>` where the template put an image)
/// to the places of `images`, in order: `<|image>`, one `<|image|>` per soft token,
/// `<image|>`. The markers and the images must agree in number.
pub fn place(
    ids: &[u32],
    tokens: ImageTokens,
    images: &[Arc<PreparedImage>],
) -> Result<(Vec<u32>, Vec<PromptImage>), ImageError> {
    let markers = ids.iter().filter(|&&i| i == tokens.soft).count();
    if markers != images.len() {
        return Err(ImageError::Mismatch(format!(
            "the rendered prompt has {markers} image places for {} images (the chat template \
             placed them, or a message typed the marker)",
            images.len()
        )));
    }
    let extra: usize = images.iter().map(|i| i.patches.soft_tokens + 1).sum();
    let mut out = Vec::with_capacity(ids.len() + extra);
    let mut placed = Vec::with_capacity(images.len());
    let mut next = images.iter();
    for &id in ids {
        if id != tokens.soft {
            out.push(id);
            continue;
        }
        let Some(image) = next.next() else {
            break;
        };
        let n = image.patches.soft_tokens;
        out.push(tokens.begin);
        placed.push(PromptImage {
            at: out.len(),
            len: n,
            id: image.id.clone(),
        });
        out.extend(std::iter::repeat_n(tokens.soft, n));
        out.push(tokens.end);
    }
    Ok((out, placed))
}

/// The longest prefix of `held` (ids `held_ids` with images `held_images`) that a prompt
/// (`ids`, `images`) may reuse: common ids, cut before the first image the two place
/// differently, and never inside an image.
pub fn common_prefix(
    (held_ids, held_images): (&[u32], &[PromptImage]),
    (ids, images): (&[u32], &[PromptImage]),
) -> usize {
    let mut common = held_ids.iter().zip(ids).take_while(|(a, b)| a == b).count();
    for (i, held) in held_images.iter().enumerate() {
        if held.at >= common {
            break;
        }
        if images.get(i) != Some(held) {
            common = common.min(held.at);
        }
    }
    for (i, image) in images.iter().enumerate() {
        if image.at < common && held_images.get(i) != Some(image) {
            common = common.min(image.at);
        }
    }
    cut_outside(common, images)
}

/// `n`, or the start of the image of `images` it falls inside.
pub fn cut_outside(n: usize, images: &[PromptImage]) -> usize {
    images
        .iter()
        .find(|i| i.at < n && n < i.at + i.len)
        .map_or(n, |i| i.at)
}

#[cfg(test)]
mod tests;
