// The app's live state and the actions the views call. One instance, shared by the views;
// every engine call goes through api.ts.

import * as api from "./api";
import type {
  Activity,
  CacheOptions,
  CacheSelection,
  ContextCost,
  ConversationInfo,
  MemoryEstimate,
  MemorySample,
  ModelCard,
  SwitchEvent,
} from "./api";
import { AttachmentStore } from "./attachments.svelte";
import { frameBatch } from "./frameBatch";
import { cacheTransferText } from "./format";
import { applyEvent, conversationTitle, newId, pendingAnswer, toWire, userMessage, type ChatMessage } from "./chat";
import type { Starter } from "./starters";
import { SessionListStore } from "./sessionList.svelte";
import { MemoryTimeline, markerOf, sampleValues, type XAxis } from "./timeline";

export interface Settings {
  temperature: number;
  top_p: number;
  max_tokens: number;
  thinking: boolean;
}

export const DEFAULT_SYSTEM = "";

const CACHE_BUDGET_KEY = "kvlab.cacheBudgetBytes";
const KV_BUDGET_KEY = "kvlab.kvBudgetBytes";

function loadBudget(key: string): number | null {
  try {
    const v = Number(localStorage.getItem(key));
    return Number.isFinite(v) && v > 0 ? v : null;
  } catch {
    return null;
  }
}

function saveBudget(key: string, bytes: number | null): void {
  try {
    if (bytes === null) localStorage.removeItem(key);
    else localStorage.setItem(key, String(bytes));
  } catch {
    // Storage unavailable: the budget holds for this run.
  }
}
export const CONTEXTS = [2048, 8192, 32768];

export interface SavedSession {
  id: string;
  title: string;
  created_ms: number;
  updated_ms: number;
  model_path: string;
  system: string;
  settings: Settings;
  cache_spec: string;
  messages: ChatMessage[];
  timeline: ReturnType<MemoryTimeline["toJSON"]>;
}

export class AppStore {
  /** What the engine is doing (null until its first report). */
  status: Activity | null = $state(null);
  info: api.SystemInfo | undefined = $state();
  card: ModelCard | null = $state(null);
  modelPath = $state("");
  defaultModelPath = $state("");
  loadError = $state("");
  estimate: MemoryEstimate | null = $state(null);
  context = $state(8192);
  /** The cache menu, from the engine. */
  cacheOptions: CacheOptions | null = $state(null);
  /** KV bytes at `context` tokens under each preset, for the loaded model. */
  contextCosts: ContextCost[] = $state([]);

  system = $state(DEFAULT_SYSTEM);
  // The engine's one set of chat defaults (generated into bindings.ts).
  settings: Settings = $state({
    temperature: api.CHAT_DEFAULTS.sampling.temperature,
    top_p: api.CHAT_DEFAULTS.sampling.top_p ?? 1,
    max_tokens: api.CHAT_DEFAULTS.max_tokens,
    thinking: false,
  });
  messages: ChatMessage[] = $state([]);
  generating = $state(false);
  /** The cache as the engine names it (canonical SPEC); the engine's default until its cache
   * options arrive. */
  cacheSpec = $state("");
  /** How a safetensors checkpoint's weights are held; null: the device's default. */
  weights: api.WeightsChoice | null = $state(null);
  switchError = $state("");

  /** Documents attached to the next message (the documents domain). */
  docs = new AttachmentStore(() => ({
    loaded: !!this.card,
    reserve: this.settings.max_tokens,
    maxBytes: this.info?.max_document_bytes,
    conversation: this.sessionId,
  }));

  timeline = new MemoryTimeline();
  timelineVersion = $state(0);
  xAxis: XAxis = $state("time");
  lastSample: MemorySample | null = $state(null);

  sessionId = $state(newId("s"));
  sessionTitle = $state("New chat");
  sessionCreated = Date.now();
  /** The saved conversations (the sessions domain). */
  sessionList = new SessionListStore({
    currentId: () => this.sessionId,
    renamed: (title) => (this.sessionTitle = title),
    // Its cache went with it: nothing to save.
    deleted: () => this.reset(),
  });

  /** What the last save or restore of the conversation's KV cache did (the status line). */
  cacheNotice = $state("");
  /** What saved caches may take on disk; null: the app's default. Kept in this browser profile. */
  cacheBudget: number | null = $state(loadBudget(CACHE_BUDGET_KEY));
  /** What all conversations' KV caches may hold in memory; null: what the machine has. */
  kvBudget: number | null = $state(loadBudget(KV_BUDGET_KEY));

