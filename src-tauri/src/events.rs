//! The wire shapes the UI reads: chat stream events (over an ipc Channel, one generation
//! each), and the low-rate engine status and memory snapshots. Their JSON is a contract,
//! pinned by the tests below and mirrored in ui/src/lib/api.ts.

use serde::{Deserialize, Serialize};

/// Numbers shown under each answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GenerationStats {
    /// From the request to the first streamed token, in milliseconds.
    pub ttft_ms: f64,
    /// Prompt tokens run through the model (the rest came from the cache).
    pub prefill_tokens: usize,
    /// Prompt tokens reused from the cache.
    pub reused_tokens: usize,
    pub prefill_tok_s: f64,
    /// Tokens generated.
    pub decode_tokens: usize,
    pub decode_tok_s: f64,
    /// Tokens in the context after this answer.
    pub context_tokens: usize,
    /// KV bytes in use after this answer.
    pub kv_bytes: u64,
    /// The cache policy the answer ran with.
    pub cache_policy: String,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model ended its turn.
    EndOfTurn,
    /// `max_tokens` reached.
    MaxTokens,
    /// The user stopped it.
    Cancelled,
}

/// One message on a generation's channel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatEvent {
    Token {
        text: String,
    },
    Thinking {
        text: String,
    },
    Done {
        reason: StopReason,
        stats: GenerationStats,
    },
    Error {
        code: String,
        message: String,
    },
}

/// One message on a comparison's channel: a pane's stream event, or the final fidelity.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CompareEvent {
    /// An event of pane 0 (the reference) or 1 (the test policy).
    Pane { pane: usize, event: ChatEvent },
    /// Teacher-forced fidelity of the test cache against the reference on the reference's
    /// tokens, and both caches' bytes.
    Fidelity {
        mean_kld: f64,
        max_kld: f64,
        top1_agreement: f64,
        tokens_scored: usize,
        kv_bytes: [u64; 2],
    },
}

/// What the engine is doing, as the status bar shows it (the `engine-status` event).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum EngineStatus {
    NoModel,
    Loading { path: String },
    Ready { model: String },
    Generating { model: String },
    Failed { message: String },
}

impl EngineStatus {
    pub fn label(&self) -> String {
        match self {
            EngineStatus::NoModel => "no model loaded".into(),
            EngineStatus::Loading { path } => format!("loading {}…", short_name(path)),
            EngineStatus::Ready { model } => format!("{model} · ready"),
            EngineStatus::Generating { model } => format!("{model} · generating"),
            EngineStatus::Failed { message } => format!("error: {message}"),
        }
    }
}

fn short_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// KV cache bytes of one attention kind at one precision.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KvPart {
    /// `full` or `sliding`.
    pub kind: &'static str,
    pub precision: String,
    pub bytes: u64,
}

/// The engine's memory, updated after every step and read by the memory sampler.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct EngineMemory {
    pub weights_bytes: u64,
    pub kv: Vec<KvPart>,
    pub context_tokens: usize,
    pub cache_policy: String,
}

/// A cache switch, as the timeline marks it (the `cache-switched` event and command reply).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SwitchReport {
    pub t_ms: u64,
    pub from: String,
    pub to: String,
    pub before_bytes: u64,
    pub after_bytes: u64,
    pub convert_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_events_have_a_stable_json_shape() {
        assert_eq!(
            serde_json::to_value(ChatEvent::Token { text: "hi".into() }).unwrap(),
            json!({"type": "token", "text": "hi"})
        );
        assert_eq!(
            serde_json::to_value(ChatEvent::Thinking { text: "hm".into() }).unwrap(),
            json!({"type": "thinking", "text": "hm"})
        );
        let done = ChatEvent::Done {
            reason: StopReason::MaxTokens,
            stats: GenerationStats {
                decode_tokens: 3,
                ..Default::default()
            },
        };
        let v = serde_json::to_value(done).unwrap();
        assert_eq!(v["type"], "done");
        assert_eq!(v["reason"], "max_tokens");
        assert_eq!(v["stats"]["decode_tokens"], 3);
    }

    #[test]
    fn status_labels_read_well() {
        let s = EngineStatus::Loading {
            path: "/a/b/model.gguf".into(),
        };
        assert_eq!(s.label(), "loading model.gguf…");
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"state": "loading", "path": "/a/b/model.gguf"})
        );
        assert_eq!(EngineStatus::NoModel.label(), "no model loaded");
    }
}
