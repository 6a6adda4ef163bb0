import { describe, expect, it } from "vitest";
import type { DownloadUpdate } from "./api";
import { REPO_ID_EXAMPLES } from "./bindings";
import { fileLine, formatEta, formatSpeed, isRepoId, offerOffline, percent, progressLine } from "./download";

const update = (over: Partial<DownloadUpdate> = {}): DownloadUpdate => ({
  repo: "google/gemma-4-E2B-it",
  file: "model.safetensors",
  file_done: 512 * 1024,
  file_total: 1024 * 1024,
  done: 3 * 1024 * 1024,
  total: 4 * 1024 * 1024,
  bytes_per_sec: 1.5 * 1024 * 1024,
  eta_secs: 0.66,
  ...over,
});

describe("isRepoId", () => {
  it("takes exactly the ids the engine takes", () => {
    expect(REPO_ID_EXAMPLES.length).toBeGreaterThan(10);
    for (const [id, ok] of REPO_ID_EXAMPLES) expect(isRepoId(id), JSON.stringify(id)).toBe(ok);
  });

  it("accepts owner/name with an optional revision", () => {
    for (const ok of ["google/gemma-4-E2B-it", "a/b", "google/gemma-3-270m@main", " org.x/model_v1.5 "]) {
      expect(isRepoId(ok), ok).toBe(true);
    }
  });
  it("refuses paths and malformed ids", () => {
    for (const bad of ["", "gemma", "a/b/c", "/abs/path", "./x", "a/.hidden", "a/b@", "a/b@c@d", "a b/c"]) {
      expect(isRepoId(bad), bad).toBe(false);
    }
  });
});

describe("percent", () => {
  it("rounds down to one decimal and clamps", () => {
    expect(percent(0, 100)).toBe(0);
    expect(percent(1, 3)).toBe(33.3);
    expect(percent(2, 3)).toBe(66.6);
    expect(percent(999, 1000)).toBe(99.9);
    expect(percent(1000, 1000)).toBe(100);
    expect(percent(1200, 1000)).toBe(100);
  });
  it("is 0 while the total is unknown", () => {
    expect(percent(10, 0)).toBe(0);
    expect(percent(Number.NaN, 10)).toBe(0);
  });
});

describe("formatSpeed", () => {
  it("uses binary units per second", () => {
    expect(formatSpeed(1.5 * 1024 * 1024)).toBe("1.50 MiB/s");
    expect(formatSpeed(800)).toBe("800 B/s");
    expect(formatSpeed(0)).toBe("0 B/s");
  });
  it("says nothing before the speed is known", () => {
    expect(formatSpeed(null)).toBe("–");
    expect(formatSpeed(Number.POSITIVE_INFINITY)).toBe("–");
  });
});

describe("formatEta", () => {
  it("rounds up and picks the unit", () => {
    expect(formatEta(0)).toBe("0 s");
    expect(formatEta(0.2)).toBe("1 s");
    expect(formatEta(59)).toBe("59 s");
    expect(formatEta(185)).toBe("3 min 05 s");
    expect(formatEta(2 * 3600 + 7 * 60 + 30)).toBe("2 h 07 min");
  });
  it("says nothing when unknown", () => {
    expect(formatEta(null)).toBe("–");
    expect(formatEta(-1)).toBe("–");
  });
});

describe("progress lines", () => {
  it("show percentage, bytes, speed and time left", () => {
    expect(progressLine(update())).toBe("75.0 % · 3.00 MiB of 4.00 MiB · 1.50 MiB/s · 1 s left");
    expect(progressLine(update({ bytes_per_sec: null, eta_secs: null, done: 0 }))).toBe("0.0 % · 0 B of 4.00 MiB · – · – left");
    expect(fileLine(update())).toBe("model.safetensors (512 KiB of 1.00 MiB)");
  });
  it("offer the offline model only when the Hub is unreachable", () => {
    expect(offerOffline("network")).toBe(true);
    expect(offerOffline("model_not_found")).toBe(false);
    expect(offerOffline("cancelled")).toBe(false);
    expect(offerOffline(undefined)).toBe(false);
  });
});
