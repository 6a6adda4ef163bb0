//! Where a checkpoint keeps its chat template: a GGUF file's metadata, or the files beside
//! safetensors weights. Finding it is the checkpoint's job; parsing and rendering it are the
//! chat's.

use std::path::Path;

use crate::chat::{ChatError, TemplateSource};

/// The chat template a checkpoint ships, from its files alone: a GGUF file's
/// `tokenizer.chat_template`, else `chat_template.jinja`, else `chat_template` in
/// `tokenizer_config.json` (a string, or a list of named templates, the `default` one
/// taken). `Ok(None)` for a checkpoint without one.
pub(crate) fn find_template(
    weights: &Path,
    gguf: Option<&candle_core::quantized::gguf_file::Content>,
) -> Result<Option<(String, TemplateSource)>, ChatError> {
    if let Some(content) = gguf {
        return Ok(match content.metadata.get("tokenizer.chat_template") {
            Some(candle_core::quantized::gguf_file::Value::String(s)) => {
                Some((s.clone(), TemplateSource::Gguf))
            }
            _ => None,
        });
    }
    let dir = if weights.is_dir() {
        weights.to_path_buf()
    } else {
        weights.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let jinja = dir.join("chat_template.jinja");
    if let Ok(text) = std::fs::read_to_string(&jinja) {
        return Ok(Some((
            text,
            TemplateSource::Jinja {
                path: display(&jinja),
            },
        )));
    }
    let config = dir.join("tokenizer_config.json");
    let Ok(bytes) = std::fs::read(&config) else {
        return Ok(None);
    };
    let bad = |reason: String| ChatError::BadTemplate {
        origin: display(&config),
        line: None,
        reason,
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let source = TemplateSource::TokenizerConfig {
        path: display(&config),
    };
    Ok(match v.get("chat_template") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some((s.clone(), source)),
        Some(serde_json::Value::Array(named)) => {
            let pick = named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or_else(|| named.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .ok_or_else(|| bad("chat_template holds no template".into()))?;
            Some((pick.to_owned(), source))
        }
        Some(_) => return Err(bad("chat_template is neither text nor a list".into())),
    })
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_found_where_checkpoints_keep_them() {
        let dir = tempfile::tempdir().unwrap();
        let weights = dir.path().join("model.safetensors");
        assert!(find_template(&weights, None).unwrap().is_none());
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .unwrap();
        let (text, source) = find_template(&weights, None).unwrap().unwrap();
        assert_eq!(text, "D");
        assert!(matches!(source, TemplateSource::TokenizerConfig { .. }));
        std::fs::write(dir.path().join("chat_template.jinja"), "J").unwrap();
        assert_eq!(find_template(&weights, None).unwrap().unwrap().0, "J");
    }
}
