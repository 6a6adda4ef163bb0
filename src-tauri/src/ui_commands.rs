// The app commands the web view may call, and no others: `build.rs` turns each into an
// `allow-…` permission, `capabilities/default.json` grants exactly these, and
// `webview_guard`'s tests check both against the commands the UI's sources invoke.
// (Included by build.rs and by the library, so plain items only.)

/// Every command the UI invokes, in snake_case.
pub const UI_COMMANDS: &[&str] = &[
    "cache_options",
    "cancel_download",
    "compare",
    "context_costs",
    "default_model",
    "delete_session",
    "drop_session_cache",
    "document_fits",
    "engine_status",
    "export_file",
    "generate",
    "hub_models",
    "hub_quants",
    "inspect_document_bytes",
    "inspect_document_path",
    "inspect_model",
    "list_sessions",
    "load_model",
    "load_session",
    "pick_model",
    "preview_prompt",
    "rename_session",
    "restore_session_cache",
    "save_session",
    "save_session_cache",
    "server_start",
    "server_status",
    "server_stop",
    "set_kv_budget",
    "set_parallel",
    "start_download",
    "stop_compare",
    "stop_generation",
    "switch_cache",
    "system_info",
    "ui_theme",
];
