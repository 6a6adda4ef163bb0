//! The server over real HTTP on the tiny Gemma 3 GGUF: answers in OpenAI's shapes whole and
//! streamed (the stream adds up to the whole answer), a request's own KV cache with its
//! exact bytes back, stop strings, and each refusal with its status and code.

mod common;

use common::{chat, post, request, Reply, Server};
use kvlab_server::ServerConfig;
use serde_json::{json, Value};

fn start(max_body_bytes: usize) -> Server {
    common::start(ServerConfig {
        max_body_bytes,
        ..ServerConfig::local(0)
    })
}

#[test]
fn answers_whole_and_streamed_agree_and_carry_the_caches_bytes() {
    let server = start(kvlab_server::DEFAULT_MAX_BODY_BYTES);
    let models = request(server.addr, "GET", "/v1/models", "localhost", "").json();
    assert_eq!(models["data"][0]["id"], "tiny_gemma3.f32.gguf");

    let whole = post(server.addr, "/v1/chat/completions", chat(json!({})));
    assert_eq!(whole.status, 200, "{}", whole.body);
    let whole = whole.json();
    assert_eq!(whole["object"], "chat.completion");
    let content = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert!(!content.is_empty());
    let usage = &whole["usage"];
    assert_eq!(usage["kv_cache"], "f16");
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let f16_bytes = usage["kv_bytes"].as_u64().expect("kv_bytes");
    assert!(f16_bytes > 0);

    // Streamed: the deltas add up to the same greedy answer, then usage, then [DONE].
    let streamed = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert_eq!(streamed.status, 200);
    assert!(
        streamed.headers.contains("content-type: text/event-stream"),
        "{}",
        streamed.headers
    );
    let events = streamed.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("a chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, content);
    let last = chunks.last().expect("a usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["kv_bytes"].as_u64(), Some(f16_bytes));

    // The same conversation in an f32 cache holds exactly twice the bytes, and it says so.
    let f32 = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"kv_cache": "f32"})),
    )
    .json();
    assert_eq!(f32["usage"]["kv_cache"], "f32");
    assert_eq!(f32["usage"]["kv_bytes"].as_u64(), Some(2 * f16_bytes));
    assert_eq!(f32["choices"][0]["message"]["content"], content.as_str());

    // Layers of their own formats: two of the six in f32, the rest f16. It says its SPEC
    // canonically and holds more than f16 and less than f32 everywhere.
    let layered = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"kv_cache": "F16, 1=f32, 0=f32"})),
    )
    .json();
    assert_eq!(layered["usage"]["kv_cache"], "f16,0-1=f32");
    let bytes = layered["usage"]["kv_bytes"].as_u64().expect("kv_bytes");
    assert!(
        f16_bytes < bytes && bytes < 2 * f16_bytes,
        "{bytes} vs {f16_bytes}"
    );

    // The next request without one runs in the server's default cache again.
    let again = post(server.addr, "/v1/chat/completions", chat(json!({}))).json();
    assert_eq!(again["usage"]["kv_cache"], "f16");
    assert_eq!(again["usage"]["kv_bytes"].as_u64(), Some(f16_bytes));

    // A stop string cuts the answer before it, as a stop.
    let cut = content
        .char_indices()
        .nth(content.chars().count() / 2)
        .map(|(i, _)| i)
        .unwrap_or(0);
    let stop: String = content[cut..].chars().take(3).collect();
    let stopped = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"stop": [stop.clone()]})),
    )
    .json();
    let expect = &content[..content.find(&stop).expect("stop in the answer")];
    assert_eq!(stopped["choices"][0]["message"]["content"], expect);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Plain completions continue text.
    let done = post(
        server.addr,
        "/v1/completions",
        json!({"prompt": "The sea", "temperature": 0, "max_tokens": 5}),
    )
    .json();
    assert_eq!(done["object"], "text_completion");
    assert_eq!(done["usage"]["completion_tokens"], 5);

    // The timeline and the metrics see the cache.
    let kv = request(server.addr, "GET", "/v1/kv", "localhost", "").json();
    assert_eq!(kv["now"]["cache_spec"], "f16");
    assert_eq!(
        kv["now"]["kv"]["total_used"].as_u64(),
        Some(server.engine.status().kv.total_used)
    );
    let metrics = request(server.addr, "GET", "/metrics", "localhost", "").body;
    assert!(
        metrics.contains("kvlab_requests_total{endpoint=\"chat\"} 6"),
        "{metrics}"
    );
    assert!(metrics.contains("kvlab_queue_depth 0"), "{metrics}");
}

#[test]
fn refusals_have_openai_shapes_statuses_and_our_codes() {
    let server = start(64 * 1024);
    let code = |r: &Reply| r.json()["error"]["code"].as_str().unwrap_or("").to_string();
    let bad_spec = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"kv_cache": "tq9"})),
    );
    assert_eq!(
        (bad_spec.status, code(&bad_spec).as_str()),
        (400, "invalid_request")
    );
    let unknown = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"model": "gpt-4o"})),
    );
    assert_eq!(
        (unknown.status, code(&unknown).as_str()),
        (404, "model_not_found")
    );
    let foreign = request(server.addr, "GET", "/v1/models", "evil.example", "");
    assert_eq!(
        (foreign.status, code(&foreign).as_str()),
        (403, "forbidden_host")
    );
    let huge = "word ".repeat(20_000);
    let too_big = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": "user", "content": huge}]})),
    );
    assert_eq!(
        (too_big.status, code(&too_big).as_str()),
        (413, "request_too_large")
    );
    // Under the cap but over the model's 256-token context.
    let long = "sea ".repeat(400);
    let overflow = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": "user", "content": long}], "stream": true})),
    );
    assert_eq!(
        (overflow.status, code(&overflow).as_str()),
        (400, "context_overflow")
    );
    let not_json = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        "localhost",
        "{",
    );
    assert_eq!(
        (not_json.status, code(&not_json).as_str()),
        (400, "invalid_request")
    );
    // The engine is unharmed.
    assert_eq!(
        post(server.addr, "/v1/chat/completions", chat(json!({}))).status,
        200
    );
}
