// Generated from the Rust types by src-tauri/src/bindings.rs: do not edit.
// Regenerate with `KVLAB_BLESS=1 cargo test -p kvlab bindings`.

export type Activity = { "state": "no_model" } | { "state": "loading", 
/**
 * What is loading (path or repository).
 */
source: string, } | { "state": "ready", 
/**
 * Its name.
 */
model: string, } | { "state": "generating", 
/**
 * The model's name.
 */
model: string, } | { "state": "failed", 
/**
 * Why.
 */
message: string, };

export type AppCode = "no_default_model" | "document_refused" | "pdf_unreadable" | "pdf_encrypted" | "pdf_no_text" | "session_not_found" | "bad_session" | "document_empty" | "document_binary" | "document_not_utf8" | "document_too_large" | "document_timeout" | "document_out_of_memory" | "document_crashed" | "session_corrupt";

export type AttentionKind = "sliding" | "full";

export type ByteCount = { 
/**
 * Bytes that hold live tokens.
 */
used: number, 
/**
 * Bytes reserved, live or not.
 */
allocated: number, };

export type CacheChoice = { 
/**
 * How keys are stored.
 */
keys: SideFormat, 
/**
 * How values are stored.
 */
values: SideFormat, 
/**
 * Which cache-owning layers get these formats.
 */
scope: LayerScope, 
/**
 * Whether compressed sides keep the first token as f16 too (`+sink`, docs/cache-options.md).
 */
sink: boolean, };

export type CacheOptions = { 
/**
 * The presets, in menu order.
 */
presets: Array<CachePreset>, 
/**
 * Formats a side may take (for keys and values set apart): every row of the registry.
 */
formats: Array<FormatOption>, 
/**
 * The cache a model loads with unless the user picks another.
 */
default_spec: string, 
/**
 * The TurboQuant cache suggested for a first try: the switch demo's target and the
 * comparison's test pane.
 */
suggested_spec: string, 
/**
 * The comparison's menu: every preset on all layers, then the suggested cache on the
 * full-attention layers only.
 */
compare: Array<LabeledSpec>, 
/**
 * Where the presets' measured figures come from.
 */
measured_on: string, };

export type CacheOrigin = "new" | "held" | "demoted" | "restored" | "dropped" | "reread";

export type CachePreset = { 
/**
 * A short stable name (`f16`, `k4v3+qw`): its SPEC on all layers without the scope.
 */
id: string, 
/**
 * Button label: the format for dense caches (`FP16`), the measured bits per coordinate
 * for TurboQuant ones (`TQ 3.6`).
 */
label: string, 
/**
 * Keys' format.
 */
keys: SideFormat, 
/**
 * Values' format.
 */
values: SideFormat, 
/**
 * Whether it keeps the first token as f16 too ([`CacheChoice::sink`]).
 */
sink: boolean, 
/**
 * Its canonical SPEC at each scope, to compare with the current policy.
 */
specs: ScopedSpecs, 
/**
 * What it costs and loses on all layers, as measured ([`MEASURED_ON`]); `None` for the
 * dense presets (FP16 is the reference).
 */
measured: PresetFidelity | null, 
/**
 * One of llama.cpp's types (`-ctk`/`-ctv`), which a menu shows apart.
 */
llama_cpp: boolean, };

export type CacheSelection = string | CacheChoice;

export type CacheTransfer = { 
/**
 * The session.
 */
id: string, cache: SavedCache, 
/**
 * Seconds the engine took.
 */
secs: number, 
/**
 * Sessions whose saved caches were dropped to keep within the budget.
 */
dropped: Array<string>, };

export type Code = ErrorCode | AppCode;

export type CommandError = { 
/**
 * Machine-readable code.
 */
code: Code, 
/**
 * Human-readable message.
 */
message: string, };

export type CompareFidelity = { 
/**
 * Mean KL(reference ‖ test) per position, nats.
 */
mean_kld: number, 
/**
 * Largest per-position KL.
 */
max_kld: number, 
/**
 * Fraction of positions whose top token agrees.
 */
top1_agreement: number, 
/**
 * Positions scored.
 */
tokens_scored: number, 
/**
 * Perplexity of the reference's tokens under the test cache.
 */
ppl: number, 
/**
 * Perplexity under the reference cache.
 */
ppl_reference: number, 
/**
 * KV bytes each pane's cache held at its end.
 */
kv_bytes: [number, number], };

