//! Where commands wait: long work (the engine's replies, header reads, token counting, file
//! reads, dialogs) runs on `spawn_blocking` threads, never Tauri's async workers.

use crate::error::{CommandError, ErrorCode};

/// A command's result: the engine's value or a coded error.
pub(crate) type Res<T> = Result<T, CommandError>;

/// Runs `f` on a blocking thread and waits for it.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Res<T> + Send + 'static,
) -> Res<T> {
    tauri::async_runtime::spawn_blocking(f)
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}
