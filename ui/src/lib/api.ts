// The call wrappers for the Tauri commands and events. Every type comes from bindings.ts,
// which is generated from the Rust types (src-tauri/src/bindings.rs): nothing here restates
// a Rust shape by hand.

import { Channel, invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";
import type {
  Activity,
  CacheOptions,
  CacheSelection,
  CacheTransfer,
  CompareRequest,
  ContextCost,
  DefaultModel,
  DocumentFit,
  DownloadUpdate,
  Downloaded,
  Event,
  GenerateRequest,
  GgufQuant,
  HubModel,
  InspectedDocument,
  CommandError,
  MemoryEstimate,
  MemorySample,
  ModelCard,
  Prompt,
  PromptPreview,
  ServerInfo,
  SessionList,
  SessionSummary,
  SwitchEvent,
  SystemInfo,
  WeightsChoice,
} from "./bindings";

export type * from "./bindings";
export { CHAT_DEFAULTS, DEFAULT_CACHE_BUDGET_BYTES, WEIGHTS_CHOICES } from "./bindings";
import { APP_EVENTS } from "./bindings";

/** Whether `e` is a coded error as commands reject with. */
export function isCommandError(e: unknown): e is CommandError {
  return typeof e === "object" && e !== null && "code" in e && "message" in e;
}

export function errorText(e: unknown): string {
  return isCommandError(e) ? e.message : String(e);
}

export const systemInfo = () => invoke<SystemInfo>("system_info");
export const engineStatus = () => invoke<Activity>("engine_status");
/** The theme KVLAB_THEME forces ("light" or "dark"), or null to follow the system. */
export const uiTheme = () => invoke<"light" | "dark" | null>("ui_theme");
export const defaultModel = () => invoke<DefaultModel>("default_model");
export const inspectModel = (path: string, context: number, cache: CacheSelection, weights: WeightsChoice | null) =>
  invoke<MemoryEstimate>("inspect_model", { path, context, cache, weights });
export const loadModel = (
  path: string,
  cache: CacheSelection,
  weights: WeightsChoice | null,
  context: number,
) => invoke<ModelCard>("load_model", { path, cache, weights, context });
export const pickModel = (folder: boolean) => invoke<string | null>("pick_model", { folder });
/** Stops conversation `conversation`'s generation (a session's id). */
export const stopGeneration = (conversation: string) => invoke<void>("stop_generation", { conversation });
/** Stops the side-by-side comparison. */
export const stopCompare = () => invoke<void>("stop_compare");
/** Re-encodes a conversation's cache (and makes it new chats' cache). */
export const switchCache = (conversation: string, cache: CacheSelection) =>
  invoke<SwitchEvent>("switch_cache", { conversation, cache });
export const cacheOptions = () => invoke<CacheOptions>("cache_options");
export const contextCosts = (tokens: number) => invoke<ContextCost[]>("context_costs", { tokens });
export const documentFits = (conversation: string | null, documents: number[], reserve: number) =>
  invoke<DocumentFit[]>("document_fits", { conversation, documents, reserve });
export const inspectDocumentPath = (path: string) => invoke<InspectedDocument>("inspect_document_path", { path });
/** `size` is the file's real size: a file over the limit comes with no bytes and is refused by it. */
export const inspectDocumentBytes = (name: string, bytes: number[], size: number) =>
  invoke<InspectedDocument>("inspect_document_bytes", { name, bytes, size });
export const listSessions = () => invoke<SessionList>("list_sessions");
export const loadSession = (id: string) => invoke<unknown>("load_session", { id });
export const saveSession = (session: unknown) => invoke<SessionSummary>("save_session", { session });
export const renameSession = (id: string, title: string) => invoke<SessionSummary>("rename_session", { id, title });
export const deleteSession = (id: string) => invoke<void>("delete_session", { id });
/** Saves the engine's cache as session `id`'s (null: nothing to save); `budgetBytes` caps all saved caches. */
export const saveSessionCache = (id: string, budgetBytes: number | null) =>
  invoke<CacheTransfer | null>("save_session_cache", { id, budgetBytes });
/** Restores session `id`'s saved cache into the engine (null: it has none). */
export const restoreSessionCache = (id: string) => invoke<CacheTransfer | null>("restore_session_cache", { id });
export const dropSessionCache = (id: string) => invoke<void>("drop_session_cache", { id });
/** What all conversations' KV caches may hold in memory (null: what the machine has). */
export const setKvBudget = (bytes: number | null) => invoke<void>("set_kv_budget", { bytes });
/** How many requests run at once, each a row of one shared forward pass; returns the count applied. */
export const setParallel = (requests: number) => invoke<number>("set_parallel", { requests });
/** Asks where to save and writes `contents` (text or bytes) there; null when cancelled. */
export const exportFile = (fileName: string, contents: string | Uint8Array) =>
  invoke<string | null>("export_file", {
    fileName,
    contents: Array.from(typeof contents === "string" ? new TextEncoder().encode(contents) : contents),
  });

// The local OpenAI-compatible server on the app's engine (src-tauri/src/api_server).
export const serverStatus = () => invoke<ServerInfo>("server_status");
export const serverStart = (port: number) => invoke<ServerInfo>("server_start", { port });
export const serverStop = () => invoke<ServerInfo>("server_stop");

/** How long a streaming command's last event may trail its reply before the caller goes on. */
export const LAST_EVENT_GRACE_MS = 10_000;

/**
 * Starts a command that streams events over `channel` (`start` invokes it), and resolves once
 * the command has replied and `isLast` has seen its final event (or after `LAST_EVENT_GRACE_MS`, should one
 * never come). A channel keeps its own messages in order, but not against the command's
 * reply: Tauri fetches larger messages apart, and a generation's `stats` and `done` could
 * land after `generate` had returned, so the session was saved without the answer's stats.
 */
export function streaming<E>(
  start: (channel: Channel<E>) => Promise<void>,
  onEvent: (e: E) => void,
  isLast: (e: E) => boolean,
  graceMs = LAST_EVENT_GRACE_MS,
): Promise<void> {
  const channel = new Channel<E>();
  let ended = () => {};
  const last = new Promise<void>((resolve) => (ended = resolve));
  channel.onmessage = (e) => {
    onEvent(e);
    if (isLast(e)) ended();
  };
  return start(channel).then(() => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const grace = new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs)));
    return Promise.race([last, grace]).finally(() => clearTimeout(timer));
  });
}

