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