export type CompareRequest = { 
/**
 * What both panes continue from.
 */
prompt: Prompt, 
/**
 * Sampling settings, the same for both (greedy makes the panes comparable).
 */
sampling: SamplingParams, 
/**
 * Most tokens each pane generates (the stop token included).
 */
max_tokens: number, 
/**
 * The reference cache (pane 0) and the tested one (pane 1).
 */
caches: [CacheSelection, CacheSelection], 
/**
 * Caches to sweep after the comparison: each scored against the reference on the
 * reference's tokens, as `sweep_point` events (the compare view's KLD-against-bits chart).
 */
sweep: Array<CacheSelection>, 
/**
 * What both answers are held to (a JSON schema: does this cache break my JSON?).
 */
constraint?: Constraint, 
/**
 * A cache to fit to a budget after the sweep, probed and then scored on the
 * reference's tokens (a `fitted` event, then its `sweep_point`).
 */
fit?: FitTarget, };

export type Constraint = { "type": "json_object" } | { "type": "json_schema", 
/**
 * The schema (draft 2020-12, as llguidance reads it).
 */
schema: unknown, } | { "type": "tool_call", name?: string, parallel: boolean, };

export type ContextCost = { 
/**
 * The preset's label.
 */
label: string, 
/**
 * Its canonical SPEC on all layers.
 */
spec: string, 
/**
 * The bytes.
 */
bytes: number, };

export type ConversationChoice = { "by": "id", 
/**
 * Its name.
 */
id: ConversationId, } | { "by": "continuing", 
/**
 * The namespace (`api:`).
 */
prefix: string, };

export type ConversationId = string;

export type ConversationInfo = { 
/**
 * Its name.
 */
id: ConversationId, 
/**
 * Where its cache is.
 */
tier: Tier, 
/**
 * Tokens its cache holds (or held, on disk).
 */
tokens: number, 
/**
 * Its cache's policy, as its canonical SPEC.
 */
spec: string, 
/**
 * KV bytes it holds in memory.
 */
bytes: number, 
/**
 * KV bytes its cache has allocated in memory (what the pool's budget counts: rows held
 * and a bounded spare).
 */
allocated: number, 
/**
 * Its TurboQuant layers still hold their first tokens as f16, waiting for the model's
 * calibration rows (`ModelCard::calibration_rows`) before they code them.
 */
calibrating: boolean, 
/**
 * Bytes of its cache file (0 when none).
 */
disk_bytes: number, 
/**
 * A request is running in it (it is never demoted or spilled then).
 */
busy: boolean, 
/**
 * When it last ran, in milliseconds since the Unix epoch.
 */
last_used_ms: number, 
/**
 * Each layer's format, tokens and bytes, for a cache held in memory whose layers have
 * formats of their own (a per-layer SPEC, a fitted cache); empty otherwise, where the
 * SPEC says it all.
 */
layers: Array<LayerBytes>, 
/**
 * Tokens of it that are images' soft tokens (in memory; 0 on disk or without images).
 */
image_tokens?: number, };

export type DefaultModel = { path: string, name: string, };

export type Document = { name: string, kind: DocumentKind, bytes: number, 
/**
 * Page count, for PDFs.
 */
pages?: number, text: string, 
/**
 * An image's id (messages name it by it), sizes and thumbnail.
 */
image?: ImageAttachment, };

export type DocumentFit = { 
/**
 * The document's tokens.
 */
tokens: number, 
/**
 * Extra KV bytes it adds to the context, under each preset.
 */
costs: Array<ContextCost>, 
/**
 * Context tokens after the documents up to this one and room for the answer.
 */
context_after: number, 
/**
 * Whether that still fits the model's context.
 */
fits: boolean, };

export type DocumentKind = "text" | "markdown" | "code" | "pdf" | "image";

export type DoneReason = "stop" | "length" | "cancelled";

export type DownloadUpdate = { repo: string, 
/**
 * The file being fetched.
 */
file: string, file_done: number, file_total: number, 
/**
 * Bytes on disk over all files, including those kept from an earlier run.
 */
done: number, total: number, 
/**
 * Over the last few seconds; `None` until measurable.
 */
bytes_per_sec: number | null, 
/**
 * Seconds left at that speed.
 */
eta_secs: number | null, };

export type Downloaded = { repo: string, 
/**
 * The snapshot directory, or the GGUF file of the quant chosen.
 */
path: string, };

