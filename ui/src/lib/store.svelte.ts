// The app's live state: one store per domain (model, cache, chat, timeline, the saved
// conversations, the attached documents), and the conversation on screen that ties them
// together: its id and title, opening, saving and leaving it. One instance, shared by the
// views; every engine call goes through api.ts.

import * as api from "./api";
import type { CacheSelection, MemorySample, SwitchEvent } from "./api";
import { AttachmentStore } from "./attachments.svelte";
import { conversationTitle, newId, type ChatMessage } from "./chat";
import { SessionListStore } from "./sessionList.svelte";
import { CacheStore } from "./stores/cache.svelte";
import { ChatStore, DEFAULT_SYSTEM, type Settings } from "./stores/chat.svelte";
import { ModelStore } from "./stores/model.svelte";
import { TimelineStore } from "./stores/timeline.svelte";
import type { MemoryTimeline } from "./timeline";

export const CONTEXTS = [2048, 8192, 32768];

/** A conversation as saved on disk (the sessions domain lists them). */
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
  sessionId = $state(newId("s"));
  /** A cache to fit to a budget, asked from the cache panel: the compare view opens and runs it. */
  fitRequest = $state<api.FitTarget | null>(null);
  sessionTitle = $state("New chat");
  sessionCreated = Date.now();

  model: ModelStore = new ModelStore({
    cacheSpec: () => this.cache.spec,
    loaded: async (card) => {
      if (!card.supports_thinking) this.chat.settings.thinking = false;
      // The conversation on screen continues from its saved cache, if this model saved one.
      if (this.chat.messages.length) await this.cache.restore(this.sessionId);
    },
  });

  /** The saved conversations (the sessions domain). */
  sessionList: SessionListStore = new SessionListStore({
    currentId: () => this.sessionId,
    renamed: (title) => (this.sessionTitle = title),
    // Its cache went with it: nothing to save.
    deleted: () => this.reset(),
  });

  cache: CacheStore = new CacheStore({
    conversation: () => this.sessionId,
    card: () => this.model.card,
    sessionsChanged: () => this.sessionList.refresh(),
    sessionError: (m) => (this.sessionList.error = m),
  });

  timeline = new TimelineStore();

  /** Documents attached to the next message (the documents domain). */
  docs: AttachmentStore = new AttachmentStore(() => ({
    loaded: !!this.model.card,
    reserve: this.chat.settings.max_tokens,
    maxBytes: this.model.info?.max_document_bytes,
    maxImageBytes: this.model.info?.max_image_bytes,
    conversation: this.sessionId,
  }));

  chat: ChatStore = new ChatStore(
    {
      conversation: () => this.sessionId,
      ready: () => !!this.model.card,
      preset: (role) => this.cache.options?.[role],
      cacheSpec: () => this.cache.spec,
      switchCache: (c) => this.switchCache(c),
      finished: async () => {
        if (this.sessionTitle === "New chat" && this.chat.messages[0]) {
          this.sessionTitle = conversationTitle(this.chat.messages);
        }
        await this.save();
      },
    },
    this.docs,
  );

  /** Start-up: system info, sessions (restoring the latest), then the default model. */
  async start(): Promise<void> {
    api.systemInfo().then((i) => (this.model.info = i)).catch(() => {});
    api.engineStatus().then((s) => (this.model.status = s)).catch(() => {});
    // Awaited: the cache the first load uses is the engine's default.
    await this.cache.start();
    await this.sessionList.refresh();
    let restored: SavedSession | null = null;
    if (this.sessionList.sessions.length) {
      restored = await this.openSession(this.sessionList.sessions[0].id, false);
    }
    try {
      const d = await api.defaultModel();
      this.model.defaultModelPath = d.path;
    } catch (e) {
      this.model.loadError = api.errorText(e);
    }
    const path = restored?.model_path || this.model.defaultModelPath;
    if (path) await this.model.load(path);
  }

  /** This session's conversation in the engine, if it holds one. */
  get conversation() {
    return this.timeline.conversation(this.sessionId);
  }

  onSample(s: MemorySample): void {
    this.timeline.onSample(s, this.sessionId, this.cache.spec);
  }

  /** A pool marker (a demotion, spill, restore or drop) on the timeline. */
  onMarker(m: SwitchEvent): void {
    this.timeline.mark(m);
  }

  /** A new chat. The one left keeps its cache in the engine's pool (which may demote or
   * spill it when memory is short, and saves it on quit). */
  async reset(): Promise<void> {
    if (this.chat.generating) await this.chat.stop();
    this.cache.notice = "";
    this.chat.messages = [];
    this.docs.clear();
    this.sessionId = newId("s");
    this.sessionTitle = "New chat";
    this.sessionCreated = Date.now();
    this.timeline.clear();
  }

  /** Applies a cache (a preset's or saved SPEC, or a menu choice) to the conversation, marks
   * it on the timeline and saves the session. */
  async switchCache(cache: CacheSelection): Promise<void> {
    const r = await this.cache.switchTo(cache);
    if (!r || !this.model.card) return;
    this.timeline.mark(r);
    await this.save();
  }

  snapshot(): SavedSession {
    return {
      id: this.sessionId,
      title: this.sessionTitle,
      created_ms: this.sessionCreated,
      updated_ms: Date.now(),
      model_path: this.model.modelPath,
      system: this.chat.system,
      settings: { ...this.chat.settings },
      cache_spec: this.cache.spec,
      messages: $state.snapshot(this.chat.messages) as ChatMessage[],
      timeline: this.timeline.series.toJSON(),
    };
  }

  async save(): Promise<void> {
    if (!this.chat.messages.length) return;
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
    if (!this.model.card || this.chat.generating || !this.chat.messages.length) return;
    await this.cache.save();
  }

  /** Opens saved session `id`; with `reset`, its saved cache is restored into the model. */
  async openSession(id: string, reset = true): Promise<SavedSession | null> {
    if (this.chat.generating) return null;
    try {
      const s = (await api.loadSession(id)) as SavedSession;
      // The conversation left keeps its cache in the engine's pool.
      this.cache.notice = "";
      this.sessionId = s.id;
      this.sessionTitle = s.title;
      this.sessionCreated = s.created_ms ?? Date.now();
      this.chat.system = s.system ?? DEFAULT_SYSTEM;
      this.chat.settings = { ...this.chat.settings, ...(s.settings ?? {}) };
      this.chat.messages = (s.messages ?? []).map((m) => ({ ...m, streaming: false }));
      this.timeline.restore(s.timeline, Date.now());
      // With no model loaded the engine keeps the cache for the next load.
      if (s.cache_spec && s.cache_spec !== this.cache.spec) await this.switchCache(s.cache_spec);
      if (reset && this.model.card) await this.cache.restore(s.id);
      return s;
    } catch (e) {
      this.sessionList.error = `Not opened: ${api.errorText(e)}`;
      return null;
    }
  }
}
