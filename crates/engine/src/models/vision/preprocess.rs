//! An image file to the patches Gemma 4's tower reads, as transformers does it for a file
//! (`load_image`, then `Gemma4ImageProcessorPil`): decode within limits (PNG, JPEG, WebP, GIF's
//! first frame), turn by the EXIF orientation, drop any alpha to RGB, resize with Pillow's
//! bicubic to the largest size that keeps the aspect ratio within the soft-token budget and
//! divides into whole pooling squares, scale to [0, 1], and cut into patches (rows of
//! `patch × patch × 3` values, row by row, channels innermost) with their (column, row).
//! The resize is Pillow's own arithmetic (fixed-point weights, an 8-bit pass per axis): no
//! resizing crate rounds as Pillow does, and the patches must equal the reference's.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageReader};

use super::config::VisionConfig;
use crate::error::{EngineError, Result};

/// The soft-token budgets Gemma 4's processor accepts.
pub const SOFT_TOKEN_BUDGETS: [usize; 5] = [70, 140, 280, 560, 1120];
/// The processor's default budget.
pub const DEFAULT_SOFT_TOKENS: usize = 280;

/// What a decoded image may take: its sides, and the decoder's allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Longest side, in pixels.
    pub max_side: u32,
    /// Bytes the decoder may allocate.
    pub max_alloc: u64,
}

impl Default for ImageLimits {
    /// 16,384 pixels a side and 256 MiB: a 64-megapixel photo fits, a decompression bomb
    /// does not.
    fn default() -> Self {
        Self {
            max_side: 16_384,
            max_alloc: 256 << 20,
        }
    }
}

/// One image cut into patches for the tower.
#[derive(Debug, Clone, PartialEq)]
pub struct Patches {
    /// `[patches, patch·patch·3]` values in [0, 1], row-major.
    pub values: Vec<f32>,
    /// Each patch's (column, row) in the resized image.
    pub positions: Vec<(u32, u32)>,
    /// The resized image's width and height in pixels.
    pub size: (u32, u32),
    /// The image as decoded (after its EXIF turn).
    pub original: (u32, u32),
    /// The soft tokens the tower will make of it (patches ÷ pooling²).
    pub soft_tokens: usize,
}

/// How the processor is set: the tower's patch and pooling sizes and a soft-token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Processor {
    pub patch_size: usize,
    pub pooling_kernel_size: usize,
    pub max_soft_tokens: usize,
}

impl Processor {
    /// The processor for `cfg` at `max_soft_tokens` (one of [`SOFT_TOKEN_BUDGETS`]).
    pub fn new(cfg: &VisionConfig, max_soft_tokens: usize) -> Result<Self> {
        if !SOFT_TOKEN_BUDGETS.contains(&max_soft_tokens) {
            return Err(EngineError::invalid(format!(
                "{max_soft_tokens} soft tokens per image: Gemma 4 takes {SOFT_TOKEN_BUDGETS:?}"
            )));
        }
        Ok(Self {
            patch_size: cfg.patch_size,
            pooling_kernel_size: cfg.pooling_kernel_size,
            max_soft_tokens,
        })
    }

    /// The resized (height, width): the largest that keeps the aspect ratio, holds at most
    /// `max_soft_tokens · pooling²` patches and divides into whole pooling squares of
    /// patches; a side that would round to nothing gets one square, the other side as many
    /// as its ratio gives up to the budget's longest side.
    pub fn target_size(&self, height: u32, width: u32) -> Result<(u32, u32)> {
        let (h, w) = (height as f64, width as f64);
        let max_patches = self.max_soft_tokens * self.pooling_kernel_size.pow(2);
        let target_px = (max_patches * self.patch_size.pow(2)) as f64;
        let factor = (target_px / (h * w)).sqrt();
        let side = (self.pooling_kernel_size * self.patch_size) as f64;
        let mut th = ((factor * h / side).floor() * side) as u64;
        let mut tw = ((factor * w / side).floor() * side) as u64;
        let longest = (max_patches / self.pooling_kernel_size.pow(2)) as u64 * side as u64;
        match (th, tw) {
            (0, 0) => return Err(EngineError::invalid("the image resizes to nothing")),
            (0, _) => {
                th = side as u64;
                tw = (((w / h).floor() as u64).saturating_mul(side as u64)).min(longest);
            }
            (_, 0) => {
                tw = side as u64;
                th = (((h / w).floor() as u64).saturating_mul(side as u64)).min(longest);
            }
            _ => {}
        }
        if (th * tw) as f64 > target_px {
            return Err(EngineError::invalid(format!(
                "a {width}×{height} image does not fit {max_patches} patches"
            )));
        }
        Ok((th as u32, tw as u32))
    }

