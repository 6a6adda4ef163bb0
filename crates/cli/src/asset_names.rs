//! Offline asset names on the command line (`--model gemma3-270m`, `--text alice`): resolved
//! here to the fetched files, so the engine only ever sees paths and Hub ids.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kvlab_engine::ModelSource;

/// The asset named by `arg` (`NAME` from the catalog, or `asset:NAME`), if it names one.
fn asset_name(arg: &str) -> Option<&str> {
    match arg.strip_prefix("asset:") {
        Some(name) => Some(name),
        None => kvlab_assets::find(arg).map(|_| arg),
    }
}

/// The file `arg` names: an existing path as it is, an asset name as its fetched file (an
/// error saying how to fetch it when it is missing), anything else as a plain path.
fn resolve_in(arg: &str, assets_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(arg);
    if path.exists() {
        return Ok(path);
    }
    match asset_name(arg) {
        Some(name) => kvlab_assets::resolve_in(assets_dir, name)
            .with_context(|| format!("`{arg}` names an offline asset that is not usable")),
        None => Ok(path),
    }
}

fn assets_dir() -> anyhow::Result<PathBuf> {
    Ok(kvlab_assets::assets_dir()?)
}

/// A `--model` value as the engine's source: asset names become their local files; paths and
/// Hub ids are read by [`ModelSource::parse`].
pub fn model_source(arg: &str) -> anyhow::Result<ModelSource> {
    if asset_name(arg).is_none() || Path::new(arg).exists() {
        return Ok(ModelSource::parse(arg));
    }
    Ok(ModelSource::Local {
        path: resolve_in(arg, &assets_dir()?)?,
    })
}

/// A file argument (`--text alice`, `bench decode --model gemma3-270m`): a path, or an asset
/// name resolved to its fetched file. A path that does not exist is an error naming it.
pub fn file(arg: &str) -> anyhow::Result<PathBuf> {
    let path = if asset_name(arg).is_some() && !Path::new(arg).exists() {
        resolve_in(arg, &assets_dir()?)?
    } else {
        PathBuf::from(arg)
    };
    anyhow::ensure!(
        path.exists(),
        "`{arg}` is neither a file nor an offline asset name (see `kvlab assets list`)"
    );
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_names_are_catalog_names_or_prefixed() {
        assert_eq!(asset_name("gemma3-270m"), Some("gemma3-270m"));
        assert_eq!(asset_name("asset:alice"), Some("alice"));
        assert_eq!(asset_name("asset:nope"), Some("nope"));
        assert_eq!(asset_name("google/gemma-3-270m"), None);
        assert_eq!(asset_name("./model.gguf"), None);
    }

    #[test]
    fn an_asset_resolves_to_its_file_or_says_how_to_fetch_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_in("alice", dir.path()).unwrap_err();
        assert!(
            format!("{err:#}").contains("kvlab assets fetch alice"),
            "{err:#}"
        );
        assert!(resolve_in("asset:nope", dir.path()).is_err());
        let file = std::fs::File::create(dir.path().join("alice29.txt")).unwrap();
        file.set_len(152_089).unwrap();
        assert_eq!(
            resolve_in("asset:alice", dir.path()).unwrap(),
            dir.path().join("alice29.txt")
        );
        // A real path wins over an asset name, and other strings stay paths.
        let here = dir.path().join("alice29.txt");
        let here = here.to_str().unwrap();
        assert_eq!(resolve_in(here, dir.path()).unwrap(), PathBuf::from(here));
        assert_eq!(
            resolve_in("some/file.txt", dir.path()).unwrap(),
            PathBuf::from("some/file.txt")
        );
    }

    #[test]
    fn models_that_are_not_assets_go_to_the_engine_parser() {
        assert_eq!(
            model_source("google/gemma-3-270m").unwrap(),
            ModelSource::Hub {
                repo: "google/gemma-3-270m".into(),
                revision: None,
                quant: None
            }
        );
        assert_eq!(
            model_source("/no/such/model.gguf").unwrap(),
            ModelSource::Local {
                path: "/no/such/model.gguf".into()
            }
        );
        assert!(file("/no/such/text.txt").is_err());
    }
}
