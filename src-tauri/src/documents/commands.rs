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
/// child process (an image's in the image reader's).
#[tauri::command]
pub async fn inspect_document_path(
    state: State<'_, AppState>,
    path: String,
) -> Res<InspectedDocument> {
    let path = PathBuf::from(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if super::is_image(&name, &[]) {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        super::check_image_size(&name, len)?;
        let bytes = std::fs::read(&path).map_err(|e| {
            crate::error::CommandError::new(
                crate::error::AppCode::DocumentRefused,
                format!("{name}: {e}"),
            )
        })?;
        return inspect_image(&state, name, bytes).await;
    }
    let reader = state.documents.clone();
    let doc = blocking(move || reader.inspect_path(&path)).await?;
    with_tokens(&state, doc).await
}

/// An image read in the image reader's child process, kept by the engine for the message
/// that will name it: its tokens (soft tokens and markers) and a thumbnail.
async fn inspect_image(state: &AppState, name: String, bytes: Vec<u8>) -> Res<InspectedDocument> {
    let engine = state.engine.clone();
    let reader = state.documents.clone();
    blocking(move || {
        let handle = engine.handle();
        let processor = handle.image_processor().ok_or_else(|| {
            crate::error::CommandError::new(
                crate::error::ErrorCode::BadImage,
                format!(
                    "{name}: the loaded model reads no images (load one with its vision \
                     tower: a multimodal checkpoint, or a GGUF with its mmproj beside it)"
                ),
            )
        })?;
        let resized = reader.read_image(
            &name,
            &bytes,
            processor,
            kvlab_engine::contract::ImageLimits::default(),
        )?;
        let thumbnail = thumbnail(&resized);
        let info = handle
            .add_resized_image(&bytes, resized)
            .map_err(crate::error::CommandError::from)?;
        Ok(InspectedDocument {
            doc: Document {
                name,
                kind: super::DocumentKind::Image,
                bytes: bytes.len(),
                pages: None,
                text: String::new(),
                image: Some(super::ImageAttachment {
                    id: info.id,
                    width: info.width,
                    height: info.height,
                    resized: info.resized,
                    thumbnail,
                }),
            },
            tokens: info.tokens,
        })
    })
    .await
}

/// A PNG of at most 160 pixels a side of the image as the model reads it, as a data: URL.
fn thumbnail(resized: &kvlab_engine::contract::ResizedImage) -> String {
    use base64::Engine as _;
    let (w, h) = resized.size;
    let Some(rgb) = image::RgbImage::from_raw(w, h, resized.pixels.clone()) else {
        return String::new();
    };
    let scale = (160.0 / w.max(h) as f64).min(1.0);
    let (tw, th) = (
        ((w as f64 * scale) as u32).max(1),
        ((h as f64 * scale) as u32).max(1),
    );
    let small = image::imageops::thumbnail(&rgb, tw, th);
    let mut png = Vec::new();
    if small
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .is_err()
    {
        return String::new();
    }
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    )
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
    if super::is_image(&name, &bytes) || (bytes.is_empty() && super::is_image(&name, &[])) {
        super::check_image_size(&name, size.unwrap_or(0).max(bytes.len() as u64))?;
        return inspect_image(&state, name, bytes).await;
    }
    super::check_size(&name, size.unwrap_or(0).max(bytes.len() as u64))?;
    let reader = state.documents.clone();
    // Parsing waits on a child process: keep it off the async runtime.
    let doc = blocking(move || reader.inspect(&name, &bytes)).await?;
    with_tokens(&state, doc).await
}
