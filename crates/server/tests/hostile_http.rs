//! The server against careless and hostile clients over loopback (issue 36): each test sends
//! one attack, asserts the refusal or the bound (memory from `/proc/self/status`, times only
//! as generous ceilings), checks that a normal request is still answered, and writes its
//! `HOSTILE <attack> -> <outcome>` line for `scripts/hostile.sh`. The tests run one at a
//! time (one lock), so one test's memory is not another's.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use common::{
    chat, connect, eventually, get, head, hostile, parse, peak_rise_mib, post, read_reply,
    reset_peak, send_as_in_thread, serial, start, Hold, Reply,
};
use kvlab_engine::contract::MAX_QUEUED;
use kvlab_server::{Limits, ServerConfig};
use serde_json::{json, Value};

fn config(f: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    let mut c = ServerConfig::local(0);
    f(&mut c);
    c
}

/// Sends `body` on a new connection in a thread; the reply comes on the handle.
fn send_in_thread(
    addr: std::net::SocketAddr,
    body: Value,
) -> std::thread::JoinHandle<(Reply, Duration)> {
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = post(addr, "/v1/chat/completions", body);
        (r, t.elapsed())
    })
}

#[test]
fn hostile_max_tokens_of_a_billion_is_cut_to_the_servers_bound() {
    let _one = serial();
    let server = start(config(|c| {
        c.limits = Limits {
            max_tokens: 8,
            context: None,
            ..Limits::default()
        }
    }));
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"max_tokens": 1_000_000_000u64})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["usage"]["completion_tokens"].as_u64() <= Some(8), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    hostile("max_tokens of 1e9 -> capped");
    server.still_answers();
}

#[test]
fn hostile_a_prompt_over_the_servers_context_is_refused_before_any_work() {
    let _one = serial();
    let server = start(config(|c| {
        c.limits = Limits {
            max_tokens: 8,
            context: Some(64),
            ..Limits::default()
        }
    }));
    // Over --ctx 64 but within the model's 256 tokens: the server's limit refuses it.
    let r = post(
        server.addr,
        "/v1/completions",
        json!({"prompt": "1234567890".repeat(12), "max_tokens": 4}),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "context_overflow"));
    assert!(r.body.contains("64"), "{}", r.body);
    // A prompt that fits gets an answer that ends where the context does.
    let r = post(
        server.addr,
        "/v1/completions",
        json!({"prompt": "123", "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    hostile("prompt over the server's --ctx -> context_overflow");
    server.still_answers();
}

#[test]
fn hostile_a_262_kb_message_is_refused_without_holding_the_engine() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let base = reset_peak();
    let t = Instant::now();
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": "user", "content": "sea ".repeat(65_536)}]})),
    );
    let took = t.elapsed();
    assert_eq!((r.status, r.code().as_str()), (400, "context_overflow"));
    let rise = peak_rise_mib(base);
    eprintln!("262 KB message: refused in {took:?}, peak RSS +{rise:.1} MiB");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(rise < 32.0, "+{rise:.1} MiB");
    hostile("262 KB chat message -> context_overflow");
    server.still_answers();
}

#[test]
fn hostile_requests_past_a_full_queue_are_refused_the_moment_they_arrive() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let hold = Hold::new(&server, &[1]);
    hold.held();
    // Sixteen clients (a client holds at most PER_CLIENT_QUEUED places).
    let waiting: Vec<_> = (0..MAX_QUEUED)
        .map(|i| {
            send_as_in_thread(
                server.addr,
                chat(json!({"max_tokens": 2})),
                &format!("client-{i}"),
            )
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || server.engine.status().queued
            == MAX_QUEUED),
        "{} queued",
        server.engine.status().queued
    );
    // The engine thread is held: every refusal comes from admission, not from a step.
    for _ in 0..8 {
        let t = Instant::now();
        let r = post(server.addr, "/v1/chat/completions", chat(json!({})));
        assert_eq!((r.status, r.code().as_str()), (429, "queue_full"));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    hold.release();
    for w in waiting {
        let (r, _) = w.join().expect("client");
        assert_eq!(r.status, 200, "{}", r.body);
    }
    hostile("requests past a full queue while the engine is held -> queue_full");
    server.still_answers();
}

