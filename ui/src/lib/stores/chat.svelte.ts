// The chat domain: the conversation's messages, its system prompt and sampling settings, and
// the generations that fill its answers (send, a first-run starter, stop, regenerate). Which
// conversation it is, and what happens when an answer ends, the app store says.

import * as api from "../api";
import type { CacheSelection } from "../api";
import { applyEvent, pendingAnswer, toWire, userMessage, type ChatMessage } from "../chat";
import { frameBatch } from "../frameBatch";
import type { CacheRole, Starter } from "../starters";
import type { AttachmentStore } from "../attachments.svelte";

export interface Settings {
  temperature: number;
  top_p: number;
  max_tokens: number;
  thinking: boolean;
}

export const DEFAULT_SYSTEM = "";

/** What the chat reads from the other domains. */
export interface ChatHooks {
  /** The conversation on screen. */
  conversation: () => string;
  /** Whether a model is loaded. */
  ready: () => boolean;
  /** The menu's cache in `role` (its default or suggested cache), once the menu is known. */
  preset: (role: CacheRole) => string | undefined;
  /** The conversation's cache SPEC now. */
  cacheSpec: () => string;
  /** Switches the conversation's cache (for starters). */
  switchCache: (cache: CacheSelection) => Promise<void>;
  /** An answer ended (however): the app titles and saves the session. */
  finished: () => Promise<void>;
}

export class ChatStore {
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
  /** Answer tokens streamed so far, all answers together (a starter's switch waits on it). */
  private streamed = 0;

  constructor(
    private hooks: ChatHooks,
    private docs: AttachmentStore,
  ) {}

  /** The request for the answer at `upTo`: the conversation before it. */
  request(upTo: number): api.GenerateRequest {
    return {
      conversation: { by: "id", id: this.hooks.conversation() },
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
      const err: api.CommandError = api.isCommandError(e) ? e : { code: "internal", message: String(e) };
      batch.flush();
      // A command's rejection, not an engine event: it may carry an app code.
      const msg = this.messages[at];
      if (!msg.error) this.messages[at] = { ...msg, streaming: false, error: { code: err.code, message: err.message } };
    } finally {
      batch.flush();
      if (this.messages[at]?.streaming) this.messages[at] = { ...this.messages[at], streaming: false };
      this.generating = false;
      await this.hooks.finished();
    }
  }

  /** The prompt the answer at `at` was asked with, as the model reads it. */
  async promptFor(at: number): Promise<api.PromptPreview> {
    return api.previewPrompt(this.request(at).prompt);
  }

  /** Sends `text` with the attached documents (each as a fenced block before it). */
  async send(text: string): Promise<void> {
    if ((!text.trim() && !this.docs.attachments.length) || this.generating || !this.hooks.ready()) return;
    const attached = this.docs.take();
    const docs = attached.filter((d) => !d.image);
    const images = attached.flatMap((d) => (d.image ? [{ id: d.image.id, name: d.name, thumbnail: d.image.thumbnail }] : []));
    const body = docs.map((d) => `File \`${d.name}\`:\n\n\`\`\`\n${d.text}\n\`\`\``).join("\n\n");
    const content = body ? `${body}\n\n${text}`.trim() : text;
    const message = userMessage(content, docs.length ? docs.map((d) => d.name) : undefined, docs.length ? text : undefined);
    if (images.length) message.images = images;
    this.messages.push(message);
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
    if (this.generating || !this.hooks.ready()) return;
    const from = s.from && this.hooks.preset(s.from);
    const switchTo = s.switchTo && this.hooks.preset(s.switchTo);
    if (from && this.hooks.cacheSpec() !== from) await this.hooks.switchCache(from);
    this.messages.push(userMessage(s.prompt, s.document ? [s.document] : undefined, s.document ? "" : undefined));
    this.messages.push(pendingAnswer());
    const start = this.streamed;
    const answering = this.run(this.messages.length - 1);
    if (switchTo) {
      while (this.generating && this.streamed - start < (s.switchAfter ?? 16)) {
        await new Promise((r) => setTimeout(r, 40));
      }
      await this.hooks.switchCache(switchTo);
    }
    await answering;
  }

  async stop(): Promise<void> {
    if (this.generating) await api.stopGeneration(this.hooks.conversation());
  }

  async regenerate(): Promise<void> {
    const last = this.messages.length - 1;
    if (this.generating || last < 1 || this.messages[last].role !== "model") return;
    this.messages[last] = pendingAnswer();
    await this.run(last);
  }
}
