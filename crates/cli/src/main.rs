//! `kvlab`: the headless command line over KV Lab's engine, for benchmarks and scripts.

mod asset_names;
mod bench;
mod chat_cmd;
mod codec_cmd;
mod fidelity;
mod logits_cmd;
mod model_args;
mod ppl_cmd;
mod serve_cmd;
mod template_cmd;

use clap::{Parser, Subcommand};
use kvlab_engine::host;

#[derive(Parser)]
#[command(
    name = "kvlab",
    version,
    about = "KV Lab: local language models and their KV cache, headless"
)]
struct Cli {
    /// Compute threads: a number, or `desktop` for the app's own count (physical cores − 1,
    /// at least 1). Default: `KVLAB_THREADS`, else the physical cores. With another busy
    /// process on the machine, one fewer than the cores decodes faster: every parallel op
    /// waits for its slowest thread.
    #[arg(long, global = true, value_parser = parse_threads)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the engine version.
    Version,
    /// Offline test assets: fetch, list, locate (the same as the `kvlab-assets` binary).
    Assets(kvlab_assets::cli::AssetsArgs),
    /// TurboQuant codec: distortion (`eval`) and speed (`bench`).
    Codec(codec_cmd::CodecArgs),
    /// Model speed: `bench decode` (prefill then decode tok/s).
    Bench(bench::BenchArgs),
    /// Chat: one user turn, streamed to stdout (stats on stderr).
    Chat(chat_cmd::ChatArgs),
    /// Perplexity of a text (chunked prefill through the KV cache).
    Ppl(ppl_cmd::PplArgs),
    /// Cache fidelity against bits: `kvlab fidelity sweep`.
    Fidelity(fidelity::FidelityArgs),
    /// All-position logits of token ids under a chunk schedule, to .safetensors.
    Logits(logits_cmd::LogitsArgs),
    /// A conversation as the model reads it (its own chat template), ids and stops.
    Template(template_cmd::TemplateArgs),
    /// Serve the model over a local OpenAI-compatible API (with KV Lab's cache fields).
    Serve(serve_cmd::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // First, before any thread or model op: candle sizes its pools once per process.
    let threads = cli
        .threads
        .or_else(host::threads_from_env)
        .unwrap_or_else(host::physical_cores);
    host::set_compute_threads(threads)?;
    match cli.command {
        Command::Version => println!("kvlab {}", env!("CARGO_PKG_VERSION")),
        Command::Assets(args) => kvlab_assets::cli::run(args.command)?,
        Command::Codec(args) => codec_cmd::run(args)?,
        Command::Bench(args) => bench::run(args)?,
        Command::Chat(args) => chat_cmd::run(args)?,
        Command::Ppl(args) => ppl_cmd::run(args)?,
        Command::Fidelity(args) => fidelity::run(args)?,
        Command::Logits(args) => logits_cmd::run(args)?,
        Command::Template(args) => template_cmd::run(args)?,
        Command::Serve(args) => serve_cmd::run(args)?,
    }
    Ok(())
}

/// `--threads`: a count, or `desktop` for [`host::desktop_default`] (what the app uses),
/// so benchmarks compare the CLI with the app at the app's own count.
fn parse_threads(s: &str) -> Result<usize, String> {
    if s == "desktop" {
        return Ok(host::desktop_default());
    }
    s.parse()
        .map_err(|_| format!("`{s}` is neither a thread count nor `desktop`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_take_a_count_or_the_desktop_default() {
        assert_eq!(parse_threads("3"), Ok(3));
        assert_eq!(parse_threads("desktop"), Ok(host::desktop_default()));
        let err = parse_threads("many").unwrap_err();
        assert!(err.contains("`many`"), "{err}");
    }
}