export type ErrorCode = "model_not_found" | "bad_model_file" | "tokenizer_not_found" | "bad_tokenizer" | "no_model" | "context_overflow" | "busy" | "cancelled" | "invalid_request" | "network" | "hub_auth" | "hub_rate_limited" | "hub_unavailable" | "download_incomplete" | "download_corrupt" | "disk_full" | "out_of_memory" | "non_finite_logits" | "engine_stopped" | "unsupported_model" | "io" | "internal" | "bad_chat_template" | "queue_full" | "cache_corrupt" | "cache_mismatch" | "bad_image";

export type Event = { "type": "loading", 
/**
 * What is happening now.
 */
phase: LoadPhase, 
/**
 * Bytes done so far in this phase (downloads), when known.
 */
done?: number | null, 
/**
 * Bytes in total for this phase, when known.
 */
total?: number | null, } | { "type": "loaded", 
/**
 * What was loaded.
 */
card: ModelCard, } | { "type": "token", 
/**
 * Text to append (never ends inside a character).
 */
text: string, } | { "type": "thinking", 
/**
 * Text to append.
 */
text: string, } | { "type": "tool_call", 
/**
 * Its place among this answer's calls, from 0.
 */
index: number, 
/**
 * The id a tool's answer names.
 */
id: string, 
/**
 * The function called.
 */
name: string, 
/**
 * Its arguments, a JSON object as text.
 */
arguments: string, } | { "type": "stats" } & GenStats | { "type": "done", 
/**
 * Why it ended.
 */
reason: DoneReason, 
/**
 * Ids of every generated token, the stop token included.
 */
token_ids: Array<number>, } | { "type": "error", 
/**
 * Machine-readable code.
 */
code: ErrorCode, 
/**
 * Human-readable message.
 */
message: string, } | { "type": "pane", 
/**
 * Which pane.
 */
pane: number, 
/**
 * Its event.
 */
event: Event, } | { "type": "sweep_point", 
/**
 * Its figures.
 */
point: SweepPoint, } | { "type": "fitted", 
/**
 * What was chosen.
 */
fitted: FittedCache, } | { "type": "scoring", 
/**
 * Token steps run.
 */
done: number, 
/**
 * Token steps in all.
 */
total: number, } | { "type": "finished", 
/**
 * The scores.
 */
fidelity: CompareFidelity | null, };

export type Family = "gemma3" | "gemma4";

export type FitOption = { 
/**
 * Its cache, as a canonical SPEC.
 */
spec: string, 
/**
 * Bytes it would need.
 */
needed_bytes: number, };

export type FitTarget = { 
/**
 * Bytes the whole cache may hold at `ctx` tokens.
 */
bytes: number, 
/**
 * Tokens the budget is counted at (sliding layers hold their window).
 */
ctx: number, };

export type FittedCache = { 
/**
 * Its canonical SPEC, layers of their own included (`k4v3+qw+sink@all,5=k5v4+qw+sink`).
 */
spec: string, 
/**
 * Bits per coordinate it holds at the target's context.
 */
bits_per_coordinate: number, 
/**
 * Bytes it holds at the target's context.
 */
bytes: number, 
/**
 * The context of the budget.
 */
ctx: number, 
/**
 * The mean KLD its sides' probes predict (the sweep point then measures it).
 */
predicted_kld: number, };

export type FormatOption = { 
/**
 * The format.
 */
format: SideFormat, 
/**
 * Its label.
 */
label: string, 
/**
 * One of llama.cpp's types.
 */
llama_cpp: boolean, 
/**
 * Dense floats: holds every token as it came (a cache with a side that is not dense may
 * keep its first token as f16, `sink`).
 */
dense: boolean, };