    /// Decodes `bytes` (PNG, JPEG, WebP or GIF) within `limits` and cuts it into patches.
    pub fn process(&self, bytes: &[u8], limits: ImageLimits) -> Result<Patches> {
        self.cut(self.read(bytes, limits)?)
    }

    /// Decodes `bytes` within `limits` and resizes the picture for the tower: the part of
    /// [`Processor::process`] that reads the untrusted file.
    pub fn read(&self, bytes: &[u8], limits: ImageLimits) -> Result<ResizedImage> {
        self.resize(decode(bytes, limits)?)
    }

    /// Cuts a decoded image into patches.
    pub fn patches(&self, image: DynamicImage) -> Result<Patches> {
        self.cut(self.resize(image)?)
    }

    /// The decoded image as RGB at the size the tower reads it (the decoding side of the
    /// processor, which the app runs in its isolated reader).
    pub fn resize(&self, image: DynamicImage) -> Result<ResizedImage> {
        let rgb = image.to_rgb8();
        let (w, h) = rgb.dimensions();
        let (th, tw) = self.target_size(h, w)?;
        let pixels = if (th, tw) == (h, w) {
            rgb.into_raw()
        } else {
            resize_bicubic(rgb.into_raw(), (w, h), (tw, th))?
        };
        Ok(ResizedImage {
            pixels,
            size: (tw, th),
            original: (w, h),
        })
    }

    /// The patches of an image resized by [`Processor::resize`] (perhaps in another
    /// process: its size must be the one this processor gives its original, and its pixels
    /// must fill it).
    pub fn cut(&self, image: ResizedImage) -> Result<Patches> {
        let ResizedImage {
            pixels,
            size: (tw, th),
            original: (w, h),
        } = image;
        if (h, w) == (0, 0) || self.target_size(h, w)? != (th, tw) {
            return Err(bad_image(format!(
                "a {w}×{h} image resized to {tw}×{th}, not to what the processor gives it"
            )));
        }
        if pixels.len() as u64 != u64::from(tw) * u64::from(th) * 3 {
            return Err(bad_image(format!(
                "{} bytes of pixels for a {tw}×{th} RGB image",
                pixels.len()
            )));
        }
        let p = self.patch_size;
        let (cols, rows) = (tw as usize / p, th as usize / p);
        let width = p * p * 3;
        let mut values = Vec::with_capacity(cols * rows * width);
        let mut positions = Vec::with_capacity(cols * rows);
        for py in 0..rows {
            for px in 0..cols {
                for r in 0..p {
                    let at = ((py * p + r) * tw as usize + px * p) * 3;
                    // As transformers rescales: the byte in f64 times 1/255, then to f32.
                    values.extend(
                        pixels[at..at + p * 3]
                            .iter()
                            .map(|&v| (f64::from(v) * (1.0 / 255.0)) as f32),
                    );
                }
                positions.push((px as u32, py as u32));
            }
        }
        Ok(Patches {
            values,
            soft_tokens: positions.len() / self.pooling_kernel_size.pow(2),
            positions,
            size: (tw, th),
            original: (w, h),
        })
    }
}

/// An image at the size the tower reads it: RGB bytes, row by row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizedImage {
    pub pixels: Vec<u8>,
    /// Its width and height.
    pub size: (u32, u32),
    /// The decoded image's width and height (after its EXIF turn).
    pub original: (u32, u32),
}

impl ResizedImage {
    /// The image as bytes for a pipe: four little-endian u32 (width, height, original
    /// width, original height), then the pixels.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.pixels.len());
        for v in [self.size.0, self.size.1, self.original.0, self.original.1] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.pixels);
        out
    }

    /// Reads [`ResizedImage::to_bytes`]' layout (the sizes are checked when it is cut).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let u = |i: usize| -> Result<u32> {
            bytes
                .get(4 * i..4 * i + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(|| bad_image("the reader's reply is cut short"))
        };
        Ok(Self {
            size: (u(0)?, u(1)?),
            original: (u(2)?, u(3)?),
            pixels: bytes[16..].to_vec(),
        })
    }
}

fn bad_image(e: impl std::fmt::Display) -> EngineError {
    EngineError::invalid(format!("cannot read the image: {e}"))
}

