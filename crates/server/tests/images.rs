//! Images over HTTP on the tiny Gemma 4 with its vision tower: an `image_url` part with a
//! `data:` URL is read (its tokens in the usage), and whatever else is refused with a clear
//! error, many times, leaving no conversation: a remote URL (the server fetches nothing),
//! bad base64, a file that is no image, an image past the side limit, and an image part
//! outside a user message.

mod common;

use std::io::Cursor;

use base64::Engine as _;
use common::{post, Server};
use kvlab_engine::contract::ImageLimits;
use kvlab_server::{Limits, ServerConfig};
use serde_json::{json, Value};

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x ^ y) as u8]));
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .expect("png");
    out
}

fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn ask(parts: Value, conversation: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": parts}],
        "temperature": 0, "max_tokens": 3, "conversation": conversation,
    })
}

fn start() -> (tempfile::TempDir, Server) {
    let (dir, load) = common::vision_model();
    let config = ServerConfig {
        limits: Limits {
            images: ImageLimits {
                max_side: 1000,
                ..ImageLimits::default()
            },
            ..Limits::default()
        },
        ..ServerConfig::local(0)
    };
    (dir, common::start_with(config, load))
}

#[test]
fn an_inline_image_is_read_and_its_tokens_counted() {
    let _serial = common::serial();
    let (_dir, server) = start();
    let bytes = png(40, 30);
    let info = server
        .engine
        .add_image(&bytes, ImageLimits::default())
        .expect("image");
    let plain = post(
        server.addr,
        "/v1/chat/completions",
        ask(json!([{"type": "text", "text": "What is it?"}]), "plain"),
    );
    assert_eq!(plain.status, 200, "{}", plain.body);
    let with = post(
        server.addr,
        "/v1/chat/completions",
        ask(
            json!([{"type": "text", "text": "What is it?"},
                   {"type": "image_url", "image_url": {"url": data_url(&bytes)}}]),
            "with",
        ),
    );
    assert_eq!(with.status, 200, "{}", with.body);
    let tokens = |r: &common::Reply| r.json()["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert_eq!(tokens(&with), tokens(&plain) + info.tokens as u64);
}

#[test]
fn hostile_image_parts_are_refused_with_clear_errors_and_leave_nothing() {
    let _serial = common::serial();
    let (_dir, server) = start();
    let mut truncated = png(64, 64);
    truncated.truncate(truncated.len() / 2);
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "a remote image URL",
            json!([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]),
            "invalid_request",
            "fetches nothing",
        ),
        (
            "an image data URL that is not base64",
            json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]),
            "invalid_request",
            "base64",
        ),
        (
            "a truncated PNG as a data URL",
            json!([{"type": "image_url", "image_url": {"url": data_url(&truncated)}}]),
            "bad_image",
            "cannot read the image",
        ),
        (
            "an image past --max-image-side",
            json!([{"type": "image_url", "image_url": {"url": data_url(&png(1200, 8))}}]),
            "bad_image",
            "cannot read the image",
        ),
    ];
    let before = server.engine.status().conversations.len();
    for (what, parts, code, says) in &cases {
        for k in 0..20 {
            let r = post(
                server.addr,
                "/v1/chat/completions",
                ask(parts.clone(), &format!("c{k}")),
            );
            assert_eq!(r.status, 400, "{what}: {}", r.body);
            assert_eq!(r.code(), *code, "{what}");
            let message = r.json()["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            assert!(message.contains(says), "{what}: {message}");
        }
        common::hostile(&format!("{what} -> {code}"));
    }
    // An image in an assistant's message.
    let body = json!({
        "messages": [{"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": [{"type": "image_url",
                       "image_url": {"url": data_url(&png(8, 8))}}]},
                     {"role": "user", "content": "And?"}],
        "max_tokens": 2,
    });
    let r = post(server.addr, "/v1/chat/completions", body);
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    assert_eq!(
        server.engine.status().conversations.len(),
        before,
        "no conversation left behind"
    );
    let after = post(
        server.addr,
        "/v1/chat/completions",
        ask(json!([{"type": "text", "text": "Still there?"}]), "after"),
    );
    assert_eq!(after.status, 200, "{}", after.body);
}
