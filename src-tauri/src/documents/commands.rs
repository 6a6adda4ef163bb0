//! Commands of the documents domain: a dropped or picked file read in the reader's child
//! process, counted in tokens, and what attached documents add to the conversation.

use std::path::PathBuf;

use kvlab_engine::contract::DocumentFit;
use serde::Serialize;
use tauri::State;
use ts_rs::TS;

use super::Document;
use crate::blocking::{blocking, Res};
use crate::state::AppState;

/// What each attached document (token counts, in order) adds to the conversation.
#[tauri::command]
pub fn document_fits(
    state: State<'_, AppState>,
    conversation: Option<kvlab_engine::contract::ConversationId>,
    documents: Vec<usize>,
    reserve: usize,
) -> Res<Vec<DocumentFit>> {
    state
        .engine
        .handle()
        .document_fits(conversation.as_ref(), &documents, reserve)
        .map_err(crate::error::CommandError::from)
}

/// A document with its token count (what the prompt will cost).
#[derive(Debug, Clone, Serialize, TS)]
pub struct InspectedDocument {
    #[serde(flatten)]
    pub doc: Document,
    pub tokens: usize,
}

async fn with_tokens(state: &AppState, doc: Document) -> Res<InspectedDocument> {
    let (engine, text) = (state.engine.clone(), doc.text.clone());
    let tokens = blocking(move || {
        engine
            .handle()
            .count_tokens(&text)
            .map_err(crate::error::CommandError::from)
    })
    .await?;
    Ok(InspectedDocument { doc, tokens })
}

/// Reads a dropped or picked file by path; its bytes are parsed in the document reader's
/// child process.
#[tauri::command]
pub async fn inspect_document_path(
    state: State<'_, AppState>,
    path: String,
) -> Res<InspectedDocument> {
    let reader = state.documents.clone();
    let doc = blocking(move || reader.inspect_path(&PathBuf::from(path))).await?;
    with_tokens(&state, doc).await
}

/// Reads a file the web view already holds (a DOM drop or the picker). `size` is the file's
/// size as the web view knows it: a file over the limit is refused by it and sent empty, so
/// the web view never copies hundreds of megabytes over IPC.
#[tauri::command]
pub async fn inspect_document_bytes(
    state: State<'_, AppState>,
    name: String,
    bytes: Vec<u8>,
    size: Option<u64>,
) -> Res<InspectedDocument> {
    super::check_size(&name, size.unwrap_or(0).max(bytes.len() as u64))?;
    let reader = state.documents.clone();
    // Parsing waits on a child process: keep it off the async runtime.
    let doc = blocking(move || reader.inspect(&name, &bytes)).await?;
    with_tokens(&state, doc).await
}
