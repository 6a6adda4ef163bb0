// The sessions domain: the saved conversations the sidebar lists, the files that could not be
// read, and renaming and deleting them. Opening and saving a session touch the conversation
// itself, so the app store does those and reports their errors here.

import * as api from "./api";
import type { SessionSummary, UnreadableSession } from "./api";

/** What renaming or deleting the current conversation changes outside the list. */
export interface SessionListHooks {
  /** The id of the conversation on screen. */
  currentId: () => string;
  /** The current conversation was renamed. */
  renamed: (title: string) => void;
  /** The current conversation was deleted. */
  deleted: () => Promise<void>;
}

export class SessionListStore {
  sessions: SessionSummary[] = $state([]);
  error = $state("");
  /** Session files set aside as unreadable, kept until dismissed. */
  unreadable: UnreadableSession[] = $state([]);

  constructor(private hooks: SessionListHooks) {}

  async refresh(): Promise<void> {
    try {
      const list = await api.listSessions();
      this.sessions = list.sessions;
      // A set-aside file is reported once (it is no longer listed): keep it until dismissed.
      this.unreadable = [...this.unreadable, ...list.unreadable];
    } catch (e) {
      this.sessions = [];
      this.error = `Sessions not listed: ${api.errorText(e)}`;
    }
  }

  async rename(id: string, title: string): Promise<void> {
    if (!title.trim()) return;
    try {
      await api.renameSession(id, title);
      this.error = "";
    } catch (e) {
      this.error = `Not renamed: ${api.errorText(e)}`;
      return;
    }
    if (id === this.hooks.currentId()) this.hooks.renamed(title.trim());
    await this.refresh();
  }

  async delete(id: string): Promise<void> {
    try {
      await api.deleteSession(id);
      this.error = "";
    } catch (e) {
      this.error = `Not deleted: ${api.errorText(e)}`;
      return;
    }
    if (id === this.hooks.currentId()) await this.hooks.deleted();
    await this.refresh();
  }
}
