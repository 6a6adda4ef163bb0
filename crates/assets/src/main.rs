//! `kvlab-assets fetch|list|path`: the offline test assets without the engine, so that
//! `scripts/setup.sh` and the e2e driver build and run only this small crate (no candle).

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "kvlab-assets",
    version,
    about = "KV Lab's offline test assets: fetch, list, locate"
)]
struct Cli {
    #[command(subcommand)]
    command: kvlab_assets::cli::AssetsCommand,
}

fn main() -> ExitCode {
    match kvlab_assets::cli::run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
