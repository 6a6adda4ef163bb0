//! The OpenAI wire format this server speaks (chat completions, completions, models), plus
//! KV Lab's own fields: a request's `kv_cache` (any cache SPEC) and the cache's bytes in
//! `usage`. Requests are read leniently (clients send fields we ignore, skipped unbuffered)
//! but a field that asks for something we do not do (`n > 1`, penalties, logprobs) is
//! refused, not ignored; every list is bounded as it is read.

use kvlab_engine::contract::MAX_STOPS;
use kvlab_engine::contract::{CacheOrigin, GenStats};
use kvlab_engine::contract::{ImageLimits, MAX_IMAGES_PER_PROMPT};
use kvlab_engine::contract::{Message, Role};
use std::marker::PhantomData;

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{Prompt, PREFILL_CHUNK};
use kvlab_engine::GenerateRequest;
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::client::Client;
use crate::error::ApiError;
use crate::tools::{Calls, ResponseFormatIn, ToolCallIn, ToolIn, Tools};
use kvlab_engine::contract::Constraint;

/// A bound on a list in a request: a list is read item by item and refused at its
/// `MAX + 1`th, before more is read (a body of many tiny items would otherwise take many
/// times its size in memory).
pub trait ListBound {
    const MAX: usize;
    /// What the list holds, for the refusal.
    const WHAT: &'static str;
}

/// Messages of a chat request (a long conversation is some hundreds).
#[derive(Debug)]
pub struct Messages;
impl ListBound for Messages {
    const MAX: usize = 65_536;
    const WHAT: &'static str = "messages";
}

/// Content parts of one message.
#[derive(Debug)]
pub struct Parts;
impl ListBound for Parts {
    const MAX: usize = 4_096;
    const WHAT: &'static str = "content parts in a message";
}

/// Stop strings.
#[derive(Debug)]
pub struct Stops;
impl ListBound for Stops {
    const MAX: usize = MAX_STOPS;
    const WHAT: &'static str = "stop sequences";
}

/// Prompts of a completion request (one answer per request).
#[derive(Debug)]
pub struct Prompts;
impl ListBound for Prompts {
    const MAX: usize = 1;
    const WHAT: &'static str = "prompts (one string per request)";
}

/// A JSON list of at most `K::MAX` items.
pub struct Bounded<T, K>(pub Vec<T>, PhantomData<K>);

impl<T: std::fmt::Debug, K> std::fmt::Debug for Bounded<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

struct BoundedVisitor<T, K>(PhantomData<(T, K)>);

impl<'de, T: Deserialize<'de>, K: ListBound> Visitor<'de> for BoundedVisitor<T, K> {
    type Value = Bounded<T, K>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a list of at most {} {}", K::MAX, K::WHAT)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(K::MAX).min(64));
        while let Some(item) = seq.next_element()? {
            if items.len() == K::MAX {
                return Err(A::Error::invalid_length(K::MAX + 1, &self));
            }
            items.push(item);
        }
        Ok(Bounded(items, PhantomData))
    }
}

impl<'de, T: Deserialize<'de>, K: ListBound> Deserialize<'de> for Bounded<T, K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(BoundedVisitor(PhantomData))
    }
}

/// One string, or a list of at most `K::MAX` items (`content`, `stop`, `prompt`), read
/// without buffering (serde's untagged enums copy the whole value first).
#[derive(Debug)]
pub enum TextOr<T, K> {
    Text(String),
    List(Bounded<T, K>),
}

struct TextOrVisitor<T, K>(PhantomData<(T, K)>);

impl<'de, T: Deserialize<'de>, K: ListBound> Visitor<'de> for TextOrVisitor<T, K> {
    type Value = TextOr<T, K>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a string or a list of at most {} {}", K::MAX, K::WHAT)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(TextOr::Text(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(TextOr::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        BoundedVisitor(PhantomData).visit_seq(seq).map(TextOr::List)
    }
}

impl<'de, T: Deserialize<'de>, K: ListBound> Deserialize<'de> for TextOr<T, K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextOrVisitor(PhantomData))
    }
}

/// One part of a message's content: text, or an image as a `data:` URL.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub image_url: Option<ImageUrl>,
}

/// OpenAI's `image_url` part: `{"url": "data:image/png;base64,…"}` (or the URL alone).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ImageUrl {
    Object { url: String },
    Url(String),
}

impl ImageUrl {
    fn url(&self) -> &str {
        match self {
            ImageUrl::Object { url } | ImageUrl::Url(url) => url,
        }
    }
}

