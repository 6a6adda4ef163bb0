//! The Hub models the download picker offers: the Gemma 4 variants (Google's safetensors,
//! and the GGUF repositories of ggml-org and unsloth that llama.cpp, Ollama and LM Studio
//! users download) and the Gemma 3 text models the engine runs. Any other `owner/name` can
//! still be typed in.

use serde::Serialize;
use ts_rs::TS;

/// One entry of the picker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, TS)]
pub struct HubModel {
    /// The Hub repository id.
    pub repo: &'static str,
    /// What the picker shows.
    pub label: &'static str,
    /// The model family (`gemma4`, `gemma3`).
    pub family: &'static str,
    /// A repository of GGUF files: the picker lists its quantizations to choose one.
    pub gguf: bool,
}

const fn m(repo: &'static str, label: &'static str, family: &'static str) -> HubModel {
    HubModel {
        repo,
        label,
        family,
        gguf: false,
    }
}

const fn g(repo: &'static str, label: &'static str) -> HubModel {
    HubModel {
        repo,
        label,
        family: "gemma4",
        gguf: true,
    }
}

/// The curated list, smallest first within each family.
pub fn hub_models() -> Vec<HubModel> {
    vec![
        m("google/gemma-4-E2B-it", "Gemma 4 E2B (instruct)", "gemma4"),
        m("google/gemma-4-E4B-it", "Gemma 4 E4B (instruct)", "gemma4"),
        m(
            "google/gemma-4-26B-A4B-it",
            "Gemma 4 26B-A4B MoE (instruct)",
            "gemma4",
        ),
        m("google/gemma-4-31B-it", "Gemma 4 31B (instruct)", "gemma4"),
        g(
            "ggml-org/gemma-4-E2B-it-GGUF",
            "Gemma 4 E2B GGUF (ggml-org)",
        ),
        g(
            "ggml-org/gemma-4-E4B-it-GGUF",
            "Gemma 4 E4B GGUF (ggml-org)",
        ),
        g(
            "ggml-org/gemma-4-26B-A4B-it-GGUF",
            "Gemma 4 26B-A4B GGUF (ggml-org)",
        ),
        g(
            "ggml-org/gemma-4-31B-it-GGUF",
            "Gemma 4 31B GGUF (ggml-org)",
        ),
        g("unsloth/gemma-4-E2B-it-GGUF", "Gemma 4 E2B GGUF (unsloth)"),
        g("unsloth/gemma-4-E4B-it-GGUF", "Gemma 4 E4B GGUF (unsloth)"),
        g(
            "unsloth/gemma-4-26B-A4B-it-GGUF",
            "Gemma 4 26B-A4B GGUF (unsloth)",
        ),
        g("unsloth/gemma-4-31B-it-GGUF", "Gemma 4 31B GGUF (unsloth)"),
        m(
            "google/gemma-3-270m-it",
            "Gemma 3 270M (instruct)",
            "gemma3",
        ),
        m("google/gemma-3-1b-it", "Gemma 3 1B (instruct)", "gemma3"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_engine::ModelSource;

    #[test]
    fn every_entry_parses_as_a_hub_repository() {
        let models = hub_models();
        assert_eq!(models.len(), 14);
        for model in models {
            // The GGUF repositories are named so, and only they.
            assert_eq!(model.gguf, model.repo.ends_with("-GGUF"), "{}", model.repo);
            assert_eq!(
                ModelSource::parse(model.repo),
                ModelSource::Hub {
                    repo: model.repo.into(),
                    revision: None,
                    quant: None
                },
                "{}",
                model.repo
            );
        }
    }
}
