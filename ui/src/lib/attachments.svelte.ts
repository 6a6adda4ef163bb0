// The documents domain: files attached to the next message, each read and counted by the
// engine, with what each costs on top of the conversation. Refusals leave the chat untouched
// and show as a notice.

import * as api from "./api";
import type { DocumentFit, InspectedDocument } from "./api";
import { documentPayload, isImageFile } from "./documents";

/** What the attachments need to know of the rest of the app, read when they act. */
export interface AttachmentContext {
  /** Whether a model is loaded (costs need its tokenizer and cache). */
  loaded: boolean;
  /** Tokens kept free for the answer. */
  reserve: number;
  /** The largest file the engine accepts (the web view sends only a larger file's size). */
  maxBytes: number | undefined;
  /** The largest image it accepts, likewise. */
  maxImageBytes?: number;
  /** The conversation the documents join (a session's id). */
  conversation?: string;
}

export class AttachmentStore {
  attachments: InspectedDocument[] = $state([]);
  /** Each attachment's cost and fit, in attachment order (the engine's figures). */
  fits: DocumentFit[] = $state([]);
  notice = $state("");

  constructor(private context: () => AttachmentContext) {}

  /** Attaches a document the engine has read and counted; refusals leave the chat untouched. */
  async attach(read: () => Promise<InspectedDocument>): Promise<void> {
    try {
      const doc = await read();
      this.attachments.push(doc);
      this.notice = "";
      await this.refreshFits();
    } catch (e) {
      this.notice = api.errorText(e);
    }
  }

  /** Attaches files the web view holds (a DOM drop or the picker), one after another. */
  async attachFiles(files: File[]): Promise<void> {
    for (const f of files) {
      await this.attach(async () =>
        api.inspectDocumentBytes(
          f.name,
          await documentPayload(f, isImageFile(f) ? this.context().maxImageBytes : this.context().maxBytes),
          f.size,
        ),
      );
    }
  }

  /** Removes an attachment and recounts the others' costs. */
  async detach(doc: InspectedDocument): Promise<void> {
    this.attachments = this.attachments.filter((a) => a !== doc);
    await this.refreshFits();
  }

  /** Hands the attachments over (to a message being sent) and starts empty. */
  take(): InspectedDocument[] {
    const docs = this.attachments;
    this.clear();
    return docs;
  }

  clear(): void {
    this.attachments = [];
    this.fits = [];
    this.notice = "";
  }

  /** Asks the engine what each attachment costs on top of the conversation and those before it. */
  async refreshFits(): Promise<void> {
    const { loaded, reserve, conversation } = this.context();
    if (!loaded || !this.attachments.length) {
      this.fits = [];
      return;
    }
    try {
      this.fits = await api.documentFits(
        conversation ?? null,
        this.attachments.map((d) => d.tokens),
        reserve,
      );
    } catch (e) {
      this.fits = [];
      this.notice = api.errorText(e);
    }
  }
}
