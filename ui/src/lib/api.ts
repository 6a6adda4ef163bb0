// Typed bridge to the Tauri commands and events. Everything the UI asks of the app goes here;
// the shapes mirror src-tauri/src/events.rs, card.rs and commands.rs.

import { Channel, invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";

export interface SystemInfo {
  total_memory_bytes: number;
  cpu_cores: number;
  os: string;
  engine_version: string;
  data_dir: string;
}

export interface EngineStatus {
  state: "starting" | "no_model" | "loading" | "ready" | "generating" | "failed";
  label: string;
  path?: string;
  model?: string;
  message?: string;
}

export interface KvPart {
  kind: "full" | "sliding";
  precision: string;
  bytes: number;
}

export interface EngineMemory {
  weights_bytes: number;
  kv: KvPart[];
  context_tokens: number;
  cache_policy: string;
}

export interface ProcessMemorySample {
  t_ms: number;
  rss_bytes: number;
  virtual_bytes: number;
  engine: EngineMemory;
}

export interface TokenCost {
  spec: string;
  label: string;
  full_bytes_per_token: number;
  sliding_bytes_per_token: number;
}

export interface ModelCard {
  name: string;
  path: string;
  family: string;
  format: string;
  parameters: number;
  layers: number;
  full_layers: number;
  sliding_layers: number;
  shared_layers: number;
  hidden_size: number;
  vocab_size: number;
  max_context: number;
  sliding_window: number;
  kv_heads: number;
  head_dim: number;
  weights_bytes: number;
  supports_thinking: boolean;
  /** Whether the checkpoint ships a chat template (false: a base model, which continues
   * text); known once the model is loaded, absent before. */
  has_chat_template?: boolean | null;
  token_costs: TokenCost[];
  warnings: string[];
}

export interface MemoryEstimate {
  card: ModelCard;
  context: number;
  spec: string;
  weights_bytes: number;
  kv_bytes: number;
  total_bytes: number;
}

export interface GenerationStats {
  ttft_ms: number;
  prefill_tokens: number;
  reused_tokens: number;
  prefill_tok_s: number;
  decode_tokens: number;
  decode_tok_s: number;
  context_tokens: number;
  kv_bytes: number;
  cache_policy: string;
}

export type StopReason = "end_of_turn" | "max_tokens" | "cancelled";

export type ChatEvent =
  | { type: "token"; text: string }
  | { type: "thinking"; text: string }
  | { type: "done"; reason: StopReason; stats: GenerationStats }
  | { type: "error"; code: string; message: string };

export interface SamplingParams {
  temperature: number;
  top_k: number | null;
  top_p: number | null;
  seed: number;
}

export interface WireMessage {
  role: "system" | "user" | "model";
  content: string;
}

export interface GenerateRequest {
  messages: WireMessage[];
  sampling: SamplingParams;
  max_tokens: number;
  thinking: boolean;
}

export interface SwitchReport {
  t_ms: number;
  from: string;
  to: string;
  before_bytes: number;
  after_bytes: number;
  convert_ms: number;
}

export interface InspectedDocument {
  name: string;
  kind: "text" | "markdown" | "code" | "pdf";
  bytes: number;
  /** Page count, for PDFs only. */
  pages?: number;
  text: string;
  tokens: number;
}

export interface SessionSummary {
  id: string;
  title: string;
  updated_ms: number;
}

/** A command error as the app sends it: a stable code and a readable message. */
export interface CommandError {
  code: string;
  message: string;
}

export function isCommandError(e: unknown): e is CommandError {
  return typeof e === "object" && e !== null && "code" in e && "message" in e;
}

export function errorText(e: unknown): string {
  return isCommandError(e) ? e.message : String(e);
}

export const systemInfo = () => invoke<SystemInfo>("system_info");
export const engineStatus = () => invoke<EngineStatus>("engine_status");
/** The theme KVLAB_THEME forces ("light" or "dark"), or null to follow the system. */
export const uiTheme = () => invoke<string | null>("ui_theme");
export const defaultModel = () => invoke<{ path: string; name: string }>("default_model");
export const inspectModel = (path: string, context: number, spec: string) =>
  invoke<MemoryEstimate>("inspect_model", { path, context, spec });
export const loadModel = (path: string, spec: string) => invoke<ModelCard>("load_model", { path, spec });
export const pickModel = (folder: boolean) => invoke<string | null>("pick_model", { folder });
export const stopGeneration = () => invoke<void>("stop_generation");
export const resetConversation = () => invoke<void>("reset_conversation");
export const switchCache = (spec: string) => invoke<SwitchReport>("switch_cache", { spec });
export const inspectDocumentPath = (path: string) => invoke<InspectedDocument>("inspect_document_path", { path });
export const inspectDocumentBytes = (name: string, bytes: number[]) =>
  invoke<InspectedDocument>("inspect_document_bytes", { name, bytes });
export const listSessions = () => invoke<SessionSummary[]>("list_sessions");
export const loadSession = (id: string) => invoke<unknown>("load_session", { id });
export const saveSession = (session: unknown) => invoke<SessionSummary>("save_session", { session });
export const renameSession = (id: string, title: string) => invoke<SessionSummary>("rename_session", { id, title });
export const deleteSession = (id: string) => invoke<void>("delete_session", { id });
/** Asks where to save and writes `contents` (text or bytes) there; null when cancelled. */
export const exportFile = (fileName: string, contents: string | Uint8Array) =>
  invoke<string | null>("export_file", {
    fileName,
    contents: Array.from(typeof contents === "string" ? new TextEncoder().encode(contents) : contents),
  });

/** Starts a generation; `onEvent` receives the stream in order. Resolves when it ends. */
export function generate(request: GenerateRequest, onEvent: (e: ChatEvent) => void): Promise<void> {
  const channel = new Channel<ChatEvent>();
  channel.onmessage = onEvent;
  return invoke<void>("generate", { request, onEvent: channel });
}

export type CompareEvent =
  | { type: "pane"; pane: 0 | 1; event: ChatEvent }
  | { type: "fidelity"; mean_kld: number; max_kld: number; top1_agreement: number; tokens_scored: number; kv_bytes: [number, number] };

export interface CompareRequest {
  messages: WireMessage[];
  sampling: SamplingParams;
  max_tokens: number;
  specs: [string, string];
}

/** Runs one conversation through two cache policies; both panes stream, then fidelity. */
export function compare(request: CompareRequest, onEvent: (e: CompareEvent) => void): Promise<void> {
  const channel = new Channel<CompareEvent>();
  channel.onmessage = onEvent;
  return invoke<void>("compare", { request, onEvent: channel });
}

export function onMemorySample(cb: (s: ProcessMemorySample) => void): Promise<UnlistenFn> {
  return listen<ProcessMemorySample>("memory-sample", (event) => cb(event.payload));
}

export function onEngineStatus(cb: (s: EngineStatus) => void): Promise<UnlistenFn> {
  return listen<EngineStatus>("engine-status", (event) => cb(event.payload));
}

// Model downloads from the Hugging Face Hub (src-tauri/src/download).

/** A model the download picker offers. */
export interface HubModel {
  repo: string;
  label: string;
  family: string;
}

/** One progress message of a download. */
export interface DownloadUpdate {
  repo: string;
  file: string;
  file_done: number;
  file_total: number;
  done: number;
  total: number;
  bytes_per_sec: number | null;
  eta_secs: number | null;
}

export const hubModels = () => invoke<HubModel[]>("hub_models");
export const cancelDownload = (repo: string) => invoke<boolean>("cancel_download", { repo });

/** Downloads (or resumes) a Hub repository; resolves with the local folder to load. */
export function startDownload(repo: string, onProgress: (u: DownloadUpdate) => void): Promise<{ repo: string; path: string }> {
  const channel = new Channel<DownloadUpdate>();
  channel.onmessage = onProgress;
  return invoke<{ repo: string; path: string }>("start_download", { repo, onProgress: channel });
}
