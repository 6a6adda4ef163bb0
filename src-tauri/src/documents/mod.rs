//! Files the user attaches to a prompt: decides whether a file is readable text (plain,
//! markdown, code) or a PDF with a text layer and returns its text, or refuses it with its own
//! code (empty, binary, not UTF-8, too large, an unreadable PDF). Parsing runs in a child
//! process with limits ([`isolated`]): `inspect` here is what that child runs. The chat is
//! never touched here; token costs are counted by the engine thread afterwards.

pub mod commands;

pub mod child;
pub mod isolated;
mod pdf;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::error::{AppCode, CommandError};

pub use isolated::{Limits, Reader};

/// Largest file accepted, in bytes; also the most text a PDF may yield.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

/// What kind of text a document holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, TS)]
#[serde(rename_all = "snake_case")]
pub enum DocumentKind {
    Text,
    Markdown,
    Code,
    Pdf,
    /// An image for a model that reads them: its text is empty, its cost is its soft tokens.
    Image,
}

/// A file accepted as text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, TS)]
pub struct Document {
    pub name: String,
    pub kind: DocumentKind,
    pub bytes: usize,
    /// Page count, for PDFs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub pages: Option<usize>,
    pub text: String,
    /// An image's id (messages name it by it), sizes and thumbnail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub image: Option<ImageAttachment>,
}

/// What an attached image is to the chat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, TS)]
pub struct ImageAttachment {
    /// The engine's id of it.
    pub id: String,
    pub width: u32,
    pub height: u32,
    /// Its size as the model reads it.
    pub resized: (u32, u32),
    /// A small PNG of it, as a data: URL.
    pub thumbnail: String,
}

/// Largest image file accepted, in bytes (photos are larger than text).
pub const MAX_IMAGE_BYTES: usize = 16 * 1024 * 1024;

/// Whether the file is an image for the image reader: by its first bytes (PNG, JPEG, GIF,
/// WebP), or its extension when it has no bytes yet (a path not read).
pub fn is_image(name: &str, bytes: &[u8]) -> bool {
    const MAGIC: [&[u8]; 5] = [b"\x89PNG", b"\xFF\xD8\xFF", b"GIF87a", b"GIF89a", b"RIFF"];
    if bytes.is_empty() {
        return ["png", "jpg", "jpeg", "gif", "webp"].contains(&extension(name).as_str());
    }
    MAGIC.iter().any(|m| bytes.starts_with(m))
        && (!bytes.starts_with(b"RIFF") || bytes.get(8..12) == Some(b"WEBP"))
}

