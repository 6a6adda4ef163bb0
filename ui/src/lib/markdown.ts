// Model output (and restored sessions, which anyone can edit) as safe HTML: markdown through
// `marked`, then DOMPurify, because the text can hold raw HTML — <script>, event handlers,
// javascript: and data: links, SVG with script, images that would call a server — and none of
// it may run or load. What survives is text, formatting and http(s)/mailto links, and links
// open nothing (`inertLinkClick`): the URL shows on hover. The CSP and the app's navigation
// guard (src-tauri/src/webview_guard.rs) stand behind this.

import DOMPurify from "dompurify";
import { Marked } from "marked";

const marked = new Marked({ gfm: true, breaks: true, async: false });

const PURIFY = {
  // HTML only: no SVG and no MathML, where script and odd URL attributes hide.
  USE_PROFILES: { html: true },
  // Nothing that loads a resource, submits, embeds or styles.
  FORBID_TAGS: ["style", "form", "input", "button", "iframe", "img", "picture", "source", "video", "audio", "track", "object", "embed", "link", "meta", "base"],
  FORBID_ATTR: ["style", "srcset", "target", "ping", "formaction", "background", "poster"],
  // URLs: web and mail links and in-page anchors only (no javascript:, data:, file:, blob:).
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName !== "A") return;
  const href = node.getAttribute("href");
  node.setAttribute("rel", "noopener noreferrer");
  if (href) node.setAttribute("title", href);
});

export function renderMarkdown(text: string): string {
  return DOMPurify.sanitize(marked.parse(text) as string, PURIFY) as string;
}

/**
 * A click or middle-click on a link inside rendered model output: the web view does not
 * follow it (the app's navigation guard would refuse it anyway).
 */
export function inertLinkClick(e: MouseEvent): void {
  if (e.target instanceof Element && e.target.closest("a")) e.preventDefault();
}