/**
 * Starts a generation; `onEvent` receives the engine's events in order. Resolves when it has
 * ended and its last event (`done` or `error`) has been received.
 */
export const generate = (request: GenerateRequest, onEvent: (e: Event) => void): Promise<void> =>
  streaming<Event>(
    (channel) => invoke<void>("generate", { request, onEvent: channel }),
    onEvent,
    (e) => e.type === "done" || e.type === "error",
  );

/** The prompt as the loaded model reads it (its chat template's rendering, ids, stops). */
export const previewPrompt = (prompt: Prompt) => invoke<PromptPreview>("preview_prompt", { prompt });

/** Runs one prompt through two caches; both panes stream, then fidelity. Resolves once the
 * comparison's `finished` or `error` has been received. */
export const compare = (request: CompareRequest, onEvent: (e: Event) => void): Promise<void> =>
  streaming<Event>(
    (channel) => invoke<void>("compare", { request, onEvent: channel }),
    onEvent,
    (e) => e.type === "finished" || e.type === "error",
  );

export function onMemorySample(cb: (s: MemorySample) => void): Promise<UnlistenFn> {
  return listen<MemorySample>(APP_EVENTS.memorySample, (event) => cb(event.payload));
}

/** The engine pool's markers: a conversation demoted, spilled, restored or dropped. */
export function onMemoryMarker(cb: (m: SwitchEvent) => void): Promise<UnlistenFn> {
  return listen<SwitchEvent>(APP_EVENTS.memoryMarker, (event) => cb(event.payload));
}

export function onEngineStatus(cb: (s: Activity) => void): Promise<UnlistenFn> {
  return listen<Activity>(APP_EVENTS.engineStatus, (event) => cb(event.payload));
}

// Model downloads from the Hugging Face Hub (src-tauri/src/download).

export const hubModels = () => invoke<HubModel[]>("hub_models");
export const hubQuants = (repo: string) => invoke<GgufQuant[]>("hub_quants", { repo });
export const cancelDownload = (repo: string) => invoke<boolean>("cancel_download", { repo });

/** Downloads (or resumes) a Hub repository (of a GGUF repository, the quant given);
 * resolves with the local folder or file to load. Progress that arrives after the result
 * (a channel's messages are not ordered against the command's reply, see `streaming`) is
 * dropped: it could only show a download that has already ended as still running. */
export function startDownload(
  repo: string,
  quant: string | null,
  onProgress: (u: DownloadUpdate) => void,
): Promise<Downloaded> {
  const channel = new Channel<DownloadUpdate>();
  let over = false;
  channel.onmessage = (u) => {
    if (!over) onProgress(u);
  };
  return invoke<Downloaded>("start_download", { repo, quant, onProgress: channel }).finally(() => {
    over = true;
  });
}
