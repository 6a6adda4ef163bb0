// Streamed events applied once per painted frame, not once per token: the webview lays out
// and paints the answer at most once a frame whatever the token rate, which leaves the CPU to
// the engine (on a 2-core machine the webview rendering every token took most of a core).
// Events keep their order; `flush` applies what is pending at once (at the end of a stream).

/** Schedules `cb` for the next frame; returns nothing (cancellation is never needed). */
export type Schedule = (cb: () => void) => void;

/**
 * The next animation frame, or 100 ms if no frame comes first (a hidden or minimized window
 * paints no frames, and the answer must still move on).
 */
export const nextFrame: Schedule = (cb) => {
  let done = false;
  const once = () => {
    if (!done) {
      done = true;
      cb();
    }
  };
  if (typeof requestAnimationFrame === "function") requestAnimationFrame(once);
  setTimeout(once, 100);
};

export interface FrameBatch<T> {
  /** Queues `ev`; the batch is applied on the next frame. */
  push: (ev: T) => void;
  /** Applies the pending events now. */
  flush: () => void;
}

/** Collects events and hands them to `apply` in arrival order, one batch per frame. */
export function frameBatch<T>(apply: (events: T[]) => void, schedule: Schedule = nextFrame): FrameBatch<T> {
  let pending: T[] = [];
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (!pending.length) return;
    const batch = pending;
    pending = [];
    apply(batch);
  };
  return {
    push: (ev) => {
      pending.push(ev);
      if (!scheduled) {
        scheduled = true;
        schedule(flush);
      }
    },
    flush,
  };
}
