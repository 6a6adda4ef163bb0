// Markdown for a text that grows a token at a time, without re-parsing the whole answer per
// token. The text is cut at its last block boundary — a blank line outside a code fence —
// and everything before the cut is rendered once and kept; only the open block after it is
// rendered again as tokens arrive. Work per token is the size of that block, not of the answer.
//
// Rendering blocks apart can differ from one render of the whole text where markdown joins
// blocks across a blank line (a loose list, a reference-style link defined later), so the
// finished message is rendered whole, once (`finish`).

/** The renderer the blocks go through (markdown.ts's `renderMarkdown`; a pure one in tests). */
export type RenderFn = (markdown: string) => string;

/** A fence opener or closer: three or more backticks or tildes at a line's start. */
const FENCE = /^ {0,3}(`{3,}|~{3,})/;

export class StreamingMarkdown {
  private readonly render: RenderFn;
  /** The source already rendered into `doneHtml`; always ends at a block boundary. */
  private doneSource = "";
  private doneHtml = "";
  /** The complete lines scanned for boundaries so far, and the fence state after them. */
  private scannedSource = "";
  private inFence = false;
  private lastCut = 0;

  constructor(render: RenderFn) {
    this.render = render;
  }

  /** HTML for `text`, which is the previous text with more appended (or a new text). */
  update(text: string): string {
    const { done, open } = this.parts(text);
    return done + open;
  }

  /**
   * `update`'s HTML in two parts: the finished blocks, which change only when a block ends
   * (the same string otherwise, so the page keeps their nodes), and the open block.
   */
  parts(text: string): { done: string; open: string } {
    if (!text.startsWith(this.scannedSource)) this.reset();
    const cut = this.lastBoundary(text);
    if (cut > this.doneSource.length) {
      this.doneHtml += this.render(text.slice(this.doneSource.length, cut));
      this.doneSource = text.slice(0, cut);
    }
    const tail = text.slice(this.doneSource.length);
    return { done: this.doneHtml, open: tail.trim() ? this.render(tail) : "" };
  }

  /** HTML for the finished text: one render of the whole, exactly as a restored message. */
  finish(text: string): string {
    this.reset();
    return this.render(text);
  }

  private reset(): void {
    this.doneSource = "";
    this.doneHtml = "";
    this.scannedSource = "";
    this.inFence = false;
    this.lastCut = 0;
  }

  /**
   * The end of the last blank line outside a fence, at or after the rendered part. Scans only
   * the complete lines not seen before, so the whole text is scanned once over the stream.
   */
  private lastBoundary(text: string): number {
    let pos = this.scannedSource.length;
    for (;;) {
      const nl = text.indexOf("\n", pos);
      if (nl < 0) break; // the last line is still being written
      const line = text.slice(pos, nl);
      if (FENCE.test(line)) this.inFence = !this.inFence;
      else if (!this.inFence && line.trim() === "" && pos > 0) this.lastCut = nl + 1;
      pos = nl + 1;
    }
    this.scannedSource = text.slice(0, pos);
    return Math.max(this.lastCut, this.doneSource.length);
  }
}
