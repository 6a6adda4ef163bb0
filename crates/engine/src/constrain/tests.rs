//! Grammars over the tiny Gemma 4 vocabulary, driven by random logits (what a random-weight
//! model gives): whatever the logits, the answer is what the grammar says.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;
use crate::chat::tools::{parse_call, QUOTE};
use crate::contract::Family;
use crate::tokenizer::tiny;

/// Tokens sampled greedily from seeded random logits under `guide`, until a stop id or
/// `max` tokens. Every fourth step or so the control tokens and the closing characters
/// `"`, `}`, `]` are favoured, as a model ends what it opened: random logits alone would
/// write a string without end.
fn drive(guide: &mut Guide, tok: &GemmaTokenizer, seed: u64, max: usize) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let closers = tok.encode("\"}]", false).unwrap();
    let mut ids = Vec::new();
    for _ in 0..max {
        let mut logits: Vec<f32> = (0..tok.vocab_size() + 3).map(|_| next()).collect();
        if next() < 0.25 {
            let specials = tok.specials().iter().map(|(_, id)| *id);
            for id in specials.chain(closers.iter().copied()) {
                logits[id as usize] += 10.0;
            }
        }
        guide.mask(&mut logits).unwrap();
        let id = crate::generate::sampling::argmax(&logits).unwrap();
        guide.commit(id).unwrap();
        ids.push(id);
        if tok.stop_ids().contains(&id) {
            break;
        }
    }
    ids
}

fn weather() -> Tool {
    serde_json::from_value(json!({
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "hourly": {"type": "boolean"}},
          "required": ["city", "unit"]}
    }))
    .unwrap()
}

#[test]
fn a_required_call_is_well_formed_from_any_logits() {
    let tok = tiny(Family::Gemma4);
    let tools = [
        weather(),
        serde_json::from_value(json!({"name": "ping"})).unwrap(),
    ];
    for seed in 0..20 {
        let choice = Constraint::ToolCall {
            name: (seed % 2 == 0).then(|| "get_weather".to_owned()),
            parallel: seed % 3 == 0,
        };
        let mut guide = Guide::compile(&choice, &tools, false, &tok).unwrap();
        let ids = drive(&mut guide, &tok, seed, 400);
        // Ends on the hand-over to the tools' answers (a stop id).
        assert_eq!(ids.last(), Some(&50), "seed {seed}: {ids:?}");
        let text = tok.decode(&ids, false).unwrap();
        let quote = QUOTE.to_string();
        let mut calls = 0;
        for call in text.split("<|tool_call>").skip(1) {
            let body = call.split("<tool_call|>").next().unwrap();
            let (name, args) = parse_call(&body.replace("<|\"|>", &quote))
                .unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
            calls += 1;
            if name == "get_weather" {
                assert!(args["city"].is_string(), "{args}");
                assert!(
                    ["c", "f"].contains(&args["unit"].as_str().unwrap()),
                    "{args}"
                );
                assert!(args.get("days").is_none_or(Value::is_i64), "{args}");
                assert!(args.get("hourly").is_none_or(Value::is_boolean), "{args}");
                assert!(args.as_object().unwrap().len() <= 4);
            } else {
                assert_eq!(name, "ping");
                assert!(seed % 2 == 1, "only get_weather was allowed");
            }
        }
        assert!(calls >= 1, "seed {seed}: {text:?}");
        if seed % 3 != 0 {
            assert_eq!(calls, 1, "one call unless parallel");
        }
    }
}

#[test]
fn json_answers_parse_under_their_schema_from_any_logits() {
    let tok = tiny(Family::Gemma4);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"}},
      "required": ["name", "age", "tags", "ok"], "additionalProperties": false});
    for seed in 0..20 {
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
        };
        let mut guide = Guide::compile(&c, &[], seed % 2 == 1, &tok).unwrap();
        let ids = drive(&mut guide, &tok, seed, 300);
        assert_eq!(
            ids.last(),
            Some(&106),
            "seed {seed}: ended on the end of turn"
        );
        let text = tok.decode(&ids[..ids.len() - 1], false).unwrap();
        // With thinking on, an optional thought channel may come first.
        if seed % 2 == 0 {
            assert!(!text.contains("<|channel>"), "{text:?}");
        }
        let answer = text.rsplit("<channel|>").next().unwrap();
        let v: Value =
            serde_json::from_str(answer).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 8);
        assert!((0..=150).contains(&v["age"].as_i64().unwrap()));
        assert!(v["tags"].as_array().unwrap().len() <= 3);
        assert!(v["ok"].is_boolean());
        assert_eq!(v.as_object().unwrap().len(), 4);
    }
    let mut any = Guide::compile(&Constraint::JsonObject, &[], false, &tok).unwrap();
    let ids = drive(&mut any, &tok, 7, 2000);
    let text = tok.decode(&ids, true).unwrap();
    if ids.last() == Some(&106) {
        // Valid JSON; serde_json alone refuses numbers past f64 (1e99999), which JSON allows.
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => assert!(v.is_object(), "{text:?}"),
            Err(e) => assert!(
                e.to_string().contains("number out of range"),
                "{e}: {text:?}"
            ),
        }
    } else {
        assert!(text.starts_with('{'), "{text:?}");
    }
}

