//! The OpenAI wire format this server speaks (chat completions, completions, models), plus
//! KV Lab's own fields: a request's `kv_cache` (any cache SPEC) and the cache's bytes in
//! `usage`. Requests are read leniently (clients send fields we ignore) but a field that asks
//! for something we do not do (`n > 1`, penalties, logprobs) is refused, not ignored.

use kvlab_engine::chat::{Message, Role};
use kvlab_engine::events::{CacheOrigin, ConversationChoice, ConversationId, GenStats};
use kvlab_engine::generate::stop::MAX_STOPS;
use kvlab_engine::generate::{GenerateRequest, Prompt, DEFAULT_MAX_TOKENS, PREFILL_CHUNK};
use kvlab_engine::kv::CacheSelection;
use kvlab_engine::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// The namespace of the conversations clients of this server run in: no request reaches
/// the app's own conversations, whatever it names.
pub const CONVERSATION_PREFIX: &str = "api:";

/// A message's content: a string, or OpenAI's list of parts (only text parts are read).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// A previous answer's thinking, as llama-server and vLLM send it back.
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `chat_template_kwargs` (vLLM's and llama-server's way to turn thinking on).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateKwargs {
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

/// The settings both endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub max_tokens: Option<usize>,
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub stop: Option<StopField>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// KV Lab: the cache this request runs with, as a SPEC (`f16`, `tq4`, `tq3.5@full`, …):
    /// its own conversation's cache is re-encoded to it first.
    #[serde(default)]
    pub kv_cache: Option<String>,
    /// KV Lab: the conversation this request continues (also the `X-Conversation` header);
    /// without one, the one its prompt continues, else a new one.
    #[serde(default)]
    pub conversation: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub common: Common,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
}

/// `prompt`: one string or a list of exactly one.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub common: Common,
}

/// What a request asks of the engine, checked.
#[derive(Debug, Clone)]
pub struct Planned {
    pub request: GenerateRequest,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

impl Common {
    /// Sampling, limits, stops, cache and conversation (named in the body, else by
    /// `header`, the `X-Conversation` header), checked; `prompt` is what to continue. A
    /// request that names no cache runs with its conversation's (a new conversation gets the
    /// server's default, `kvlab serve --kv`).
    pub fn plan(&self, prompt: Prompt, header: Option<&str>) -> Result<Planned, ApiError> {
        if self.n.unwrap_or(1) != 1 {
            return Err(ApiError::invalid("n must be 1: one answer per request"));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if v.unwrap_or(0.0) != 0.0 {
                return Err(ApiError::invalid(format!("{name} is not supported")));
            }
        }
        if self.logprobs == Some(true) {
            return Err(ApiError::invalid("logprobs are not supported"));
        }
        let defaults = SamplingParams::chat();
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: match self.top_k {
                Some(0) => None,
                Some(k) => Some(k),
                None => defaults.top_k,
            },
            top_p: self.top_p.or(defaults.top_p),
            seed: self.seed.unwrap_or(defaults.seed),
        };
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err(ApiError::invalid("max_tokens must be at least 1"));
        }
        let stops = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::invalid(format!(
                "at most {MAX_STOPS} stop sequences, got {}",
                stops.len()
            )));
        }
        let cache = match self.kv_cache.as_deref() {
            None => None,
            Some(spec) => {
                let selection = CacheSelection::Spec(spec.to_string());
                // Checked here, so a bad SPEC is a 400 before the request waits in the queue.
                selection
                    .policy()
                    .map_err(|e| ApiError::invalid(format!("kv_cache {spec:?}: {e}")))?;
                Some(selection)
            }
        };
        let conversation = match self.conversation.as_deref().or(header) {
            Some(name) => ConversationChoice::Id {
                id: ConversationId::new(format!("{CONVERSATION_PREFIX}{name}")).map_err(|e| {
                    ApiError::invalid(format!("conversation: {e} (at most 124 of them here)"))
                })?,
            },
            None => ConversationChoice::Continuing {
                prefix: CONVERSATION_PREFIX.into(),
            },
        };
        Ok(Planned {
            request: GenerateRequest {
                prompt,
                sampling,
                max_tokens,
                prefill_chunk: PREFILL_CHUNK,
                cache,
                stop: stops.clone(),
                conversation: Some(conversation),
            },
            stops,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        })
    }
}

