//! Why a generation (or a scoring run) could not proceed, with the stable code each failure
//! maps to.

use crate::chat::ChatError;
use crate::contract::ErrorCode;
use crate::error::EngineError;
use crate::generate::sampling::SamplingError;
use crate::tokenizer::{RenderError, TokenizerError};

/// A generation failure. Cancelling is not one: it ends with `done` / `cancelled`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The prompt is longer than the model's context.
    #[error("the prompt has {prompt} tokens but the model's context holds {max}")]
    ContextOverflow {
        /// Prompt tokens.
        prompt: usize,
        /// Maximum context.
        max: usize,
    },
    /// The prompt is far longer than the model's context: refused before it was all
    /// encoded, so its length is a lower bound.
    #[error("the prompt has at least {at_least} tokens but the model's context holds {max}")]
    PromptTooLong {
        /// Prompt tokens, at least.
        at_least: usize,
        /// Maximum context.
        max: usize,
    },
    /// The context would outgrow the memory available (the message has the numbers and
    /// what would fit).
    #[error("{0}")]
    OutOfMemory(String),
    /// The model's output holds NaN or infinite values.
    #[error(
        "the model produced {bad} non-finite logits (NaN or infinite, of {vocab}) at position \
         {position}: its weights hold NaN or Inf values, or the computation overflowed; the \
         cache was cleared and the conversation is kept"
    )]
    NonFiniteLogits {
        /// Non-finite entries.
        bad: usize,
        /// Vocabulary size.
        vocab: usize,
        /// Context position of the token whose logits they are.
        position: usize,
    },
    /// Nothing to run.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Stop strings the engine will not watch for.
    #[error("{0}")]
    BadStop(String),
    /// A request for no tokens at all.
    #[error("max_tokens must be at least 1")]
    NoTokens,
    /// The conversation cannot be rendered.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// Encoding or decoding failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Bad sampling settings.
    #[error(transparent)]
    Sampling(#[from] SamplingError),

    #[error(transparent)]
    Constraint(#[from] crate::constrain::ConstrainError),
    /// An image cannot be used.
    #[error(transparent)]
    Image(#[from] crate::images::ImageError),
    /// The model or cache failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A tensor operation outside the model failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

impl From<RenderError> for GenerateError {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Chat(c) => GenerateError::Chat(c),
            RenderError::Tokenizer(t) => GenerateError::Tokenizer(t),
        }
    }
}

impl GenerateError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            GenerateError::ContextOverflow { .. } | GenerateError::PromptTooLong { .. } => {
                ErrorCode::ContextOverflow
            }
            GenerateError::OutOfMemory(_) | GenerateError::Engine(EngineError::OutOfMemory(_)) => {
                ErrorCode::OutOfMemory
            }
            GenerateError::NonFiniteLogits { .. } => ErrorCode::NonFiniteLogits,
            GenerateError::Chat(ChatError::BadTemplate { .. }) => ErrorCode::BadChatTemplate,
            GenerateError::EmptyPrompt
            | GenerateError::NoTokens
            | GenerateError::BadStop(_)
            | GenerateError::Chat(_)
            | GenerateError::Sampling(_)
            | GenerateError::Constraint(_)
            | GenerateError::Engine(EngineError::InvalidRequest(_)) => ErrorCode::InvalidRequest,
            GenerateError::Tokenizer(_) => ErrorCode::BadTokenizer,
            GenerateError::Image(_) => ErrorCode::BadImage,
            GenerateError::Engine(_) | GenerateError::Candle(_) => ErrorCode::Internal,
        }
    }
}
