//! The UI's TypeScript types, generated from the Rust types the app sends and receives (the
//! engine's events, cards, estimates, costs, markers and errors, and the app's own command
//! shapes), into `ui/src/lib/bindings.ts`. The test fails when that file is stale;
//! `KVLAB_BLESS=1 cargo test -p kvlab bindings` rewrites it.

use std::path::Path;

use kvlab_engine::contract::CompareFidelity;
use kvlab_engine::contract::Constraint;
use kvlab_engine::contract::ImageInfo;
use kvlab_engine::contract::MemoryEstimate;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::SweepPoint;
use kvlab_engine::contract::TokenCost;
use kvlab_engine::contract::WeightsChoice;
use kvlab_engine::contract::{
    Activity, CacheOrigin, ConversationChoice, ConversationId, ConversationInfo, DoneReason,
    ErrorCode, Event, GenStats, LoadPhase, MarkerKind, Tier,
};
use kvlab_engine::contract::{AttentionKind, Family};
use kvlab_engine::contract::{
    ByteCount, ContextCost, DocumentFit, KindBytes, KvBytes, KvPart, LayerBytes, MemorySample,
    SwitchEvent,
};
use kvlab_engine::contract::{
    CacheChoice, CacheOptions, CachePreset, CacheSelection, FormatOption, LabeledSpec, LayerScope,
    PresetFidelity, ScopedSpecs, SideFormat,
};
use kvlab_engine::contract::{FitOption, MemoryFit};
use kvlab_engine::contract::{FitTarget, FittedCache};
use kvlab_engine::contract::{HeadShape, LayerCounts, ModelCard, VisionCard};
use kvlab_engine::contract::{Message, Role, TemplateSource, Tool, ToolCall};
use kvlab_engine::contract::{Prompt, PromptPreview, StopToken};
use kvlab_engine::hub::GgufQuant;
use kvlab_engine::CompareRequest;
use kvlab_engine::GenerateRequest;

use crate::error::{AppCode, Code, CommandError};
use kvlab_engine::contract::WeightFormat;
use ts_rs::{Config, TS};

use crate::api_server::ServerInfo;
use crate::documents::commands::InspectedDocument;
use crate::documents::{Document, DocumentKind, ImageAttachment};
use crate::downloads::{DownloadUpdate, Downloaded, HubModel};
use crate::models::commands::{DefaultModel, SystemInfo};
use crate::sessions::caches::{CacheTransfer, SavedCache};
use crate::sessions::{SessionList, SessionSummary, UnreadableSession};

/// One exported declaration.
fn decl<T: TS>(cfg: &Config) -> (String, String) {
    (T::name(cfg), format!("export {}", T::decl(cfg)))
}

/// The whole file, declarations sorted by name so the output is stable.
pub fn typescript() -> String {
    // JSON numbers: u64 byte counts stay far below 2^53, and serde_json writes them as numbers.
    let cfg = Config::new().with_large_int("number");
    let mut decls = vec![
        decl::<Activity>(&cfg),
        decl::<CacheOrigin>(&cfg),
        decl::<ConversationChoice>(&cfg),
        decl::<ConversationId>(&cfg),
        decl::<ConversationInfo>(&cfg),
        decl::<MarkerKind>(&cfg),
        decl::<Tier>(&cfg),
        decl::<AttentionKind>(&cfg),
        decl::<ByteCount>(&cfg),
        decl::<CacheChoice>(&cfg),
        decl::<CacheOptions>(&cfg),
        decl::<CachePreset>(&cfg),
        decl::<PresetFidelity>(&cfg),
        decl::<CacheSelection>(&cfg),
        decl::<CompareFidelity>(&cfg),
        decl::<CompareRequest>(&cfg),
        decl::<Constraint>(&cfg),
        decl::<Tool>(&cfg),
        decl::<ToolCall>(&cfg),
        decl::<SweepPoint>(&cfg),
        decl::<FitTarget>(&cfg),
        decl::<FittedCache>(&cfg),
        decl::<ContextCost>(&cfg),
        decl::<DefaultModel>(&cfg),
        decl::<Document>(&cfg),
        decl::<ImageAttachment>(&cfg),
        decl::<DocumentFit>(&cfg),
        decl::<DocumentKind>(&cfg),
        decl::<DoneReason>(&cfg),
        decl::<DownloadUpdate>(&cfg),
        decl::<Downloaded>(&cfg),
        decl::<ErrorCode>(&cfg),
        decl::<Event>(&cfg),
        decl::<Family>(&cfg),
        decl::<FitOption>(&cfg),
        decl::<FormatOption>(&cfg),
        decl::<GenStats>(&cfg),
        decl::<GenerateRequest>(&cfg),
        decl::<GgufQuant>(&cfg),
        decl::<HeadShape>(&cfg),
        decl::<LabeledSpec>(&cfg),
        decl::<HubModel>(&cfg),
        decl::<InspectedDocument>(&cfg),
        decl::<CommandError>(&cfg),
        decl::<Code>(&cfg),
        decl::<AppCode>(&cfg),
        decl::<KindBytes>(&cfg),
        decl::<KvBytes>(&cfg),
        decl::<KvPart>(&cfg),
        decl::<LayerBytes>(&cfg),
        decl::<LayerCounts>(&cfg),
        decl::<ServerInfo>(&cfg),
        decl::<LayerScope>(&cfg),
        decl::<LoadPhase>(&cfg),
        decl::<PromptPreview>(&cfg),
        decl::<StopToken>(&cfg),
        decl::<TemplateSource>(&cfg),
        decl::<MemoryEstimate>(&cfg),
        decl::<MemoryFit>(&cfg),
        decl::<MemorySample>(&cfg),
        decl::<Message>(&cfg),
        decl::<ModelCard>(&cfg),
        decl::<VisionCard>(&cfg),
        decl::<ImageInfo>(&cfg),
        decl::<Prompt>(&cfg),
        decl::<Role>(&cfg),
        decl::<SamplingParams>(&cfg),
        decl::<ScopedSpecs>(&cfg),
        decl::<SessionList>(&cfg),
        decl::<SessionSummary>(&cfg),
        decl::<SavedCache>(&cfg),
        decl::<CacheTransfer>(&cfg),
        decl::<SideFormat>(&cfg),
        decl::<SwitchEvent>(&cfg),
        decl::<SystemInfo>(&cfg),
        decl::<TokenCost>(&cfg),
        decl::<UnreadableSession>(&cfg),
        decl::<WeightFormat>(&cfg),
        decl::<WeightsChoice>(&cfg),
    ];
    decls.sort();
    let mut out = String::from(
        "// Generated from the Rust types by src-tauri/src/bindings.rs: do not edit.\n\
         // Regenerate with `KVLAB_BLESS=1 cargo test -p kvlab bindings`.\n",
    );
    for (_, d) in decls {
        out.push('\n');
        out.push_str(&d);
        out.push('\n');
    }
    out.push_str(&facts());
    out
}

