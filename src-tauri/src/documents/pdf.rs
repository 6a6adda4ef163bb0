//! Text out of an attached PDF: `pdf-extract` reads it page by page, the whitespace is
//! normalized, and PDFs that are corrupt, password-locked or hold no text are refused with a
//! coded `CommandError` (`pdf_unreadable`, `pdf_encrypted`, `pdf_no_text`). The library panics
//! on some malformed files, so every call into it runs behind `catch_unwind`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pdf_extract::{Document as Pdf, OutputError, PlainTextOutput};

use crate::error::{AppCode, CommandError};

/// What every PDF starts with (ISO 32000-1, 7.5.2). Files are told apart by this, not by name.
pub const MAGIC: &[u8] = b"%PDF-";

/// Whether `bytes` is a PDF by its header.
pub fn is_pdf(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The text of a PDF, pages separated by a blank line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    pub text: String,
    pub pages: usize,
}

/// Why the library could not give text back.
enum Failure {
    Locked,
    Corrupt(String),
}

/// Extracts and normalizes the text of the PDF `bytes` named `name`, or says why it cannot.
pub fn extract(name: &str, bytes: &[u8]) -> Result<Extracted, CommandError> {
    let unreadable = |why: String| {
        CommandError::new(
            AppCode::PdfUnreadable,
            format!("{name}: not a readable PDF ({why})"),
        )
    };
    let pages = match catch_unwind(AssertUnwindSafe(|| read_pages(bytes))) {
        Ok(Ok(pages)) => pages,
        Ok(Err(Failure::Locked)) => {
            return Err(CommandError::new(
                AppCode::PdfEncrypted,
                format!(
                "{name}: the PDF is password-protected; remove the password and attach it again"
            ),
            ))
        }
        Ok(Err(Failure::Corrupt(why))) => return Err(unreadable(why)),
        Err(panic) => {
            let why = panic_text(panic.as_ref());
            tracing::warn!(%name, %why, "the PDF reader panicked");
            return Err(unreadable(format!("the PDF reader failed: {why}")));
        }
    };
    let text = normalize(&pages.join("\n\n"));
    if !text.chars().any(char::is_alphanumeric) {
        return Err(CommandError::new(AppCode::PdfNoText,
            format!(
                "{name}: the PDF has no text layer (a scan or images only?), so there is nothing to read"
            ),
        ));
    }
    Ok(Extracted {
        text,
        pages: pages.len(),
    })
}

/// Loads the PDF (trying the empty password a locked-for-editing file opens with) and
/// returns the raw text of each page in order.
fn read_pages(bytes: &[u8]) -> Result<Vec<String>, Failure> {
    let mut doc = Pdf::load_mem(bytes).map_err(from_pdf)?;
    if doc.is_encrypted() {
        doc.decrypt("").map_err(|_| Failure::Locked)?;
    }
    let numbers: Vec<u32> = doc.get_pages().keys().copied().collect();
    if numbers.is_empty() {
        return Err(Failure::Corrupt("it has no pages".into()));
    }
    numbers
        .into_iter()
        .map(|n| {
            let mut page = String::new();
            pdf_extract::output_doc_page(&doc, &mut PlainTextOutput::new(&mut page), n).map_err(
                |e| match e {
                    OutputError::PdfError(e) => from_pdf(e),
                    other => Failure::Corrupt(other.to_string()),
                },
            )?;
            Ok(page)
        })
        .collect()
}

fn from_pdf(e: pdf_extract::Error) -> Failure {
    use pdf_extract::Error as E;
    match e {
        E::Decryption(_) | E::InvalidPassword => Failure::Locked,
        other => Failure::Corrupt(other.to_string()),
    }
}

fn panic_text(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown error".into())
}

