//! The pool against careless and hostile clients (issue 55), over loopback against the real
//! server on the tiny model: places given back by every refusal, a budget that bounds what
//! is allocated, conversations no other client can name, list or reach, files the server
//! did not write left alone, limits a slow client cannot hold. Each test asserts its bound
//! or refusal, then that a normal request is answered, and writes its
//! `HOSTILE <attack> -> <outcome>` line for `scripts/hostile.sh`. The tests run one at a
//! time (one lock).

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{
    chat, connect, eventually, get, get_as, head, hostile, peak_rise_mib, post, post_as,
    read_reply, reset_peak, send_as_in_thread, serial, start, Hold, Server,
};
use kvlab_engine::contract::PER_CLIENT_QUEUED;
use kvlab_engine::PoolSettings;
use kvlab_server::{Limits, ServerConfig};
use serde_json::{json, Value};

/// The server's pool settings, changed by `f`.
fn pool(server: &Server, f: impl FnOnce(&mut PoolSettings)) {
    let mut p = server.engine.pool_settings();
    f(&mut p);
    server.engine.set_pool_settings(p);
}

const CHAT: &str = "/v1/chat/completions";

/// A chat of `words` words of text, as client `token`, in conversation `name` (none: an
/// unnamed one), with `extra` fields.
fn say(server: &Server, token: &str, name: Option<&str>, text: &str, extra: Value) -> Value {
    let mut body = chat(json!({
        "messages": [{"role": "user", "content": text}], "max_tokens": 4,
    }));
    if let Some(n) = name {
        body["conversation"] = json!(n);
    }
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let r = post_as(server.addr, CHAT, body, token);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn cached(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

#[test]
fn hostile_requests_refused_while_rendered_give_their_places_back() {
    let _one = serial();
    let server = start(ServerConfig {
        limits: Limits {
            context: Some(64),
            ..Limits::default()
        },
        ..ServerConfig::local(0)
    });
    // Three rounds of refusals, more than the queue holds each.
    for round in 0..3 {
        for i in 0..20 {
            let long = "sea ".repeat(200);
            let r = post(
                server.addr,
                CHAT,
                chat(json!({"messages": [{"role": "user", "content": long}]})),
            );
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "context_overflow"),
                "round {round}, {i}: {}",
                r.body
            );
            let r = post(server.addr, "/v1/completions", json!({"prompt": []}));
            assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
            let r = post(server.addr, "/v1/completions", json!({"prompt": ""}));
            assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
        }
        assert_eq!(server.engine.status().queued, 0, "round {round}");
        server.still_answers();
    }
    hostile("60 requests refused while rendered -> context_overflow");
    hostile("/v1/completions with \"prompt\": [] -> invalid_request");
    server.still_answers();
}

#[test]
fn hostile_requests_refused_out_of_memory_register_nothing() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    pool(&server, |p| p.kv_budget = Some(1024));
    let before = server.engine.status().conversations.len();
    for i in 0..200 {
        let r = post_as(
            server.addr,
            CHAT,
            chat(json!({})),
            &format!("oom-{}", i % 7),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (507, "out_of_memory"),
            "{}",
            r.body
        );
        let named = chat(json!({"conversation": format!("c{i}")}));
        let r = post_as(server.addr, CHAT, named, "oom");
        assert_eq!(r.code(), "out_of_memory", "{}", r.body);
    }
    let after = server.engine.status().conversations.len();
    assert_eq!((before, after), (0, 0), "refusals registered conversations");
    assert_eq!(server.engine.status().queued, 0);
    hostile("400 requests refused out_of_memory -> out_of_memory");
    pool(&server, |p| p.kv_budget = None);
    server.still_answers();
}

