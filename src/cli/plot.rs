//! `subagents load --plot FILE.svg`: the run's timeline as a picture — epochs settled per
//! second and children in flight over time.

use std::path::Path;

use plotters::prelude::*;
use subagents::load::Sample;
use subagents::{ErrorCode, SubagentError};

fn failed(error: impl std::fmt::Display) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidArgs, format!("drawing the plot: {error}"))
}

/// Draws `timeline` into the SVG file at `path`.
pub(crate) fn draw(timeline: &[Sample], path: &Path) -> Result<(), SubagentError> {
    // Each interval's rate, at its end.
    let rates: Vec<(f64, f64)> = timeline
        .windows(2)
        .filter_map(|pair| {
            let seconds = pair[1].at_ms.checked_sub(pair[0].at_ms)? as f64 / 1000.0;
            (seconds > 0.0).then(|| {
                (
                    pair[1].at_ms as f64 / 1000.0,
                    pair[1].settled.saturating_sub(pair[0].settled) as f64 / seconds,
                )
            })
        })
        .collect();
    let in_flight: Vec<(f64, f64)> = timeline
        .iter()
        .map(|sample| {
            (
                sample.at_ms as f64 / 1000.0,
                sample.started.saturating_sub(sample.settled) as f64,
            )
        })
        .collect();
    let end = timeline
        .last()
        .map_or(1.0, |sample| sample.at_ms as f64 / 1000.0)
        .max(0.1);
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let (upper, lower) = root.split_vertically(300);
    for (area, title, series, color) in [
        (&upper, "epochs settled per second", &rates, &BLUE),
        (&lower, "children in flight", &in_flight, &RED),
    ] {
        let top = series.iter().map(|(_, y)| *y).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end, 0.0..top)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .draw()
            .map_err(failed)?;
        chart
            .draw_series(LineSeries::new(series.iter().copied(), color))
            .map_err(failed)?;
    }
    root.present().map_err(failed)
}
