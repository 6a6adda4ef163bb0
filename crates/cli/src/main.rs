//! `kvlab`: the headless command line over KV Lab's engine, for benchmarks and scripts.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kvlab", version, about = "KV Lab: local language models and their KV cache, headless")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the engine version.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("kvlab {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