#[test]
fn hostile_the_kv_budget_bounds_what_is_allocated() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    // What one short conversation allocates (the room its layers keep, not its bytes).
    say(&server, "probe", Some("probe"), "The sea.", json!({}));
    let one = server.engine.status().kv.total_allocated;
    assert!(one > 0);
    let budget = 3 * one;
    pool(&server, |p| {
        p.kv_budget = Some(budget);
        p.spill_dir = None;
    });
    for i in 0..40 {
        say(&server, &format!("client-{i}"), None, "The sea.", json!({}));
        let s = server.engine.status();
        let held: Vec<_> = s
            .conversations
            .iter()
            .map(|c| (c.tier, c.bytes, c.tokens, c.spec.clone()))
            .filter(|c| c.1 > 0)
            .collect();
        assert!(
            s.kv.total_allocated <= budget,
            "conversation {i}: {} allocated under a budget of {budget}: {held:?}",
            s.kv.total_allocated
        );
    }
    eprintln!("40 one-turn conversations: at most {budget} bytes allocated ({one} each)");
    hostile("40 one-turn conversations under a budget of three -> bounded");
    server.still_answers();
}

#[test]
fn hostile_another_clients_conversations_cannot_be_named_guessed_or_listed() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let text = "Tell me about the sea, the ships on it and the harbour they sail from.";
    // Client a's named conversation and its next turn.
    let a1 = say(&server, "a", Some("chat"), text, json!({}));
    assert_eq!(a1["usage"]["conversation"], "chat");
    // Client b names the same conversation with the same text: its own, new.
    let b1 = say(&server, "b", Some("chat"), text, json!({}));
    assert_eq!(cached(&b1), 0, "b read a's cache: {b1}");
    // An unnamed request with a's exact text: no match in another client's conversation.
    let a_unnamed = say(&server, "a", None, text, json!({}));
    let id = a_unnamed["usage"]["conversation"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let b_guess = say(&server, "b", None, text, json!({}));
    assert_eq!(cached(&b_guess), 0, "{b_guess}");
    // b naming a's unguessable id reaches a conversation of its own.
    let b_id = say(&server, "b", Some(&id), text, json!({}));
    assert_eq!(cached(&b_id), 0, "{b_id}");
    // Client a itself continues its own, named and unnamed.
    let a2 = say(&server, "a", Some("chat"), text, json!({}));
    assert!(cached(&a2) > 0, "{a2}");
    let a3 = say(&server, "a", None, text, json!({}));
    assert!(cached(&a3) > 0, "{a3}");
    // b cannot cut or re-encode a's conversation: a's next greedy answer is as before.
    say(
        &server,
        "b",
        Some("chat"),
        "x",
        json!({"kv_cache": "tq2@all"}),
    );
    let a4 = say(&server, "a", Some("chat"), text, json!({}));
    assert_eq!(
        a4["choices"][0]["message"]["content"],
        a2["choices"][0]["message"]["content"]
    );
    assert_eq!(a4["usage"]["kv_cache"], a2["usage"]["kv_cache"]);
    // An unnamed request in another format finds nothing to continue in a's f16 one.
    let a_tq = say(&server, "a", None, text, json!({"kv_cache": "f32"}));
    assert_eq!(cached(&a_tq), 0, "{a_tq}");
    let a_f16 = say(&server, "a", None, text, json!({}));
    assert_eq!(a_f16["usage"]["kv_cache"], a2["usage"]["kv_cache"]);
    // The listing: b sees its own names only, and how many others there are.
    let kv = get_as(server.addr, "/v1/kv", "b").json();
    let names: Vec<&str> = kv["conversations"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert!(names.contains(&"chat"), "{names:?}");
    assert!(!names.contains(&id.as_str()) || names.iter().filter(|n| **n == id).count() == 1);
    assert!(names.iter().all(|n| !n.starts_with("api:")), "{names:?}");
    assert!(
        kv["others"]["count"].as_u64() >= Some(2),
        "{}",
        kv["others"]
    );
    let plain = get(server.addr, "/v1/kv").json();
    assert!(plain["conversations"].as_array().expect("list").is_empty());
    // An empty name is refused.
    let r = post_as(server.addr, CHAT, chat(json!({"conversation": ""})), "a");
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    hostile("another client's conversation named, guessed or listed -> isolated");
    hostile("empty conversation name -> invalid_request");
    server.still_answers();
}

#[test]
fn hostile_a_demotion_under_another_clients_pressure_is_undone() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    pool(&server, |p| p.spill_dir = None);
    let text = "The sea was calm that morning, and the boats went out early. ".repeat(2);
    say(&server, "owner", Some("mine"), &text, json!({}));
    let owned = server.engine.status().kv.total_allocated;
    // Room for the owner's cache and a demoted one beside it, not two f16 ones.
    pool(&server, |p| p.kv_budget = Some(owned + owned / 2));
    say(&server, "other", Some("theirs"), &text, json!({}));
    let tier = |name: &str| {
        server
            .engine
            .status()
            .conversations
            .iter()
            .find(|c| c.id.as_str().ends_with(&format!(":{name}")))
            .map(|c| c.tier)
    };
    assert_eq!(tier("mine"), Some(kvlab_engine::contract::Tier::Demoted));
    // The owner's next turn: its own cache again, its history read in f16.
    let back = say(&server, "owner", Some("mine"), &text, json!({}));
    assert_eq!(back["usage"]["cache_origin"], "reread", "{back}");
    assert_eq!(back["usage"]["kv_cache"], "f16");
    assert_eq!(tier("mine"), Some(kvlab_engine::contract::Tier::Held));
    hostile("owner's cache demoted by another client -> undone");
    pool(&server, |p| p.kv_budget = None);
    server.still_answers();
}

