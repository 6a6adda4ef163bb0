//! The grammar of a tool call in Gemma 4's own syntax (see [`crate::chat::tools`]):
//! `<|tool_call>call:NAME{key:value,…}<tool_call|>`, once or more, then the hand-over to the
//! tools' answers. Each tool's arguments follow its JSON schema as the template renders
//! values: object keys in sorted order (the template's `dictsort`), required ones always,
//! optional ones when the model wants them; strings between `<|"|>` tokens; enums, integers,
//! numbers, booleans, null, arrays and nested objects. A part of a schema this does not
//! read (`anyOf`, `$ref`, patterns) takes any value, so a call always parses even where it
//! is not held to every keyword.

use serde_json::Value;

use super::ConstrainError;
use crate::chat::Tool;

/// The token ids of the call syntax.
pub(super) struct Markers {
    pub open: u32,
    pub close: u32,
    pub quote: u32,
    /// `<|tool_response>`, written after the calls when the vocabulary has it.
    pub handover: Option<u32>,
}

/// Deepest schema nesting read.
const MAX_DEPTH: usize = 16;

/// The Lark rules (`body` first) for a call of one of `tools`, or several when `parallel`.
pub(super) fn grammar(
    tools: &[&Tool],
    parallel: bool,
    m: &Markers,
) -> Result<String, ConstrainError> {
    let mut g = Grammar {
        rules: Vec::new(),
        quote: m.quote,
    };
    let mut calls = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        tool.check().map_err(ConstrainError::Refused)?;
        // The arguments are an object: its properties when the schema lists them, else
        // any object.
        let args = match &tool.parameters {
            Some(Value::Object(schema)) => g.object(schema, 0)?,
            _ => "gobject".to_owned(),
        };
        let rule = format!("call{i}");
        g.rules.push(format!(
            "{rule}: <[{}]> {} {args} <[{}]>",
            m.open,
            lark_str(&format!("call:{}", tool.name)),
            m.close
        ));
        calls.push(rule);
    }
    let one = calls.join(" | ");
    let many = if parallel { "call+" } else { "call" };
    let end = m.handover.map(|h| format!(" <[{h}]>")).unwrap_or_default();
    let mut out = format!("body: {many}{end}\ncall: {one}\n");
    for r in &g.rules {
        out.push_str(r);
        out.push('\n');
    }
    out.push_str(&generic(m.quote));
    Ok(out)
}

/// Any value in the call syntax (`gvalue`, `gobject`), for schemas not read further.
fn generic(quote: u32) -> String {
    format!(
        "gvalue: gstring | NUMBER | \"true\" | \"false\" | \"null\" | gobject | garray\n\
         gstring: <[{quote}]> TEXT? <[{quote}]>\n\
         gobject: \"{{\" (gpair (\",\" gpair)*)? \"}}\"\n\
         gpair: KEY \":\" gvalue\n\
         garray: \"[\" (gvalue (\",\" gvalue)*)? \"]\"\n\
         KEY: /[A-Za-z_][A-Za-z0-9_.\\-]{{0,63}}/\n\
         TEXT: /(.|\\n)+/\n\
         INT: /-?(0|[1-9][0-9]{{0,17}})/\n\
         NUMBER: /-?(0|[1-9][0-9]{{0,17}})(\\.[0-9]{{1,17}})?([eE][\\-+]?[0-9]{{1,3}})?/\n"
    )
}

struct Grammar {
    rules: Vec<String>,
    quote: u32,
}

