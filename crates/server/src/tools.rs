//! OpenAI's tools and structured output on the wire: `tools`, `tool_choice`,
//! `parallel_tool_calls`, `response_format`, and the `tool_calls` of earlier answers, read
//! into the engine's tools and constraint. What the engine does with them (the template's
//! rendering, the grammar, the call syntax) is the engine's; this only reads and checks.

use kvlab_engine::contract::Constraint;
use kvlab_engine::contract::{Tool, ToolCall};
use serde::Deserialize;
use serde_json::Value;

use crate::api::{Bounded, ListBound};
use crate::error::ApiError;

/// Tools of one request (agent clients send tens).
#[derive(Debug)]
pub struct Tools;
impl ListBound for Tools {
    const MAX: usize = 128;
    const WHAT: &'static str = "tools";
}

/// Calls in one earlier answer.
#[derive(Debug)]
pub struct Calls;
impl ListBound for Calls {
    const MAX: usize = 128;
    const WHAT: &'static str = "tool calls in a message";
}

/// `{"type": "function", "function": {…}}`.
#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionIn,
}

/// A function as a request declares it.
#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    /// Arguments held to `parameters`: they always are here when a call is forced.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// An earlier call, as an answer carried it.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: CalledIn,
}

/// The function an earlier call named, and its arguments (JSON text, as OpenAI sends them,
/// or an object).
#[derive(Debug, Deserialize)]
pub struct CalledIn {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// `response_format`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormatIn {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaIn>,
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
pub struct JsonSchemaIn {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// The declared tools as the engine's.
pub fn tools(list: Option<Bounded<ToolIn, Tools>>) -> Result<Vec<Tool>, ApiError> {
    let mut out: Vec<Tool> = Vec::new();
    for (i, t) in list
        .map(|l| l.0)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        if t.kind.as_deref().is_some_and(|k| k != "function") {
            return Err(ApiError::invalid(format!(
                "tools[{i}].type must be \"function\""
            )));
        }
        let tool = Tool {
            name: t.function.name,
            description: t.function.description,
            parameters: t.function.parameters,
        };
        tool.check()
            .map_err(|e| ApiError::invalid(format!("tools[{i}]: {e}")))?;
        if out.iter().any(|o| o.name == tool.name) {
            return Err(ApiError::invalid(format!(
                "tools[{i}]: {:?} is declared twice",
                tool.name
            )));
        }
        out.push(tool);
    }
    Ok(out)
}

/// An earlier answer's calls as the engine's (arguments as objects: the template renders
/// them as the model writes them).
pub fn calls(
    i: usize,
    list: Option<Bounded<ToolCallIn, Calls>>,
) -> Result<Vec<ToolCall>, ApiError> {
    let mut out = Vec::new();
    for (j, c) in list
        .map(|l| l.0)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let at = || format!("messages[{i}].tool_calls[{j}]");
        if c.kind.as_deref().is_some_and(|k| k != "function") {
            return Err(ApiError::invalid(format!(
                "{}.type must be \"function\"",
                at()
            )));
        }
        let arguments = match c.function.arguments {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(Value::String(text)) => serde_json::from_str(&text).map_err(|e| {
                ApiError::invalid(format!("{}.function.arguments is not JSON: {e}", at()))
            })?,
            Some(v) => v,
        };
        if !arguments.is_object() {
            return Err(ApiError::invalid(format!(
                "{}.function.arguments must be a JSON object",
                at()
            )));
        }
        out.push(ToolCall {
            id: c.id,
            name: c.function.name,
            arguments,
        });
    }
    Ok(out)
}

/// What `tool_choice` asks: the constraint on the answer (a call forced; the engine refuses
/// one no offered tool can meet), and whether the tools are offered at all (`none`: they are
/// not rendered, and the answer is text).
pub fn choice(
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<(Option<Constraint>, bool), ApiError> {
    let forced = |name: Option<String>| Constraint::ToolCall {
        name,
        parallel: parallel.unwrap_or(true),
    };
    match tool_choice {
        None | Some(Value::Null) => Ok((None, true)),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok((None, true)),
            "none" => Ok((None, false)),
            "required" => Ok((Some(forced(None)), true)),
            other => Err(ApiError::invalid(format!(
                "tool_choice {other:?} is not one of auto, none, required, or a function"
            ))),
        },
        Some(v) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice must be auto, none, required, or {\"type\": \"function\", \"function\": {\"name\": …}}",
                    )
                })?;
            Ok((Some(forced(Some(name.to_owned()))), true))
        }
    }
}

/// What `response_format` asks (`text`: nothing).
pub fn response_format(f: Option<ResponseFormatIn>) -> Result<Option<Constraint>, ApiError> {
    let Some(f) = f else { return Ok(None) };
    match f.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint::JsonObject)),
        "json_schema" => {
            let schema = f.json_schema.and_then(|s| s.schema).ok_or_else(|| {
                ApiError::invalid("response_format.json_schema.schema is required")
            })?;
            if !schema.is_object() {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema must be a JSON schema object",
                ));
            }
            Ok(Some(Constraint::JsonSchema { schema }))
        }
        other => Err(ApiError::invalid(format!(
            "response_format.type {other:?} is not one of text, json_object, json_schema"
        ))),
    }
}