export type GenStats = { 
/**
 * Tokens in the rendered prompt.
 */
prompt_tokens: number, 
/**
 * Prompt tokens found already in the cache (not recomputed).
 */
reused_tokens: number, 
/**
 * Prompt tokens run through the model in this request.
 */
prefill_tokens: number, 
/**
 * Tokens generated (the stop token included).
 */
generated_tokens: number, 
/**
 * Seconds from the request to the first generated token.
 */
time_to_first_token_s: number, 
/**
 * Prefill throughput (tokens per second; 0 when nothing was prefilled).
 */
prefill_tok_per_s: number, 
/**
 * Decode throughput (tokens per second; 0 with fewer than two tokens).
 */
decode_tok_per_s: number, 
/**
 * Tokens the cache now holds (position of the next token).
 */
context_tokens: number, 
/**
 * The model's maximum context.
 */
max_context: number, 
/**
 * Bytes the KV cache holds for live tokens.
 */
kv_bytes: number, 
/**
 * Bytes the KV cache has reserved.
 */
kv_bytes_allocated: number, 
/**
 * Its TurboQuant layers still hold their first tokens as f16, waiting for the model's
 * calibration rows (`kv_bytes` are then f16's).
 */
kv_calibrating: boolean, 
/**
 * The cache it ran with at its end, as its canonical SPEC.
 */
cache_spec: string, 
/**
 * The conversation it ran in.
 */
conversation?: ConversationId, 
/**
 * Where its cache came from: held, demoted, restored from disk, or read again.
 */
cache_origin: CacheOrigin, };

export type GenerateRequest = { 
/**
 * What to continue from.
 */
prompt: Prompt, 
/**
 * Sampling settings (temperature 0 = greedy).
 */
sampling: SamplingParams, 
/**
 * Most tokens to generate (the stop token included).
 */
max_tokens: number, 
/**
 * Prefill chunk size.
 */
prefill_chunk?: number, 
/**
 * The cache this request runs with: the conversation's cache is re-encoded to it first
 * (a switch, checked against memory) when it holds another. `None`: as it is (a new
 * conversation gets the engine's default for new ones).
 */
cache?: CacheSelection, 
/**
 * Strings that end the answer where its text shows one (it is never sent): at most
 * [`stop::MAX_STOPS`] of at most [`stop::MAX_STOP_BYTES`] bytes.
 */
stop?: Array<string>, 
/**
 * The conversation it runs in (`None`: the default one).
 */
conversation?: ConversationChoice, 
/**
 * Tokens of context the turn may reach, prompt and answer together, when less than the
 * model's (a server's `--ctx`): a longer prompt is refused before any work, and the
 * answer ends (`length`) where the context does. `None`: the model's whole context.
 */
context?: number, 
/**
 * What the answer is held to (JSON, a schema, a tool call), by constrained decoding.
 */
constraint?: Constraint, };

export type GgufQuant = { 
/**
 * The quant as named in the file (`Q4_K_M`, `Q8_0`, `UD-Q4_K_XL`, `BF16`), or the file
 * stem when the name carries none.
 */
name: string, 
/**
 * Repository paths of its file(s), shards in order.
 */
files: Array<string>, 
/**
 * Bytes of all its files, from the Hub listing.
 */
bytes: number, };

export type HeadShape = { 
/**
 * Which layers.
 */
kind: AttentionKind, 
/**
 * Query heads.
 */
n_heads: number, 
/**
 * Key/value heads.
 */
n_kv_heads: number, 
/**
 * Dimensions per head.
 */
head_dim: number, };

export type HubModel = { 
/**
 * The Hub repository id.
 */
repo: string, 
/**
 * What the picker shows.
 */
label: string, 
/**
 * The model family (`gemma4`, `gemma3`).
 */
family: string, 
/**
 * A repository of GGUF files: the picker lists its quantizations to choose one.
 */
gguf: boolean, };

export type ImageAttachment = { 
/**
 * The engine's id of it.
 */
id: string, width: number, height: number, 
/**
 * Its size as the model reads it.
 */
resized: [number, number], 
/**
 * A small PNG of it, as a data: URL.
 */
thumbnail: string, };

export type ImageInfo = { 
/**
 * The id messages name it by.
 */
id: string, 
/**
 * Its width and height as decoded (after its EXIF turn).
 */
width: number, height: number, 
/**
 * Its width and height as the tower reads it.
 */
resized: [number, number], 
/**
 * Its soft tokens.
 */
soft_tokens: number, 
/**
 * Prompt tokens it takes: its soft tokens and its two markers.
 */
tokens: number, };

export type InspectedDocument = { tokens: number, name: string, kind: DocumentKind, bytes: number, 
/**
 * Page count, for PDFs.
 */
pages?: number, text: string, 
/**
 * An image's id (messages name it by it), sizes and thumbnail.
 */
image?: ImageAttachment, };

export type KindBytes = { 
/**
 * Sliding-window layers.
 */
sliding: ByteCount, 
/**
 * Full-attention layers.
 */
full: ByteCount, };

