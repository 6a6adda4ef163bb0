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
    use super::is_usable_locale;

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
