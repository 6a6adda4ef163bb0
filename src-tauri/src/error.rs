//! Errors as the UI sees them: the engine's [`JobError`](kvlab_engine::JobError) — one
//! [`ErrorCode`] vocabulary and a readable message — for engine jobs and the app's own
//! commands (documents, sessions, downloads) alike. Serialized as `{code, message}`.

pub use kvlab_engine::{ErrorCode, JobError as CommandError};