export type KvBytes = { 
/**
 * Per attention kind.
 */
by_kind: KindBytes, 
/**
 * Per precision, keyed by its SPEC form (`f16`, `tq4`, …).
 */
by_precision: { [key in string]: ByteCount }, 
/**
 * Per attention kind and precision together, in layer order of first appearance (the
 * memory timeline's stacked series).
 */
parts: Array<KvPart>, 
/**
 * Every cache-owning layer (KV-sharing consumers own nothing and are left out).
 */
layers: Array<LayerBytes>, 
/**
 * Bytes holding live tokens, all layers.
 */
total_used: number, 
/**
 * Bytes reserved, all layers.
 */
total_allocated: number, };

export type KvPart = { 
/**
 * Sliding or full.
 */
kind: AttentionKind, 
/**
 * Precision in SPEC form.
 */
precision: string, 
/**
 * Their bytes.
 */
bytes: ByteCount, };

export type LabeledSpec = { 
/**
 * Canonical SPEC.
 */
spec: string, 
/**
 * What the menu shows.
 */
label: string, };

export type LayerBytes = { 
/**
 * Layer index.
 */
layer: number, 
/**
 * Sliding or full.
 */
kind: AttentionKind, 
/**
 * Precision in SPEC form (`f16`, `tq4`, `k4v3`).
 */
precision: string, 
/**
 * Tokens held.
 */
tokens: number, 
/**
 * Bytes.
 */
bytes: ByteCount, };

export type LayerCounts = { 
/**
 * Sliding-window layers that own a cache.
 */
sliding: number, 
/**
 * Full-attention layers that own a cache.
 */
full: number, 
/**
 * Layers that read another layer's cache (Gemma 4 KV sharing).
 */
shared: number, };

export type LayerScope = "full" | "sliding" | "all";

export type LoadPhase = "resolving" | "downloading" | "weights" | "tokenizer";

export type MarkerKind = "switch" | "demote" | "spill" | "restore" | "drop" | "reread";

export type MemoryEstimate = { 
/**
 * The model's card.
 */
card: ModelCard, 
/**
 * Tokens in the context.
 */
context: number, 
/**
 * The cache, as its canonical SPEC.
 */
spec: string, 
/**
 * Weight bytes (the card's).
 */
weights_bytes: number, 
/**
 * KV bytes of that context, the rewind margin included.
 */
kv_bytes: number, 
/**
 * Their sum.
 */
total_bytes: number, 
/**
 * Whether that fits the memory available now, and what would if it does not.
 */
fit: MemoryFit, };

export type MemoryFit = { 
/**
 * Bytes the request needs beyond what is held now: weights (for a load) plus KV.
 */
needed_bytes: number, 
/**
 * Of which weights (0 when growing a context).
 */
weights_bytes: number, 
/**
 * Of which KV cache.
 */
kv_bytes: number, 
/**
 * The context asked for, in tokens.
 */
context: number, 
/**
 * The cache asked for, as a canonical SPEC.
 */
spec: string, 
/**
 * Memory available now.
 */
available_bytes: number, 
/**
 * Of which kept free.
 */
margin_bytes: number, 
/**
 * `needed ≤ available − margin`.
 */
fits: boolean, 
/**
 * The TurboQuant cache with the most bits that fits the same context, when the asked
 * cache does not fit and one does.
 */
turboquant: FitOption | null, 
/**
 * The longest context that fits with the asked cache, when the asked one does not fit
 * (absent when not even the weights fit).
 */
max_context: number | null, };

export type MemorySample = { 
/**
 * When it was taken: milliseconds since the Unix epoch (the app), or since the
 * timeline started (benchmarks).
 */
t_ms: number, 
/**
 * Tokens processed so far (the next token's position).
 */
tokens_in_context: number, 
/**
 * Exact KV bytes.
 */
kv: KvBytes, 
/**
 * Bytes of the model's weights as held.
 */
weights_bytes: number, 
/**
 * Process resident set (0 when the platform does not report it).
 */
rss_bytes: number, 
/**
 * The cache's policy at that moment, as its canonical SPEC (so a figure and its label
 * always come from the same instant).
 */
cache_spec: string, 
/**
 * Whether the cache's TurboQuant layers still hold their first tokens as f16, waiting
 * for the model's calibration rows ([`KvCache::calibrating`]).
 */
calibrating: boolean, 
/**
 * Every conversation's cache: its tier and bytes, in memory and on disk (the timeline's
 * stack by conversation and tier).
 */
conversations: Array<ConversationInfo>, };

