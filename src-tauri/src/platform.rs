//! Process-level fixes that must happen before the webview starts.

/// WebKitGTK derives `navigator.language` from LANG/LC_ALL. Under the POSIX locale ("C",
/// common on servers, CI and Xvfb sessions) that becomes the invalid BCP 47 tag "C", and
/// `Intl.NumberFormat()` throws, which breaks any UI code that formats numbers. When no
/// usable language is set we fall back to en-US. Call before any thread is started.
pub fn ensure_valid_locale() {
    let current = std::env::var("LC_ALL")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| std::env::var("LANG").ok());
    if !is_usable_locale(current.as_deref()) {
        std::env::set_var("LANG", "en_US.UTF-8");
        std::env::remove_var("LC_ALL");
    }
}

/// WebKitGTK's variables that keep its rendering off GL. Without a GPU, GL is Mesa's
/// software rasterizer: composited through it, the webview took 90% of a core while an answer
/// streamed (tests/e2e/bench-app.mjs under Xvfb), and the engine's decode halved. Drawn in
/// shared memory it takes 40%.
pub const SOFTWARE_RENDERING_VARS: [&str; 2] = [
    "WEBKIT_DISABLE_DMABUF_RENDERER",
    "WEBKIT_DISABLE_COMPOSITING_MODE",
];

/// On Linux with no GPU render node (`/dev/dri/renderD*`), asks WebKitGTK to draw without
/// GL, unless the user set those variables themselves. A machine with a GPU is left as it
/// is. Call before any thread is started.
pub fn prefer_software_rendering_without_gpu() {
    if cfg!(target_os = "linux") {
        let has_gpu = std::fs::read_dir("/dev/dri")
            .map(|dir| {
                dir.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("renderD"))
            })
            .unwrap_or(false);
        for name in software_rendering_vars(has_gpu, |n| std::env::var_os(n).is_some()) {
            std::env::set_var(name, "1");
        }
    }
}

/// The variables to set: none with a GPU, otherwise those the user has not set.
pub fn software_rendering_vars(has_gpu: bool, is_set: impl Fn(&str) -> bool) -> Vec<&'static str> {
    if has_gpu {
        return Vec::new();
    }
    SOFTWARE_RENDERING_VARS
        .into_iter()
        .filter(|n| !is_set(n))
        .collect()
}

/// True when the POSIX locale name maps to a real language tag.
pub fn is_usable_locale(value: Option<&str>) -> bool {
    match value {
        None => false,
        Some(v) => {
            let lang = v.split(['.', '@']).next().unwrap_or("");
            !(lang.is_empty() || lang.eq_ignore_ascii_case("c") || lang == "POSIX")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_usable_locale, software_rendering_vars, SOFTWARE_RENDERING_VARS};

    #[test]
    fn software_rendering_only_without_a_gpu_and_never_over_the_users_choice() {
        assert!(software_rendering_vars(true, |_| false).is_empty());
        assert_eq!(
            software_rendering_vars(false, |_| false),
            SOFTWARE_RENDERING_VARS
        );
        assert_eq!(
            software_rendering_vars(false, |n| n == "WEBKIT_DISABLE_COMPOSITING_MODE"),
            ["WEBKIT_DISABLE_DMABUF_RENDERER"]
        );
    }

    #[test]
    fn posix_locales_are_not_usable_languages() {
        assert!(!is_usable_locale(None));
        assert!(!is_usable_locale(Some("")));
        assert!(!is_usable_locale(Some("C")));
        assert!(!is_usable_locale(Some("C.UTF-8")));
        assert!(!is_usable_locale(Some("POSIX")));
        assert!(is_usable_locale(Some("de_DE.UTF-8")));
        assert!(is_usable_locale(Some("en_GB")));
    }
}