/// The bytes of an image sent as a `data:` URL; any other URL is refused (the server fetches
/// nothing).
fn data_url_bytes(i: usize, url: &str) -> Result<Vec<u8>, ApiError> {
    use base64::Engine as _;
    let refused = |why: &str| {
        ApiError::invalid(format!(
            "messages[{i}]: image_url {why}: send the image inline as a data: URL \
             (data:image/png;base64,...); the server fetches nothing"
        ))
    };
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split(':').next().unwrap_or_default();
        let scheme: String = scheme.chars().take(16).collect();
        return Err(refused(&format!("of scheme {scheme:?} is not read")));
    };
    let Some((head, data)) = rest.split_once(',') else {
        return Err(refused("has no data"));
    };
    if !head.ends_with(";base64") {
        return Err(refused("is not base64"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| refused(&format!("is not valid base64 ({e})")))
}

/// One message of a chat request.
#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    /// A string, or OpenAI's list of parts.
    #[serde(default)]
    pub content: Option<TextOr<ContentPart, Parts>>,
    /// A previous answer's thinking, as llama-server and vLLM send it back.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// A previous answer's calls.
    #[serde(default)]
    pub tool_calls: Option<Bounded<ToolCallIn, Calls>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
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

/// The body of either endpoint, `POST /v1/chat/completions` (`messages`) and
/// `POST /v1/completions` (`prompt`): one flat struct, so a field we do not know is skipped
/// as it is read, never buffered.
#[derive(Debug, Default, Deserialize)]
pub struct RequestBody {
    #[serde(default)]
    pub messages: Option<Bounded<ChatMessageIn, Messages>>,
    #[serde(default)]
    pub prompt: Option<TextOr<String, Prompts>>,
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
    pub stop: Option<TextOr<String, Stops>>,
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
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Functions the model may call.
    #[serde(default)]
    pub tools: Option<Bounded<ToolIn, Tools>>,
    /// `auto`, `none`, `required`, or one function.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `text`, `json_object`, or `json_schema`.
    #[serde(default)]
    pub response_format: Option<ResponseFormatIn>,
    /// The constraint `tool_choice` asked for, found as the chat's messages are read.
    #[serde(skip)]
    forced_call: Option<Constraint>,
    /// The images of the chat's messages, decoded from their `data:` URLs: (message, bytes).
    #[serde(skip)]
    images: Vec<(usize, Vec<u8>)>,
}

/// What the server allows every request (`kvlab serve --max-tokens`, `--ctx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tokens an answer may run to: a request's own default, and its most (a larger
    /// `max_tokens` is cut to it, as llama-server cuts it to its `-n`).
    pub max_tokens: usize,
    /// Tokens of context a request may reach, prompt and answer (`None`: the model's): a
    /// longer prompt is refused before any work, an answer ends where it runs out.
    pub context: Option<usize>,
    /// What an image may take to decode (`--max-image-side`); its file's bytes are bounded
    /// by the body's.
    pub images: ImageLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tokens: DEFAULT_SERVER_MAX_TOKENS,
            context: None,
            images: ImageLimits::default(),
        }
    }
}

/// The most tokens an answer may run to unless the server is told otherwise.
pub const DEFAULT_SERVER_MAX_TOKENS: usize = 2048;

/// What a request asks of the engine, checked.
#[derive(Debug, Clone)]
pub struct Planned {
    pub request: GenerateRequest,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Images to add to the engine before the request goes (message, bytes), read within
    /// `image_limits`.
    pub images: Vec<(usize, Vec<u8>)>,
    pub image_limits: ImageLimits,
}

impl RequestBody {
    /// Sampling, limits, stops, cache and conversation (named in the body, else by
    /// `header`, the `X-Conversation` header), checked against `limits`; `prompt` is what to
    /// continue. A request that names no cache runs with its conversation's (a new
    /// conversation gets the server's default, `kvlab serve --kv`).
    pub fn plan(
        &mut self,
        prompt: Prompt,
        header: Option<&str>,
        client: &Client,
        limits: Limits,
    ) -> Result<Planned, ApiError> {
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
        let asked = self.max_completion_tokens.or(self.max_tokens);
        if asked == Some(0) {
            return Err(ApiError::invalid("max_tokens must be at least 1"));
        }
        let max_tokens = asked
            .unwrap_or(limits.max_tokens)
            .min(limits.max_tokens)
            .max(1);
        let stops = match self.stop.take() {
            None => Vec::new(),
            Some(TextOr::Text(s)) => vec![s],
            Some(TextOr::List(v)) => v.0,
        };
        let cache = match self.kv_cache.as_deref() {
            None => None,
            Some(spec) => {
                let selection = CacheSelection::Spec(spec.to_string());
                // Checked here, so a bad SPEC is a 400 before the request waits in the queue
                // (the engine refuses a long one before parsing it, with a short echo).
                selection
                    .policy()
                    .map_err(|e| ApiError::invalid(format!("kv_cache: {e}")))?;
                Some(selection)
            }
        };
        let format = crate::tools::response_format(self.response_format.take())?;
        let constraint = match (self.forced_call.take(), format) {
            (Some(_), Some(_)) => return Err(ApiError::invalid(
                "a forced tool call and a response_format cannot both hold the answer: choose one",
            )),
            (call, format) => call.or(format),
        };
        let conversation = client.conversation(self.conversation.as_deref().or(header))?;
        Ok(Planned {
            request: GenerateRequest {
                prompt,
                sampling,
                max_tokens,
                prefill_chunk: PREFILL_CHUNK,
                cache,
                stop: stops.clone(),
                conversation: Some(conversation),
                context: limits.context,
                constraint,
            },
            stops,
            stream: self.stream,
            images: std::mem::take(&mut self.images),
            image_limits: limits.images,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        })
    }