#[test]
fn hostile_one_client_with_many_streams_leaves_places_to_others() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    // One client asks for 20 answers at once, while the engine is held.
    let hold = Hold::new(&server, &[1]);
    hold.held();
    let greedy: Vec<_> = (0..20)
        .map(|_| send_as_in_thread(server.addr, chat(json!({"max_tokens": 48})), "greedy"))
        .collect();
    assert!(eventually(Duration::from_secs(20), || {
        let s = server.engine.status();
        s.queued >= PER_CLIENT_QUEUED
    }));
    // Another client still finds a place, and starts before the greedy one's waiting ones.
    let t = Instant::now();
    let polite = send_as_in_thread(server.addr, chat(json!({"max_tokens": 2})), "polite");
    assert!(eventually(Duration::from_secs(20), || {
        server.engine.status().queued == PER_CLIENT_QUEUED + 1
    }));
    hold.release();
    drop(hold);
    let (r, _) = polite.join().expect("client");
    assert_eq!(r.status, 200, "{}", r.body);
    let replies: Vec<_> = greedy
        .into_iter()
        .map(|g| g.join().expect("client").0)
        .collect();
    let refused = replies.iter().filter(|r| r.code() == "queue_full").count();
    let served = replies.iter().filter(|r| r.status == 200).count();
    eprintln!("one client's 20 streams: {served} served, {refused} queue_full; the other answered in {:?}", t.elapsed());
    assert_eq!(served + refused, 20);
    // The held request runs; the greedy client's answers wait in its share of the queue.
    assert_eq!(served, PER_CLIENT_QUEUED, "{served}");
    hostile("one client with 20 long streams -> queue_full");
    server.still_answers();
}

#[test]
fn hostile_files_the_server_did_not_write_are_never_removed() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let dir = tempfile::tempdir().expect("dir");
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(spill.join("api")).expect("dir");
    let planted = [spill.join("user-session.kvc"), spill.join("api/theirs.kvc")];
    for p in &planted {
        std::fs::write(p, vec![9u8; 64 << 10]).expect("plant");
    }
    // A KV budget of one conversation and a disk budget of one byte: every spill is over.
    say(&server, "probe", Some("probe"), "The sea.", json!({}));
    let one = server.engine.status().kv.total_allocated;
    pool(&server, |p| {
        p.kv_budget = Some(one + one / 2);
        p.disk_budget = 1;
        p.spill_dir = Some(spill.clone());
    });
    for i in 0..12 {
        say(
            &server,
            &format!("c{i}"),
            Some("chat"),
            "The sea and the ships.",
            json!({}),
        );
    }
    let _ = server.engine.save_all();
    for p in &planted {
        assert!(p.exists(), "{} was removed", p.display());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        // What the server wrote is its owner's alone.
        let ours: Vec<_> = std::fs::read_dir(spill.join("api"))
            .expect("read")
            .flatten()
            .map(|e| e.path())
            .filter(|p| !planted.contains(p) && p.extension().is_some_and(|e| e == "kvc"))
            .collect();
        for p in &ours {
            assert_eq!(mode(p), 0o600, "{}", p.display());
        }
        // The disk budget held: at most one file of ours is left, over it by that file.
        assert!(ours.len() <= 1, "{ours:?}");
    }
    hostile("a cache file the server did not write, disk budget spent -> kept");
    pool(&server, |p| p.kv_budget = None);
    server.still_answers();
}