  /** Answer tokens streamed so far, all answers together (a starter's switch waits on it). */
  private streamed = 0;

  /** Start-up: system info, sessions (restoring the latest), then the default model. */
  async start(): Promise<void> {
    api.systemInfo().then((i) => (this.info = i)).catch(() => {});
    api.engineStatus().then((s) => (this.status = s)).catch(() => {});
    // Awaited: the cache the first load uses is the engine's default.
    try {
      this.cacheOptions = await api.cacheOptions();
      if (!this.cacheSpec) this.cacheSpec = this.cacheOptions.default_spec;
    } catch (e) {
      this.switchError = api.errorText(e);
    }
    if (this.kvBudget !== null) await api.setKvBudget(this.kvBudget).catch(() => {});
    await this.sessionList.refresh();
    let restored: SavedSession | null = null;
    if (this.sessionList.sessions.length) {
      restored = await this.openSession(this.sessionList.sessions[0].id, false);
    }
    try {
      const d = await api.defaultModel();
      this.defaultModelPath = d.path;
    } catch (e) {
      this.loadError = api.errorText(e);
    }
    const path = restored?.model_path || this.defaultModelPath;
    if (path) await this.load(path);
  }

  /** Every conversation the engine holds, as the last sample listed them. */
  conversations: ConversationInfo[] = $state([]);

  /** The SPECs (every preset's, at every scope) of the presets the loaded model cannot hold:
   * the card prices exactly those it can (llama.cpp's types need heads of whole 32-wide
   * blocks). Empty before a card. */
  get unfitSpecs(): Set<string> {
    if (!this.card) return new Set();
    const priced = new Set(this.card.token_costs.map((t) => t.spec));
    return new Set(
      (this.cacheOptions?.presets ?? []).filter((p) => !priced.has(p.specs.all)).flatMap((p) => [p.specs.all, p.specs.full, p.specs.sliding]),
    );
  }

  /** This session's conversation in the engine, if it holds one. */
  get conversation(): ConversationInfo | undefined {
    return this.conversations.find((c) => c.id === this.sessionId);
  }

  onSample(s: MemorySample): void {
    // The engine samples all conversations; the figures that name one are this session's.
    const mine = s.conversations.find((c) => c.id === this.sessionId);
    this.conversations = s.conversations;
    this.lastSample = {
      ...s,
      tokens_in_context: mine?.tokens ?? 0,
      cache_spec: mine?.spec ?? this.cacheSpec,
    };
    this.timeline.push({ tMs: s.t_ms, tokens: mine?.tokens ?? 0, values: sampleValues(s, this.sessionId) });
    this.timelineVersion += 1;
  }

  /** A pool marker (a demotion, spill, restore or drop) on the timeline. */
  onMarker(m: SwitchEvent): void {
    this.timeline.mark(markerOf(m));
    this.timelineVersion += 1;
  }

  /** KV bytes at the chosen context under every preset (the card's table). */
  async refreshContextCosts(): Promise<void> {
    if (!this.card) return;
    this.contextCosts = await api.contextCosts(this.context).catch(() => []);
  }

  async estimateFor(path: string): Promise<void> {
    try {
      this.estimate = await api.inspectModel(path, this.context, this.cacheSpec, this.weights);
      this.loadError = "";
    } catch (e) {
      this.estimate = null;
      this.loadError = api.errorText(e);
    }
  }

  async load(path: string): Promise<void> {
    this.loadError = "";
    // A load sends every conversation's cache to its file first (the engine does it), so
    // each comes back when this model does.
    this.modelPath = path;
    await this.estimateFor(path);
    try {
      this.card = await api.loadModel(path, this.cacheSpec, this.weights, this.context);
      if (!this.card.supports_thinking) this.settings.thinking = false;
      await this.refreshContextCosts();
      // The conversation on screen continues from its saved cache, if this model saved one.
      if (this.messages.length) await this.restoreCache(this.sessionId);
    } catch (e) {
      // The engine keeps serving the previous model when a load fails before replacing it.
      const st = await api.engineStatus().catch(() => null);
      if (st?.state !== "ready") this.card = null;
      else if (this.card) this.modelPath = this.card.path;
      this.loadError = api.errorText(e);
    }
  }

  async pickAndLoad(folder: boolean): Promise<void> {
    try {
      const path = await api.pickModel(folder);
      if (path) await this.load(path);
    } catch (e) {
      this.loadError = api.errorText(e);
    }
  }

