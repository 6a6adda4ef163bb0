//! Gemma 4's vision against the reference (fixtures/vision, written by transformers 5.24 and
//! llama.cpp's converter, see make_vision.py and make_mmproj.sh): the tower and projector
//! from safetensors and from mmproj GGUF, an image's soft tokens in a prompt, and the
//! processor's patches of five awkward image files.

use crate::common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::max_diff;
use kvlab_engine::contract::{ImageLimits, ImageProcessor};
use kvlab_engine::lab::{
    KvPrecision, Logits, Model, Patches, PrecisionPolicy, SoftSpan, VisionTower,
};
use kvlab_engine::LoadOptions;

const TOL: f32 = 1e-3;

fn golden(style: &str) -> HashMap<String, Tensor> {
    common::golden(&format!("vision/{style}"))
}

/// The real (unpadded) patches of a golden `[max, 48]` pixel tensor and `[max, 2]` positions.
fn patches(pixels: &Tensor, positions: &Tensor, pooling: usize) -> Patches {
    let pos: Vec<Vec<i64>> = positions.to_vec2().expect("positions");
    let n = pos.iter().take_while(|p| p[0] >= 0).count();
    let values: Vec<f32> = pixels
        .narrow(0, 0, n)
        .expect("narrow")
        .flatten_all()
        .expect("flat")
        .to_vec1()
        .expect("values");
    let positions: Vec<(u32, u32)> = pos[..n]
        .iter()
        .map(|p| (p[0] as u32, p[1] as u32))
        .collect();
    let (w, h) = positions
        .iter()
        .fold((0, 0), |(w, h), p| (w.max(p.0 + 1), h.max(p.1 + 1)));
    Patches {
        values,
        positions,
        size: (w, h),
        original: (w, h),
        soft_tokens: n / (pooling * pooling),
    }
}

fn tower(style: &str) -> VisionTower {
    VisionTower::from_safetensors(
        &common::fixture(&format!("vision/{style}")),
        &LoadOptions::default(),
    )
    .expect("load tower")
    .expect("a vision checkpoint has a tower")
}

#[test]
fn the_tower_and_projector_match_transformers() {
    for style in ["e", "dense"] {
        let g = golden(style);
        let t = tower(style);
        let p = patches(
            &g["pixel_values"],
            &g["image_position_ids"],
            t.config().pooling_kernel_size,
        );
        assert_eq!(
            p.soft_tokens,
            g["soft_tokens"].dim(0).expect("n"),
            "{style}"
        );
        let out = t.encode(&p).expect("encode");
        let dt = max_diff(&out.tower, &g["vision_hidden"]);
        let ds = max_diff(&out.soft_tokens, &g["soft_tokens"]);
        eprintln!("{style}: tower max |diff| {dt:.2e}, soft tokens {ds:.2e}");
        assert!(dt <= TOL, "{style}: tower differs by {dt}");
        assert!(ds <= TOL, "{style}: soft tokens differ by {ds}");
        // The clipped linears (E) and the standardized pooler (31B) are what each style adds.
        assert_eq!(t.config().clipped_linears, style == "e");
        assert_eq!(t.config().standardize, style == "dense");
        let tokens = t.tokens().expect("the config names the image tokens");
        assert_eq!((tokens.begin, tokens.soft, tokens.end), (500, 501, 502));
    }
}

#[test]
fn an_mmproj_from_llamas_converter_loads_equal_to_safetensors() {
    for style in ["e", "dense"] {
        let g = golden(style);
        let path = common::fixture(&format!("vision/mmproj-{style}.f32.gguf"));
        let gguf = VisionTower::from_mmproj(&path, &LoadOptions::default()).expect("mmproj");
        let st = tower(style);
        // The mmproj stores the norm epsilon as f32; everything else is the same tower.
        let mut cfg = gguf.config().clone();
        assert_eq!(cfg.rms_norm_eps as f32, st.config().rms_norm_eps as f32);
        cfg.rms_norm_eps = st.config().rms_norm_eps;
        assert_eq!(
            &cfg,
            st.config(),
            "{style}: the same tower from either file"
        );
        let p = patches(&g["pixel_values"], &g["image_position_ids"], 3);
        let (a, b) = (gguf.encode(&p).expect("gguf"), st.encode(&p).expect("st"));
        assert_eq!(
            max_diff(&a.soft_tokens, &b.soft_tokens),
            0.0,
            "{style}: bit for bit"
        );
        assert!(max_diff(&a.soft_tokens, &g["soft_tokens"]) <= TOL);
    }
}