export type Message = { role: Role, content: string, thinking?: string | null, 
/**
 * The calls a model turn made.
 */
tool_calls?: Array<ToolCall>, 
/**
 * The call a tool turn answers.
 */
tool_call_id?: string, 
/**
 * The images a user turn shows, by the ids the engine gave them when they were added,
 * in order before its text (the template places each).
 */
images?: Array<string>, };

export type ModelCard = { 
/**
 * Display name (file or repository name).
 */
name: string, 
/**
 * The weights' path (file or folder).
 */
path: string, 
/**
 * Gemma 3 or Gemma 4.
 */
architecture: Family, 
/**
 * The family as people write it (`Gemma 4`).
 */
family_name: string, 
/**
 * GGUF or safetensors.
 */
format: WeightFormat, 
/**
 * Parameters of the language model, counted from the weight headers.
 */
params: number, 
/**
 * Decoder layers.
 */
layers: number, 
/**
 * Layers by attention kind.
 */
layer_counts: LayerCounts, 
/**
 * Residual stream width.
 */
hidden_size: number, 
/**
 * Vocabulary size.
 */
vocab_size: number, 
/**
 * Maximum context in tokens.
 */
max_context: number, 
/**
 * Tokens a TurboQuant cache that centers or weighs its keys (every menu preset) holds
 * as f16 before it calibrates on all of them and codes them (`kv::calibration_rows`).
 */
calibration_rows: number, 
/**
 * Sliding window (0 without sliding layers).
 */
sliding_window: number, 
/**
 * Head shapes, one entry per distinct shape, sliding layers first.
 */
heads: Array<HeadShape>, 
/**
 * Bytes the weights take in memory as loaded: quantized matrices at their block size,
 * the rest in `weights_dtype`. Estimated from the headers before loading, measured
 * after (see `weights_measured`).
 */
weights_bytes: number, 
/**
 * How the weights are held: for a safetensors checkpoint the weights choice (`q4_k`,
 * `q8_0`, `f16`, `bf16`, `f32`); for a GGUF file its own type as llama.cpp names it and
 * the block types of its matrices, most used first (`Q4_K_M: q5_0, q8_0, q4_k, q6_k`),
 * which it is held in as stored.
 */
weights_dtype: string, 
/**
 * True once `weights_bytes` is what the loaded model holds.
 */
weights_measured: boolean, 
/**
 * Whether the model has a thinking mode.
 */
supports_thinking: boolean, 
/**
 * Whether the checkpoint ships a chat template (false: a base model, best prompted
 * with plain text; `None`: unknown).
 */
has_chat_template: boolean | null, 
/**
 * What one token of KV cache costs under each preset.
 */
token_costs: Array<TokenCost>, 
/**
 * Config fields that were ignored, defaulted or assumed.
 */
warnings: Array<string>, 
/**
 * How the model reads images (`None`: it reads none).
 */
vision?: VisionCard, };

export type PresetFidelity = { 
/**
 * Bits per coordinate as held (codes, norms, offsets and weights).
 */
bits_per_coordinate: number, 
/**
 * Mean KL divergence against the FP16 cache, nats.
 */
mean_kld: number, 
/**
 * Top-1 agreement with the FP16 cache.
 */
top1_agreement: number, };

export type Prompt = { "type": "chat", 
/**
 * System prompt (Gemma 3 prefixes it to the first user message).
 */
system?: string | null, 
/**
 * The turns so far; the last is normally the user's.
 */
messages: Array<Message>, 
/**
 * Let the model think first (Gemma 4 only).
 */
thinking: boolean, 
/**
 * Functions the model may call, rendered by the template (a model whose template
 * has no tools refuses them).
 */
tools?: Array<Tool>, } | { "type": "conversation", 
/**
 * The turns so far (a system turn may lead).
 */
messages: Array<Message>, 
/**
 * Let the model think first (Gemma 4 only; ignored for plain text).
 */
thinking: boolean, 
/**
 * Functions the model may call (see [`Prompt::Chat`]; refused for plain text).
 */
tools?: Array<Tool>, } | { "type": "text", 
/**
 * The text.
 */
text: string, } | { "type": "ids", 
/**
 * The ids.
 */
ids: Array<number>, };

