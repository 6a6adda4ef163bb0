//! `kvlab fidelity sweep --plot FILE`: mean KL divergence (log scale) against bits per
//! coordinate, one labelled point per cache and any peer points beside them, into a PNG (or
//! an SVG when FILE ends in `.svg`).

use std::path::Path;

use anyhow::{bail, Context};
use plotters::prelude::*;

use crate::bench::memory_plot::register_system_font;
use crate::fidelity::PeerPoint;
use kvlab_engine::contract::SweepPoint as SweepRow;

/// Draws `kvlab fidelity sweep`'s rows (and any peer points) as KL divergence against bits.
pub fn draw(rows: &[SweepRow], peers: &[PeerPoint], path: &Path) -> anyhow::Result<()> {
    register_system_font()?;
    let is_svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if is_svg {
        let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
        fidelity_chart(&root, rows, peers)?;
        root.present().context("writing the SVG")?;
    } else {
        let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
        fidelity_chart(&root, rows, peers)?;
        root.present().context("writing the PNG")?;
    }
    Ok(())
}

fn fidelity_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    rows: &[SweepRow],
    peers: &[PeerPoint],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ours: Vec<(String, f64, f64)> = rows
        .iter()
        .filter(|r| r.mean_kld > 0.0)
        .map(|r| (r.kv.clone(), r.bits_per_coordinate, r.mean_kld))
        .collect();
    let theirs: Vec<(String, f64, f64)> = peers
        .iter()
        .filter(|p| p.mean_kld > 0.0)
        .map(|p| (p.label.clone(), p.bits_per_coordinate, p.mean_kld))
        .collect();
    let every = ours.iter().chain(&theirs);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    let mut max_bits = 1.0f64;
    for (_, b, k) in every {
        lo = lo.min(*k);
        hi = hi.max(*k);
        max_bits = max_bits.max(*b);
    }
    if !lo.is_finite() {
        bail!("no cache with a KL divergence above zero to draw");
    }
    let mut chart = ChartBuilder::on(root)
        .caption(
            "KL divergence against bits per coordinate",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(
            // Room on the right for the last point's label.
            0.0..(max_bits * 1.3).ceil(),
            (lo / 2.0..hi * 2.0).log_scale(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("bits per coordinate, as held")
        .y_desc("mean KLD vs the reference (nats)")
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (points, color, name) in [(&ours, BLUE, "KV Lab"), (&theirs, RED, "peers")] {
        if points.is_empty() {
            continue;
        }
        // Each point with its label set off to the upper right, clear of the dot.
        chart
            .draw_series(points.iter().map(|(label, b, k)| {
                EmptyElement::at((*b, *k))
                    + Circle::new((0, 0), 5, color.filled())
                    + Text::new(label.clone(), (8, -16), ("sans-serif", 13).into_font())
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| Circle::new((x, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
