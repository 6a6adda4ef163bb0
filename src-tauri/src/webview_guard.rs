//! The web view runs nothing it is sent and never leaves the app: model output and restored
//! sessions are sanitized in the UI (`ui/src/lib/markdown.ts`), the CSP in `tauri.conf.json`
//! allows no inline script and no remote origin, this plugin refuses every navigation away
//! from the app's own pages (a link in an answer opens nothing), and the capability grants
//! only the commands the UI invokes (`ui_commands.rs`). The tests below keep all three so.

use tauri::plugin::{Builder, TauriPlugin};
use tauri::{Runtime, Url};

/// Whether `url` is one of the app's own pages: the bundled UI (`tauri://localhost` on Linux
/// and macOS, `http://tauri.localhost` on Windows) or, in a dev build, the Vite server.
pub fn stays_in_app(url: &Url) -> bool {
    match (url.scheme(), url.host_str(), url.port()) {
        ("tauri", Some("localhost"), None) => true,
        ("http" | "https", Some("tauri.localhost"), None) => true,
        ("http", Some("localhost"), Some(5173)) => !cfg!(feature = "custom-protocol"),
        _ => false,
    }
}

/// The plugin that cancels any navigation [`stays_in_app`] refuses.
pub fn plugin<R: Runtime>() -> TauriPlugin<R> {
    Builder::new("webview-guard")
        .on_navigation(|_, url| {
            let ok = stays_in_app(url);
            if !ok {
                tracing::warn!(%url, "navigation away from the app refused");
            }
            ok
        })
        .build()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    include!("ui_commands.rs");

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn only_the_apps_own_pages_are_navigable() {
        for ok in [
            "tauri://localhost",
            "tauri://localhost/index.html",
            "http://tauri.localhost/",
        ] {
            assert!(stays_in_app(&url(ok)), "{ok}");
        }
        for no in [
            "https://example.com/",
            "http://127.0.0.1:8080/x",
            "javascript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "file:///etc/passwd",
            "tauri://evil.example",
            "http://tauri.localhost.evil.example/",
            "http://tauri.localhost:8080/",
            "about:blank",
        ] {
            assert!(!stays_in_app(&url(no)), "{no}");
        }
    }

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    /// The CSP's directives, each with its sources.
    fn csp() -> Vec<(String, Vec<String>)> {
        let conf: Value =
            serde_json::from_str(&std::fs::read_to_string(root().join("tauri.conf.json")).unwrap())
                .unwrap();
        let csp = conf["app"]["security"]["csp"].as_str().unwrap().to_owned();
        csp.split(';')
            .map(|d| {
                let mut words = d.split_whitespace().map(str::to_owned);
                (words.next().unwrap(), words.collect())
            })
            .collect()
    }

    #[test]
    fn the_csp_allows_no_inline_script_and_no_remote_origin() {
        let csp = csp();
        let get = |name: &str| {
            csp.iter()
                .find(|(d, _)| d == name)
                .map(|(_, s)| s.clone())
                .unwrap_or_else(|| panic!("no {name} in the CSP"))
        };
        assert_eq!(get("default-src"), ["'self'"]);
        assert_eq!(get("script-src"), ["'self'"], "no inline or eval'd script");
        for d in ["object-src", "base-uri", "form-action", "frame-ancestors"] {
            assert_eq!(get(d), ["'none'"], "{d}");
        }
        // Local sources only: the app, inline data, and Tauri's IPC.
        let local = [
            "'self'",
            "'none'",
            "data:",
            "blob:",
            "ipc:",
            "http://ipc.localhost",
        ];
        for (directive, sources) in &csp {
            for s in sources {
                let inline_style = directive == "style-src" && s == "'unsafe-inline'";
                assert!(
                    local.contains(&s.as_str()) || inline_style,
                    "{directive} allows {s}"
                );
            }
        }
    }

    /// Every command name the UI's sources pass to `invoke`.
    fn invoked_by_the_ui() -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let mut stack = vec![root().join("ui/src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.to_string_lossy();
                if name.ends_with(".test.ts") || name.ends_with("bindings.ts") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for (i, _) in text.match_indices("invoke<") {
                    // invoke<T>("name", …): the first string literal after the call.
                    let rest = &text[i..];
                    let Some(open) = rest.find("(\"") else {
                        continue;
                    };
                    let name = &rest[open + 2..];
                    let name = &name[..name.find('"').unwrap()];
                    found.insert(name.to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn the_capability_grants_exactly_the_commands_the_ui_invokes() {
        let ui = invoked_by_the_ui();
        let listed: BTreeSet<String> = UI_COMMANDS.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            ui, listed,
            "ui_commands.rs and the UI's invoke calls differ"
        );
        let cap: Value = serde_json::from_str(
            &std::fs::read_to_string(root().join("src-tauri/capabilities/default.json")).unwrap(),
        )
        .unwrap();
        let granted: Vec<&str> = cap["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().expect("plain permission names"))
            .collect();
        let commands: BTreeSet<String> = granted
            .iter()
            .filter_map(|p| p.strip_prefix("allow-"))
            .map(|p| p.replace('-', "_"))
            .collect();
        assert_eq!(commands, listed);
        // Beyond the app's commands, only the event system (listen/unlisten).
        let others: Vec<&&str> = granted
            .iter()
            .filter(|p| !p.starts_with("allow-"))
            .collect();
        assert_eq!(others, [&"core:event:default"]);
        // Only the main window, and no remote URL may use them.
        assert_eq!(cap["windows"], serde_json::json!(["main"]));
        assert!(cap.get("remote").is_none());
    }
}