export type PromptPreview = { 
/**
 * The text the ids encode, control tokens spelled out.
 */
text: string, 
/**
 * The ids the model reads.
 */
ids: Array<number>, 
/**
 * Ids that end the answer, with their pieces.
 */
stops: Array<StopToken>, 
/**
 * The chat template that rendered it (`None`: plain text, no template).
 */
template: TemplateSource | null, };

export type Role = "system" | "user" | "model" | "tool";

export type SamplingParams = { temperature: number, 
/**
 * Keep only the `top_k` most likely tokens (`None`: no limit).
 */
top_k: number | null, 
/**
 * Keep the smallest set of most likely tokens whose probability reaches `top_p`
 * (`None`: no limit).
 */
top_p: number | null, seed: number, };

export type SavedCache = { 
/**
 * The file's size.
 */
bytes: number, 
/**
 * Tokens it holds.
 */
tokens: number, 
/**
 * Its precision, as a cache SPEC.
 */
spec: string, 
/**
 * When it was written (ms since the Unix epoch; 0 when the file system does not say).
 */
saved_ms: number, };

export type ScopedSpecs = { 
/**
 * Every cache-owning layer.
 */
all: string, 
/**
 * Full-attention layers only.
 */
full: string, 
/**
 * Sliding-window layers only.
 */
sliding: string, };

export type ServerInfo = { 
/**
 * The base URL clients use (`http://127.0.0.1:8080/v1`) while it runs.
 */
url: string | null, 
/**
 * The port it listens on, or the one it would start on.
 */
port: number, };

export type SessionList = { sessions: Array<SessionSummary>, unreadable: Array<UnreadableSession>, };

export type SessionSummary = { id: string, title: string, updated_ms: number, 
/**
 * Its saved KV cache, when it has one.
 */
cache?: SavedCache, };

export type SideFormat = "f32" | "f16" | "bf16" | "8" | "6" | "5" | "4.5" | "4" | "3.5" | "3" | "2.5" | "2" | "q8_0" | "q5_1" | "q5_0" | "q4_1" | "q4_0" | "iq4_nl";

export type StopToken = { 
/**
 * Its id.
 */
id: number, 
/**
 * Its piece (`<turn|>`).
 */
piece: string, };

export type SweepPoint = { 
/**
 * The cache (its canonical SPEC, or a label for a per-layer policy).
 */
kv: string, 
/**
 * Bits per coordinate as held at the scored context (32 × bytes / f32 bytes).
 */
bits_per_coordinate: number, 
/**
 * Mean KL(reference ‖ cache) per scored position, nats.
 */
mean_kld: number, 
/**
 * The 99th percentile of the per-position KL divergence.
 */
p99_kld: number, 
/**
 * Fraction of positions whose top token agrees with the reference's.
 */
top1_agreement: number, 
/**
 * Perplexity of the text under this cache.
 */
ppl: number, 
/**
 * Perplexity under the reference cache.
 */
ppl_reference: number, 
/**
 * Positions scored.
 */
tokens_scored: number, };

export type SwitchEvent = { 
/**
 * What happened (a switch by its owner unless the pool acted).
 */
kind: MarkerKind, 
/**
 * The conversation whose cache it was.
 */
conversation?: ConversationId, 
/**
 * When it happened, in milliseconds since the Unix epoch.
 */
t_ms: number, 
/**
 * The policy before, as its canonical SPEC ([`PrecisionPolicy::spec_string`]).
 */
from: string, 
/**
 * After.
 */
to: string, 
/**
 * Tokens converted (the context length at the switch).
 */
tokens: number, 
/**
 * KV bytes before the switch.
 */
kv_before: ByteCount, 
/**
 * KV bytes after the switch.
 */
kv_after: ByteCount, 
/**
 * Process resident bytes before (0 when unknown).
 */
rss_before: number, 
/**
 * Process resident bytes after (0 when unknown).
 */
rss_after: number, 
/**
 * Wall time of the conversion.
 */
duration_ms: number, };

export type SystemInfo = { total_memory_bytes: number, cpu_cores: number, os: string, engine_version: string, data_dir: string, 
/**
 * The largest document accepted: the web view sends a larger file's size, not its bytes.
 */
max_document_bytes: number, 
/**
 * The largest image accepted, likewise.
 */
max_image_bytes: number, };

