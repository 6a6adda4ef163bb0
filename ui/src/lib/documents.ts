// What the document picker offers and how an attached document is summed up. The app decides
// what it accepts from the file's bytes (src-tauri/src/documents.rs); this only narrows the
// picker to the likely files.

import type { InspectedDocument } from "./api";

const EXTENSIONS = [
  "txt", "text", "log", "csv", "md", "markdown", "mdx", "rs", "py", "js", "mjs", "ts", "tsx", "jsx", "svelte",
  "c", "h", "cpp", "hpp", "cc", "go", "java", "kt", "swift", "rb", "php", "sh", "bash", "toml", "yaml", "yml",
  "json", "html", "css", "sql", "lua", "zig", "pdf",
];

const IMAGES = ["png", "jpg", "jpeg", "gif", "webp"];

/** The `accept` attribute of the document picker: text of any kind, code, markdown, PDF and images. */
export const DOCUMENT_ACCEPT = [
  "text/*", "application/pdf", "image/png", "image/jpeg", "image/gif", "image/webp",
  ...EXTENSIONS.map((e) => `.${e}`), ...IMAGES.map((e) => `.${e}`),
].join(",");

/** Whether a file is an image by its name or type (the app decides by its bytes). */
export function isImageFile(file: Pick<File, "name" | "type">): boolean {
  const ext = file.name.split(".").pop()?.toLowerCase() ?? "";
  return file.type.startsWith("image/") || IMAGES.includes(ext);
}

/** One line about a document: its kind, pages for a PDF, and its tokens. */
export function documentSummary(doc: Pick<InspectedDocument, "kind" | "pages" | "tokens" | "image">): string {
  const parts: string[] = [doc.kind === "pdf" ? "PDF" : doc.kind];
  if (doc.image) parts.push(`${doc.image.width}×${doc.image.height}, read at ${doc.image.resized[0]}×${doc.image.resized[1]}`);
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