#[test]
fn hostile_an_idle_conversation_is_spilled_after_its_time() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    let dir = tempfile::tempdir().expect("dir");
    pool(&server, |p| {
        p.spill_dir = Some(dir.path().to_path_buf());
        p.idle_ttl = Some(Duration::from_millis(200));
    });
    let text = "Tell me about the sea and the ships.";
    say(&server, "idle", Some("chat"), text, json!({}));
    let on_disk = eventually(Duration::from_secs(10), || {
        server
            .engine
            .status()
            .conversations
            .iter()
            .any(|c| c.tier == kvlab_engine::contract::Tier::OnDisk)
    });
    assert!(on_disk, "{:?}", server.engine.status().conversations);
    assert_eq!(server.engine.status().kv.total_allocated, 0);
    let back = say(&server, "idle", Some("chat"), text, json!({}));
    assert_eq!(back["usage"]["cache_origin"], "restored", "{back}");
    hostile("conversation idle past --idle-ttl -> spilled");
    pool(&server, |p| p.idle_ttl = None);
    server.still_answers();
}

#[test]
fn hostile_trickled_bodies_neither_hold_the_budget_nor_last() {
    let _one = serial();
    let server = start(ServerConfig {
        max_buffered_bytes: 16 << 20,
        ..ServerConfig::local(0)
    });
    let size = 8 << 20;
    let tricklers: Vec<_> = (0..8)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut s = connect(addr);
                let _ = s.write_all(head("POST", CHAT, "localhost", size).as_bytes());
                let t = Instant::now();
                for _ in 0..60 {
                    if s.write_all(b" ").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    if t.elapsed() > Duration::from_secs(30) {
                        break;
                    }
                }
                (read_reply(&mut s), t.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Others are answered meanwhile: the tricklers reserved what they sent, not 8 MB each.
    for _ in 0..3 {
        let r = post(server.addr, CHAT, chat(json!({"max_tokens": 2})));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for t in tricklers {
        let (r, took) = t.join().expect("client");
        assert_eq!(r.code(), "request_timeout", "{}", r.body);
        assert!(took < Duration::from_secs(15), "{took:?}");
    }
    hostile("8 bodies of 8 MB sent a byte every 0.5 s -> request_timeout");
    server.still_answers();
}

#[test]
fn hostile_the_timeline_is_paged_and_names_no_one() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    for i in 0..40 {
        say(
            &server,
            &format!("client-{i}"),
            Some("secret-name"),
            "The sea.",
            json!({}),
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    let r = get(server.addr, "/v1/kv");
    assert_eq!(r.status, 200);
    assert!(!r.body.contains("secret-name"), "a name leaked");
    assert!(r.body.len() < 256 << 10, "{} bytes", r.body.len());
    let kv = r.json();
    assert!(kv["samples"].as_array().expect("samples").len() <= 240);
    assert_eq!(kv["others"]["count"], 40);
    let next = kv["next"].as_u64().expect("next");
    let later = get(server.addr, &format!("/v1/kv?since={next}")).json();
    assert!(later["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .all(|s| s["t_ms"].as_u64() > Some(next)));
    hostile("GET /v1/kv with 40 other clients' conversations -> bounded");
    server.still_answers();
}

#[test]
fn hostile_a_stream_that_waits_gets_its_first_byte_at_once() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    // The engine thread held: no token comes to the stream until it is released.
    let hold = Hold::new(&server, &[1]);
    hold.held();
    let mut s = connect(server.addr);
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let body = chat(json!({"stream": true, "max_tokens": 2})).to_string();
    let t = Instant::now();
    s.write_all(head("POST", CHAT, "localhost", body.len()).as_bytes())
        .expect("write");
    s.write_all(body.as_bytes()).expect("write");
    let mut first = [0u8; 12];
    std::io::Read::read_exact(&mut s, &mut first).expect("a first byte while the engine is held");
    let waited = t.elapsed();
    assert!(
        first.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    hold.release();
    drop(hold);
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let rest = read_reply(&mut s);
    assert!(rest.body.contains("[DONE]"), "{}", rest.body);
    eprintln!("a waiting stream's first byte after {waited:?}");
    hostile("a stream waiting for a place -> first_byte");
    server.still_answers();
}

#[test]
fn hostile_a_client_opening_hundreds_of_conversations_forgets_its_own() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    pool(&server, |p| p.spill_dir = None);
    let text = "Tell me about the sea, the ships on it and the harbour they sail from.";
    say(&server, "quiet", Some("mine"), text, json!({}));
    // One client opens more conversations than the pool keeps (512).
    let t = Instant::now();
    for i in 0..530 {
        let body = chat(
            json!({"messages": [{"role": "user", "content": format!("{i}")}], "max_tokens": 1}),
        );
        let r = post_as(server.addr, CHAT, body, "flood");
        assert_eq!(r.status, 200, "{i}: {}", r.body);
    }
    let status = server.engine.status();
    assert!(
        status.conversations.len() <= 512,
        "{}",
        status.conversations.len()
    );
    // The other client's conversation is still there, its cache read on its next turn.
    let back = say(&server, "quiet", Some("mine"), text, json!({}));
    assert!(cached(&back) > 0, "{back}");
    eprintln!(
        "530 conversations of one client in {:?}: the other's kept",
        t.elapsed()
    );
    hostile("one client opening 530 conversations -> own_forgotten");
    server.still_answers();
}

#[test]
fn the_parallel_setting_bounds_the_requests_that_run_at_once() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    for parallel in [1, 2] {
        pool(&server, |p| p.parallel = parallel);
        let clients: Vec<_> = (0..4)
            .map(|i| {
                send_as_in_thread(
                    server.addr,
                    chat(json!({"max_tokens": 64})),
                    &format!("p{i}"),
                )
            })
            .collect();
        let mut most = 0;
        while clients.iter().any(|c| !c.is_finished()) {
            most = most.max(server.engine.status().running);
            std::thread::sleep(Duration::from_millis(1));
        }
        for c in clients {
            let (r, _) = c.join().expect("client");
            assert_eq!(r.status, 200, "{}", r.body);
        }
        assert!(
            most <= parallel,
            "{most} ran at once with --parallel {parallel}"
        );
        assert!(most >= 1);
    }
    pool(&server, |p| {
        p.parallel = kvlab_engine::contract::MAX_RUNNING
    });
    server.still_answers();
}

/// A connection to `addr` whose receive buffer is as small as the system allows: a client
/// that stops reading stalls the server's writes after a few KiB, not megabytes.
#[cfg(unix)]
fn connect_small_window(addr: std::net::SocketAddr) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(v4) = addr else {
        panic!("loopback v4")
    };
    // SAFETY: a fresh socket, options and connect on it; ownership passes to the TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket");
        let small: libc::c_int = 1024;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "connect");
        std::net::TcpStream::from_raw_fd(fd)
    }
}

