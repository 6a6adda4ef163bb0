//! The Hub models the download picker offers: the Gemma 4 variants and the Gemma 3 text
//! models the engine runs. Any other `owner/name` can still be typed in.

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
}

const fn m(repo: &'static str, label: &'static str, family: &'static str) -> HubModel {
    HubModel {
        repo,
        label,
        family,
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
        assert_eq!(models.len(), 6);
        for model in models {
            assert_eq!(
                ModelSource::parse(model.repo),
                ModelSource::Hub {
                    repo: model.repo.into(),
                    revision: None
                },
                "{}",
                model.repo
            );
        }
    }
}
