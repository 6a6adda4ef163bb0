//! Tools in a chat: the functions a request offers the model ([`Tool`]), the calls a model
//! makes ([`ToolCall`]), and Gemma 4's own call syntax read back into JSON ([`parse_call`]).
//!
//! Gemma 4 writes a call as `<|tool_call>call:NAME{key:value,…}<tool_call|>`, its chat
//! template's rendering of an OpenAI call: keys bare, strings between `<|"|>` tokens, numbers,
//! `true`/`false`/`null`, `{…}` and `[…]` as in JSON. The splitter hands the text between the
//! markers here with each `<|"|>` as [`QUOTE`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use ts_rs::TS;

/// A function the model may call (OpenAI's `{"type": "function", "function": {…}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Its name (`get_weather`): letters, digits, `_`, `-` and `.`, at most [`MAX_NAME`]
    /// bytes.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub description: Option<String>,
    /// Its arguments as a JSON schema (an object schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional, type = "unknown")]
    pub parameters: Option<Value>,
}

/// Longest tool name, in bytes.
pub const MAX_NAME: usize = 64;

impl Tool {
    /// Refuses a name the call syntax could not carry.
    pub fn check(&self) -> Result<(), String> {
        let ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return Err(format!(
                "tool name {:?} must be 1 to {MAX_NAME} letters, digits, '_', '-' or '.'",
                self.name.chars().take(80).collect::<String>()
            ));
        }
        match &self.parameters {
            None | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err(format!(
                "tool {:?}: parameters must be a JSON schema object",
                self.name
            )),
        }
    }

    /// The tool as chat templates read it (OpenAI's shape).
    pub fn template_value(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), self.name.clone().into());
        function.insert(
            "description".into(),
            self.description.clone().unwrap_or_default().into(),
        );
        if let Some(p) = &self.parameters {
            function.insert("parameters".into(), p.clone());
        }
        serde_json::json!({ "type": "function", "function": function })
    }
}

/// A call the model made, or an earlier one a conversation sends back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The id the tool's answer names (`tool_call_id`).
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments: a JSON object.
    #[ts(type = "unknown")]
    pub arguments: Value,
}

impl ToolCall {
    /// The call as chat templates read it (OpenAI's shape, arguments as a mapping: Gemma 4's
    /// template refuses a string).
    pub fn template_value(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": { "name": self.name, "arguments": self.arguments },
        })
    }
}

/// What stands for the `<|"|>` token in the text [`parse_call`] reads (a private-use
/// character no tokenizer writes as text).
pub const QUOTE: char = '\u{E001}';

/// Deepest nesting a call's arguments may have.
const MAX_DEPTH: usize = 64;

/// Reads `call:NAME{…}` (the text between Gemma 4's call markers, `<|"|>` as [`QUOTE`]) as
/// the function's name and its arguments object.
pub fn parse_call(text: &str) -> Result<(String, Value), String> {
    let rest = text
        .trim()
        .strip_prefix("call:")
        .ok_or("a call starts with \"call:\"")?;
    let brace = rest.find('{').ok_or("a call's arguments start with '{'")?;
    let name = rest[..brace].trim();
    if name.is_empty() {
        return Err("the call names no function".into());
    }
    let mut p = Reader {
        s: &rest[brace..],
        at: 0,
    };
    let args = p.object(0)?;
    p.skip_ws();
    if p.at != p.s.len() {
        return Err(format!("text after the arguments: {:?}", &p.s[p.at..]));
    }
    Ok((name.to_owned(), args))
}

