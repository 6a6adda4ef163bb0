//! Tools and constrained decoding through the engine, on the tiny random-weight Gemma 4
//! E-model with a vocabulary that has Gemma 4's tool tokens (fixtures/tiny_e/
//! tokenizer_tools.json) and the published Jul 14 template beside it: a forced call is well
//! formed and read back, whatever the weights; JSON answers parse under their schema on
//! every cache format, several at once in the batched step; a model without tools, or a
//! schema past the bounds, is refused with a clear error, leaving nothing behind.

use crate::common;

use std::sync::mpsc;

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Constraint;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ConversationChoice, ConversationId, DoneReason, ErrorCode, Event};
use kvlab_engine::contract::{Message, Tool};
use kvlab_engine::GenerateRequest;
use kvlab_engine::LoadRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};
use serde_json::{json, Value};

/// The tiny Gemma 4 with its tool vocabulary and template, in a temporary folder.
fn tool_model() -> (EngineHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = common::fixture("tiny_e");
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .expect("copy");
    // A longer context than the fixture's 256: a tool's declaration alone is some hundreds
    // of tokens in this tiny vocabulary (random weights do not mind the positions).
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config json");
    config["max_position_embeddings"] = json!(2048);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    std::fs::copy(
        common::fixture("templates").join("g4_e2b_jul14.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .expect("template");
    let engine = Engine::spawn().expect("spawn");
    engine
        .submit(LoadRequest {
            tokenizer: Some(src.join("tokenizer_tools.json")),
            cache: CacheSelection::Spec("f16".into()),
            ..LoadRequest::new(ModelSource::Local {
                path: dir.path().join("model.safetensors"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    (engine, dir)
}

fn weather() -> Tool {
    serde_json::from_value(json!({
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 6},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
          "required": ["city", "unit"]}
    }))
    .expect("tool")
}

fn ask(tools: Vec<Tool>, constraint: Option<Constraint>, id: &str) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: 120,
        constraint,
        conversation: Some(ConversationChoice::Id {
            id: ConversationId::new(id).expect("id"),
        }),
        ..GenerateRequest::new(Prompt::Conversation {
            messages: vec![Message::user("Weather in Paris?")],
            thinking: false,
            tools,
        })
    }
}

/// Everything a request streamed: its answer text, its calls, how it ended.
struct Streamed {
    text: String,
    calls: Vec<(usize, String, String, String)>,
    done: Result<DoneReason, (ErrorCode, String)>,
}

fn run(engine: &EngineHandle, req: GenerateRequest) -> Streamed {
    let mut out = Streamed {
        text: String::new(),
        calls: Vec::new(),
        done: Err((ErrorCode::Internal, "no end".into())),
    };
    let ticket = match engine.submit(req) {
        Ok(t) => t,
        Err(e) => {
            out.done = Err((e.code, e.message));
            return out;
        }
    };
    for ev in ticket.events() {
        match ev {
            Event::Token { text } => out.text.push_str(&text),
            Event::ToolCall {
                index,
                id,
                name,
                arguments,
            } => out.calls.push((index, id, name, arguments)),
            Event::Done { reason, .. } => {
                out.done = Ok(reason);
                break;
            }
            Event::Error { code, message } => {
                out.done = Err((code, message));
                break;
            }
            _ => {}
        }
    }
    out
}

#[test]
fn a_required_call_is_forced_and_read_back_from_random_weights() {
    let (engine, _dir) = tool_model();
    for (i, name) in [None, Some("get_weather")].into_iter().enumerate() {
        let ping: Tool = serde_json::from_value(json!({"name": "ping"})).expect("tool");
        let req = ask(
            vec![weather(), ping],
            Some(Constraint::ToolCall {
                name: name.map(str::to_owned),
                parallel: false,
            }),
            &format!("call-{i}"),
        );
        let got = run(&engine, req);
        assert_eq!(got.done, Ok(DoneReason::Stop), "{:?}", got.text);
        assert_eq!(got.calls.len(), 1, "one call: {:?}", got.calls);
        let (index, id, called, args) = &got.calls[0];
        assert_eq!(*index, 0);
        assert!(id.starts_with("call_") && id.len() == 21, "{id}");
        let args: Value = serde_json::from_str(args).expect("arguments are JSON");
        if name.is_some() || called == "get_weather" {
            assert_eq!(called, "get_weather");
            assert!(args["city"].as_str().expect("city").chars().count() <= 6);
            assert!(["c", "f"].contains(&args["unit"].as_str().expect("unit")));
            assert!(args.get("days").is_none_or(Value::is_i64), "{args}");
        } else {
            assert_eq!((called.as_str(), args), ("ping", json!({})));
        }
    }
    // The answer goes on from the tool's answer: the conversation renders the call and the
    // tool message (the template's own rendering), and the model answers in text.
    let call = kvlab_engine::contract::ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Paris", "unit": "c"}),
    };
    let mut model = Message::model("");
    model.tool_calls = vec![call];
    let req = GenerateRequest {
        max_tokens: 8,
        ..GenerateRequest::new(Prompt::Conversation {
            messages: vec![
                Message::user("Weather in Paris?"),
                model,
                Message::tool("call_1", "{\"temp\": 21}"),
            ],
            thinking: false,
            tools: vec![weather()],
        })
    };
    let got = run(&engine, req);
    assert!(got.done.is_ok(), "{:?}", got.done);
}

#[test]
fn json_answers_hold_to_their_schema_on_every_cache_at_once() {
    let (engine, _dir) = tool_model();
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"}},
      "required": ["name", "n", "ok"], "additionalProperties": false});
    // Every format a head of 16 takes (ggml blocks need rows of 32: the 270M's openai
    // tests hold JSON under q8_0).
    let caches = ["f16", "f32", "bf16", "tq4", "tq3", "k4v3+qw"];
    let (tx, rx) = mpsc::channel();
    // All submitted before any ends: they share the engine's steps.
    let tickets: Vec<_> = caches
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut req = ask(
                Vec::new(),
                Some(Constraint::JsonSchema {
                    schema: schema.clone(),
                }),
                &format!("json-{i}"),
            );
            req.cache = Some(kvlab_engine::contract::CacheSelection::Spec((*spec).into()));
            req.max_tokens = 60;
            let tx = tx.clone();
            let spec = spec.to_string();
            let mut text = String::new();
            engine
                .submit_with(req, move |ev| {
                    match ev {
                        Event::Token { text: t } => text.push_str(&t),
                        Event::Done { reason, .. } => {
                            let _ =
                                tx.send((spec.clone(), Ok((reason, std::mem::take(&mut text)))));
                        }
                        Event::Error { code, message } => {
                            let _ = tx.send((spec.clone(), Err(format!("[{code}] {message}"))));
                        }
                        _ => {}
                    }
                    true
                })
                .expect("submit")
        })
        .collect();
    drop(tx);
    let mut seen = 0;
    for (spec, got) in rx {
        let (reason, text) = got.unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(reason, DoneReason::Stop, "{spec}: {text:?}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{spec}: {e}: {text:?}"));
        assert!(
            v["name"].as_str().expect("name").chars().count() <= 5,
            "{spec}: {v}"
        );
        assert!(
            (0..=99).contains(&v["n"].as_i64().expect("n")),
            "{spec}: {v}"
        );
        assert!(v["ok"].is_boolean(), "{spec}: {v}");
        assert_eq!(v.as_object().expect("object").len(), 3, "{spec}: {v}");
        seen += 1;
    }
    drop(tickets);
    assert_eq!(seen, caches.len());
}

