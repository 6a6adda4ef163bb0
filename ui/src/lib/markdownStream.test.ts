import { describe, expect, it } from "vitest";
import { Marked } from "marked";
import { StreamingMarkdown } from "./markdownStream";

// The app's markdown settings, without the sanitizer (DOMPurify needs a DOM; vitest runs in
// node). The streaming logic is the same whatever the renderer.
const marked = new Marked({ gfm: true, breaks: true, async: false });
const render = (md: string) => marked.parse(md) as string;

/** A renderer that counts the characters it was given. */
function counting() {
  const c = { chars: 0, calls: 0, render: (md: string) => ((c.chars += md.length), c.calls++, render(md)) };
  return c;
}

/** Streams `text` in tokens of `size` characters; returns the HTML after each token. */
function stream(sm: StreamingMarkdown, text: string, size: number): string[] {
  const out: string[] = [];
  for (let end = size; end < text.length + size; end += size) out.push(sm.update(text.slice(0, end)));
  return out;
}

const DOC = [
  "# Down the rabbit hole",
  "",
  "Alice was beginning to get **very** tired of sitting by her sister on the bank.",
  "",
  "```rust",
  "fn main() {",
  "",
  "    println!(\"a blank line inside a fence is not a block boundary\");",
  "}",
  "```",
  "",
  "- a tight list",
  "- of two items",
  "",
  "> a quote with `code` and a [link](https://example.org).",
  "",
  "The end.",
].join("\n");

describe("StreamingMarkdown", () => {
  it("renders a streamed text exactly as one render of the whole, at every token", () => {
    const sm = new StreamingMarkdown(render);
    for (const size of [1, 3, 7]) {
      const htmls = stream(sm, DOC, size);
      expect(htmls[htmls.length - 1]).toBe(render(DOC));
      // Mid-stream too, wherever the text stands (the tail is rendered as it is).
      for (const end of [40, 120, 150, 200]) {
        const s = new StreamingMarkdown(render);
        stream(s, DOC.slice(0, end), size);
        expect(s.update(DOC.slice(0, end))).toBe(render(DOC.slice(0, end)));
      }
    }
  });

  it("never cuts inside a code fence", () => {
    const sm = new StreamingMarkdown(render);
    const open = "Intro.\n\n```\nfirst\n\nsecond\n";
    const html = stream(sm, open, 2).pop()!;
    // One <pre> holding both lines: the blank line inside the fence did not end a block.
    expect(html.match(/<pre>/g)).toHaveLength(1);
    expect(html).toContain("first\n\nsecond");
  });

  it("parses each block once: work per token is the open block, not the answer", () => {
    const paragraph = "The Rabbit actually took a watch out of its waistcoat-pocket, and looked at it.";
    const text = Array.from({ length: 200 }, (_, i) => `Paragraph ${i}: ${paragraph}`).join("\n\n") + "\n";
    const token = 4;
    const c = counting();
    const htmls = stream(new StreamingMarkdown(c.render), text, token);
    expect(htmls[htmls.length - 1]).toBe(render(text));
    const tokens = Math.ceil(text.length / token);
    const naive = Array.from({ length: tokens }, (_, i) => Math.min((i + 1) * token, text.length)).reduce((a, b) => a + b, 0);
    // Each finished block is rendered once, and each token re-renders at most its open block.
    expect(c.chars).toBeLessThanOrEqual(text.length + tokens * (paragraph.length + 16));
    expect(naive / c.chars).toBeGreaterThan(50);
  });

  it("keeps the finished blocks' HTML the same string until another block ends", () => {
    const sm = new StreamingMarkdown(render);
    const first = sm.parts("One.\n\nTwo, still");
    const second = sm.parts("One.\n\nTwo, still open");
    // The page keeps the finished blocks' nodes only if their HTML is the identical string.
    expect(second.done).toBe(first.done);
    expect(second.done).toBe(render("One.\n\n"));
    expect(second.open).toBe(render("Two, still open"));
    const third = sm.parts("One.\n\nTwo, still open.\n\nThree");
    expect(third.done).toBe(render("One.\n\n") + render("Two, still open.\n\n"));
    expect(third.done + third.open).toBe(render("One.\n\nTwo, still open.\n\nThree"));
  });

  it("starts over for a text that is not a continuation (a regenerated answer)", () => {
    const sm = new StreamingMarkdown(render);
    stream(sm, DOC, 5);
    const other = "A different answer.\n\nWith two paragraphs.";
    expect(sm.update(other)).toBe(render(other));
  });

  it("renders the finished text whole, once", () => {
    const c = counting();
    const sm = new StreamingMarkdown(c.render);
    // A loose list: markdown joins its items across the blank line, which block-wise
    // rendering cannot know while streaming; the finished message is exact.
    const loose = "- one\n\n- two\n";
    stream(sm, loose, 2);
    c.calls = 0;
    expect(sm.finish(loose)).toBe(render(loose));
    expect(c.calls).toBe(1);
  });
});