#[test]
fn an_image_in_the_prompt_gives_the_references_logits() {
    for style in ["e", "dense"] {
        let (model, g, ids, at, soft) = image_prompt(style);
        let spans = [SoftSpan { at, rows: soft }];
        let mut cache = model
            .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
            .expect("cache");
        let logits = model
            .forward_with(&ids, &spans, &mut cache, Logits::All)
            .expect("forward");
        // The 31B shape lets an image attend to itself both ways on sliding layers; its
        // causal-only reference stands apart from the real one, so the overlay is tested.
        let key = "logits";
        if model.config().image_bidirectional {
            let apart = max_diff(&g["logits"], &g["logits_causal"]);
            assert!(
                apart > 10.0 * TOL,
                "{style}: the overlay moves the logits ({apart})"
            );
            let d = max_diff(&logits, &g["logits_causal"]);
            assert!(d > 10.0 * TOL, "{style}: not the causal-only logits ({d})");
        }
        let d = max_diff(&logits, &g[key]);
        eprintln!("{style}: logits with an image max |diff| {d:.2e} (against {key})");
        assert!(d <= TOL, "{style}: logits differ by {d}");
        assert_eq!(model.config().image_bidirectional, style == "dense");
        // Without the image (its places read as the pad token) the logits move: the soft
        // tokens are what the text after the image sees.
        let mut plain = model
            .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
            .expect("cache");
        let without = model
            .forward(&ids, &mut plain, Logits::All)
            .expect("forward");
        assert!(
            max_diff(&without, &g[key]) > 0.1,
            "{style}: the image changes the answer"
        );
    }
}

/// A fixture's (`style`: "e" or "dense") model, golden, prompt ids, where its image's
/// places start, and the tower's soft tokens for them.
fn image_prompt(style: &str) -> (Model, HashMap<String, Tensor>, Vec<u32>, usize, Tensor) {
    let g = golden(style);
    let dir = common::fixture(&format!("vision/{style}"));
    let model = Model::load(&dir, &LoadOptions::default()).expect("text model");
    let p = patches(&g["pixel_values"], &g["image_position_ids"], 3);
    let soft = tower(style).encode(&p).expect("encode").soft_tokens;
    let ids: Vec<u32> = g["input_ids"]
        .to_vec1::<i64>()
        .expect("ids")
        .iter()
        .map(|&i| i as u32)
        .collect();
    let at = ids.iter().position(|&i| i == 501).expect("image places");
    (model, g, ids, at, soft)
}

#[test]
fn an_image_attends_both_ways_in_chunks_in_decode_and_in_every_storage() {
    let (model, g, ids, at, soft) = image_prompt("dense");
    let want = &g["logits"];
    let n = ids.len();
    let rows = |t: &Tensor, a: usize, len: usize| t.narrow(0, a, len).expect("rows");
    // The text before the image in one chunk, the image and the rest in the next, then the
    // last token decoded alone: each equals the reference's rows.
    let mut cache = model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache");
    let first = model
        .forward(&ids[..at], &mut cache, Logits::All)
        .expect("text chunk");
    let spans = [SoftSpan {
        at: 0,
        rows: soft.clone(),
    }];
    let second = model
        .forward_with(&ids[at..n - 1], &spans, &mut cache, Logits::All)
        .expect("image chunk");
    let last = model
        .forward(&ids[n - 1..], &mut cache, Logits::All)
        .expect("decode");
    for (name, got, a) in [
        ("text", &first, 0),
        ("image", &second, at),
        ("decode", &last, n - 1),
    ] {
        let d = max_diff(got, &rows(want, a, got.dim(0).expect("rows")));
        eprintln!("chunked, {name}: max |diff| {d:.2e}");
        assert!(d <= TOL, "chunked, {name}: {d}");
    }
    // Every storage path applies the same overlay: f16 (the CPU fast path) and TurboQuant
    // codes (the split storage's row ranges; ggml blocks need 32-wide heads, this fixture's
    // sliding heads are 16) stay within a tenth of what the overlay moves the logits.
    let apart = max_diff(want, &g["logits_causal"]);
    for spec in ["f16", "tq8"] {
        let policy = kvlab_engine::lab::CacheSpec::parse(spec)
            .expect("spec")
            .to_policy();
        let mut cache = model
            .new_cache(&policy)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let spans = [SoftSpan {
            at,
            rows: soft.clone(),
        }];
        let got = model
            .forward_with(&ids, &spans, &mut cache, Logits::All)
            .expect("forward");
        let d = max_diff(&got, want);
        eprintln!("{spec}: max |diff| {d:.2e} (the overlay moves the logits by {apart:.2e})");
        assert!(d < apart / 10.0, "{spec}: {d} against {apart}");
    }
}