/// Layout-driven extraction scatters spaces and blank lines: runs of whitespace inside a line
/// become one space, runs of blank lines one blank line (a paragraph or page break), line ends
/// are `\n`, control characters go, and the text is trimmed.
pub fn normalize(raw: &str) -> String {
    let raw = raw.replace("\r\n", "\n");
    let mut out = String::with_capacity(raw.len());
    let mut blank = false;
    for line in raw.split(['\n', '\r', '\u{c}']) {
        let clean: String = line
            .chars()
            .filter(|c| c.is_whitespace() || !c.is_control())
            .collect();
        let words: Vec<&str> = clean.split_whitespace().collect();
        if words.is_empty() {
            blank = !out.is_empty();
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank { "\n\n" } else { "\n" });
        }
        out.push_str(&words.join(" "));
        blank = false;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &[u8] = include_bytes!("../../../tests/fixtures/documents/report.pdf");
    const SCAN: &[u8] = include_bytes!("../../../tests/fixtures/documents/scan.pdf");
    const LOCKED: &[u8] = include_bytes!("../../../tests/fixtures/documents/locked.pdf");

    #[test]
    fn extracts_the_text_of_every_page() {
        let got = extract("report.pdf", REPORT).unwrap();
        assert_eq!(got.pages, 2);
        assert_eq!(
            got.text,
            "KV Lab test document\n\n\
             The secret word is pineapple. The cache keeps keys and values for every token.\n\n\
             Second page: a quantized cache costs fewer bytes."
        );
    }

    #[test]
    fn truncated_or_garbage_pdfs_are_unreadable_not_a_panic() {
        for bytes in [
            &REPORT[..REPORT.len() / 2],
            &REPORT[..MAGIC.len() + 3],
            b"%PDF-1.7\nthis is not a PDF body at all\n%%EOF\n".as_slice(),
        ] {
            let e = extract("broken.pdf", bytes).unwrap_err();
            assert_eq!(e.code, AppCode::PdfUnreadable, "{}", e.message);
            assert!(
                e.message.starts_with("broken.pdf: not a readable PDF ("),
                "{}",
                e.message
            );
        }
    }

    /// A one-page PDF around the content stream `content`, with a correct xref table.
    fn one_page_pdf(content: &str) -> Vec<u8> {
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R /Resources << >> >>"
                .to_owned(),
            format!(
                "<< /Length {} >>\nstream\n{content}\nendstream",
                content.len()
            ),
        ];
        let mut pdf = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(pdf.len());
            pdf.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
        }
        let xref = pdf.len();
        pdf.extend_from_slice(
            format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
        );
        for o in offsets {
            pdf.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
        }
        pdf.extend_from_slice(
            format!(
                "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
                objects.len() + 1
            )
            .as_bytes(),
        );
        pdf
    }

    #[test]
    fn a_library_panic_becomes_an_unreadable_error() {
        // pdf-extract asserts that `Tm` has six operands: five make it panic.
        let e = extract("odd.pdf", &one_page_pdf("BT 1 0 0 1 0 Tm ET")).unwrap_err();
        assert_eq!(e.code, AppCode::PdfUnreadable, "{}", e.message);
        assert!(e.message.contains("the PDF reader failed"), "{}", e.message);
        // The same file with a well-formed operator reads fine (and holds no text).
        let e = extract("ok.pdf", &one_page_pdf("BT 1 0 0 1 0 0 Tm ET")).unwrap_err();
        assert_eq!(e.code, AppCode::PdfNoText, "{}", e.message);
    }

    #[test]
    fn a_pdf_without_text_is_refused() {
        let e = extract("scan.pdf", SCAN).unwrap_err();
        assert_eq!(e.code, AppCode::PdfNoText);
        assert!(e.message.contains("no text layer"), "{}", e.message);
    }

    #[test]
    fn a_password_protected_pdf_is_refused() {
        let e = extract("locked.pdf", LOCKED).unwrap_err();
        assert_eq!(e.code, AppCode::PdfEncrypted, "{}", e.message);
        assert!(e.message.contains("password"), "{}", e.message);
    }

    #[test]
    fn magic_bytes_decide_what_is_a_pdf() {
        assert!(is_pdf(REPORT));
        assert!(!is_pdf(b"%PD"));
        assert!(!is_pdf(b" %PDF-1.4"));
    }

    #[test]
    fn normalize_collapses_spaces_and_blank_lines() {
        assert_eq!(
            normalize("  a \t b\u{a0}c  \r\n\r\n\n\nd\u{0}e\u{c}f\n \n"),
            "a b c\n\nde\nf"
        );
        assert_eq!(normalize("\n\n  \n"), "");
    }
}
