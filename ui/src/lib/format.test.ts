import { describe, expect, it } from "vitest";
import { formatBytes, formatRate } from "./format";

describe("formatBytes", () => {
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

import { formatCount, formatMs, statsParts } from "./format";

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
      ttft_ms: 312,
      prefill_tok_s: 154.2,
      decode_tok_s: 21.44,
      decode_tokens: 48,
      kv_bytes: 3 * 1024 * 1024,
      cache_policy: "f16",
    });
    expect(parts.map((p) => `${p.label} ${p.value}`)).toEqual([
      "first token 312 ms",
      "prefill 154 tok/s",
      "decode 21.4 tok/s",
      "tokens 48",
      "KV 3.00 MiB",
      "cache f16",
    ]);
  });
});
