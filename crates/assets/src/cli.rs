//! `fetch|list|path`: the commands of both `kvlab-assets` and `kvlab assets`, one
//! implementation over this crate's catalog, checks and installation; progress goes to
//! stderr, results to stdout.

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::{
    self as assets, AssetError, AssetState, FetchOutcome, Progress, RegistryFetcher, Verify,
};

/// Partial downloads older than this are left over from killed fetches.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[derive(Args)]
pub struct AssetsArgs {
    #[command(subcommand)]
    pub command: AssetsCommand,
}

#[derive(Subcommand)]
pub enum AssetsCommand {
    /// Download and verify assets (all of them when no name is given); assets already present
    /// and valid are left alone.
    Fetch {
        /// Asset names (see `list`).
        names: Vec<String>,
        /// Re-hash present files fully instead of trusting their verification stamps.
        #[arg(long)]
        verify: bool,
    },
    /// Show each asset, its size and whether it is present and valid.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Re-hash present files fully instead of trusting their verification stamps.
        #[arg(long)]
        verify: bool,
    },
    /// Print the absolute path of an asset (fails if it is unknown or not fetched).
    Path { name: String },
}

/// Byte progress of one asset as an indicatif bar on stderr (plain lines when not a terminal).
struct Bar {
    name: String,
    bar: ProgressBar,
}

impl Progress for Bar {
    fn message(&self, text: &str) {
        if self.bar.is_hidden() {
            eprintln!("{}: {text}", self.name);
        } else {
            self.bar.set_message(text.to_owned());
        }
    }

    fn bytes(&self, done: u64, _total: u64) {
        self.bar.set_position(done);
    }
}

fn verify_mode(full: bool) -> Verify {
    if full {
        Verify::Full
    } else {
        Verify::Quick
    }
}

fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

/// Runs one command; a fetch that fails for some assets still tries the others, then
/// reports them all ([`AssetError::FetchFailed`]).
pub fn run(command: AssetsCommand) -> Result<(), AssetError> {
    match command {
        AssetsCommand::Fetch { names, verify } => fetch(&names, verify_mode(verify)),
        AssetsCommand::List { json, verify } => list(json, verify_mode(verify)),
        AssetsCommand::Path { name } => {
            println!("{}", assets::resolve(&name)?.display());
            Ok(())
        }
    }
}

fn fetch(names: &[String], verify: Verify) -> Result<(), AssetError> {
    let specs = if names.is_empty() {
        assets::catalog()
    } else {
        names
            .iter()
            .map(|n| assets::spec(n))
            .collect::<Result<Vec<_>, _>>()?
    };
    let root = assets::cache_root()?;
    let dir = assets::assets_dir()?;
    // Leftovers of fetches killed a day or more ago; a failed cleanup must not block a fetch.
    for place in [&root, &dir] {
        if let Err(e) = assets::clean_stale(place, STALE_AFTER) {
            eprintln!("warning: cleaning old partial downloads: {e}");
        }
    }
    let fetcher = RegistryFetcher::new(&root)?;
    // The template is a constant: it parses, and a plain bar would do if it ever did not.
    let style = ProgressStyle::with_template(
        "{prefix:>16} [{bar:30}] {bytes:>10}/{total_bytes:<10} {wide_msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let mut failed = Vec::new();
    for spec in &specs {
        let bar = ProgressBar::new(spec.size)
            .with_style(style.clone())
            .with_prefix(spec.name.clone());
        let progress = Bar {
            name: spec.name.clone(),
            bar: bar.clone(),
        };
        let result = assets::install(spec, &dir, &fetcher, &progress, verify);
        bar.finish_and_clear();
        match result {
            Ok(FetchOutcome::AlreadyPresent) => {
                println!("{}: present, nothing to download", spec.name)
            }
            Ok(FetchOutcome::Installed { bytes, previous }) => {
                let why = match previous {
                    AssetState::Invalid(reason) => format!(" (was invalid: {reason})"),
                    _ => String::new(),
                };
                println!(
                    "{}: fetched and verified, {} -> {}{why}",
                    spec.name,
                    human(bytes),
                    dir.join(&spec.file).display()
                );
            }
            Ok(FetchOutcome::Restored { files }) => println!(
                "{}: present; restored {} next to it",
                spec.name,
                files.join(", ")
            ),
            Err(e) => {
                eprintln!("{}: {e}", spec.name);
                failed.push(spec.name.clone());
            }
        }
    }
    if !failed.is_empty() {
        return Err(AssetError::FetchFailed { names: failed });
    }
    Ok(())
}

fn list(json: bool, verify: Verify) -> Result<(), AssetError> {
    let dir = assets::assets_dir()?;
    let rows = assets::status(&assets::catalog(), &dir, verify)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("assets directory: {}", dir.display());
    println!("{:<16} {:<26} {:>10}  STATE", "NAME", "FILE", "SIZE");
    for row in rows {
        let state = match row.state {
            AssetState::Present => "present".to_owned(),
            AssetState::Missing => "missing".to_owned(),
            AssetState::Invalid(why) => format!("invalid: {why}"),
        };
        println!(
            "{:<16} {:<26} {:>10}  {state}",
            row.name,
            row.file,
            human(row.size)
        );
    }
    Ok(())
}
