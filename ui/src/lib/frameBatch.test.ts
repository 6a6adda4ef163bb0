import { describe, expect, it } from "vitest";
import { frameBatch } from "./frameBatch";

/** A scheduler whose frames the test fires by hand. */
function manualFrames() {
  const queue: (() => void)[] = [];
  return {
    schedule: (cb: () => void) => void queue.push(cb),
    frame: () => queue.splice(0).forEach((cb) => cb()),
    waiting: () => queue.length,
  };
}

describe("frameBatch", () => {
  it("applies every event once, in order, one batch per frame", () => {
    const frames = manualFrames();
    const batches: number[][] = [];
    const b = frameBatch<number>((evs) => batches.push(evs), frames.schedule);
    for (let i = 0; i < 100; i++) b.push(i);
    // A hundred tokens within one frame: one frame scheduled, nothing applied yet.
    expect(frames.waiting()).toBe(1);
    expect(batches).toEqual([]);
    frames.frame();
    b.push(100);
    b.push(101);
    frames.frame();
    frames.frame();
    expect(batches.length).toBe(2);
    expect(batches.flat()).toEqual(Array.from({ length: 102 }, (_, i) => i));
  });

  it("flush applies what is pending at once, and a late frame then does nothing", () => {
    const frames = manualFrames();
    const batches: string[][] = [];
    const b = frameBatch<string>((evs) => batches.push(evs), frames.schedule);
    b.push("a");
    b.push("done");
    b.flush();
    expect(batches).toEqual([["a", "done"]]);
    frames.frame();
    expect(batches).toEqual([["a", "done"]]);
    // After a flush the next event schedules a new frame.
    b.push("b");
    expect(frames.waiting()).toBe(1);
    frames.frame();
    expect(batches).toEqual([["a", "done"], ["b"]]);
  });
});
