// The timeline domain: the memory samples the engine sends every 500 ms (the conversation on
// screen's figures, every conversation the engine holds), the markers of switches and of the
// pool's moves, and the chart's x axis. A conversation's timeline is saved with its session.

import type { ConversationInfo, MemorySample, SwitchEvent } from "../api";
import { MemoryTimeline, markerOf, sampleValues, type XAxis } from "../timeline";

export class TimelineStore {
  series = new MemoryTimeline();
  /** Bumped at every change of `series` (which is not itself reactive). */
  version = $state(0);
  xAxis: XAxis = $state("time");
  /** The last sample, its figures those of the conversation on screen. */
  lastSample: MemorySample | null = $state(null);
  /** Every conversation the engine holds, as the last sample listed them. */
  conversations: ConversationInfo[] = $state([]);

  /** Conversation `id` in the engine, if it holds it. */
  conversation(id: string): ConversationInfo | undefined {
    return this.conversations.find((c) => c.id === id);
  }

  /** A sample: the engine samples all conversations; the figures that name one are those of
   * `current` (its cache named `spec` until the engine holds it). */
  onSample(s: MemorySample, current: string, spec: string): void {
    const mine = s.conversations.find((c) => c.id === current);
    this.conversations = s.conversations;
    this.lastSample = {
      ...s,
      tokens_in_context: mine?.tokens ?? 0,
      cache_spec: mine?.spec ?? spec,
      calibrating: mine?.calibrating ?? false,
    };
    this.series.push({ tMs: s.t_ms, tokens: mine?.tokens ?? 0, values: sampleValues(s, current) });
    this.version += 1;
  }

  /** A switch, demotion, spill, restore or drop, marked where it happened. */
  mark(m: SwitchEvent): void {
    this.series.mark(markerOf(m));
    this.version += 1;
  }

  /** An empty timeline (a new chat). */
  clear(): void {
    this.series = new MemoryTimeline();
    this.version += 1;
  }

  /** A saved conversation's timeline. A sample with no values breaks every line, so the
   * saved past and the live present are not joined by a misleading straight line. */
  restore(saved: ReturnType<MemoryTimeline["toJSON"]>, nowMs: number): void {
    this.series = MemoryTimeline.fromJSON(saved);
    if (this.series.length) this.series.push({ tMs: nowMs, tokens: 0, values: {} });
    this.version += 1;
  }
}
