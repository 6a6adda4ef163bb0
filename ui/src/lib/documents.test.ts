import { describe, expect, it } from "vitest";
import { DOCUMENT_ACCEPT, documentSummary } from "./documents";

describe("documentSummary", () => {
  it("names the kind and counts tokens, with pages for a PDF", () => {
    expect(documentSummary({ kind: "markdown", tokens: 1234 })).toBe("markdown · 1,234 tokens");
    expect(documentSummary({ kind: "pdf", pages: 2, tokens: 31 })).toBe("PDF · 2 pages · 31 tokens");
    expect(documentSummary({ kind: "pdf", pages: 1, tokens: 5 })).toBe("PDF · 1 page · 5 tokens");
  });
});

describe("DOCUMENT_ACCEPT", () => {
  it("offers PDFs, markdown, code and any text in the picker", () => {
    const accepted = DOCUMENT_ACCEPT.split(",");
    for (const a of [".pdf", "application/pdf", ".md", ".rs", "text/*"]) expect(accepted).toContain(a);
    expect(accepted).not.toContain(".png");
  });
});
