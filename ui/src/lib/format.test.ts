import { describe, expect, it } from "vitest";
import { FORMAT_BYTES_EXAMPLES } from "./bindings";
import { apiClient, apiName, calibratingLabel, formatBytes, formatRate, templateLabel } from "./format";

describe("formatBytes", () => {
  it("writes every size as the engine's format_bytes does", () => {
    expect(FORMAT_BYTES_EXAMPLES.length).toBeGreaterThan(10);
    for (const [bytes, text] of FORMAT_BYTES_EXAMPLES) expect(formatBytes(bytes), String(bytes)).toBe(text);
  });

  it("uses binary units with three significant digits", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(1023)).toBe("1023 B");
    expect(formatBytes(1024)).toBe("1.00 KiB");
    expect(formatBytes(1536 * 1024 * 1024)).toBe("1.50 GiB");
    expect(formatBytes(130 * 1024 * 1024)).toBe("130 MiB");
    expect(formatBytes(12.34 * 1024 * 1024)).toBe("12.3 MiB");
  });
  it("refuses nonsense", () => {
    expect(formatBytes(-1)).toBe("–");
    expect(formatBytes(Number.NaN)).toBe("–");
  });
});

describe("formatRate", () => {
  it("keeps one decimal below 100", () => {
    expect(formatRate(41.26)).toBe("41.3 tok/s");
    expect(formatRate(412.6)).toBe("413 tok/s");
  });
});

import { activityLabel, cacheTransferText, formatCount, formatMs, statsParts } from "./format";

describe("formatMs / formatCount", () => {
  it("switches units at sensible points", () => {
    expect(formatMs(849.6)).toBe("850 ms");
    expect(formatMs(1250)).toBe("1.25 s");
    expect(formatMs(12_340)).toBe("12.3 s");
    expect(formatCount(268_098_176)).toBe("268M");
    expect(formatCount(1_500_000_000)).toBe("1.5B");
    expect(formatCount(640)).toBe("640");
  });
});

describe("statsParts", () => {
  it("lists what each answer ran with", () => {
    const parts = statsParts({
      prompt_tokens: 20,
      reused_tokens: 0,
      prefill_tokens: 20,
      generated_tokens: 48,
      time_to_first_token_s: 0.312,
      prefill_tok_per_s: 154.2,
      decode_tok_per_s: 21.44,
      context_tokens: 68,
      max_context: 32768,
      kv_bytes: 3 * 1024 * 1024,
      kv_bytes_allocated: 4 * 1024 * 1024,
      kv_calibrating: false,
      cache_spec: "f16",
      cache_origin: "new",
    });
    expect(parts.map((p) => `${p.label} ${p.value}`)).toEqual([
      "prompt 20 (0 cached)",
      "first token 312 ms",
      "prefill 154 tok/s",
      "decode 21.4 tok/s",
      "tokens 48",
      "KV 3.00 MiB",
      "cache f16",
    ]);
  });
});

describe("cacheTransferText", () => {
  const t = (tokens: number, secs: number, dropped: string[] = []) => ({
    id: "s1",
    cache: { bytes: 3 * 1024 * 1024, tokens, spec: "tq3.5@all", saved_ms: 0 },
    secs,
    dropped,
  });
  it("says what a restore saved the user from", () => {
    expect(cacheTransferText("restored", t(16384, 0.31))).toBe("Restored 16,384 tokens from cache in 0.31 s, instead of re-reading");
  });
  it("says what a save wrote and what the budget dropped", () => {
    expect(cacheTransferText("saved", t(40, 0.004))).toBe("Saved 40 tokens of cache (3.00 MiB, tq3.5@all) in 0.00 s");
    expect(cacheTransferText("saved", t(40, 12.5, ["a", "b"]))).toBe(
      "Saved 40 tokens of cache (3.00 MiB, tq3.5@all) in 12.5 s; 2 older saved caches dropped to stay within the budget",
    );
  });
});

describe("activityLabel", () => {
  it("reads the engine's activity", () => {
    expect(activityLabel({ state: "loading", source: "/a/b/model.gguf" })).toBe("loading model.gguf…");
    expect(activityLabel({ state: "ready", model: "m" })).toBe("m · ready");
    expect(activityLabel({ state: "no_model" })).toBe("no model loaded");
    expect(activityLabel({ state: "failed", message: "bad file" })).toBe("error: bad file");
  });
});

describe("templateLabel", () => {
  it("names each source", () => {
    expect(templateLabel(null)).toMatch(/^plain text/);
    expect(templateLabel({ kind: "gguf" })).toBe("the GGUF file's own chat template");
    expect(templateLabel({ kind: "jinja", path: "/m/chat_template.jinja" })).toBe("chat template from /m/chat_template.jinja");
    expect(templateLabel({ kind: "builtin", family: "gemma4", family_name: "Gemma 4" })).toMatch(/built-in Gemma 4/);
  });
});

describe("calibratingLabel", () => {
  it("names the engine's calibration rows, and says so plainly without a card", () => {
    expect(calibratingLabel(512)).toBe("f16 until 512");
    expect(calibratingLabel(16)).toBe("f16 until 16");
    expect(calibratingLabel(undefined)).toBe("f16 until calibrated");
  });
});

describe("apiName", () => {
  it("names a Local API conversation as its client named it, apart from the client", () => {
    expect(apiName("api:0123456789abcdef:e2e-client")).toBe("e2e-client");
    expect(apiName("api:0123456789abcdef:a:b")).toBe("a:b");
    expect(apiClient("api:0123456789abcdef:e2e-client")).toBe("0123456789abcdef");
    expect(apiName("api:old")).toBe("old");
    expect(apiClient("api:old")).toBe("");
    expect(apiName("api:0123456789abcdef:6ba6cfe7b0d1931fd8ae6c14a2d7f0e1")).toBe("unnamed 6ba6cfe7…");
  });
});
