// The conversation's message model and the reducer that folds a generation's stream events
// into it. Pure: no Tauri, no DOM, so it is unit-tested directly.

import type { Code, DoneReason, Event, GenStats, Message } from "./api";

export interface ChatMessage {
  id: string;
  role: "user" | "model";
  content: string;
  thinking: string;
  /** Set while tokens are still arriving. */
  streaming: boolean;
  stats?: GenStats;
  stopReason?: DoneReason;
  error?: { code: Code | string; message: string };
  /** Documents attached to a user message (names only; their text is in `content`). */
  attachments?: string[];
  /** What the user typed, when `content` also carries attached documents. */
  display?: string;
  /** Images shown with a user message: the engine's ids (sent) and thumbnails (shown). */
  images?: { id: string; name: string; thumbnail: string }[];
}

let counter = 0;
export function newId(prefix = "m"): string {
  counter += 1;
  return `${prefix}-${Date.now().toString(36)}-${counter}`;
}

export function userMessage(content: string, attachments?: string[], display?: string): ChatMessage {
  return { id: newId(), role: "user", content, thinking: "", streaming: false, attachments, display };
}

export function pendingAnswer(): ChatMessage {
  return { id: newId(), role: "model", content: "", thinking: "", streaming: true };
}

/**
 * Applies one engine event to the answer being written; returns the updated message. The
 * engine sends `stats` just before `done`; loading events never reach a generation.
 */
export function applyEvent(msg: ChatMessage, ev: Event): ChatMessage {
  switch (ev.type) {
    case "token":
      return { ...msg, content: msg.content + ev.text };
    case "thinking":
      return { ...msg, thinking: msg.thinking + ev.text };
    case "stats": {
      const { type: _type, ...stats } = ev;
      return { ...msg, stats };
    }
    case "done":
      return { ...msg, streaming: false, stopReason: ev.reason };
    case "error":
      return { ...msg, streaming: false, error: { code: ev.code, message: ev.message } };
    default:
      return msg;
  }
}

/**
 * What the model is asked: the system prompt (if any), then the conversation up to `upTo`
 * (exclusive). Failed or empty answers are left out together with the question before them,
 * so roles keep alternating as Gemma's template requires.
 */
export function toWire(system: string, messages: ChatMessage[], upTo = messages.length): Message[] {
  const out: Message[] = [];
  if (system.trim()) out.push({ role: "system", content: system });
  const turns = messages.slice(0, upTo);
  for (let i = 0; i < turns.length; i++) {
    const m = turns[i];
    if (m.role === "user") {
      const answer = turns[i + 1];
      const last = i === turns.length - 1;
      const user: Message = { role: "user", content: m.content };
      if (m.images?.length) user.images = m.images.map((i) => i.id);
      if (last) out.push(user);
      else if (answer?.role === "model" && !answer.error && answer.content.trim()) {
        out.push(user, { role: "model", content: answer.content });
        i += 1;
      }
    }
  }
  return out;
}

/** The conversation as a Markdown document (session export). */
export function toMarkdown(title: string, system: string, messages: ChatMessage[]): string {
  const parts = [`# ${title}`];
  if (system.trim()) parts.push(`> **System:** ${system.trim()}`);
  for (const m of messages) {
    if (m.role === "user") {
      const files = m.attachments?.length ? ` (attached: ${m.attachments.join(", ")})` : "";
      parts.push(`## You${files}\n\n${m.display ?? m.content}`);
    } else {
      const stats = m.stats
        ? `\n\n*${m.stats.generated_tokens} tokens · ${m.stats.decode_tok_per_s.toFixed(1)} tok/s · cache ${m.stats.cache_spec}*`
        : "";
      parts.push(`## Model\n\n${m.content}${stats}`);
    }
  }
  return parts.join("\n\n") + "\n";
}

/**
 * A conversation's title from the user's own words: the first line of what they typed in the
 * first message (never the attached documents' text), at most 48 characters. When they typed
 * nothing but attached files, the files' names.
 */
export function conversationTitle(messages: ChatMessage[], fallback = "New chat"): string {
  const first = messages.find((m) => m.role === "user");
  if (!first) return fallback;
  const typed = (first.attachments?.length ? (first.display ?? "") : first.content).trim();
  const line = typed.split("\n")[0].trim();
  if (line) return line.slice(0, 48);
  if (first.attachments?.length) return first.attachments.join(", ").slice(0, 48);
  return fallback;
}