impl ChatRequest {
    /// The conversation as the engine's prompt (rendered by the model's own template).
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages must not be empty"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = Role::from_openai(&m.role).ok_or_else(|| {
                ApiError::invalid(format!(
                    "messages[{i}].role {:?} is not one of system, developer, user, assistant",
                    m.role
                ))
            })?;
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid(format!(
                                    "messages[{i}]: content parts of type {kind:?} are not supported (text only)"
                                )))
                            }
                        }
                    }
                    text
                }
            };
            messages.push(Message {
                role,
                content,
                thinking: m.reasoning_content.clone(),
            });
        }
        Ok(Prompt::Conversation {
            messages,
            thinking: self.thinking(),
        })
    }

    /// Thinking is asked for by `chat_template_kwargs.enable_thinking` or a
    /// `reasoning_effort` other than `none`/`minimal`.
    fn thinking(&self) -> bool {
        if let Some(on) = self
            .chat_template_kwargs
            .as_ref()
            .and_then(|k| k.enable_thinking)
        {
            return on;
        }
        matches!(self.reasoning_effort.as_deref(), Some(e) if e != "none" && e != "minimal")
    }
}

impl CompletionRequest {
    /// The text to continue.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        let text = match &self.prompt {
            PromptField::One(s) => s.clone(),
            PromptField::Many(v) if v.len() == 1 => v[0].clone(),
            PromptField::Many(v) => {
                return Err(ApiError::invalid(format!(
                    "prompt must be one string (got a list of {})",
                    v.len()
                )))
            }
        };
        Ok(Prompt::Text { text })
    }
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens found in this request's own conversation's cache.
    pub cached_tokens: usize,
}

/// `usage`, with KV Lab's fields beside OpenAI's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Prompt tokens found in the cache and not computed again (its own conversation's).
    pub reused_tokens: usize,
    /// The conversation it ran in (`api:` and its name, or a number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// Where its cache came from: `held`, `demoted`, `restored`, or read again.
    pub cache_origin: CacheOrigin,
    /// Bytes the KV cache holds after this request.
    pub kv_bytes: usize,
    /// Bytes the KV cache has reserved.
    pub kv_bytes_allocated: usize,
    /// The cache it ran with, as its canonical SPEC.
    pub kv_cache: String,
    pub time_to_first_token_s: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
}

impl From<&GenStats> for Usage {
    fn from(s: &GenStats) -> Self {
        Self {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.generated_tokens,
            total_tokens: s.prompt_tokens + s.generated_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: s.reused_tokens,
            },
            reused_tokens: s.reused_tokens,
            conversation: s.conversation.as_ref().map(|c| {
                c.as_str()
                    .trim_start_matches(CONVERSATION_PREFIX)
                    .to_owned()
            }),
            cache_origin: s.cache_origin,
            kv_bytes: s.kv_bytes,
            kv_bytes_allocated: s.kv_bytes_allocated,
            kv_cache: s.cache_spec.clone(),
            time_to_first_token_s: s.time_to_first_token_s,
            prefill_tokens_per_second: s.prefill_tok_per_s,
            decode_tokens_per_second: s.decode_tok_per_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: serde_json::Value) -> ChatRequest {
        serde_json::from_value(json).expect("a chat request")
    }

    #[test]
    fn a_chat_request_becomes_the_engines_conversation_and_settings() {
        let r = chat(serde_json::json!({
            "model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "temperature": 0, "max_completion_tokens": 7, "stop": "\n", "seed": 3,
            "kv_cache": "tq4", "user": "ignored"
        }));
        let planned = r.common.plan(r.prompt().unwrap(), None).unwrap();
        let Prompt::Conversation { messages, thinking } = &planned.request.prompt else {
            panic!("{:?}", planned.request.prompt)
        };
        assert_eq!(
            (messages[0].role, messages[1].content.as_str()),
            (Role::System, "Hi")
        );
        assert!(!thinking);
        assert_eq!(planned.request.max_tokens, 7);
        assert_eq!(planned.request.sampling.temperature, 0.0);
        assert_eq!(planned.request.sampling.seed, 3);
        assert_eq!(planned.stops, vec!["\n".to_string()]);
        assert_eq!(
            planned.request.cache,
            Some(CacheSelection::Spec("tq4".into()))
        );
    }

    #[test]
    fn what_we_do_not_do_is_refused_not_ignored() {
        for bad in [
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "kv_cache": "tq9"}),
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5}),
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}),
        ] {
            let r = chat(bad.clone());
            let e = r.common.plan(r.prompt().unwrap(), None).unwrap_err();
            assert_eq!(e.code, "invalid_request", "{bad}");
        }
        let r = chat(serde_json::json!({"messages": [{"role": "tool", "content": "x"}]}));
        assert_eq!(r.prompt().unwrap_err().code, "invalid_request");
    }

    #[test]
    fn thinking_is_asked_for_as_peers_ask_for_it() {
        let base = serde_json::json!({"messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: serde_json::Value| {
            let mut j = base.clone();
            j[k] = v;
            chat(j).thinking()
        };
        assert!(!chat(base.clone()).thinking());
        assert!(with("reasoning_effort", "high".into()));
        assert!(!with("reasoning_effort", "none".into()));
        assert!(with(
            "chat_template_kwargs",
            serde_json::json!({"enable_thinking": true})
        ));
    }
}