export type TemplateSource = { "kind": "gguf" } | { "kind": "jinja", 
/**
 * The file.
 */
path: string, } | { "kind": "tokenizer_config", 
/**
 * The file.
 */
path: string, } | { "kind": "builtin", 
/**
 * Whose.
 */
family: Family, 
/**
 * The family as people write it (`Gemma 4`).
 */
family_name: string, } | { "kind": "custom" };

export type Tier = "held" | "demoted" | "on_disk" | "dropped";

export type TokenCost = { 
/**
 * The preset's label (`TQ 3.5`).
 */
label: string, 
/**
 * Its canonical SPEC on all layers.
 */
spec: string, 
/**
 * Bytes per token over the full-attention layers (these grow with every token).
 */
full_bytes_per_token: number, 
/**
 * Bytes per token over the sliding layers (these stop growing at their window).
 */
sliding_bytes_per_token: number, };

export type Tool = { 
/**
 * Its name (`get_weather`): letters, digits, `_`, `-` and `.`, at most [`MAX_NAME`]
 * bytes.
 */
name: string, 
/**
 * What it does, for the model.
 */
description?: string, 
/**
 * Its arguments as a JSON schema (an object schema).
 */
parameters?: unknown, };

export type ToolCall = { 
/**
 * The id the tool's answer names (`tool_call_id`).
 */
id: string, 
/**
 * The function called.
 */
name: string, 
/**
 * Its arguments: a JSON object.
 */
arguments: unknown, };

export type UnreadableSession = { 
/**
 * The file's name in the sessions folder.
 */
file: string, 
/**
 * The name it was set aside under (same folder), when it was corrupt; `None` when it
 * could not be read at all and was left where it is.
 */
set_aside_as?: string, 
/**
 * `session_corrupt`, or `io` for a file that could not be read.
 */
code: Code, message: string, };

export type VisionCard = { 
/**
 * Where the tower came from (the checkpoint, or the mmproj file's path).
 */
source: string, 
/**
 * Bytes of the tower's weights as held.
 */
weights_bytes: number, 
/**
 * Soft tokens an image takes at most (the processor's budget).
 */
max_soft_tokens: number, };

export type WeightFormat = "gguf" | "safetensors";

export type WeightsChoice = "q4_k" | "q8_0" | "f16" | "bf16" | "f32";

/** The app's event names. */
export const APP_EVENTS = {"engineStatus":"engine-status","memorySample":"memory-sample","memoryMarker":"memory-marker"} as const;

/** How a safetensors checkpoint's weights may be held, in menu order. */
export const WEIGHTS_CHOICES: Array<WeightsChoice> = ["q4_k","q8_0","f16","bf16","f32"];

/** The engine's `format_bytes` on sample sizes. */
export const FORMAT_BYTES_EXAMPLES: Array<[number, string]> = [[0,"0 B"],[1,"1 B"],[1023,"1023 B"],[1024,"1.00 KiB"],[1536,"1.50 KiB"],[10485760,"10.0 MiB"],[12939427,"12.3 MiB"],[136314880,"130 MiB"],[1072693248,"1023 MiB"],[1610612736,"1.50 GiB"],[322122547200,"300 GiB"],[5497558138880,"5.00 TiB"],[2251799813685248,"2.00 PiB"]];

/** Whether the app takes each string as a Hub id (`source::hub_id`). */
export const REPO_ID_EXAMPLES: Array<[string, boolean]> = [["google/gemma-4-E2B-it",true],["a/b",true],["google/gemma-3-270m@main",true],[" org.x/model_v1.5 ",true],["unsloth/gemma-4-E4B-it-GGUF:Q8_0",true],["unsloth/gemma-4-E4B-it-GGUF:Q4_K_M@main",true],["a/b@v:1",true],["",false],["gemma",false],["a/b/c",false],["/abs/path",false],["./x",false],["a/.hidden",false],["a/b@",false],["a/b:",false],["a/b@c@d",false],["a/b:Q8:x",false],["a b/c",false]];

/** The one set of chat defaults (`SamplingParams::chat`, `DEFAULT_MAX_TOKENS`). */
export const CHAT_DEFAULTS: { sampling: SamplingParams; max_tokens: number } = {"sampling":{"temperature":1.0,"top_k":64,"top_p":0.949999988079071,"seed":0},"max_tokens":512};

/** What saved KV caches may take on disk unless the user sets a budget. */
export const DEFAULT_CACHE_BUDGET_BYTES = 2147483648;