  private request(upTo: number): api.GenerateRequest {
    return {
      conversation: { by: "id", id: this.sessionId },
      prompt: { type: "conversation", messages: toWire(this.system, this.messages, upTo), thinking: this.settings.thinking },
      sampling: { ...api.CHAT_DEFAULTS.sampling, temperature: this.settings.temperature, top_p: this.settings.top_p, seed: Date.now() % 1_000_000 },
      max_tokens: this.settings.max_tokens,
    };
  }

  /** Runs a generation into the answer at index `at`. */
  private async run(at: number): Promise<void> {
    this.generating = true;
    const req = this.request(at);
    // Tokens reach the answer once per painted frame (see frameBatch.ts).
    const batch = frameBatch<api.Event>((events) => {
      this.messages[at] = events.reduce(applyEvent, this.messages[at]);
    });
    const arrive = (ev: api.Event) => {
      if (ev.type === "token") this.streamed += 1;
      batch.push(ev);
    };
    try {
      await api.generate(req, arrive);
    } catch (e) {
      const err: api.JobError = api.isCommandError(e) ? e : { code: "internal", message: String(e) };
      batch.flush();
      if (!this.messages[at].error) batch.push({ type: "error", code: err.code, message: err.message });
    } finally {
      batch.flush();
      if (this.messages[at]?.streaming) this.messages[at] = { ...this.messages[at], streaming: false };
      this.generating = false;
      if (this.sessionTitle === "New chat" && this.messages[0]) {
        this.sessionTitle = conversationTitle(this.messages);
      }
      await this.save();
    }
  }

  /** The prompt the answer at `at` was asked with, as the model reads it. */
  async promptFor(at: number): Promise<api.PromptPreview> {
    return api.previewPrompt(this.request(at).prompt);
  }

  async send(text: string): Promise<void> {
    if ((!text.trim() && !this.docs.attachments.length) || this.generating || !this.card) return;
    const docs = this.docs.take();
    const body = docs.map((d) => `File \`${d.name}\`:\n\n\`\`\`\n${d.text}\n\`\`\``).join("\n\n");
    const content = body ? `${body}\n\n${text}`.trim() : text;
    this.messages.push(userMessage(content, docs.length ? docs.map((d) => d.name) : undefined, docs.length ? text : undefined));
    this.messages.push(pendingAnswer());
    await this.run(this.messages.length - 1);
  }

  /**
   * Runs a first-run starter: its prompt as the next turn (a document shows as an attachment
   * chip, its text goes to the model) and, with `switchTo`, the cache re-encoded as
   * `switchTo` once `switchAfter` tokens of the answer have streamed, so the timeline marks
   * the switch mid-answer. With `from`, the cache is switched to `from` first if it is not
   * there already.
   */
  async sendStarter(s: Starter): Promise<void> {
    if (this.generating || !this.card) return;
    const from = s.from && this.cacheOptions?.[s.from];
    const switchTo = s.switchTo && this.cacheOptions?.[s.switchTo];
    if (from && this.cacheSpec !== from) await this.switchCache(from);
    this.messages.push(userMessage(s.prompt, s.document ? [s.document] : undefined, s.document ? "" : undefined));
    this.messages.push(pendingAnswer());
    const start = this.streamed;
    const answering = this.run(this.messages.length - 1);
    if (switchTo) {
      while (this.generating && this.streamed - start < (s.switchAfter ?? 16)) {
        await new Promise((r) => setTimeout(r, 40));
      }
      await this.switchCache(switchTo);
    }
    await answering;
  }

  async stop(): Promise<void> {
    if (this.generating) await api.stopGeneration(this.sessionId);
  }

  async regenerate(): Promise<void> {
    const last = this.messages.length - 1;
    if (this.generating || last < 1 || this.messages[last].role !== "model") return;
    this.messages[last] = pendingAnswer();
    await this.run(last);
  }

  /** A new chat. The one left keeps its cache in the engine's pool (which may demote or
   * spill it when memory is short, and saves it on quit). */
  async reset(): Promise<void> {
    if (this.generating) await this.stop();
    this.cacheNotice = "";
    this.messages = [];
    this.docs.clear();
    this.sessionId = newId("s");
    this.sessionTitle = "New chat";
    this.sessionCreated = Date.now();
    this.timeline = new MemoryTimeline();
    this.timelineVersion += 1;
  }