#[test]
fn an_image_cut_by_a_chunk_or_two_images_in_one_are_refused_on_a_both_ways_model() {
    let (model, _, ids, at, soft) = image_prompt("dense");
    let half = soft.dim(0).expect("rows") / 2;
    for _ in 0..20 {
        let mut cache = model
            .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
            .expect("cache");
        let two = [
            SoftSpan {
                at,
                rows: soft.narrow(0, 0, half).expect("half"),
            },
            SoftSpan {
                at: at + half,
                rows: soft.narrow(0, half, half).expect("half"),
            },
        ];
        let err = model
            .forward_with(&ids, &two, &mut cache, Logits::Last)
            .expect_err("two images in a chunk");
        assert!(err.to_string().contains("one image per chunk"), "{err}");
        assert_eq!(cache.seq_len(), 0, "nothing kept");
    }
}

#[test]
fn the_processor_cuts_awkward_images_as_transformers_does() {
    let pre = candle_core::safetensors::load(
        common::fixture("vision/preprocess.safetensors"),
        &Device::Cpu,
    )
    .expect("preprocess golden");
    let cfg = tower("e").config().clone();
    let proc = ImageProcessor::new(&cfg, 70).expect("processor");
    for (file, tol) in [
        ("rgba.png", 0.0),
        ("gray.png", 0.0),
        ("wide.png", 0.0),
        // JPEGs: the decoders differ (zune-jpeg here, libjpeg-turbo under Pillow: IDCT and
        // chroma upsampling round apart), by a few levels of 255; everything after is exact.
        ("cmyk.jpg", 6.0 / 255.0),
        ("exif.jpg", 6.0 / 255.0),
    ] {
        let stem = file.split('.').next().expect("stem");
        let bytes = std::fs::read(common::fixture("vision/images").join(file)).expect("image");
        let got = proc.process(&bytes, ImageLimits::default()).expect(file);
        let want = patches(
            &pre[&format!("{stem}.pixel_values")],
            &pre[&format!("{stem}.position_ids")],
            3,
        );
        let soft = pre[&format!("{stem}.soft_tokens")]
            .to_vec1::<i64>()
            .expect("n")[0] as usize;
        assert_eq!(got.soft_tokens, soft, "{file}: soft tokens");
        assert_eq!(got.positions, want.positions, "{file}: patch positions");
        let d = got
            .values
            .iter()
            .zip(&want.values)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let off = got
            .values
            .iter()
            .zip(&want.values)
            .filter(|(a, b)| a != b)
            .count();
        eprintln!(
            "{file}: {}×{} → {:?}, max |diff| {d:.2e}, {off} of {} values differ",
            got.original.0,
            got.original.1,
            got.size,
            got.values.len()
        );
        assert!(d <= tol, "{file}: pixels differ by {d}");
    }
}

/// A PNG chunk: length, type, data, CRC.
fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut c = (data.len() as u32).to_be_bytes().to_vec();
    c.extend_from_slice(kind);
    c.extend_from_slice(data);
    let mut h = crc32fast::Hasher::new();
    h.update(kind);
    h.update(data);
    c.extend_from_slice(&h.finalize().to_be_bytes());
    c
}

/// A PNG header claiming `w`×`h` RGBA, with a few bytes of image data.
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &[0x78, 0x9c, 0x63, 0x00, 0x00]));
    png.extend(chunk(b"IEND", &[]));
    png
}

/// A GIF of `frames` 1×1 frames.
fn gif_of(frames: usize) -> Vec<u8> {
    let mut g = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\x00\x00\x00\x00\xff".to_vec();
    for _ in 0..frames {
        // Image descriptor, LZW code size 2, one sub-block: clear, index 0, end.
        g.extend_from_slice(b"\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00");
    }
    g.push(0x3b);
    g
}

