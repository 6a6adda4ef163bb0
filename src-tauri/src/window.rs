//! What the environment may force on the window, for tests and screenshots: `KVLAB_THEME`
//! (`light` or `dark`; unset, the UI follows the system's appearance) and `KVLAB_WINDOW_SIZE`
//! (`WIDTHxHEIGHT` in logical pixels; unset, the size in tauri.conf.json).

use tauri::{LogicalSize, Manager, Runtime};

/// The theme a `KVLAB_THEME` value forces, if it names one.
pub fn theme_from(value: Option<&str>) -> Option<&'static str> {
    match value?.trim().to_ascii_lowercase().as_str() {
        "light" => Some("light"),
        "dark" => Some("dark"),
        _ => None,
    }
}

/// The logical size a `KVLAB_WINDOW_SIZE` value (`1280x800`) asks for, if it is one.
pub fn size_from(value: Option<&str>) -> Option<(u32, u32)> {
    let (w, h) = value?.trim().split_once(['x', 'X'])?;
    let (w, h): (u32, u32) = (w.trim().parse().ok()?, h.trim().parse().ok()?);
    let fits = |n: u32| (200..=10_000).contains(&n);
    (fits(w) && fits(h)).then_some((w, h))
}

/// The theme `KVLAB_THEME` forces (the UI sets it on <html>), or none: follow the system.
#[tauri::command]
pub fn ui_theme() -> Option<&'static str> {
    theme_from(std::env::var("KVLAB_THEME").ok().as_deref())
}

/// Resizes the main window as `KVLAB_WINDOW_SIZE` asks, if set.
pub fn apply_size<R: Runtime, M: Manager<R>>(app: &M) {
    let Some((w, h)) = size_from(std::env::var("KVLAB_WINDOW_SIZE").ok().as_deref()) else {
        return;
    };
    if let Some(window) = app.get_webview_window("main") {
        if let Err(e) = window.set_size(LogicalSize::new(w, h)) {
            tracing::warn!("KVLAB_WINDOW_SIZE: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_light_and_dark_force_a_theme() {
        assert_eq!(theme_from(Some("light")), Some("light"));
        assert_eq!(theme_from(Some(" Dark\n")), Some("dark"));
        assert_eq!(theme_from(Some("auto")), None);
        assert_eq!(theme_from(Some("")), None);
        assert_eq!(theme_from(None), None);
    }

    #[test]
    fn window_sizes_are_width_by_height_within_bounds() {
        assert_eq!(size_from(Some("1280x800")), Some((1280, 800)));
        assert_eq!(size_from(Some(" 1440 X 900 ")), Some((1440, 900)));
        assert_eq!(size_from(Some("1280")), None);
        assert_eq!(size_from(Some("0x800")), None);
        assert_eq!(size_from(Some("1280x-1")), None);
        assert_eq!(size_from(Some("99999x800")), None);
        assert_eq!(size_from(None), None);
    }
}
