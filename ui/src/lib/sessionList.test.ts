import { beforeEach, describe, expect, it, vi } from "vitest";

// Saved sessions as the app's store keeps them; a failure is switched on per test.
const disk = vi.hoisted(() => ({
  sessions: [] as { id: string; title: string; updated_ms: number }[],
  unreadable: [] as { code: string; message: string }[],
  fail: "",
}));
vi.mock("./api", async (importOriginal) => {
  const real = await importOriginal<typeof import("./api")>();
  const refuse = (what: string) => {
    if (disk.fail === what) throw { code: "io", message: `${what} failed` };
  };
  return {
    ...real,
    listSessions: vi.fn(async () => {
      refuse("list");
      const out = { sessions: [...disk.sessions], unreadable: disk.unreadable };
      disk.unreadable = [];
      return out;
    }),
    renameSession: vi.fn(async (id: string, title: string) => {
      refuse("rename");
      disk.sessions = disk.sessions.map((s) => (s.id === id ? { ...s, title } : s));
    }),
    deleteSession: vi.fn(async (id: string) => {
      refuse("delete");
      disk.sessions = disk.sessions.filter((s) => s.id !== id);
    }),
  };
});

const { SessionListStore } = await import("./sessionList.svelte");

describe("SessionListStore", () => {
  let current = "a";
  let title = "";
  let deleted = 0;
  const store = () =>
    new SessionListStore({
      currentId: () => current,
      renamed: (t) => (title = t),
      deleted: async () => {
        deleted += 1;
      },
    });
  beforeEach(() => {
    disk.sessions = [
      { id: "a", title: "First", updated_ms: 2 },
      { id: "b", title: "Second", updated_ms: 1 },
    ];
    disk.unreadable = [{ code: "bad_session", message: "x.json set aside" }];
    disk.fail = "";
    current = "a";
    title = "";
    deleted = 0;
  });

  it("lists sessions and keeps unreadable files reported once until dismissed", async () => {
    const s = store();
    await s.refresh();
    await s.refresh();
    expect(s.sessions.map((x) => x.id)).toEqual(["a", "b"]);
    expect(s.unreadable).toEqual([{ code: "bad_session", message: "x.json set aside" }]);
  });

  it("renames the conversation on screen too, trimmed, and never to blank", async () => {
    const s = store();
    await s.rename("a", "  Plans  ");
    expect(title).toBe("Plans");
    expect(s.sessions.find((x) => x.id === "a")?.title).toBe("  Plans  ");
    await s.rename("b", "   ");
    expect(s.sessions.find((x) => x.id === "b")?.title).toBe("Second");
    await s.rename("b", "Other");
    expect(title).toBe("Plans");
  });

  it("deleting the conversation on screen starts a new one; a failure keeps the list and says so", async () => {
    const s = store();
    await s.delete("b");
    expect(deleted).toBe(0);
    await s.delete("a");
    expect(deleted).toBe(1);
    expect(s.sessions).toEqual([]);
    disk.sessions = [{ id: "c", title: "Third", updated_ms: 3 }];
    await s.refresh();
    disk.fail = "delete";
    await s.delete("c");
    expect(s.error).toBe("Not deleted: delete failed");
    expect(s.sessions.map((x) => x.id)).toEqual(["c"]);
  });
});
