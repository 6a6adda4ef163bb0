import type { Activity, CacheTransfer, GenStats, TemplateSource } from "./api";

// Human-readable numbers for the UI: bytes in binary units, rates, durations.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** Formats a byte count with binary units and three significant digits ("1.50 GiB"). */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return "–";
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${value} B`;
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/** Formats a rate such as tokens per second ("41.3 tok/s"). */
export function formatRate(perSecond: number, unit = "tok/s"): string {
  if (!Number.isFinite(perSecond) || perSecond < 0) return "–";
  const digits = perSecond >= 100 ? 0 : 1;
  return `${perSecond.toFixed(digits)} ${unit}`;
}

/** Formats milliseconds ("850 ms", "1.25 s"). */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
}

/** Formats a large count with a metric suffix ("268M", "1.5B", "640"). */
export function formatCount(n: number): string {
  if (!Number.isFinite(n) || n < 0) return "–";
  const units: [number, string][] = [
    [1e9, "B"],
    [1e6, "M"],
    [1e3, "K"],
  ];
  for (const [size, suffix] of units) {
    if (n >= size) {
      const v = n / size;
      return `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(0) : v.toFixed(1)}${suffix}`;
    }
  }
  return String(Math.round(n));
}

/** Where an answer's cache came from, when that is news (held as left, or new, is not). */
const ORIGIN_TEXT: Partial<Record<GenStats["cache_origin"], string>> = {
  demoted: "demoted cache (the pool re-encoded it while idle)",
  restored: "cache restored from disk",
  dropped: "history read again (its cache had been dropped)",
  reread: "history read again (its rows had been coded lossily)",
};

/** The facts under an answer, in display order. */
export function statsParts(s: GenStats): { label: string; value: string }[] {
  const origin = ORIGIN_TEXT[s.cache_origin];
  return [
    // How much of the prompt the cache already held: a restored or continued conversation
    // reads only what is new.
    { label: "prompt", value: `${s.prompt_tokens} (${s.reused_tokens} cached)` },
    ...(origin ? [{ label: "from", value: origin }] : []),
    { label: "first token", value: formatMs(s.time_to_first_token_s * 1000) },
    { label: "prefill", value: formatRate(s.prefill_tok_per_s) },
    { label: "decode", value: formatRate(s.decode_tok_per_s) },
    { label: "tokens", value: String(s.generated_tokens) },
    { label: "KV", value: formatBytes(s.kv_bytes) },
    { label: "cache", value: s.cache_spec },
  ];
}

/** The line that says what saving or restoring a session's KV cache did. */
export function cacheTransferText(kind: "saved" | "restored", t: CacheTransfer): string {
  const tokens = t.cache.tokens.toLocaleString("en-US");
  const secs = `${t.secs.toFixed(t.secs < 10 ? 2 : 1)} s`;
  if (kind === "restored") return `Restored ${tokens} tokens from cache in ${secs}, instead of re-reading`;
  const dropped = t.dropped.length
    ? `; ${t.dropped.length} older saved ${t.dropped.length === 1 ? "cache" : "caches"} dropped to stay within the budget`
    : "";
  return `Saved ${tokens} tokens of cache (${formatBytes(t.cache.bytes)}, ${t.cache.spec}) in ${secs}${dropped}`;
}

/** What the status bar says for the engine's activity. */
export function activityLabel(a: Activity): string {
  const short = (p: string) => p.split(/[\\/]/).pop() ?? p;
  switch (a.state) {
    case "no_model":
      return "no model loaded";
    case "loading":
      return `loading ${short(a.source)}…`;
    case "ready":
      return `${a.model} · ready`;
    case "generating":
      return `${a.model} · generating`;
    case "failed":
      return `error: ${a.message}`;
  }
}

/** Where a prompt's template came from, in words (`null`: plain text, no template). */
export function templateLabel(t: TemplateSource | null): string {
  if (!t) return "plain text (no chat template: a base model continues it)";
  switch (t.kind) {
    case "gguf":
      return "the GGUF file's own chat template";
    case "jinja":
    case "tokenizer_config":
      return `chat template from ${t.path}`;
    case "builtin":
      return `the built-in ${t.family_name} template (the checkpoint ships none)`;
    case "custom":
      return "a custom chat template";
  }
}

/** What a TurboQuant cache still waiting to calibrate holds: f16 rows until it has seen the
 * model's calibration rows (`ModelCard.calibration_rows`, the engine's figure). */
export function calibratingLabel(rows: number | undefined): string {
  return rows ? `f16 until ${rows}` : "f16 until calibrated";
}

/** A Local API conversation's id (`api:CLIENT:NAME`): the name its client gave it, or, for
 * an unnamed one, the start of the random id it got. */
export function apiName(id: string): string {
  const parts = id.split(":");
  const name = parts.length >= 3 ? parts.slice(2).join(":") : id.replace(/^api:/, "");
  return /^[0-9a-f]{32}$/.test(name) ? `unnamed ${name.slice(0, 8)}…` : name;
}

/** The client part of a Local API conversation's id (a digest of its address and token). */
export function apiClient(id: string): string {
  const parts = id.split(":");
  return parts.length >= 3 ? parts[1] : "";
}