struct Reader<'a> {
    s: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.at..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            self.at += c.len_utf8();
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected {c:?} at byte {}", self.at))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("arguments nested deeper than {MAX_DEPTH}"));
        }
        self.skip_ws();
        match self.peek() {
            Some('{') => self.object(depth + 1),
            Some('[') => self.array(depth + 1),
            Some(QUOTE) => self.string().map(Value::String),
            Some(_) => self.bare(),
            None => Err("the arguments end early".into()),
        }
    }

    /// `{key:value,…}`; keys are bare, or quoted (`escape_keys` in the template).
    fn object(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("arguments nested deeper than {MAX_DEPTH}"));
        }
        self.expect('{')?;
        let mut map = Map::new();
        if self.eat('}') {
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            let key = if self.peek() == Some(QUOTE) {
                self.string()?
            } else {
                let end = self.s[self.at..]
                    .find(':')
                    .ok_or("a key without ':' after it")?;
                let key = self.s[self.at..self.at + end].trim().to_owned();
                self.at += end;
                key
            };
            if key.is_empty() {
                return Err(format!("an empty key at byte {}", self.at));
            }
            self.expect(':')?;
            let v = self.value(depth)?;
            map.insert(key, v);
            if self.eat('}') {
                return Ok(Value::Object(map));
            }
            self.expect(',')?;
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.expect('[')?;
        let mut items = Vec::new();
        if self.eat(']') {
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            if self.eat(']') {
                return Ok(Value::Array(items));
            }
            self.expect(',')?;
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.at += QUOTE.len_utf8();
        let end = self.s[self.at..]
            .find(QUOTE)
            .ok_or("a string that never closes")?;
        let s = self.s[self.at..self.at + end].to_owned();
        self.at += end + QUOTE.len_utf8();
        Ok(s)
    }

    /// A number, `true`, `false` or `null` (what the template writes bare).
    fn bare(&mut self) -> Result<Value, String> {
        let rest = &self.s[self.at..];
        let end = rest.find([',', '}', ']']).unwrap_or(rest.len());
        let word = rest[..end].trim();
        self.at += end;
        match word {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            "null" => Ok(Value::Null),
            _ => serde_json::from_str::<serde_json::Number>(word)
                .map(Value::Number)
                .map_err(|_| format!("{word:?} is not a value")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> String {
        s.replace("<|\"|>", &QUOTE.to_string())
    }

    #[test]
    fn calls_as_the_template_writes_them_read_back_as_json() {
        let (name, args) = parse_call(&q(
            "call:get_weather{city:<|\"|>Paris, \"FR\"<|\"|>,days:3,detail:{hourly:true,units:[<|\"|>c<|\"|>,null]},t:-1.5e2}",
        ))
        .unwrap();
        assert_eq!(name, "get_weather");
        assert_eq!(
            args,
            json!({"city": "Paris, \"FR\"", "days": 3,
                   "detail": {"hourly": true, "units": ["c", null]}, "t": -150.0})
        );
        // Quoted keys (the template's escape_keys) and an empty call.
        assert_eq!(
            parse_call(&q("call:f{<|\"|>a b<|\"|>:1}")).unwrap().1,
            json!({"a b": 1})
        );
        assert_eq!(
            parse_call("call:ping{}").unwrap(),
            ("ping".into(), json!({}))
        );
    }

    #[test]
    fn what_is_not_a_call_is_refused_with_where() {
        for bad in [
            "",
            "get{}",
            "call:{}",
            "call:f",
            "call:f{a:}",
            "call:f{a:1",
            "call:f{a:1}x",
            "call:f{a:nope}",
            "call:f{a:[1,}",
        ] {
            assert!(parse_call(&q(bad)).is_err(), "{bad:?} parsed");
        }
        let deep = format!("call:f{{a:{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_call(&deep).unwrap_err().contains("deeper"));
    }

    #[test]
    fn tools_render_in_openai_shape_and_bad_names_are_refused() {
        let t = Tool {
            name: "get_weather".into(),
            description: None,
            parameters: Some(json!({"type": "object"})),
        };
        assert!(t.check().is_ok());
        assert_eq!(
            t.template_value(),
            json!({"type": "function", "function": {"name": "get_weather", "description": "",
                   "parameters": {"type": "object"}}})
        );
        for name in ["", "a b", "x{", &"n".repeat(65), "call:<"] {
            let bad = Tool {
                name: name.into(),
                ..t.clone()
            };
            assert!(bad.check().is_err(), "{name:?}");
        }
        let bad = Tool {
            parameters: Some(json!([1])),
            ..t
        };
        assert!(bad.check().is_err());
    }
}
