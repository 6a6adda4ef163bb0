// The app's live state and the actions the views call. One instance, shared by the views;
// every engine call goes through api.ts.

import * as api from "./api";
import type { EngineStatus, InspectedDocument, MemoryEstimate, ModelCard, ProcessMemorySample, SessionSummary } from "./api";
import { applyEvent, newId, pendingAnswer, toWire, userMessage, type ChatMessage } from "./chat";
import { documentFit } from "./cost";
import type { Starter } from "./starters";
import { MemoryTimeline, type XAxis } from "./timeline";

export interface Settings {
  temperature: number;
  top_p: number;
  max_tokens: number;
  thinking: boolean;
}

export const DEFAULT_SYSTEM = "";
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
  status: EngineStatus = $state({ state: "starting", label: "starting…" });
  info: api.SystemInfo | undefined = $state();
  card: ModelCard | null = $state(null);
  modelPath = $state("");
  defaultModelPath = $state("");
  loadError = $state("");
  estimate: MemoryEstimate | null = $state(null);
  context = $state(8192);

  system = $state(DEFAULT_SYSTEM);
  settings: Settings = $state({ temperature: 0.7, top_p: 0.95, max_tokens: 256, thinking: false });
  messages: ChatMessage[] = $state([]);
  generating = $state(false);
  cacheSpec = $state("f16");
  switchError = $state("");

  attachments: InspectedDocument[] = $state([]);
  docNotice = $state("");

  timeline = new MemoryTimeline();
  timelineVersion = $state(0);
  xAxis: XAxis = $state("time");
  lastSample: ProcessMemorySample | null = $state(null);

  sessionId = $state(newId("s"));
  sessionTitle = $state("New chat");
  sessionCreated = Date.now();
  sessions: SessionSummary[] = $state([]);

  /** Answer tokens streamed so far, all answers together (a starter's switch waits on it). */
  private streamed = 0;

  /** Start-up: system info, sessions (restoring the latest), then the default model. */
  async start(): Promise<void> {
    api.systemInfo().then((i) => (this.info = i)).catch(() => {});
    api.engineStatus().then((s) => (this.status = s)).catch(() => {});
    await this.refreshSessions();
    let restored: SavedSession | null = null;
    if (this.sessions.length) {
      restored = await this.openSession(this.sessions[0].id, false);
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

  onSample(s: ProcessMemorySample): void {
    this.lastSample = s;
    const values: Record<string, number> = { process: s.rss_bytes };
    const e = s.engine;
    if (e.weights_bytes) values.weights = e.weights_bytes;
    if (e.kv.length) {
      values["kv total"] = e.kv.reduce((a, k) => a + k.bytes, 0);
      for (const k of e.kv) values[`kv ${k.kind} ${k.precision}`] = k.bytes;
    }
    this.timeline.push({ tMs: s.t_ms, tokens: e.context_tokens, values });
    this.timelineVersion += 1;
  }

  async estimateFor(path: string): Promise<void> {
    try {
      this.estimate = await api.inspectModel(path, this.context, this.cacheSpec);
      this.loadError = "";
    } catch (e) {
      this.estimate = null;
      this.loadError = api.errorText(e);
    }
  }

  async load(path: string): Promise<void> {
    this.loadError = "";
    this.modelPath = path;
    await this.estimateFor(path);
    try {
      this.card = await api.loadModel(path, this.cacheSpec);
      if (!this.card.supports_thinking) this.settings.thinking = false;
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
      messages: toWire(this.system, this.messages, upTo),
      sampling: { temperature: this.settings.temperature, top_k: 64, top_p: this.settings.top_p, seed: Date.now() % 1_000_000 },
      max_tokens: this.settings.max_tokens,
      thinking: this.settings.thinking,
    };
  }

  /** Runs a generation into the answer at index `at`. */
  private async run(at: number): Promise<void> {
    this.generating = true;
    const req = this.request(at);
    const update = (ev: api.ChatEvent) => {
      if (ev.type === "token") this.streamed += 1;
      this.messages[at] = applyEvent(this.messages[at], ev);
    };
    try {
      await api.generate(req, update);
    } catch (e) {
      const err = api.isCommandError(e) ? e : { code: "internal", message: String(e) };
      if (!this.messages[at].error) update({ type: "error", code: err.code, message: err.message });
    } finally {
      if (this.messages[at]?.streaming) this.messages[at] = { ...this.messages[at], streaming: false };
      this.generating = false;
      if (this.sessionTitle === "New chat" && this.messages[0]) {
        this.sessionTitle = this.messages[0].content.split("\n")[0].slice(0, 48) || "New chat";
      }
      await this.save();
    }
  }

  async send(text: string): Promise<void> {
    const docs = this.attachments;
    if ((!text.trim() && !docs.length) || this.generating || !this.card) return;
    const body = docs.map((d) => `File \`${d.name}\`:\n\n\`\`\`\n${d.text}\n\`\`\``).join("\n\n");
    const content = body ? `${body}\n\n${text}`.trim() : text;
    this.messages.push(userMessage(content, docs.length ? docs.map((d) => d.name) : undefined, docs.length ? text : undefined));
    this.attachments = [];
    this.docNotice = "";
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
    if (s.from && this.cacheSpec !== s.from) await this.switchCache(s.from);
    this.messages.push(userMessage(s.prompt, s.document ? [s.document] : undefined, s.document ? "" : undefined));
    this.messages.push(pendingAnswer());
    const start = this.streamed;
    const answering = this.run(this.messages.length - 1);
    if (s.switchTo) {
      while (this.generating && this.streamed - start < (s.switchAfter ?? 16)) {
        await new Promise((r) => setTimeout(r, 40));
      }
      await this.switchCache(s.switchTo);
    }
    await answering;
  }

  async stop(): Promise<void> {
    if (this.generating) await api.stopGeneration();
  }

  async regenerate(): Promise<void> {
    const last = this.messages.length - 1;
    if (this.generating || last < 1 || this.messages[last].role !== "model") return;
    this.messages[last] = pendingAnswer();
    await this.run(last);
  }

  async reset(): Promise<void> {
    if (this.generating) await this.stop();
    await api.resetConversation().catch(() => {});
    this.messages = [];
    this.attachments = [];
    this.sessionId = newId("s");
    this.sessionTitle = "New chat";
    this.sessionCreated = Date.now();
    this.timeline = new MemoryTimeline();
    this.timelineVersion += 1;
  }

  async switchCache(spec: string): Promise<void> {
    this.switchError = "";
    if (!this.card) {
      this.cacheSpec = spec;
      return;
    }
    try {
      const r = await api.switchCache(spec);
      this.cacheSpec = spec;
      this.timeline.mark({
        tMs: r.t_ms,
        tokens: this.lastSample?.engine.context_tokens ?? 0,
        from: r.from,
        to: r.to,
        beforeBytes: r.before_bytes,
        afterBytes: r.after_bytes,
      });
      this.timelineVersion += 1;
      await this.save();
    } catch (e) {
      this.switchError = api.errorText(e);
    }
  }

  /** Attaches a document the engine has read and counted; refusals leave the chat untouched. */
  async attach(read: () => Promise<InspectedDocument>): Promise<void> {
    try {
      const doc = await read();
      this.attachments.push(doc);
      this.docNotice = "";
    } catch (e) {
      this.docNotice = api.errorText(e);
    }
  }

  /** Attaches files the web view holds (a DOM drop or the picker), one after another. */
  async attachFiles(files: File[]): Promise<void> {
    for (const f of files) {
      await this.attach(async () => api.inspectDocumentBytes(f.name, Array.from(new Uint8Array(await f.arrayBuffer()))));
    }
  }

  fitOf(doc: InspectedDocument) {
    if (!this.card) return null;
    const extra = this.attachments.filter((d) => d !== doc).reduce((a, d) => a + d.tokens, 0);
    return documentFit(this.card, (this.lastSample?.engine.context_tokens ?? 0) + extra, doc.tokens, this.settings.max_tokens);
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
      await this.refreshSessions();
    } catch (e) {
      console.warn("session not saved", e);
    }
  }

  async refreshSessions(): Promise<void> {
    this.sessions = await api.listSessions().catch(() => []);
  }

  async openSession(id: string, reset = true): Promise<SavedSession | null> {
    if (this.generating) return null;
    try {
      const s = (await api.loadSession(id)) as SavedSession;
      if (reset) await api.resetConversation().catch(() => {});
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
      if (s.cache_spec && s.cache_spec !== this.cacheSpec) {
        if (this.card) await this.switchCache(s.cache_spec);
        else this.cacheSpec = s.cache_spec;
      }
      return s;
    } catch (e) {
      console.warn("session not opened", e);
      return null;
    }
  }

  async renameSession(id: string, title: string): Promise<void> {
    if (!title.trim()) return;
    await api.renameSession(id, title).catch(() => {});
    if (id === this.sessionId) this.sessionTitle = title.trim();
    await this.refreshSessions();
  }

  async deleteSession(id: string): Promise<void> {
    await api.deleteSession(id).catch(() => {});
    if (id === this.sessionId) await this.reset();
    await this.refreshSessions();
  }
}