/// A row of the hostile tally (scripts/hostile.sh), straight to the stderr handle.
fn row(fault: &str, outcome: &str) {
    use std::io::Write;
    let line = format!("HOSTILE {fault} -> {outcome}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Each refusal is clear and quick; a schema that compiles has a bounded step.
#[test]
fn hostile_schemas_are_refused_or_bounded() {
    let tok = tiny(Family::Gemma4);
    let schema = |s: Value| Constraint::JsonSchema { schema: s };
    let enum_10k: Vec<Value> = (0..10_000).map(|i| json!(format!("member-{i}"))).collect();
    let mut deep = json!({"type": "integer"});
    for _ in 0..2_000 {
        deep = json!({"type": "array", "items": deep});
    }
    let cases = [
        ("schema that is not an object", schema(json!([1, 2]))),
        (
            "schema of 770 KiB",
            schema(
                json!({"enum": (0..40_000).map(|i| json!(format!("long member {i}"))).collect::<Vec<_>>()}),
            ),
        ),
        (
            "schema with a 10k-member enum",
            schema(json!({"enum": enum_10k})),
        ),
        ("schema nested 2000 deep", schema(deep)),
        (
            "recursive schema",
            schema(
                json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}),
            ),
        ),
        (
            "schema with a blow-up regex",
            schema(json!({"type": "string", "pattern": "^(a|aa|aaa|aaaa)*(b{1,9}){1,9}$"})),
        ),
        (
            "schema with a broken regex",
            schema(json!({"type": "string", "pattern": "(unclosed"})),
        ),
        (
            "tool_choice naming no offered tool",
            Constraint::ToolCall {
                name: Some("nope".into()),
                parallel: false,
            },
        ),
    ];
    for round in 0..3 {
        for (what, c) in &cases {
            let start = Instant::now();
            let compiled = Guide::compile(c, &[weather()], false, &tok);
            let took = start.elapsed();
            assert!(
                took < Duration::from_secs(5),
                "{what}: compile took {took:?}"
            );
            match compiled {
                Err(ConstrainError::Refused(msg)) => {
                    assert!(!msg.is_empty() && msg.len() < 400, "{what}: {msg}");
                    if round == 0 {
                        row(what, "invalid_request");
                    }
                }
                Err(e) => panic!("{what}: {e}"),
                Ok(mut guide) => {
                    // Compiled: each step's mask is bounded in time, and the answer goes on
                    // or stops with its own error.
                    for _ in 0..20 {
                        let mut logits = vec![0.0f32; tok.vocab_size()];
                        let start = Instant::now();
                        let masked = guide.mask(&mut logits);
                        assert!(
                            start.elapsed() < Duration::from_secs(1),
                            "{what}: a slow step"
                        );
                        let Ok(()) = masked else { break };
                        let id = crate::generate::sampling::argmax(&logits).unwrap();
                        if guide.commit(id).is_err() || tok.stop_ids().contains(&id) {
                            break;
                        }
                    }
                    if round == 0 {
                        row(what, "bounded");
                    }
                }
            }
        }
    }
}

#[test]
fn tools_on_a_model_without_a_call_syntax_are_refused() {
    let tok = tiny(Family::Gemma3);
    let c = Constraint::ToolCall {
        name: None,
        parallel: false,
    };
    let Err(ConstrainError::Refused(msg)) = Guide::compile(&c, &[weather()], false, &tok) else {
        panic!("Gemma 3 took a tool call");
    };
    assert!(
        msg.contains("Gemma 3 models have no tool-call syntax"),
        "{msg}"
    );
}