/// Facts the UI needs as values, written once in Rust: the app's event names, the weights
/// menu, and the engine's byte formatting and Hub-id rule on sample inputs, which the UI's
/// own `formatBytes` and `isRepoId` must reproduce (format.test.ts, download.test.ts).
fn facts() -> String {
    let json = |v: serde_json::Value| v.to_string();
    let bytes: Vec<(u64, String)> = [
        0u64,
        1,
        1023,
        1024,
        1536,
        10 << 20,
        (12.34 * 1048576.0) as u64,
        130 << 20,
        1023 << 20,
        (1536u64) << 20,
        300 << 30,
        5 << 40,
        2 << 50,
    ]
    .into_iter()
    .map(|b| (b, kvlab_engine::contract::format_bytes(b)))
    .collect();
    let repos: Vec<(&str, bool)> = [
        "google/gemma-4-E2B-it",
        "a/b",
        "google/gemma-3-270m@main",
        " org.x/model_v1.5 ",
        "unsloth/gemma-4-E4B-it-GGUF:Q8_0",
        "unsloth/gemma-4-E4B-it-GGUF:Q4_K_M@main",
        "a/b@v:1",
        "",
        "gemma",
        "a/b/c",
        "/abs/path",
        "./x",
        "a/.hidden",
        "a/b@",
        "a/b:",
        "a/b@c@d",
        "a/b:Q8:x",
        "a b/c",
    ]
    .into_iter()
    .map(|r| (r, crate::downloads::parse_repo(r).is_ok()))
    .collect();
    format!(
        "\n/** The app's event names. */\nexport const APP_EVENTS = {} as const;\n\
         \n/** How a safetensors checkpoint's weights may be held, in menu order. */\n\
         export const WEIGHTS_CHOICES: Array<WeightsChoice> = {};\n\
         \n/** The engine's `format_bytes` on sample sizes. */\n\
         export const FORMAT_BYTES_EXAMPLES: Array<[number, string]> = {};\n\
         \n/** Whether the app takes each string as a Hub id (`source::hub_id`). */\n\
         export const REPO_ID_EXAMPLES: Array<[string, boolean]> = {};\n\
         \n/** The one set of chat defaults (`SamplingParams::chat`, `DEFAULT_MAX_TOKENS`). */\n\
         export const CHAT_DEFAULTS: {{ sampling: SamplingParams; max_tokens: number }} = {};\n\
         \n/** What saved KV caches may take on disk unless the user sets a budget. */\n\
         export const DEFAULT_CACHE_BUDGET_BYTES = {};\n",
        json(serde_json::json!({
            "engineStatus": crate::STATUS_EVENT,
            "memorySample": crate::monitor::MEMORY_EVENT,
            "memoryMarker": crate::monitor::MARKER_EVENT,
        })),
        json(serde_json::json!(kvlab_engine::contract::WEIGHTS_CHOICES)),
        json(serde_json::json!(bytes)),
        json(serde_json::json!(repos)),
        json(serde_json::json!({
            "sampling": kvlab_engine::contract::SamplingParams::chat(),
            "max_tokens": kvlab_engine::contract::DEFAULT_MAX_TOKENS,
        })),
        kvlab_engine::contract::DEFAULT_DISK_BUDGET,
    )
}

#[test]
fn typescript_bindings_are_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/src/lib/bindings.ts");
    let generated = typescript();
    if std::env::var_os("KVLAB_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write bindings.ts");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "{} is stale: run `KVLAB_BLESS=1 cargo test -p kvlab bindings` and commit it",
        path.display()
    );
}

#[test]
fn every_declared_type_is_defined_once() {
    let ts = typescript();
    let names: Vec<&str> = ts
        .lines()
        .filter_map(|l| l.strip_prefix("export type "))
        .filter_map(|l| l.split([' ', '<']).next())
        .collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "{names:?}");
    // Every name used in a declaration is declared (no dangling reference).
    assert!(names.contains(&"ModelCard") && names.contains(&"ErrorCode"));
    assert!(!ts.contains("bigint"), "u64 must map to number");
}
