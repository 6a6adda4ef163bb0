//! `kvlab bench memory --plot FILE`: the sweep's rows drawn as three charts side by side —
//! KV bytes, peak process memory and decode tokens/s, each against context — one line per
//! cache SPEC, into a PNG (or an SVG when FILE ends in `.svg`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::bench::memory::MemoryRow;

const MIB: f64 = 1024.0 * 1024.0;

/// Where TrueType fonts usually are (Linux, macOS, Windows); `KVLAB_PLOT_FONT` comes first.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a system font as plotters' `sans-serif` (labels need one to be measured).
pub fn register_system_font() -> anyhow::Result<PathBuf> {
    let from_env = std::env::var_os("KVLAB_PLOT_FONT").map(PathBuf::from);
    for path in from_env
        .into_iter()
        .chain(FONT_CANDIDATES.iter().map(PathBuf::from))
    {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // plotters keeps fonts for the process's lifetime; a CLI draws once, so leaking
        // the few hundred KiB is the simple way to give it a 'static slice.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
            return Ok(path);
        }
    }
    bail!("no TrueType font found for the chart's labels; set KVLAB_PLOT_FONT to a .ttf file")
}

/// One line of a chart: a SPEC's (context, value) points.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// The SPECs in first-seen order, each with its points sorted by context.
fn series(rows: &[MemoryRow], value: impl Fn(&MemoryRow) -> f64) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let p = (r.context as f64, value(r));
        match out.iter_mut().find(|s| s.label == r.kv) {
            Some(s) => s.points.push(p),
            None => out.push(Series {
                label: r.kv.clone(),
                points: vec![p],
            }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Draws `rows` into `path` (PNG, or SVG for a `.svg` path).
pub fn draw(rows: &[MemoryRow], path: &Path) -> anyhow::Result<()> {
    if rows.is_empty() {
        bail!("no configuration finished: nothing to plot");
    }
    register_system_font()?;
    let size = (1500, 520);
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let result = if svg {
        render(SVGBackend::new(path, size).into_drawing_area(), rows)
    } else {
        render(BitMapBackend::new(path, size).into_drawing_area(), rows)
    };
    result.with_context(|| format!("drawing {}", path.display()))
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    rows: &[MemoryRow],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((1, 3));
    let kv = series(rows, |r| r.kv_bytes as f64 / MIB);
    let peak = series(rows, |r| r.peak_rss_bytes as f64 / MIB);
    let decode = series(rows, |r| r.decode_tok_s);
    chart(&panels[0], "KV cache", "MiB", &kv)?;
    chart(&panels[1], "Peak process memory", "MiB", &peak)?;
    chart(&panels[2], "Decode speed", "tokens/s", &decode)?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Line colors, one per SPEC in order (wraps after six).
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// One chart: context on x, one colored line per SPEC.
fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_label: &str,
    lines: &[Series],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    let (x_max, y_max) = lines
        .iter()
        .flat_map(|s| &s.points)
        .fold((1.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let mut c = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..(y_max * 1.1).max(1e-9))
        .map_err(err)?;
    c.configure_mesh()
        .x_desc("context (tokens)")
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        c.draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        c.draw_series(
            s.points
                .iter()
                .map(|&p| Circle::new(p, 3, ShapeStyle::from(&color).filled())),
        )
        .map_err(err)?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(context: usize, kv: &str, kv_bytes: u64, decode: f64) -> MemoryRow {
        MemoryRow {
            context,
            kv: kv.into(),
            kv_bytes,
            kv_bytes_full: kv_bytes,
            kv_bytes_sliding: 0,
            kv_bytes_allocated: kv_bytes,
            peak_rss_bytes: kv_bytes + (300 << 20),
            peak_rss_process_bytes: 0,
            rss_after_load_bytes: 0,
            weights_bytes: 0,
            prefill_tok_s: 100.0,
            decode_tok_s: decode,
            decode_tokens: 8,
            kv_saved_vs_f16: None,
            peak_rss_saved_vs_f16: None,
            decode_speedup_vs_f16: None,
            synthetic: false,
            switch: None,
        }
    }

    #[test]
    fn series_group_by_spec_in_context_order() {
        let rows = [
            row(4096, "f16", 8 << 20, 10.0),
            row(1024, "f16", 2 << 20, 12.0),
            row(1024, "tq4", 1 << 19, 13.0),
        ];
        let s = series(&rows, |r| r.kv_bytes as f64 / MIB);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, "f16");
        assert_eq!(s[0].points, vec![(1024.0, 2.0), (4096.0, 8.0)]);
        assert_eq!(s[1].points, vec![(1024.0, 0.5)]);
    }

    #[test]
    fn draws_a_png_and_an_svg_when_a_font_is_present() -> anyhow::Result<()> {
        if register_system_font().is_err() {
            // The error path is the behaviour here: a clear message, no file.
            let dir = tempfile::tempdir()?;
            let e = draw(&[row(1024, "f16", 1, 1.0)], &dir.path().join("x.png"));
            assert!(format!("{e:?}").contains("KVLAB_PLOT_FONT"));
            return Ok(());
        }
        let rows = [
            row(1024, "f16", 2 << 20, 12.0),
            row(4096, "f16", 8 << 20, 10.0),
            row(1024, "tq4", 1 << 19, 13.0),
            row(4096, "tq4", 2 << 20, 12.5),
        ];
        let dir = tempfile::tempdir()?;
        let png = dir.path().join("sweep.png");
        draw(&rows, &png)?;
        let bytes = std::fs::read(&png)?;
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
        let svg = dir.path().join("sweep.svg");
        draw(&rows, &svg)?;
        let text = std::fs::read_to_string(&svg)?;
        assert!(text.contains("<svg") && text.contains("tq4") && text.contains("Decode speed"));
        assert!(draw(&[], &png).is_err());
        Ok(())
    }
}