#[test]
fn hostile_images_are_refused_in_bounded_time_and_memory() {
    let cfg = tower("e").config().clone();
    let proc = ImageProcessor::new(&cfg, 70).expect("processor");
    let good = std::fs::read(common::fixture("vision/images/rgba.png")).expect("png");
    let mut lying = good.clone();
    // IHDR's width (bytes 16..20) raised to 4000, its CRC fixed: the data runs out.
    lying[16..20].copy_from_slice(&4000u32.to_be_bytes());
    let crc = {
        let mut h = crc32fast::Hasher::new();
        h.update(&lying[12..29]);
        h.finalize()
    };
    lying[29..33].copy_from_slice(&crc.to_be_bytes());
    let faults: Vec<(&str, Vec<u8>)> = vec![
        (
            "a PNG header of 100000×100000",
            png_claiming(100_000, 100_000),
        ),
        (
            "a decompression bomb (16000×16000 RGBA, 1 GiB)",
            png_claiming(16_000, 16_000),
        ),
        ("a truncated PNG", good[..good.len() / 2].to_vec()),
        ("a PNG that lies about its size", lying),
        ("a text file named .png", b"hello, not an image".to_vec()),
        ("an empty file", Vec::new()),
    ];
    for (fault, bytes) in &faults {
        for _ in 0..20 {
            let t = std::time::Instant::now();
            let err = proc
                .process(bytes, ImageLimits::default())
                .expect_err(fault);
            assert!(t.elapsed().as_secs() < 5, "{fault}: {:?}", t.elapsed());
            assert_eq!(
                err.code(),
                kvlab_engine::contract::ErrorCode::InvalidRequest,
                "{fault}: {err}"
            );
            assert!(err.to_string().contains("image"), "{fault}: {err}");
            // The two oversized headers are stopped by the limits, before any allocation.
            if fault.contains("000×") {
                assert!(err.to_string().contains("limit"), "{fault}: {err}");
            }
        }
        let _ = std::io::Write::write_all(
            &mut std::io::stderr().lock(),
            format!("HOSTILE image {fault} -> invalid_request\n").as_bytes(),
        );
    }
    // An animated GIF of 10,000 frames: its first frame is read, the rest never decoded.
    let gif = gif_of(10_000);
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let p = proc
            .process(&gif, ImageLimits::default())
            .expect("first frame");
        assert!(t.elapsed().as_secs() < 5);
        assert_eq!(p.original, (1, 1));
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr().lock(),
        b"HOSTILE image an animated GIF of 10000 frames -> first_frame\n",
    );
    // A text-only checkpoint has no tower to read an image with.
    let none = VisionTower::from_safetensors(&common::fixture("tiny_e"), &LoadOptions::default())
        .expect("reads the config");
    assert!(none.is_none(), "tiny_e is text only");
}

#[test]
fn patches_that_do_not_tile_and_soft_tokens_that_do_not_fit_are_refused() {
    let t = tower("e");
    let width = 3 * 4 * 4;
    // 18 patches (two soft tokens' worth) laid 2 wide and 9 tall: not whole 3×3 squares.
    let positions: Vec<(u32, u32)> = (0..9).flat_map(|y| (0..2).map(move |x| (x, y))).collect();
    let bad = Patches {
        values: vec![0.5; positions.len() * width],
        positions,
        size: (8, 36),
        original: (8, 36),
        soft_tokens: 2,
    };
    for _ in 0..20 {
        let err = t.encode(&bad).expect_err("a 2×9 grid does not pool by 3×3");
        assert!(err.to_string().contains("tile"), "{err}");
    }
    // The same 18 patches laid 3 × 6 pool into two soft tokens.
    let good = Patches {
        positions: (0..6).flat_map(|y| (0..3).map(move |x| (x, y))).collect(),
        ..bad
    };
    assert_eq!(t.encode(&good).expect("3×6").soft_tokens.dims(), [2, 64]);

    // Soft tokens of the wrong width, or running past the chunk, leave the cache as it was.
    let model = Model::load(&common::fixture("vision/e"), &LoadOptions::default()).expect("model");
    let mut cache = model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache");
    let ids = [2u32, 500, 501, 501, 502];
    let narrow = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).expect("t");
    let wide = Tensor::zeros((2, 64), candle_core::DType::F32, &Device::Cpu).expect("t");
    for _ in 0..20 {
        for span in [
            SoftSpan {
                at: 2,
                rows: narrow.clone(),
            },
            SoftSpan {
                at: 4,
                rows: wide.clone(),
            },
        ] {
            let err = model
                .forward_with(&ids, &[span], &mut cache, Logits::Last)
                .expect_err("does not fit");
            assert!(err.to_string().contains("do not fit"), "{err}");
            assert_eq!(cache.seq_len(), 0);
        }
    }
    let ok = [SoftSpan { at: 2, rows: wide }];
    model
        .forward_with(&ids, &ok, &mut cache, Logits::Last)
        .expect("fits");
    assert_eq!(cache.seq_len(), 5);
}
