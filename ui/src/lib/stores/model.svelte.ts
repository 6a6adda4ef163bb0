// The model domain: the engine's activity, the machine, the model on screen (its card, its
// pre-load estimate, the load's error), the context the user chose and what a context costs
// under each preset.

import * as api from "../api";
import type { Activity, ContextCost, MemoryEstimate, ModelCard } from "../api";

/** What loading needs from the other domains. */
export interface ModelHooks {
  /** The cache the load starts the model with (the chat's). */
  cacheSpec: () => string;
  /** A model was loaded (the chat and the cache follow it). */
  loaded: (card: ModelCard) => Promise<void>;
}

export class ModelStore {
  /** What the engine is doing (null until its first report). */
  status: Activity | null = $state(null);
  info: api.SystemInfo | undefined = $state();
  card: ModelCard | null = $state(null);
  modelPath = $state("");
  defaultModelPath = $state("");
  loadError = $state("");
  estimate: MemoryEstimate | null = $state(null);
  context = $state(8192);
  /** KV bytes at `context` tokens under each preset, for the loaded model. */
  contextCosts: ContextCost[] = $state([]);

  /** The budget a fit starts at, in MiB: a quarter of f16's bytes at `context` (about 4
   * bits), as the engine counts them; 0 until they are known. */
  fitStartMiB(): number {
    const f16 = this.contextCosts.find((c) => c.spec === "f16")?.bytes ?? 0;
    return f16 ? Math.max(0.01, Math.round((f16 / 4 / 2 ** 20) * 100) / 100) : 0;
  }
  /** How a safetensors checkpoint's weights are held; null: the device's default. */
  weights: api.WeightsChoice | null = $state(null);

  constructor(private hooks: ModelHooks) {}

  /** KV bytes at the chosen context under every preset (the card's table). */
  async refreshContextCosts(): Promise<void> {
    if (!this.card) return;
    this.contextCosts = await api.contextCosts(this.context).catch(() => []);
  }

  async estimateFor(path: string): Promise<void> {
    try {
      this.estimate = await api.inspectModel(path, this.context, this.hooks.cacheSpec(), this.weights);
      this.loadError = "";
    } catch (e) {
      this.estimate = null;
      this.loadError = api.errorText(e);
    }
  }

  /** Loads `path`. A load sends every conversation's cache to its file first (the engine does
   * it), so each comes back when this model does. */
  async load(path: string): Promise<void> {
    this.loadError = "";
    this.modelPath = path;
    await this.estimateFor(path);
    try {
      this.card = await api.loadModel(path, this.hooks.cacheSpec(), this.weights, this.context);
      await this.refreshContextCosts();
      await this.hooks.loaded(this.card);
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
}