#[cfg(unix)]
#[test]
fn hostile_a_client_that_stops_reading_loses_its_connection() {
    let _one = serial();
    let server = start(ServerConfig {
        write_timeout: Duration::from_secs(1),
        ..ServerConfig::local(0)
    });
    // Some timeline to read: each answer is a few KiB.
    std::thread::sleep(Duration::from_millis(1500));
    let one = get(server.addr, "/v1/kv").body.len();
    // 6,000 requests sent at once on one connection whose client reads nothing: their answers
    // (some 9 MB) outgrow the socket buffers (the server's send buffer grows to 4 MiB), the
    // server's writes stall, and after the timeout it closes the connection. Read only then:
    // the answers stop short.
    let mut s = connect_small_window(server.addr);
    let asked = 6000;
    let heads = "GET /v1/kv HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(asked);
    s.write_all(heads.as_bytes()).expect("write");
    std::thread::sleep(Duration::from_secs(4));
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let t = Instant::now();
    let mut got = Vec::new();
    // Closed: an end of stream, or a reset (the server dropped what it had not read).
    let closed = match std::io::Read::read_to_end(&mut s, &mut got) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    let answered = String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200")
        .count();
    eprintln!(
        "a client that stopped reading: {answered} of {asked} answers ({} bytes, {one} each) before the close, read in {:?}",
        got.len(),
        t.elapsed()
    );
    assert!(closed, "the connection stayed open");
    assert!(answered < asked, "every answer was written: {answered}");
    hostile("a client that stops reading its answers -> closed");
    server.still_answers();
}