/// Decodes an image file within `limits`, turned upright by its EXIF orientation (as
/// Pillow's `exif_transpose` in transformers' `load_image`). A GIF gives its first frame.
pub fn decode(bytes: &[u8], limits: ImageLimits) -> Result<DynamicImage> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(bad_image)?;
    match reader.format() {
        Some(
            image::ImageFormat::Png
            | image::ImageFormat::Jpeg
            | image::ImageFormat::WebP
            | image::ImageFormat::Gif,
        ) => {}
        Some(other) => {
            return Err(EngineError::invalid(format!(
                "{other:?} images are not read: PNG, JPEG, WebP and GIF are"
            )))
        }
        None => {
            return Err(EngineError::invalid(
                "not an image: PNG, JPEG, WebP and GIF are read",
            ))
        }
    }
    let mut l = image::Limits::default();
    l.max_image_width = Some(limits.max_side);
    l.max_image_height = Some(limits.max_side);
    l.max_alloc = Some(limits.max_alloc);
    reader.limits(l.clone());
    let mut decoder = reader.into_decoder().map_err(bad_image)?;
    // The decoded picture itself counts against the allocation limit: `into_decoder` leaves
    // that check to `ImageReader::decode` (which cannot report the EXIF orientation), so it is
    // made here, from the header, before a byte of it is allocated.
    l.reserve(decoder.total_bytes()).map_err(bad_image)?;
    decoder.set_limits(l).map_err(bad_image)?;
    let orientation = decoder.orientation().map_err(bad_image)?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(bad_image)?;
    image.apply_orientation(orientation);
    Ok(image)
}

/// Pillow's fixed-point precision for 8-bit resampling (`Resample.c`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's bicubic kernel (Keys' cubic, a = −0.5), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output index along an axis of `inp` samples resized to `out`: the first input
/// sample read and the fixed-point weights of those read, as Pillow's `precompute_coeffs`
/// and `normalize_coeffs_8bpc` make them (the kernel widened by the scale when shrinking).
fn coefficients(inp: usize, out: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = inp as f64 / out as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    (0..out)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // Rounded as C's cast of `x + 0.5` does (toward zero), then clamped.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(inp as i64) as usize;
            let w: Vec<f64> = (xmin..xmax)
                .map(|x| bicubic((x as f64 - center + 0.5) / filterscale))
                .collect();
            let total: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    let v = k * f64::from(1u32 << PRECISION_BITS);
                    (if v < 0.0 { v - 0.5 } else { v + 0.5 }) as i32 as i64
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// One fixed-point sum back to a byte, as Pillow's `clip8`.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's bicubic resize of RGB bytes, in its arithmetic: a horizontal pass to 8-bit rows,
/// then a vertical pass, each sum starting from half a unit and clipped to a byte. (Pillow
/// skips a pass whose size does not change; the callers only resize when one does.)
fn resize_bicubic(src: Vec<u8>, (w, h): (u32, u32), (tw, th): (u32, u32)) -> Result<Vec<u8>> {
    let (w, h, tw, th) = (w as usize, h as usize, tw as usize, th as usize);
    if src.len() != w * h * 3 || tw == 0 || th == 0 {
        return Err(EngineError::invalid(
            "an image of no pixels cannot be resized",
        ));
    }
    let half = 1i64 << (PRECISION_BITS - 1);
    let mid = if tw != w {
        let cols = coefficients(w, tw);
        let mut mid = vec![0u8; tw * h * 3];
        for y in 0..h {
            let row = &src[y * w * 3..(y + 1) * w * 3];
            for (xx, (xmin, k)) in cols.iter().enumerate() {
                for c in 0..3 {
                    let sum = k.iter().enumerate().fold(half, |s, (i, &k)| {
                        s + i64::from(row[(xmin + i) * 3 + c]) * k
                    });
                    mid[(y * tw + xx) * 3 + c] = clip8(sum);
                }
            }
        }
        mid
    } else {
        src
    };
    if th == h {
        return Ok(mid);
    }
    let rows = coefficients(h, th);
    let mut out = vec![0u8; tw * th * 3];
    for (yy, (ymin, k)) in rows.iter().enumerate() {
        for x in 0..tw * 3 {
            let sum = k.iter().enumerate().fold(half, |s, (i, &k)| {
                s + i64::from(mid[(ymin + i) * tw * 3 + x]) * k
            });
            out[yy * tw * 3 + x] = clip8(sum);
        }
    }
    Ok(out)
}