#[test]
fn hostile_queued_clients_that_leave_free_their_places_at_once() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let hold = Hold::new(&server, &[1]);
    hold.held();
    let body = chat(json!({"max_tokens": 2})).to_string();
    let mut leaving: Vec<TcpStream> = (0..MAX_QUEUED)
        .map(|i| {
            let mut s = connect(server.addr);
            // Sixteen clients (a client holds at most PER_CLIENT_QUEUED places).
            let head = head("POST", "/v1/chat/completions", "localhost", body.len()).replace(
                "\r\n\r\n",
                &format!("\r\nAuthorization: Bearer leaving-{i}\r\n\r\n"),
            );
            s.write_all(head.as_bytes()).expect("write");
            s.write_all(body.as_bytes()).expect("write");
            s
        })
        .collect();
    assert!(eventually(Duration::from_secs(20), || server
        .engine
        .status()
        .queued
        == MAX_QUEUED));
    for s in leaving.drain(..) {
        let _ = s.shutdown(Shutdown::Both);
    }
    let t = Instant::now();
    let freed = eventually(Duration::from_secs(5), || {
        server.engine.status().queued == 0
    });
    assert!(freed, "{} still queued", server.engine.status().queued);
    let took = t.elapsed();
    eprintln!("16 queued clients left: their places free in {took:?}");
    // A newcomer gets a place, not queue_full.
    let newcomer = send_in_thread(server.addr, chat(json!({"max_tokens": 2})));
    assert!(eventually(Duration::from_secs(10), || server
        .engine
        .status()
        .queued
        == 1));
    hold.release();
    let (r, _) = newcomer.join().expect("newcomer");
    assert_eq!(r.status, 200, "{}", r.body);
    hostile("16 queued clients that leave -> places_freed");
    server.still_answers();
}

#[test]
fn hostile_half_a_request_head_is_closed_after_the_header_timeout() {
    let _one = serial();
    let server = start(config(|c| c.header_timeout = Duration::from_secs(1)));
    let mut half = connect(server.addr);
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: loc")
        .expect("write");
    let mut silent = connect(server.addr);
    for s in [&mut half, &mut silent] {
        let t = Instant::now();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "still open after {took:?}");
        let r = parse(&rest);
        assert!(r.status == 0 || r.status == 408, "{}", r.headers);
    }
    hostile("half a request head, then nothing -> connection_closed");
    server.still_answers();
}

#[test]
fn hostile_a_body_that_stops_arriving_is_answered_408() {
    let _one = serial();
    let server = start(config(|c| c.body_timeout = Duration::from_secs(1)));
    let mut s = connect(server.addr);
    s.write_all(head("POST", "/v1/chat/completions", "localhost", 100).as_bytes())
        .expect("write");
    s.write_all(br#"{"messages":"#).expect("write");
    let t = Instant::now();
    let r = read_reply(&mut s);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!((r.status, r.code().as_str()), (408, "request_timeout"));
    hostile("a body that stops after 12 of 100 bytes -> request_timeout");
    server.still_answers();
}

#[test]
fn hostile_a_declared_body_of_10_gib_is_refused_before_it_is_read() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let mut s = connect(server.addr);
    s.write_all(head("POST", "/v1/chat/completions", "localhost", 10 << 30).as_bytes())
        .expect("write");
    let t = Instant::now();
    let r = read_reply(&mut s);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!((r.status, r.code().as_str()), (413, "request_too_large"));
    hostile("Content-Length of 10 GiB -> request_too_large");
    server.still_answers();
}