impl Grammar {
    /// A Lark expression for a value under `schema`.
    fn value(&mut self, schema: &Value, depth: usize) -> Result<String, ConstrainError> {
        if depth > MAX_DEPTH {
            return Err(ConstrainError::Refused(format!(
                "a tool's parameters nest deeper than {MAX_DEPTH}"
            )));
        }
        let Value::Object(s) = schema else {
            // `true` or anything else: any value.
            return Ok("gvalue".into());
        };
        if let Some(Value::Array(options)) = s.get("enum") {
            return self.literals(options);
        }
        if let Some(c) = s.get("const") {
            return self.literals(std::slice::from_ref(c));
        }
        let types: Vec<&str> = match s.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return Ok("gvalue".into()),
        };
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "string" => self.string(s),
                "integer" => "INT".into(),
                "number" => "NUMBER".into(),
                "boolean" => "(\"true\" | \"false\")".into(),
                "null" => "\"null\"".into(),
                "array" => {
                    let item = match s.get("items") {
                        Some(items) => self.value(items, depth + 1)?,
                        None => "gvalue".into(),
                    };
                    format!("(\"[\" ({item} (\",\" {item})*)? \"]\")")
                }
                "object" => self.object(s, depth)?,
                _ => "gvalue".into(),
            });
        }
        if s.get("nullable") == Some(&Value::Bool(true)) {
            alts.push("\"null\"".into());
        }
        Ok(match alts.len() {
            0 => "gvalue".into(),
            1 => alts.remove(0),
            _ => format!("({})", alts.join(" | ")),
        })
    }

    /// A string between quote tokens, of `minLength` to `maxLength` characters when given.
    fn string(&mut self, s: &serde_json::Map<String, Value>) -> String {
        let q = self.quote;
        let bound = |k: &str| s.get(k).and_then(Value::as_u64).map(|n| n.min(10_000));
        match (bound("minLength"), bound("maxLength")) {
            (None, None) => format!("<[{q}]> TEXT? <[{q}]>"),
            (min, max) => {
                let (min, max) = (
                    min.unwrap_or(0),
                    max.map_or(String::new(), |m| m.to_string()),
                );
                format!("<[{q}]> /(.|\\n){{{min},{max}}}/ <[{q}]>")
            }
        }
    }

    /// One of `options`, written as the template writes each.
    fn literals(&mut self, options: &[Value]) -> Result<String, ConstrainError> {
        if options.is_empty() {
            return Err(ConstrainError::Refused("an enum with no members".into()));
        }
        let alts: Vec<String> = options
            .iter()
            .map(|v| match v {
                Value::String(s) => format!("<[{q}]> {} <[{q}]>", lark_str(s), q = self.quote),
                other => lark_str(&other.to_string()),
            })
            .collect();
        Ok(format!("({})", alts.join(" | ")))
    }

    /// An object with `properties`, keys in sorted order, each optional one skippable; a
    /// rule of its own.
    fn object(
        &mut self,
        s: &serde_json::Map<String, Value>,
        depth: usize,
    ) -> Result<String, ConstrainError> {
        let Some(Value::Object(props)) = s.get("properties") else {
            return Ok("gobject".into());
        };
        let required: Vec<&str> = match s.get("required") {
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort();
        let mut pairs = Vec::new();
        for k in keys {
            let bare = !k.is_empty()
                && k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !bare {
                return Err(ConstrainError::Refused(format!(
                    "a tool's parameter {:?} cannot be written in the model's call syntax",
                    k.chars().take(80).collect::<String>()
                )));
            }
            let v = self.value(&props[k], depth + 1)?;
            pairs.push((
                format!("{} {v}", lark_str(&format!("{k}:"))),
                required.contains(&k.as_str()),
            ));
        }
        // The properties from i on: `first` without a leading comma, `rest` with one each.
        let id = self.rules.len();
        let n = pairs.len();
        let name = |kind: &str, i: usize| format!("o{id}_{kind}{i}");
        for (i, (pair, req)) in pairs.iter().enumerate() {
            let (rest_next, first_next) = if i + 1 < n {
                (name("r", i + 1), name("f", i + 1))
            } else {
                (String::new(), String::new())
            };
            let rest = if *req {
                format!("\",\" {pair} {rest_next}")
            } else {
                format!("(\",\" {pair})? {rest_next}")
            };
            let first = if *req {
                format!("{pair} {rest_next}")
            } else if i + 1 < n {
                format!("{pair} {rest_next} | {first_next}")
            } else {
                format!("{pair}?")
            };
            self.rules
                .push(format!("{}: {}", name("r", i), rest.trim()));
            self.rules
                .push(format!("{}: {}", name("f", i), first.trim()));
        }
        Ok(if n == 0 {
            "(\"{\" \"}\")".into()
        } else {
            let all_optional = pairs.iter().all(|(_, r)| !r);
            let inner = name("f", 0);
            if all_optional {
                format!("(\"{{\" {inner}? \"}}\")")
            } else {
                format!("(\"{{\" {inner} \"}}\")")
            }
        })
    }
}

/// `s` as a Lark string literal (JSON string syntax, DEL escaped too).
fn lark_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned())
        .to_string()
        .replace('\u{7f}', "\\u007f")
}
