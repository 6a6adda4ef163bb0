// The cache domain: the engine's cache menu, the cache the chat's conversation holds, switching
// it, its saved copy beside the session (save, restore, drop) and the two budgets: what saved
// caches may take on disk and what all conversations' caches may hold in memory.

import * as api from "../api";
import type { CacheOptions, CacheSelection, ModelCard, SwitchEvent } from "../api";
import { cacheTransferText } from "../format";

const DISK_BUDGET_KEY = "kvlab.cacheBudgetBytes";
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

/** What the cache domain reads from the others. */
export interface CacheHooks {
  /** The conversation on screen. */
  conversation: () => string;
  /** The loaded model's card (null: none loaded). */
  card: () => ModelCard | null;
  /** Saved sessions changed (a cache saved, dropped or set aside). */
  sessionsChanged: () => Promise<void>;
  /** A failure the sessions list shows. */
  sessionError: (message: string) => void;
}

export class CacheStore {
  /** The cache menu, from the engine. */
  options: CacheOptions | null = $state(null);
  /** The cache as the engine names it (canonical SPEC); the engine's default until its
   * options arrive. */
  spec = $state("");
  switchError = $state("");
  /** What the last save or restore of the conversation's KV cache did (the status line). */
  notice = $state("");
  /** What saved caches may take on disk; null: the app's default. Kept in this browser profile. */
  diskBudget: number | null = $state(loadBudget(DISK_BUDGET_KEY));
  /** What all conversations' KV caches may hold in memory; null: what the machine has. */
  kvBudget: number | null = $state(loadBudget(KV_BUDGET_KEY));

  constructor(private hooks: CacheHooks) {}

  /** The menu from the engine, and its default cache unless one is chosen; the memory
   * budget kept from the last run goes to the engine. */
  async start(): Promise<void> {
    try {
      this.options = await api.cacheOptions();
      if (!this.spec) this.spec = this.options.default_spec;
    } catch (e) {
      this.switchError = api.errorText(e);
    }
    if (this.kvBudget !== null) await api.setKvBudget(this.kvBudget).catch(() => {});
  }

  /** The SPECs (every preset's, at every scope) of the presets the loaded model cannot hold:
   * the card prices exactly those it can (llama.cpp's types need heads of whole 32-wide
   * blocks). Empty before a card. */
  get unfitSpecs(): Set<string> {
    const card = this.hooks.card();
    if (!card) return new Set();
    const priced = new Set(card.token_costs.map((t) => t.spec));
    return new Set(
      (this.options?.presets ?? []).filter((p) => !priced.has(p.specs.all)).flatMap((p) => [p.specs.all, p.specs.full, p.specs.sliding]),
    );
  }

  /** Applies a cache (a preset's or saved SPEC, or a menu choice) to the conversation: the
   * switch the engine made, or null when it refused (the reason is in `switchError`). */
  async switchTo(cache: CacheSelection): Promise<SwitchEvent | null> {
    this.switchError = "";
    try {
      const r = await api.switchCache(this.hooks.conversation(), cache);
      this.spec = r.to;
      return r;
    } catch (e) {
      this.switchError = api.errorText(e);
      return null;
    }
  }

  /** Saves the conversation's KV cache with its session (on leaving it, and on demand). */
  async save(): Promise<void> {
    try {
      const t = await api.saveSessionCache(this.hooks.conversation(), this.diskBudget);
      if (t) this.notice = cacheTransferText("saved", t);
      await this.hooks.sessionsChanged();
    } catch (e) {
      this.notice = `Cache not saved: ${api.errorText(e)}`;
    }
  }

  /** Restores session `id`'s saved cache, so its next answer reads only what is new. */
  async restore(id: string): Promise<void> {
    try {
      const t = await api.restoreSessionCache(id);
      this.notice = t ? cacheTransferText("restored", t) : "";
      if (t) this.spec = t.cache.spec;
    } catch (e) {
      // Nothing is lost: the next answer reads the conversation again.
      this.notice = `Saved cache not used (${api.errorText(e)}): the next answer reads the conversation again`;
      await this.hooks.sessionsChanged();
    }
  }

  async drop(id: string): Promise<void> {
    try {
      await api.dropSessionCache(id);
      await this.hooks.sessionsChanged();
    } catch (e) {
      this.hooks.sessionError(`Cache not dropped: ${api.errorText(e)}`);
    }
  }

  setDiskBudget(bytes: number | null): void {
    this.diskBudget = bytes;
    saveBudget(DISK_BUDGET_KEY, bytes);
  }

  /** Sets the memory all conversations' caches share: past it the engine demotes idle ones
   * to TurboQuant, then spills them to disk. */
  async setKvBudget(bytes: number | null): Promise<void> {
    this.kvBudget = bytes;
    saveBudget(KV_BUDGET_KEY, bytes);
    await api.setKvBudget(bytes).catch((e) => this.hooks.sessionError(api.errorText(e)));
  }
}
