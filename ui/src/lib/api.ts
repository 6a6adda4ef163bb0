// Typed bridge to the Tauri commands and events. Everything the UI asks of the app goes here.

import { invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";

export interface SystemInfo {
  total_memory_bytes: number;
  cpu_cores: number;
  os: string;
  engine_version: string;
}

export interface EngineStatus {
  state: string;
  label: string;
}

export interface ProcessMemorySample {
  t_ms: number;
  rss_bytes: number;
  virtual_bytes: number;
}

/** A command error as the app sends it: a stable code and a readable message. */
export interface CommandError {
  code: string;
  message: string;
}

export function isCommandError(e: unknown): e is CommandError {
  return typeof e === "object" && e !== null && "code" in e && "message" in e;
}

export const systemInfo = () => invoke<SystemInfo>("system_info");
export const engineStatus = () => invoke<EngineStatus>("engine_status");

export function onMemorySample(cb: (s: ProcessMemorySample) => void): Promise<UnlistenFn> {
  return listen<ProcessMemorySample>("memory-sample", (event) => cb(event.payload));
}
