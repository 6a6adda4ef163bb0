//! The one error vocabulary every front end shows: a stable snake_case code per failure, the
//! same string in events, command errors, CLI messages and (later) HTTP bodies. Depends on
//! nothing else in the engine.

/// Declares a code vocabulary: each code's documentation, variant and string, once. The enum,
/// its serde names (the same strings), `ALL` and `as_str` are derived. The engine declares
/// [`ErrorCode`] with it; the app declares its own codes (documents, sessions) the same way,
/// so both serialize into one flat set of strings.
#[macro_export]
macro_rules! error_codes {
    ($(#[doc = $edoc:expr])* $name:ident { $($(#[doc = $doc:expr])* $variant:ident = $code:literal,)* }) => {
        $(#[doc = $edoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, ts_rs::TS)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[doc = $doc])* #[serde(rename = $code)] $variant,)*
        }

        impl $name {
            /// Every code, in declaration order, for exhaustive tests and documentation.
            pub const ALL: [$name; [$($code),*].len()] = [$($name::$variant),*];

            /// The code as its JSON string (e.g. `"context_overflow"`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $code,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

error_codes! {
    /// Stable, machine-readable error codes: the one vocabulary of the engine, the app and
    /// the UI (which switches on them, so never rename one).
    ErrorCode {
        /// The model path, asset or repository does not exist.
        ModelNotFound = "model_not_found",
        /// The model file exists but cannot be used (corrupt, unsupported, inconsistent).
        BadModelFile = "bad_model_file",
        /// No tokenizer could be found for the model.
        TokenizerNotFound = "tokenizer_not_found",
        /// The tokenizer file cannot be used.
        BadTokenizer = "bad_tokenizer",
        /// A job needs a loaded model and none is.
        NoModel = "no_model",
        /// The prompt does not fit in the model's context.
        ContextOverflow = "context_overflow",
        /// The engine is generating and cannot take this job now.
        Busy = "busy",
        /// The job was cancelled.
        Cancelled = "cancelled",
        /// The request is malformed (bad sampling values, bad conversation, bad cache spec).
        InvalidRequest = "invalid_request",
        /// The Hugging Face Hub could not be reached.
        Network = "network",
        /// The Hub wants a token, or the token has no access (a gated repository): the message
        /// says how to set `HF_TOKEN`.
        HubAuth = "hub_auth",
        /// The Hub is rate-limiting this client (429); the message says how long to wait.
        HubRateLimited = "hub_rate_limited",
        /// The Hub kept failing (5xx) after retries with backoff.
        HubUnavailable = "hub_unavailable",
        /// A download ended before its last byte after retries; what arrived is kept for resume.
        DownloadIncomplete = "download_incomplete",
        /// A downloaded file is not what the Hub listed (checksum or size); it was discarded.
        DownloadCorrupt = "download_corrupt",
        /// The disk (or the file system's file-size limit) has no room for what is being written:
        /// nothing was written, and the previous file is intact.
        DiskFull = "disk_full",
        /// The model, or its context, needs more memory than the machine has available.
        OutOfMemory = "out_of_memory",
        /// The model produced NaN or infinite logits (bad weights or an overflow).
        NonFiniteLogits = "non_finite_logits",
        /// The engine thread is gone.
        EngineStopped = "engine_stopped",
        /// The model's architecture is not one the engine implements.
        UnsupportedModel = "unsupported_model",
        /// A file could not be read or written.
        Io = "io",
        /// Anything else (a tensor operation failed).
        Internal = "internal",
        /// The model's chat template cannot be used (it fails to parse or render, or runs past
        /// its limits): the message names the line; the model still continues plain text.
        BadChatTemplate = "bad_chat_template",
        /// The engine's request queue is full (it holds the engine's `MAX_QUEUED`
        /// waiting requests); try again once one has finished.
        QueueFull = "queue_full",
        /// A saved KV cache file is damaged (truncated, a failed checksum, sizes that lie): it was
        /// set aside; the conversation reads its prompt again.
        CacheCorrupt = "cache_corrupt",
        /// A saved KV cache file belongs to another model or policy, or to another format
        /// version: the conversation reads its prompt again.
        CacheMismatch = "cache_mismatch",
        /// An image cannot be used: the file cannot be decoded or is past the limits, the
        /// loaded model reads no images, or a message names an image the engine no longer
        /// holds.
        BadImage = "bad_image",
    }
}