/// Refusals, many times over: each is the request's clear error, and leaves no
/// conversation behind.
#[test]
fn hostile_tools_and_schemas_are_refused_leaving_nothing() {
    let (engine, _dir) = tool_model();
    let before = engine.status().conversations.len();
    let mut deep = json!({"type": "integer"});
    for _ in 0..3_000 {
        deep = json!({"type": "array", "items": deep});
    }
    let huge =
        json!({"enum": (0..40_000).map(|i| format!("member number {i}")).collect::<Vec<_>>()});
    for round in 0..10 {
        let cases = [
            (
                "request schema nested 3000 deep",
                ask(
                    Vec::new(),
                    Some(Constraint::JsonSchema {
                        schema: deep.clone(),
                    }),
                    "r",
                ),
            ),
            (
                "request schema of 848 KiB",
                ask(
                    Vec::new(),
                    Some(Constraint::JsonSchema {
                        schema: huge.clone(),
                    }),
                    "r",
                ),
            ),
            (
                "request schema with a broken regex",
                ask(
                    Vec::new(),
                    Some(Constraint::JsonSchema {
                        schema: json!({"type": "string", "pattern": "(("}),
                    }),
                    "r",
                ),
            ),
            (
                "request forcing a tool it does not offer",
                ask(
                    vec![weather()],
                    Some(Constraint::ToolCall {
                        name: Some("nope".into()),
                        parallel: false,
                    }),
                    "r",
                ),
            ),
            (
                "request forcing a call with no tools",
                ask(
                    Vec::new(),
                    Some(Constraint::ToolCall {
                        name: None,
                        parallel: false,
                    }),
                    "r",
                ),
            ),
        ];
        for (what, req) in cases {
            let got = run(&engine, req);
            let Err((code, message)) = got.done else {
                panic!("{what}: served");
            };
            assert_eq!(code, ErrorCode::InvalidRequest, "{what}: {message}");
            assert!(message.len() < 400, "{what}: {message}");
            if round == 0 {
                use std::io::Write;
                let line = format!("HOSTILE {what} -> {code}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
        }
    }
    assert_eq!(engine.status().conversations.len(), before);
}

#[test]
fn a_model_whose_template_has_no_tools_refuses_them_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    engine
        .submit(LoadRequest {
            tokenizer: Some(tokenizer),
            ..LoadRequest::new(ModelSource::Local {
                path: common::fixture("gguf").join("tiny_gemma3.f32.gguf"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    for _ in 0..5 {
        let got = run(&engine, ask(vec![weather()], None, "g3"));
        let Err((code, message)) = got.done else {
            panic!("Gemma 3 took tools");
        };
        assert_eq!(code, ErrorCode::InvalidRequest);
        assert!(
            message.contains("tools are not supported: Gemma 3 models have no tool-call syntax"),
            "{message}"
        );
    }
}
