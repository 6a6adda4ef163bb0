// What the document picker offers and how an attached document is summed up. The app decides
// what it accepts from the file's bytes (src-tauri/src/documents.rs); this only narrows the
// picker to the likely files.

import type { InspectedDocument } from "./api";

const EXTENSIONS = [
  "txt", "text", "log", "csv", "md", "markdown", "mdx", "rs", "py", "js", "mjs", "ts", "tsx", "jsx", "svelte",
  "c", "h", "cpp", "hpp", "cc", "go", "java", "kt", "swift", "rb", "php", "sh", "bash", "toml", "yaml", "yml",
  "json", "html", "css", "sql", "lua", "zig", "pdf",
];

/** The `accept` attribute of the document picker: text of any kind, code, markdown and PDF. */
export const DOCUMENT_ACCEPT = ["text/*", "application/pdf", ...EXTENSIONS.map((e) => `.${e}`)].join(",");

/** One line about a document: its kind, pages for a PDF, and its tokens. */
export function documentSummary(doc: Pick<InspectedDocument, "kind" | "pages" | "tokens">): string {
  const parts: string[] = [doc.kind === "pdf" ? "PDF" : doc.kind];
  if (doc.pages !== undefined) parts.push(`${doc.pages.toLocaleString("en-US")} ${doc.pages === 1 ? "page" : "pages"}`);
  parts.push(`${doc.tokens.toLocaleString("en-US")} tokens`);
  return parts.join(" · ");
}

/**
 * The bytes of `file` to send for reading: none when the app's limit (`maxBytes`, from
 * system_info) already refuses it by its size, so a 200 MB file is never copied over IPC.
 */
export async function documentPayload(file: Pick<File, "size" | "arrayBuffer">, maxBytes: number | undefined): Promise<number[]> {
  if (maxBytes !== undefined && file.size > maxBytes) return [];
  return Array.from(new Uint8Array(await file.arrayBuffer()));
}