    /// The chat request's conversation as the engine's prompt (rendered by the model's own
    /// template); the messages are moved out, not copied.
    pub fn chat_prompt(&mut self) -> Result<Prompt, ApiError> {
        let listed = self.messages.take().map(|m| m.0).unwrap_or_default();
        if listed.is_empty() {
            return Err(ApiError::invalid("messages must not be empty"));
        }
        let mut messages = Vec::with_capacity(listed.len());
        for (i, m) in listed.into_iter().enumerate() {
            let role = Role::from_openai(&m.role).ok_or_else(|| {
                ApiError::invalid(format!(
                    "messages[{i}].role {:?} is not one of system, developer, user, assistant, tool",
                    m.role
                ))
            })?;
            if role == Role::Tool && m.tool_call_id.is_none() {
                return Err(ApiError::invalid(format!(
                    "messages[{i}]: a tool message names the call it answers (tool_call_id)"
                )));
            }
            let tool_calls = crate::tools::calls(i, m.tool_calls)?;
            let content = match m.content {
                None => String::new(),
                Some(TextOr::Text(t)) => t,
                Some(TextOr::List(parts)) => {
                    let mut text = String::new();
                    for p in parts.0 {
                        match (p.kind.as_str(), p.text, p.image_url) {
                            ("text", Some(t), _) => text.push_str(&t),
                            ("image_url", _, Some(url)) if role == Role::User => {
                                if self.images.len() >= MAX_IMAGES_PER_PROMPT {
                                    return Err(ApiError::invalid(format!(
                                        "more than {MAX_IMAGES_PER_PROMPT} images in one request"
                                    )));
                                }
                                self.images.push((i, data_url_bytes(i, url.url())?));
                            }
                            ("image_url", _, _) => {
                                return Err(ApiError::invalid(format!(
                                    "messages[{i}]: an image_url part needs its url, in a user message"
                                )))
                            }
                            (kind, _, _) => {
                                return Err(ApiError::invalid(format!(
                                    "messages[{i}]: content parts of type {kind:?} are not supported (text and image_url only)"
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
                thinking: m.reasoning_content,
                tool_calls,
                tool_call_id: m.tool_call_id,
                images: Vec::new(),
            });
        }
        let tools = crate::tools::tools(self.tools.take())?;
        let (forced, offered) =
            crate::tools::choice(self.tool_choice.as_ref(), self.parallel_tool_calls)?;
        self.forced_call = forced;
        Ok(Prompt::Conversation {
            messages,
            thinking: self.thinking(),
            tools: if offered { tools } else { Vec::new() },
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

    /// The completion request's text to continue.
    pub fn text_prompt(&mut self) -> Result<Prompt, ApiError> {
        let text = match self.prompt.take() {
            Some(TextOr::Text(s)) => s,
            Some(TextOr::List(v)) if v.0.len() == 1 => v.0.into_iter().next().unwrap_or_default(),
            Some(TextOr::List(v)) if v.0.len() > 1 => {
                return Err(ApiError::invalid(
                    "prompt: one prompt per request (a list of one is accepted)",
                ))
            }
            Some(TextOr::List(_)) | None => return Err(ApiError::invalid("prompt is required")),
        };
        if text.is_empty() {
            return Err(ApiError::invalid(
                "prompt is empty: give the text to continue",
            ));
        }
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
    /// The conversation it ran in: the name the client gave it, or the unguessable id a new
    /// one got (send it back as `conversation` to continue it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// Where its cache came from: `held`, `demoted`, `restored`, or read again.
    pub cache_origin: CacheOrigin,
    /// Bytes the KV cache holds after this request.
    pub kv_bytes: usize,
    /// Bytes the KV cache has reserved.
    pub kv_bytes_allocated: usize,
    /// Its TurboQuant layers still hold the first tokens as f16, waiting to calibrate on
    /// the model's calibration rows (512 on a Gemma): `kv_bytes` are then f16's.
    pub kv_calibrating: bool,
    /// The cache it ran with, as its canonical SPEC.
    pub kv_cache: String,
    pub time_to_first_token_s: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
}

impl Usage {
    /// `s` as `client` sees it: its conversation by the name it has for the client.
    pub fn of(s: &GenStats, client: &Client) -> Self {
        Self {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.generated_tokens,
            total_tokens: s.prompt_tokens + s.generated_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: s.reused_tokens,
            },
            reused_tokens: s.reused_tokens,
            conversation: s
                .conversation
                .as_ref()
                .and_then(|c| client.name_of(c.as_str()))
                .map(str::to_owned),
            cache_origin: s.cache_origin,
            kv_bytes: s.kv_bytes,
            kv_bytes_allocated: s.kv_bytes_allocated,
            kv_calibrating: s.kv_calibrating,
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

    fn body(json: serde_json::Value) -> RequestBody {
        serde_json::from_value(json).expect("a request")
    }

    fn planned(json: serde_json::Value) -> Result<Planned, ApiError> {
        let mut r = body(json);
        let prompt = r.chat_prompt()?;
        r.plan(
            prompt,
            None,
            &Client::of(None, &Default::default()),
            Limits::default(),
        )
    }

    #[test]
    fn a_chat_request_becomes_the_engines_conversation_and_settings() {
        let planned = planned(serde_json::json!({
            "model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "temperature": 0, "max_completion_tokens": 7, "stop": "\n", "seed": 3,
            "kv_cache": "tq4", "user": "ignored", "unknown": {"deep": [1, 2, {"x": null}]}
        }))
        .unwrap();
        let Prompt::Conversation {
            messages, thinking, ..
        } = &planned.request.prompt
        else {
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
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            serde_json::json!({"messages": [{"role": "tool", "content": "x"}]}),
            serde_json::json!({"messages": []}),
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "conversation": ""}),
        ] {
            let e = planned(bad.clone()).unwrap_err();
            assert_eq!(e.code, "invalid_request", "{bad}");
        }
    }

    #[test]
    fn lists_past_their_bound_are_refused_as_they_are_read() {
        let five_stops = serde_json::json!({"messages": [], "stop": ["a","b","c","d","e"]});
        let e = serde_json::from_value::<RequestBody>(five_stops).unwrap_err();
        assert!(e.to_string().contains("at most 4 stop sequences"), "{e}");
        let two_prompts = serde_json::json!({"prompt": ["a", "b"]});
        let e = serde_json::from_value::<RequestBody>(two_prompts).unwrap_err();
        assert!(e.to_string().contains("one string per request"), "{e}");
        let parts = vec![serde_json::json!({"type": "text", "text": "a"}); Parts::MAX + 1];
        let many = serde_json::json!({"messages": [{"role": "user", "content": parts}]});
        assert!(serde_json::from_value::<RequestBody>(many).is_err());
        let ok = serde_json::json!({"prompt": ["one"], "stop": ["a","b","c","d"]});
        let mut r = body(ok);
        assert!(matches!(r.text_prompt(), Ok(Prompt::Text { text }) if text == "one"));
    }

    #[test]
    fn max_tokens_defaults_to_the_servers_and_is_cut_to_it() {
        let limits = Limits {
            max_tokens: 100,
            context: Some(4096),
            ..Limits::default()
        };
        let plan = |extra: serde_json::Value| {
            let mut j = serde_json::json!({"prompt": "x"});
            for (k, v) in extra.as_object().unwrap() {
                j[k] = v.clone();
            }
            let mut r = body(j);
            let p = r.text_prompt().unwrap();
            r.plan(p, None, &Client::of(None, &Default::default()), limits)
                .unwrap()
                .request
        };
        assert_eq!(plan(serde_json::json!({})).max_tokens, 100);
        assert_eq!(plan(serde_json::json!({"max_tokens": 7})).max_tokens, 7);
        let huge = plan(serde_json::json!({"max_tokens": 1_000_000_000u64}));
        assert_eq!((huge.max_tokens, huge.context), (100, Some(4096)));
    }

    #[test]
    fn thinking_is_asked_for_as_peers_ask_for_it() {
        let base = serde_json::json!({"messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: serde_json::Value| {
            let mut j = base.clone();
            j[k] = v;
            body(j).thinking()
        };
        assert!(!body(base.clone()).thinking());
        assert!(with("reasoning_effort", "high".into()));
        assert!(!with("reasoning_effort", "none".into()));
        assert!(with(
            "chat_template_kwargs",
            serde_json::json!({"enable_thinking": true})
        ));
    }
}