  /** Applies a cache (a preset's or saved SPEC, or a menu choice) to the conversation. */
  async switchCache(cache: CacheSelection): Promise<void> {
    this.switchError = "";
    try {
      const r = await api.switchCache(this.sessionId, cache);
      this.cacheSpec = r.to;
      if (!this.card) return;
      this.timeline.mark(markerOf(r));
      this.timelineVersion += 1;
      await this.save();
    } catch (e) {
      this.switchError = api.errorText(e);
    }
  }

  snapshot(): SavedSession {
    return {
      id: this.sessionId,
      title: this.sessionTitle,
      created_ms: this.sessionCreated,
      updated_ms: Date.now(),
      model_path: this.modelPath,
      system: this.system,
      settings: { ...this.settings },
      cache_spec: this.cacheSpec,
      messages: $state.snapshot(this.messages) as ChatMessage[],
      timeline: this.timeline.toJSON(),
    };
  }

  async save(): Promise<void> {
    if (!this.messages.length) return;
    try {
      await api.saveSession(this.snapshot());
      await this.sessionList.refresh();
      this.sessionList.error = "";
    } catch (e) {
      this.sessionList.error = `Not saved: ${api.errorText(e)}`;
    }
  }

  /** Saves the conversation's KV cache with its session (on leaving it, and on demand). */
  async saveCache(): Promise<void> {
    if (!this.card || this.generating || !this.messages.length) return;
    try {
      const t = await api.saveSessionCache(this.sessionId, this.cacheBudget);
      if (t) this.cacheNotice = cacheTransferText("saved", t);
      await this.sessionList.refresh();
    } catch (e) {
      this.cacheNotice = `Cache not saved: ${api.errorText(e)}`;
    }
  }

  /** Restores session `id`'s saved cache, so its next answer reads only what is new. */
  async restoreCache(id: string): Promise<void> {
    try {
      const t = await api.restoreSessionCache(id);
      this.cacheNotice = t ? cacheTransferText("restored", t) : "";
      if (t) this.cacheSpec = t.cache.spec;
    } catch (e) {
      // Nothing is lost: the next answer reads the conversation again.
      this.cacheNotice = `Saved cache not used (${api.errorText(e)}): the next answer reads the conversation again`;
      await this.sessionList.refresh();
    }
  }

  async dropCache(id: string): Promise<void> {
    try {
      await api.dropSessionCache(id);
      await this.sessionList.refresh();
    } catch (e) {
      this.sessionList.error = `Cache not dropped: ${api.errorText(e)}`;
    }
  }

  setCacheBudget(bytes: number | null): void {
    this.cacheBudget = bytes;
    saveBudget(CACHE_BUDGET_KEY, bytes);
  }

  /** Sets the memory all conversations' caches share: past it the engine demotes idle ones
   * to TurboQuant, then spills them to disk. */
  async setKvBudget(bytes: number | null): Promise<void> {
    this.kvBudget = bytes;
    saveBudget(KV_BUDGET_KEY, bytes);
    await api.setKvBudget(bytes).catch((e) => (this.sessionList.error = api.errorText(e)));
  }

  async openSession(id: string, reset = true): Promise<SavedSession | null> {
    if (this.generating) return null;
    try {
      const s = (await api.loadSession(id)) as SavedSession;
      // The conversation left keeps its cache in the engine's pool.
      this.cacheNotice = "";
      this.sessionId = s.id;
      this.sessionTitle = s.title;
      this.sessionCreated = s.created_ms ?? Date.now();
      this.system = s.system ?? DEFAULT_SYSTEM;
      this.settings = { ...this.settings, ...(s.settings ?? {}) };
      this.messages = (s.messages ?? []).map((m) => ({ ...m, streaming: false }));
      this.timeline = MemoryTimeline.fromJSON(s.timeline);
      // A sample with no values breaks every line, so the saved past and the live present
      // are not joined by a misleading straight line.
      if (this.timeline.length) this.timeline.push({ tMs: Date.now(), tokens: 0, values: {} });
      this.timelineVersion += 1;
      // With no model loaded the engine keeps the cache for the next load.
      if (s.cache_spec && s.cache_spec !== this.cacheSpec) await this.switchCache(s.cache_spec);
      if (reset && this.card) await this.restoreCache(s.id);
      return s;
    } catch (e) {
      this.sessionList.error = `Not opened: ${api.errorText(e)}`;
      return null;
    }
  }
}