/// Refuses an image file of `len` bytes over [`MAX_IMAGE_BYTES`] (`document_too_large`).
pub fn check_image_size(name: &str, len: u64) -> Result<(), CommandError> {
    if len > MAX_IMAGE_BYTES as u64 {
        return Err(CommandError::new(
            AppCode::DocumentTooLarge,
            format!(
                "{name}: {} is over the {} MiB limit for images",
                human(len),
                MAX_IMAGE_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok(())
}
const MARKDOWN: [&str; 3] = ["md", "markdown", "mdx"];
const CODE: [&str; 30] = [
    "rs", "py", "js", "mjs", "ts", "tsx", "jsx", "svelte", "c", "h", "cpp", "hpp", "cc", "go",
    "java", "kt", "swift", "rb", "php", "sh", "bash", "toml", "yaml", "yml", "json", "html", "css",
    "sql", "lua", "zig",
];
const REFUSED_EXT: [&str; 16] = [
    "png",
    "jpg",
    "jpeg",
    "gif",
    "webp",
    "zip",
    "gz",
    "tar",
    "exe",
    "bin",
    "so",
    "dll",
    "gguf",
    "safetensors",
    "mp3",
    "mp4",
];

fn extension(name: &str) -> String {
    name.rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default()
}

/// Refuses a file of `len` bytes named `name` when it is over [`MAX_BYTES`]
/// (`document_too_large`): checked before a byte is read or sent anywhere.
pub fn check_size(name: &str, len: u64) -> Result<(), CommandError> {
    if len > MAX_BYTES as u64 {
        return Err(CommandError::new(
            AppCode::DocumentTooLarge,
            format!(
                "{name}: {} is over the {} MiB limit",
                human(len),
                MAX_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok(())
}

/// Accepts `bytes` named `name` as a text document, or says why not, each fault with its own
/// code. This parses PDFs in the calling process: the app calls it only through [`Reader`].
pub fn inspect(name: &str, bytes: &[u8]) -> Result<Document, CommandError> {
    let coded = |code: AppCode, why: String| CommandError::new(code, format!("{name}: {why}"));
    let ext = extension(name);
    check_size(name, bytes.len() as u64)?;
    if bytes.is_empty() {
        return Err(coded(AppCode::DocumentEmpty, "the file is empty".into()));
    }
    if pdf::is_pdf(bytes) {
        let got = pdf::extract(name, bytes)?;
        if got.text.len() > MAX_BYTES {
            return Err(coded(
                AppCode::DocumentTooLarge,
                format!(
                    "the extracted text ({}) is over the {} MiB limit",
                    human(got.text.len() as u64),
                    MAX_BYTES / (1024 * 1024)
                ),
            ));
        }
        return Ok(Document {
            name: name.to_owned(),
            kind: DocumentKind::Pdf,
            bytes: bytes.len(),
            pages: Some(got.pages),
            text: got.text,
            image: None,
        });
    }
    if ext == "pdf" {
        return Err(CommandError::new(
            AppCode::PdfUnreadable,
            format!(
                "{name}: not a PDF (it does not start with {})",
                String::from_utf8_lossy(pdf::MAGIC)
            ),
        ));
    }
    if REFUSED_EXT.contains(&ext.as_str()) {
        return Err(coded(
            AppCode::DocumentBinary,
            format!(".{ext} files are binary, not text"),
        ));
    }
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return Err(coded(
            AppCode::DocumentBinary,
            "binary content (NUL bytes), not text".into(),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        coded(
            AppCode::DocumentNotUtf8,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.valid_up_to()
            ),
        )
    })?;
    let kind = if MARKDOWN.contains(&ext.as_str()) {
        DocumentKind::Markdown
    } else if CODE.contains(&ext.as_str()) {
        DocumentKind::Code
    } else {
        DocumentKind::Text
    };
    Ok(Document {
        name: name.to_owned(),
        kind,
        bytes: bytes.len(),
        pages: None,
        text: text.strip_prefix('\u{feff}').unwrap_or(text).to_owned(),
        image: None,
    })
}

fn human(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_text_markdown_and_code() {
        let d = inspect("notes.md", "# Title\nbody".as_bytes()).unwrap();
        assert_eq!(
            (d.kind, d.bytes, d.text.as_str()),
            (DocumentKind::Markdown, 12, "# Title\nbody")
        );
        assert_eq!(
            inspect("main.RS", b"fn main() {}").unwrap().kind,
            DocumentKind::Code
        );
        assert_eq!(
            inspect("README", b"hello").unwrap().kind,
            DocumentKind::Text
        );
        assert_eq!(
            inspect("bom.txt", "\u{feff}hi".as_bytes()).unwrap().text,
            "hi"
        );
    }

    #[test]
    fn refuses_binary_unreadable_and_oversized_with_a_reason() {
        let e = inspect("blob.dat", &[1, 2, 0, 3]).unwrap_err();
        assert_eq!(e.code, AppCode::DocumentBinary);
        assert!(e.message.contains("NUL"), "{}", e.message);
        let e = inspect("latin1.txt", &[b'c', b'a', 0xE9]).unwrap_err();
        assert_eq!(e.code, AppCode::DocumentNotUtf8);
        assert!(e.message.contains("offset 2"), "{}", e.message);
        let e = inspect("big.txt", &vec![b'a'; MAX_BYTES + 1]).unwrap_err();
        assert_eq!(e.code, AppCode::DocumentTooLarge);
        assert!(e.message.contains("4 MiB limit"), "{}", e.message);
        let e = inspect("photo.png", b"abc").unwrap_err();
        assert_eq!(e.code, AppCode::DocumentBinary);
        assert!(e.message.contains(".png"), "{}", e.message);
        let e = inspect("empty.pdf", b"").unwrap_err();
        assert_eq!(e.code, AppCode::DocumentEmpty);
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    #[test]
    fn a_pdf_is_told_by_its_header_and_gives_its_text() {
        let report = include_bytes!("../../../tests/fixtures/documents/report.pdf");
        // Named like anything: the %PDF- header decides.
        let d = inspect("upload.bin", report).unwrap();
        assert_eq!(
            (d.kind, d.bytes, d.pages),
            (DocumentKind::Pdf, report.len(), Some(2))
        );
        assert!(d
            .text
            .starts_with("KV Lab test document\n\nThe secret word is pineapple."));
        assert!(d
            .text
            .ends_with("Second page: a quantized cache costs fewer bytes."));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(
            (json["kind"].as_str(), json["pages"].as_u64()),
            (Some("pdf"), Some(2))
        );
        assert!(serde_json::to_value(inspect("a.txt", b"x").unwrap()).unwrap()["pages"].is_null());
    }

    #[test]
    fn refuses_broken_and_textless_pdfs_with_their_codes() {
        let e = inspect("fake.pdf", b"just some text").unwrap_err();
        assert_eq!(e.code, AppCode::PdfUnreadable);
        assert!(
            e.message.contains("does not start with %PDF-"),
            "{}",
            e.message
        );
        let scan = include_bytes!("../../../tests/fixtures/documents/scan.pdf");
        assert_eq!(
            inspect("scan.pdf", scan).unwrap_err().code,
            AppCode::PdfNoText
        );
        let report = include_bytes!("../../../tests/fixtures/documents/report.pdf");
        let e = inspect("cut.pdf", &report[..report.len() / 2]).unwrap_err();
        assert_eq!(e.code, AppCode::PdfUnreadable);
        // The size limit applies to PDFs as to any file.
        let mut big = report.to_vec();
        big.resize(MAX_BYTES + 1, b' ');
        assert!(inspect("big.pdf", &big)
            .unwrap_err()
            .message
            .contains("4 MiB limit"));
    }
}
