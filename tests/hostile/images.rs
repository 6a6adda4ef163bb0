//! Hostile images through the real app binary's image reader child (`kvlab-app
//! --read-image`): a truncated PNG, a header that claims 100,000 pixels a side, a
//! decompression bomb, a text file named .png and an image past the side limit each come back
//! as `bad_image` within the reader's limits, many times over, and a good image still reads
//! at the size the processor gives it. Each fault prints one `HOSTILE` line.

use std::io::Cursor;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvlab_app::documents::{Limits, Reader};
use kvlab_engine::contract::{ErrorCode, ImageLimits, ImageProcessor};

fn reader() -> Reader {
    Reader::new(
        PathBuf::from(env!("CARGO_BIN_EXE_kvlab-app")),
        Limits::default(),
    )
}

/// Gemma 4's processor: patch 16, 3×3 pooling, 280 soft tokens.
const PROCESSOR: ImageProcessor = ImageProcessor {
    patch_size: 16,
    pooling_kernel_size: 3,
    max_soft_tokens: 280,
};

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x * y) as u8]));
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .expect("png");
    out
}

/// A PNG whose header claims `w × h` pixels, with one small IDAT.
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut small = png(8, 8);
    // IHDR's width and height sit at bytes 16..24 of a PNG; its CRC then lies too, which
    // the decoder must refuse or survive.
    small[16..20].copy_from_slice(&w.to_be_bytes());
    small[20..24].copy_from_slice(&h.to_be_bytes());
    small
}

#[test]
fn hostile_images_are_refused_by_the_reader_child_and_a_good_one_still_reads() {
    let r = reader();
    let mut truncated = png(300, 200);
    truncated.truncate(truncated.len() / 2);
    // 16,000 × 16,000 of one colour: a few hundred KiB that would decode to 768 MB.
    let bomb = {
        let img = image::GrayImage::from_pixel(16_000, 16_000, image::Luma([7]));
        let mut out = Vec::new();
        img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .expect("bomb");
        out
    };
    let cases = [
        ("image a truncated PNG through the reader child", truncated),
        (
            "image a PNG header of 100000×100000 through the reader child",
            png_claiming(100_000, 100_000),
        ),
        ("image a decompression bomb through the reader child", bomb),
        (
            "image a text file named .png through the reader child",
            b"not an image at all".to_vec(),
        ),
        (
            "image of 3000 pixels a side past a 2048 limit",
            png(3000, 4),
        ),
    ];
    let limits = ImageLimits {
        max_side: 2048,
        ..ImageLimits::default()
    };
    for (fault, bytes) in &cases {
        for _ in 0..5 {
            let started = Instant::now();
            let e = r
                .read_image("x.png", bytes, PROCESSOR, limits)
                .expect_err(fault);
            assert_eq!(e.code, ErrorCode::BadImage, "{fault}: {}", e.message);
            assert!(started.elapsed() < Duration::from_secs(20), "{fault}");
        }
        crate::tally::row(fault, "bad_image");
    }
    let good = r
        .read_image("good.png", &png(640, 480), PROCESSOR, limits)
        .expect("a good image");
    assert_eq!(good.original, (640, 480));
    let (th, tw) = PROCESSOR.target_size(480, 640).expect("target");
    assert_eq!(good.size, (tw, th));
    assert_eq!(good.pixels.len() as u32, tw * th * 3);
}