#[test]
fn hostile_connections_over_the_limit_are_refused_and_their_places_come_back() {
    let _one = serial();
    let server = start(config(|c| c.max_connections = 4));
    // Four connections with a request in flight each (the engine held): none is idle.
    let hold = Hold::new(&server, &[1]);
    hold.held();
    let busy: Vec<_> = (0..4)
        .map(|i| {
            send_as_in_thread(
                server.addr,
                chat(json!({"max_tokens": 2})),
                &format!("busy-{i}"),
            )
        })
        .collect();
    assert!(eventually(Duration::from_secs(20), || server
        .engine
        .status()
        .queued
        == 4));
    let mut fifth = connect(server.addr);
    let r = read_reply(&mut fifth);
    assert_eq!((r.status, r.code().as_str()), (503, "too_many_connections"));
    hold.release();
    for b in busy {
        let (r, _) = b.join().expect("client");
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let served = eventually(Duration::from_secs(10), || {
        post(server.addr, "/v1/chat/completions", chat(json!({}))).status == 200
    });
    assert!(served, "the places did not come back");
    hostile("connections over the limit -> too_many_connections");
    server.still_answers();
}

#[test]
fn hostile_idle_connections_at_the_limit_make_way_for_a_newcomer() {
    let _one = serial();
    let server = start(config(|c| c.max_connections = 4));
    // Every place taken by connections that send nothing (slowloris heads and idle
    // keep-alives look alike here: no request in flight).
    let mut idle: Vec<TcpStream> = (0..4).map(|_| connect(server.addr)).collect();
    idle[0]
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: loc")
        .expect("write");
    std::thread::sleep(Duration::from_millis(200));
    for round in 0..8 {
        let t = Instant::now();
        let r = post(
            server.addr,
            "/v1/chat/completions",
            chat(json!({"max_tokens": 2})),
        );
        assert_eq!(r.status, 200, "round {round}: {}", r.body);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        idle.push(connect(server.addr));
    }
    hostile("idle connections holding every place -> shed");
    server.still_answers();
}

#[test]
fn hostile_bodies_read_at_once_are_bounded_across_connections() {
    let _one = serial();
    let budget = 16 << 20;
    let server = start(config(|c| {
        c.max_buffered_bytes = budget;
        c.body_timeout = Duration::from_secs(2);
    }));
    let base = reset_peak();
    let size = 8_300_000;
    // 24 clients each declare an 8.3 MB body and send all of it but the last 100 bytes.
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut s = connect(addr);
                s.set_write_timeout(Some(Duration::from_secs(20)))
                    .expect("timeout");
                let _ =
                    s.write_all(head("POST", "/v1/chat/completions", "localhost", size).as_bytes());
                // Small writes: the figure is the server's memory, not the clients' buffers.
                let chunk = vec![b' '; 1 << 16];
                let mut sent = 0;
                while sent < size - 100 {
                    let n = chunk.len().min(size - 100 - sent);
                    if s.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                    sent += n;
                }
                read_reply(&mut s)
            })
        })
        .collect();
    let replies: Vec<Reply> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    let rise = peak_rise_mib(base);
    let busy = replies.iter().filter(|r| r.code() == "busy").count();
    let timed_out = replies
        .iter()
        .filter(|r| r.code() == "request_timeout")
        .count();
    eprintln!("24 bodies of 8.3 MB at once: {busy} busy, {timed_out} read then timed out; peak RSS +{rise:.1} MiB");
    assert_eq!(busy + timed_out, 24, "every client answered");
    assert!(
        timed_out <= budget / size,
        "{timed_out} bodies read at once"
    );
    assert!(rise < 48.0, "+{rise:.1} MiB for a 16 MiB budget");
    hostile("24 bodies of 8.3 MB at once -> busy");
    server.still_answers();
}

#[test]
fn hostile_an_unknown_field_of_8_mb_is_skipped_without_copies() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let base = reset_peak();
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"padding": "x".repeat(7_900_000)})),
    );
    let rise = peak_rise_mib(base);
    eprintln!(
        "7.9 MB unknown field: {} in peak RSS +{rise:.1} MiB",
        r.status
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // The test's own body (its JSON value and its text) is in the figure too.
    assert!(rise < 48.0, "+{rise:.1} MiB for a 7.9 MB body");
    hostile("unknown field of 7.9 MB -> skipped");
    server.still_answers();
}

#[test]
fn hostile_a_kv_cache_spec_of_8_mb_gets_a_short_error() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let base = reset_peak();
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"kv_cache": "q".repeat(7_900_000)})),
    );
    let rise = peak_rise_mib(base);
    eprintln!(
        "7.9 MB kv_cache: {} {} bytes of error, peak RSS +{rise:.1} MiB",
        r.status,
        r.body.len()
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    assert!(r.body.len() < 1024, "{} bytes", r.body.len());
    assert!(rise < 48.0, "+{rise:.1} MiB");
    hostile("kv_cache SPEC of 7.9 MB -> invalid_request");
    server.still_answers();
}

#[test]
fn hostile_a_2_mb_prompt_is_refused_without_its_tokens() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let base = reset_peak();
    let t = Instant::now();
    let r = post(
        server.addr,
        "/v1/completions",
        json!({"prompt": "7".repeat(2_000_000)}),
    );
    let took = t.elapsed();
    let rise = peak_rise_mib(base);
    eprintln!("2 MB prompt: refused in {took:?}, peak RSS +{rise:.1} MiB");
    assert_eq!((r.status, r.code().as_str()), (400, "context_overflow"));
    assert!(rise < 64.0, "+{rise:.1} MiB");
    hostile("2 MB prompt -> context_overflow");
    server.still_answers();
}

