//! `kvlab template`: a conversation as the model reads it, rendered by the checkpoint's own
//! chat template (or plain text for a base model), from the model's headers and tokenizer
//! alone (no weights are loaded). Prints the prompt exactly; `--json` adds the token ids,
//! the stop set and where the template came from.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::{Message, Role};
use kvlab_engine::lab::preview_prompt;
use kvlab_engine::lab::Checkpoint;
use kvlab_engine::lab::GemmaTokenizer;

use crate::model_args::{print_warnings, ModelArgs};

#[derive(Args, Debug)]
pub struct TemplateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A file holding an OpenAI-style message array (JSON): `[{"role":
    /// "system"|"user"|"assistant", "content": "…", "reasoning_content": "…"}, …]`.
    #[arg(long, value_name = "FILE")]
    messages: PathBuf,
    /// Let the model think first (families with a thinking channel).
    #[arg(long)]
    think: bool,
    /// Print the prompt, its token ids, the stop set and the template's source as JSON.
    #[arg(long)]
    json: bool,
}

/// OpenAI-style messages as the engine's: roles `system`/`developer`, `user`,
/// `assistant`; content as text or as a list of `{"type": "text", "text": …}` parts.
pub fn openai_messages(v: &serde_json::Value) -> anyhow::Result<Vec<Message>> {
    let list = v.as_array().context("the messages are not a JSON array")?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m["role"]
                .as_str()
                .with_context(|| format!("message {i} has no role"))?;
            let role = Role::from_openai(role)
                .with_context(|| format!("message {i}: unknown role `{role}`"))?;
            let content = match &m["content"] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(parts) => parts
                    .iter()
                    .filter(|p| p["type"] == "text")
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                serde_json::Value::Null => String::new(),
                _ => bail!("message {i}: content is neither text nor a list of parts"),
            };
            Ok(Message {
                role,
                content,
                thinking: m["reasoning_content"].as_str().map(str::to_owned),
                tool_calls: Vec::new(),
                tool_call_id: m["tool_call_id"].as_str().map(str::to_owned),
                images: Vec::new(),
            })
        })
        .collect()
}

pub fn run(args: TemplateArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.messages)
        .with_context(|| format!("reading {}", args.messages.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", args.messages.display()))?;
    let messages = openai_messages(&v)?;
    let resolved = args.model.resolve()?;
    let checkpoint = Checkpoint::open(&resolved.weights, &args.model.load_options()?)?;
    let (tokenizer, warnings) =
        GemmaTokenizer::for_checkpoint(&resolved.tokenizer, &checkpoint, &resolved.name)?;
    print_warnings(&warnings);
    // What the engine does with a conversation: the template when there is one, else the
    // conversation as plain text.
    let prompt = Prompt::Conversation {
        messages,
        thinking: args.think,
        tools: Vec::new(),
    }
    .for_model(Some(tokenizer.template().is_some()));
    let preview =
        preview_prompt(&tokenizer, &prompt).map_err(|e| anyhow::anyhow!("[{}] {e}", e.code()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&preview)?);
    } else {
        print!("{}", preview.text);
    }
    Ok(())
}
