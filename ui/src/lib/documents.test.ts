import { describe, expect, it } from "vitest";
import { DOCUMENT_ACCEPT, isImageFile, documentPayload, documentSummary } from "./documents";

describe("documentSummary", () => {
  it("names the kind and counts tokens, with pages for a PDF", () => {
    expect(documentSummary({ kind: "markdown", tokens: 1234 })).toBe("markdown · 1,234 tokens");
    expect(documentSummary({ kind: "pdf", pages: 2, tokens: 31 })).toBe("PDF · 2 pages · 31 tokens");
    expect(documentSummary({ kind: "pdf", pages: 1, tokens: 5 })).toBe("PDF · 1 page · 5 tokens");
  });
});

describe("DOCUMENT_ACCEPT", () => {
  it("offers PDFs, markdown, code, any text and the images a model may read in the picker", () => {
    const accepted = DOCUMENT_ACCEPT.split(",");
    for (const a of [".pdf", "application/pdf", ".md", ".rs", "text/*", ".png", ".jpg", ".webp", "image/gif"]) expect(accepted).toContain(a);
    for (const a of [".zip", ".exe", ".gguf", "image/*", "image/svg+xml"]) expect(accepted).not.toContain(a);
  });
  it("tells images from documents by type or name", () => {
    expect(isImageFile({ name: "a.JPG", type: "" })).toBe(true);
    expect(isImageFile({ name: "shot", type: "image/png" })).toBe(true);
    expect(isImageFile({ name: "notes.txt", type: "text/plain" })).toBe(false);
  });
});

describe("documentPayload", () => {
  const file = (bytes: number[]) => ({
    size: bytes.length,
    arrayBuffer: async () => new Uint8Array(bytes).buffer,
  });
  it("sends a file within the limit whole", async () => {
    expect(await documentPayload(file([104, 105]), 4)).toEqual([104, 105]);
    expect(await documentPayload(file([1, 2, 3, 4]), 4)).toEqual([1, 2, 3, 4]);
  });
  it("sends nothing of a file over the limit, without reading it", async () => {
    const huge = { size: 200_000_000, arrayBuffer: () => Promise.reject(new Error("read")) };
    expect(await documentPayload(huge, 4 * 1024 * 1024)).toEqual([]);
  });
  it("sends the bytes while the limit is not known yet", async () => {
    expect(await documentPayload(file([7]), undefined)).toEqual([7]);
  });
});