#[test]
fn hostile_a_stop_with_a_stream_open_ends_it_and_returns_within_seconds() {
    let _one = serial();
    let mut server = start(ServerConfig::local(0));
    // A stream that has started: the engine is held at the test's own request's first
    // token while the stream is sent, then let go, and held again 40 of its tokens later,
    // when the two have taken turns and the stream has sent text (sampled, seeded: the tiny
    // model's greedy answer is bytes that make no text until its end).
    let hold = Hold::new(&server, &[1, 40]);
    hold.held();
    let body =
        chat(json!({"stream": true, "max_tokens": 200, "temperature": 1.5, "seed": 1})).to_string();
    let mut s = connect(server.addr);
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(head("POST", "/v1/chat/completions", "localhost", body.len()).as_bytes())
        .expect("write");
    s.write_all(body.as_bytes()).expect("write");
    assert!(eventually(Duration::from_secs(20), || server
        .engine
        .status()
        .queued
        == 1));
    hold.release();
    hold.held();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"role\"") {
        let n = s.read(&mut buf).expect("the stream's first event");
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    let t = Instant::now();
    server.stop().expect("serve returns");
    let stopped = t.elapsed();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    seen.extend(rest);
    let r = parse(&seen);
    let events = r.events();
    eprintln!("stop with a stream open: serve returned in {stopped:?}");
    assert!(stopped < Duration::from_secs(4), "{stopped:?}");
    let last: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    assert!(
        last.iter()
            .any(|e| e["choices"][0]["finish_reason"] == "cancelled"),
        "{events:?}"
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    drop(hold);
    hostile("stop (Ctrl-C, the app's switch) with a stream open -> cancelled");
}

#[test]
fn hostile_reads_of_the_timeline_write_nothing() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let count = || {
        get(server.addr, "/v1/kv").json()["samples"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let t = Instant::now();
    let before = count();
    for _ in 0..60 {
        assert_eq!(get(server.addr, "/v1/kv").status, 200);
    }
    let after = count();
    // The sampler's own ticks (one per 500 ms) are the only new samples.
    let ticks = (t.elapsed().as_millis() / 500) as usize + 2;
    assert!(
        after - before <= ticks,
        "{before} -> {after} in {:?}",
        t.elapsed()
    );
    hostile("61 reads of GET /v1/kv -> no_side_effects");
    server.still_answers();
}

#[test]
fn hostile_schemas_and_tools_are_refused_with_short_errors_or_bounded() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let mut deep = json!({"type": "integer"});
    for _ in 0..600 {
        deep = json!({"type": "array", "items": deep});
    }
    let schema = |s: Value| json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}});
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let refused = [
        ("response_format schema nested 600 deep", schema(deep)),
        (
            "tool_choice required on a model without tools",
            json!({"tools": [weather], "tool_choice": "required"}),
        ),
        ("129 tools", json!({"tools": vec![weather.clone(); 129]})),
        (
            "tool call arguments that are not JSON",
            json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{city: Paris"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
        ),
    ];
    for round in 0..20 {
        for (what, extra) in &refused {
            let r = post(server.addr, "/v1/chat/completions", chat(extra.clone()));
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "invalid_request"),
                "{what}: {}",
                r.body
            );
            assert!(r.body.len() < 1024, "{what}: {} bytes", r.body.len());
            if round == 0 {
                hostile(&format!("{what} -> invalid_request"));
            }
        }
    }
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(json!({"tools": [weather], "tool_choice": "required"})),
    );
    assert!(
        r.body.contains("Gemma 3 models have no tool-call syntax"),
        "{}",
        r.body
    );
    // A schema that compiles but is large (an enum of 10k members): each step's mask is
    // bounded, and the answer is one of the members.
    let members: Vec<String> = (0..10_000).map(|i| format!("member-{i}")).collect();
    let t = Instant::now();
    let r = post(
        server.addr,
        "/v1/chat/completions",
        chat(
            json!({"max_tokens": 40, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"enum": members}}}}),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let content = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    if r.json()["choices"][0]["finish_reason"] == "stop" {
        let v: String = serde_json::from_str(&content).expect("a JSON string");
        assert!(members.contains(&v), "{v}");
    } else {
        assert!(content.starts_with("\"member-"), "{content}");
    }
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    hostile("response_format enum of 10k members -> bounded");
    server.still_answers();
}