#[test]
fn hostile_64_clients_streaming_at_once_share_steps_in_bounded_memory() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    pool(&server, |p| {
        p.parallel = kvlab_engine::contract::MAX_PARALLEL
    });
    let base = reset_peak();
    for round in 0..3 {
        let before = server.engine.step_counters();
        let clients: Vec<_> = (0..64)
            .map(|i| {
                send_as_in_thread(
                    server.addr,
                    chat(json!({"max_tokens": 24, "stream": true})),
                    &format!("swarm-{i}"),
                )
            })
            .collect();
        let mut most = 0;
        while clients.iter().any(|c| !c.is_finished()) {
            most = most.max(server.engine.status().running);
            std::thread::sleep(Duration::from_millis(1));
        }
        let replies: Vec<_> = clients
            .into_iter()
            .map(|c| c.join().expect("client").0)
            .collect();
        let served = replies.iter().filter(|r| r.status == 200).count();
        let busy = replies.iter().filter(|r| r.status == 429).count();
        let after = server.engine.step_counters();
        let per_step = (after.sequences - before.sequences) as f64
            / (after.steps - before.steps).max(1) as f64;
        eprintln!(
            "round {round}: 64 streaming clients: {served} served, {busy} × 429, at most {most} running, {per_step:.1} sequences per step"
        );
        assert_eq!(served + busy, 64, "a reply was neither an answer nor a 429");
        assert!(served >= 16, "{served} served");
        assert!(most <= kvlab_engine::contract::MAX_PARALLEL);
        // They ran together: many sequences in each forward pass, not one.
        assert!(per_step >= 4.0, "{per_step:.1} sequences per step");
        assert_eq!(server.engine.status().running, 0);
        assert_eq!(server.engine.status().queued, 0);
    }
    let rise = peak_rise_mib(base);
    eprintln!("64 streaming clients × 3: peak RSS +{rise:.1} MiB");
    assert!(rise < 256.0, "+{rise:.1} MiB");
    hostile("64 clients streaming at once, bounded memory -> shared_steps_or_queue_full");
    pool(&server, |p| {
        p.parallel = kvlab_engine::contract::MAX_RUNNING
    });
    server.still_answers();
}

#[test]
fn hostile_a_client_with_many_streams_cannot_slow_anothers_tokens() {
    let _one = serial();
    let server = start(ServerConfig::local(0));
    pool(&server, |p| p.parallel = 8);
    // One client's seven long streams take seven of the eight running places.
    let greedy: Vec<_> = (0..7)
        .map(|_| send_as_in_thread(server.addr, chat(json!({"max_tokens": 220})), "greedy"))
        .collect();
    // All seven decoding: a step runs one token of each (their prompts came in one chunk a
    // step).
    assert!(
        eventually(Duration::from_secs(30), || {
            let c = server.engine.step_counters();
            (c.last_sequences, c.last_tokens) == (7, 7)
        }),
        "{:?}",
        server.engine.step_counters()
    );
    // Another client's answer gets a token every step, as each of theirs does: it ends
    // long before theirs, and every step it ran in ran all eight.
    let before = server.engine.step_counters();
    let r = post_as(server.addr, CHAT, chat(json!({"max_tokens": 12})), "polite");
    let after = server.engine.step_counters();
    assert_eq!(r.status, 200, "{}", r.body);
    let still = server.engine.status().running;
    assert_eq!(
        still, 7,
        "the greedy client's streams ended first ({still} left)"
    );
    let per_step =
        (after.sequences - before.sequences) as f64 / (after.steps - before.steps).max(1) as f64;
    eprintln!(
        "beside 7 streams of another client: {per_step:.2} sequences per step over {} steps",
        after.steps - before.steps
    );
    assert!(per_step > 7.0, "{per_step:.2} sequences per step");
    for g in greedy {
        assert_eq!(g.join().expect("client").0.status, 200);
    }
    hostile("one client's 7 streams beside another's -> one_token_each_per_step");
    pool(&server, |p| {
        p.parallel = kvlab_engine::contract::MAX_RUNNING
    });
    server.still_answers();
}
